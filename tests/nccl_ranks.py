"""Run plans and collectives on the NCCL model (``alpa_comm.testing.nccl_model``): hosts as
threads, each with the real ``NcclSubgroupBackend`` on model CuPy buffers."""
import numpy as np
from torch.distributed import HashStore

from alpa_comm.runtime.local import execute_tree_in_threads, tree_layouts


def nccl_backend_class(hosts, backend=None, timeout: float = 20):
    """A ``backend_class(host, hub)`` for ``execute_tree_in_threads``: each host a member
    of one NCCL group of ``hosts`` (``backend``: the class, ``NcclSubgroupBackend`` by
    default)."""
    from alpa_comm.runtime.backend import NcclSubgroupBackend

    cls = backend or NcclSubgroupBackend
    store = HashStore()  # the rendezvous store, in memory
    return lambda h, hub: cls(h, hosts, store, 0, timeout)


def run_plan_on_model(plan, arrays, backend=None, timeout: float = 20, **executor_options):
    """Run ``plan`` (leaves ``arrays``) with every buffer in model device memory; returns
    per leaf every destination device's buffer as NumPy (``executor_options``: the
    executor's limits)."""
    import cupy  # the model's, installed by the caller

    layouts = tree_layouts(plan)
    host_of = plan.cluster.host_of
    hosts = sorted(set(plan.host_operations) | {host_of(d) for lay in layouts for d in lay.dst_boxes})
    out = execute_tree_in_threads(plan, arrays, timeout=timeout, xp=cupy,
                                  backend_class=nccl_backend_class(hosts, backend, timeout), **executor_options)
    return [{d: np.asarray(b).view(np.ndarray) for d, b in leaf.items()} for leaf in out]
