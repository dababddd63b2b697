"""Cross-mesh resharding planning: unit tasks, strategies, load balancing, plans (pure)."""
from .loadbalance import LOADBALANCE_MODES
from .plan import ReshardingPlan, Transfer, lower_bound, plan_resharding, smallest_cluster
from .strategies import STRATEGIES
from ..placement import device_boxes
from .unit_tasks import UnitTask, decompose

__all__ = ["LOADBALANCE_MODES", "STRATEGIES", "ReshardingPlan", "Transfer", "UnitTask", "decompose",
           "device_boxes", "lower_bound", "plan_resharding", "smallest_cluster"]
