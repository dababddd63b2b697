"""Cross-mesh resharding planning: unit tasks, transfer kinds, load balancing, plans (pure)."""
from ..placement import device_boxes
from .host_job import HostJob
from .kinds import TRANSFER_KINDS, TransferKind, transfer_kind
from .loadbalance import LOADBALANCE_MODES
from .plan import Leaf, ReshardingPlan, Transfer
from .planner import lower_bound, plan_resharding, smallest_cluster
from .strategies import STRATEGIES
from .unit_tasks import UnitTask, decompose

__all__ = ["HostJob", "LOADBALANCE_MODES", "Leaf", "ReshardingPlan", "STRATEGIES", "TRANSFER_KINDS", "Transfer",
           "TransferKind", "UnitTask", "decompose", "device_boxes", "lower_bound", "plan_resharding",
           "smallest_cluster", "transfer_kind"]
