"""alpa_comm: fast cross-mesh resharding and overlap-friendly pipeline schedules.

The planning layer imported here is pure Python + NumPy; runtime pieces that
need jax, ray, torch or cupy live in submodules and import them lazily.
"""
from .topology import ClusterSpec
from .errors import (AlpaCommError, InvalidClusterError, InvalidMeshError, InvalidOptionError,
                     InvalidSpecError)
from .mesh import DeviceMesh
from .placement import Placement, Resharding
from .resharding import LOADBALANCE_MODES, STRATEGIES, TRANSFER_KINDS, ReshardingPlan, UnitTask, plan_resharding
from .spec import ShardingSpec

__version__ = "0.1.0"


def __getattr__(name):
    # The runtime (Ray, torch) loads only when asked for: planning stays import-light.
    if name in ("Cluster", "DistributedArray", "CommunicationError"):
        from . import runtime  # noqa: PLC0415

        return getattr(runtime, name)
    raise AttributeError(f"module 'alpa_comm' has no attribute {name!r}")


__all__ = ["AlpaCommError", "ClusterSpec", "DeviceMesh", "InvalidClusterError", "InvalidMeshError",
           "InvalidOptionError", "InvalidSpecError", "LOADBALANCE_MODES", "Placement", "Resharding",
           "ReshardingPlan", "STRATEGIES", "ShardingSpec", "TRANSFER_KINDS", "UnitTask", "plan_resharding",
           "__version__"]
