"""Emulated multi-host cluster (network namespaces + tc) for tests and benchmarks."""
from .netns import ClusterExistsError, EmulatedNetwork, EmulationUnavailable, check_available

__all__ = ["ClusterExistsError", "EmulatedNetwork", "EmulationUnavailable", "check_available"]
