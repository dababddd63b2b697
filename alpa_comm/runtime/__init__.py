"""Real execution: host workers on Ray, comm backends (gloo CPU, NCCL GPU), the executor.

Importing this package does not import Ray or torch; they load when a cluster starts.
"""
from .backend import CommunicationError
from .cluster import Cluster, DistributedArray

__all__ = ["Cluster", "CommunicationError", "DistributedArray"]
