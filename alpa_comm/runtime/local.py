"""Run a plan with every host as a thread of this process (``ThreadBackend``).

No Ray, no sockets: the fastest way to check that a plan and the executor
deliver bit-exact data, used by the property tests and as a reference.
"""
from __future__ import annotations

import threading

import numpy as np

from ..resharding.plan import ReshardingPlan
from ..resharding.unit_tasks import device_boxes
from .backend import DEFAULT_TIMEOUT_S, CommunicationError, ThreadBackend, ThreadHub
from .executor import HostExecutor, Layout, numpy_dtype, view


def layout_for(plan: ReshardingPlan) -> Layout:
    return Layout(numpy_dtype(plan.dtype), device_boxes(plan.shape, plan.src_mesh, plan.src_spec),
                  device_boxes(plan.shape, plan.dst_mesh, plan.dst_spec),
                  device_boxes(plan.shape, plan.dst_mesh, plan.sent_spec))


def host_transfers(plan: ReshardingPlan, host: int):
    return [plan.transfers[i] for i in plan.host_operations.get(host, ())]


def execute_in_threads(plan: ReshardingPlan, array: np.ndarray, timeout: float = DEFAULT_TIMEOUT_S,
                       kill_host: int | None = None) -> dict[int, np.ndarray]:
    """Shard ``array`` per the plan's source layout, run the plan, return every destination
    device's buffer. ``kill_host`` makes that host fail at its first transfer (fault tests)."""
    layout = layout_for(plan)
    if array.shape != tuple(plan.shape) or array.dtype != layout.dtype:
        raise ValueError(f"array of shape {array.shape} and dtype {array.dtype} does not match the plan's "
                         f"{tuple(plan.shape)} {layout.dtype}")
    host_of = plan.cluster.host_of
    hosts = sorted(set(plan.host_operations) | {host_of(d) for d in layout.dst_boxes})
    hub = ThreadHub(plan.cluster.num_hosts)
    dst = {d: np.zeros(tuple(b - a for a, b in box), layout.dtype) for d, box in layout.dst_boxes.items()}

    def work(h: int) -> None:
        if h == kill_host:
            raise CommunicationError(f"host {h} was killed")
        src = {d: np.ascontiguousarray(view(array, tuple((0, n) for n in array.shape), box))
               for d, box in layout.src_boxes.items() if host_of(d) == h}
        mine = {d: buf for d, buf in dst.items() if host_of(d) == h}
        HostExecutor(h, layout, src, mine, ThreadBackend(h, hub), host_of, timeout).run(host_transfers(plan, h))

    _run_hosts(hosts, work, hub, timeout)
    return dst


def _run_hosts(hosts, work, hub: ThreadHub, timeout: float) -> None:
    """``work(host)`` in one thread per host; a failing host is marked dead (its peers
    stop waiting for it) and the first error is raised."""
    errors: list[BaseException] = []

    def guarded(h: int) -> None:
        try:
            work(h)
        except BaseException as e:  # noqa: BLE001 - collected and re-raised below
            hub.dead.add(h)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise CommunicationError("a host thread did not finish in time")


def tree_layouts(plan) -> list[Layout]:
    """One ``Layout`` per leaf of a ``TreePlan`` (no Alpa rewrite in trees: sent = dst)."""
    out = []
    for leaf in plan.leaves:
        dst = device_boxes(leaf.shape, leaf.dst_mesh, leaf.dst_spec)
        out.append(Layout(numpy_dtype(leaf.dtype), device_boxes(leaf.shape, leaf.src_mesh, leaf.src_spec), dst, dst))
    return out


def execute_tree_in_threads(plan, arrays, timeout: float = DEFAULT_TIMEOUT_S) -> list[dict[int, np.ndarray]]:
    """Run a ``TreePlan`` with hosts as threads; ``arrays`` in leaf order. Returns per leaf
    every destination device's buffer."""
    layouts = tree_layouts(plan)
    host_of = plan.cluster.host_of
    for leaf, lay, a in zip(plan.leaves, layouts, arrays):
        if a.shape != leaf.shape or a.dtype != lay.dtype:
            raise ValueError(f"{leaf.path}: array {a.shape} {a.dtype} does not match {leaf.shape} {lay.dtype}")
    hub = ThreadHub(plan.cluster.num_hosts)
    dst = [{d: np.zeros(tuple(b - a for a, b in box), lay.dtype) for d, box in lay.dst_boxes.items()}
           for lay in layouts]
    hosts = sorted(set(plan.host_operations) | {host_of(d) for lay in layouts for d in lay.dst_boxes})

    def work(h: int) -> None:
        src = [{d: np.ascontiguousarray(view(a, tuple((0, n) for n in a.shape), box))
                for d, box in lay.src_boxes.items() if host_of(d) == h} for lay, a in zip(layouts, arrays)]
        mine = [{d: b for d, b in leaf_dst.items() if host_of(d) == h} for leaf_dst in dst]
        HostExecutor(h, layouts, src, mine, ThreadBackend(h, hub), host_of, timeout).run(host_transfers(plan, h))

    _run_hosts(hosts, work, hub, timeout)
    return dst
