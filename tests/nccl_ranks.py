"""Run plans and collectives on the NCCL model (``alpa_comm.testing.nccl_model``): hosts as
threads, each with the real ``NcclSubgroupBackend`` on model CuPy buffers."""
import threading
import time

import numpy as np

from alpa_comm.runtime.local import execute_tree_in_threads, tree_layouts


class DictStore:
    """The rendezvous store ``NcclSubgroupBackend`` shares the NCCL id through (set, get,
    wait, check, compare_set of a torch ``Store``), in memory."""

    def __init__(self):
        self._d, self._cond = {}, threading.Condition()

    def set(self, key, value):
        with self._cond:
            self._d[key] = value.encode() if isinstance(value, str) else value
            self._cond.notify_all()

    def get(self, key):
        with self._cond:
            return self._d[key]

    def check(self, keys):
        with self._cond:
            return all(k in self._d for k in keys)

    def wait(self, keys, timeout):
        deadline = time.monotonic() + timeout.total_seconds()
        with self._cond:
            while not all(k in self._d for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"keys {keys} not set")
                self._cond.wait(left)

    def compare_set(self, key, expected, desired):
        with self._cond:
            cur = self._d.get(key, b"")
            if cur == (expected.encode() if isinstance(expected, str) else expected):
                self._d[key] = desired.encode() if isinstance(desired, str) else desired
                return self._d[key]
            return cur


def nccl_backend_class(hosts, backend=None, timeout: float = 20):
    """A ``backend_class(host, hub)`` for ``execute_tree_in_threads``: each host a member
    of one NCCL group of ``hosts`` (``backend``: the class, ``NcclSubgroupBackend`` by
    default)."""
    from alpa_comm.runtime.backend import NcclSubgroupBackend

    cls = backend or NcclSubgroupBackend
    store = DictStore()
    return lambda h, hub: cls(h, hosts, store, 0, timeout)


def run_plan_on_model(plan, arrays, backend=None, timeout: float = 20):
    """Run ``plan`` (leaves ``arrays``) with every buffer in model device memory; returns
    per leaf every destination device's buffer as NumPy."""
    import cupy  # the model's, installed by the caller

    layouts = tree_layouts(plan)
    host_of = plan.cluster.host_of
    hosts = sorted(set(plan.host_operations) | {host_of(d) for lay in layouts for d in lay.dst_boxes})
    out = execute_tree_in_threads(plan, arrays, timeout=timeout, xp=cupy,
                                  backend_class=nccl_backend_class(hosts, backend, timeout))
    return [{d: np.asarray(b).view(np.ndarray) for d, b in leaf.items()} for leaf in out]
