"""Run a plan with every host as a thread of this process (``ThreadBackend``).

No Ray, no sockets: the fastest way to check that a plan and the executor
deliver bit-exact data, used by the property tests and as a reference. A
single-array plan is a one-leaf plan: both run through ``execute_tree_in_threads``.
"""
from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidArgumentError
from ..resharding.host_job import HostJob
from ..resharding.plan import ReshardingPlan
from .backend import DEFAULT_TIMEOUT_S, CommunicationError, ThreadBackend, ThreadHub
from .executor import ExecutorOptions, HostExecutor, Layout


def tree_layouts(plan) -> list[Layout]:
    """One ``Layout`` per leaf of a plan (a single-array plan has one)."""
    return [Layout.of(leaf) for leaf in plan.leaves]


def execute_in_threads(plan: ReshardingPlan, array: np.ndarray, timeout: float = DEFAULT_TIMEOUT_S,
                       kill_host: int | None = None, **executor_options) -> dict[int, np.ndarray]:
    """Shard ``array`` per the plan's source layout, run the plan, return every destination
    device's buffer. ``kill_host`` makes that host fail at its first transfer (fault tests)."""
    return execute_tree_in_threads(plan, [array], timeout, kill_host, **executor_options)[0]


def execute_tree_in_threads(plan, arrays, timeout: float = DEFAULT_TIMEOUT_S,
                            kill_host: int | None = None, xp=None, backend_class=ThreadBackend,
                            on_timings=None, **executor_options) -> list[dict[int, np.ndarray]]:
    """Run a plan with hosts as threads; ``arrays`` in leaf order. Returns per leaf every
    destination device's buffer. ``xp``: keep every buffer in that array module's memory
    (sources, destinations and everything the executor makes), as on GPUs.
    ``backend_class``: a ``ThreadBackend`` (sub)class; ``on_timings(host, timings)``: told
    each host's transfer timings; ``executor_options``: ``ExecutorOptions`` fields
    (``max_concurrent``, ``max_inflight_bytes``, ...)."""
    layouts = tree_layouts(plan)
    for leaf, lay, a in zip(plan.leaves, layouts, arrays):
        if a.shape != tuple(leaf.shape) or a.dtype != lay.dtype:
            where = "" if leaf.path == "/" else f"{leaf.path}: "
            raise InvalidArgumentError(f"{where}array of shape {a.shape} and dtype {a.dtype} does not match the "
                                       f"plan's {tuple(leaf.shape)} {lay.dtype}")
    options = ExecutorOptions(timeout, xp=xp, **executor_options)  # a bad option fails before any host starts
    host_of = plan.cluster.host_of
    hub = ThreadHub(plan.cluster.num_hosts)
    alloc = None if xp is None else (lambda d, shape, dtype: xp.zeros(shape, dtype))
    dst = [lay.empty_destinations(lambda d: True, zeros=True, alloc=alloc) for lay in layouts]
    hosts = sorted(set(plan.host_operations) | {host_of(d) for lay in layouts for d in lay.dst_boxes})
    hub.hosts = hosts  # the hosts that run (a backend of sockets connects exactly these)

    def work(h: int) -> None:
        if h == kill_host:
            raise CommunicationError(f"host {h} was killed")
        job = HostJob.for_host(plan, h)
        src = [lay.source_shards(a, job.is_local) for lay, a in zip(layouts, arrays)]
        if xp is not None:
            src = [{d: xp.asarray(b) for d, b in leaf_src.items()} for leaf_src in src]
        mine = [{d: b for d, b in leaf_dst.items() if job.is_local(d)} for leaf_dst in dst]
        timings = HostExecutor(h, layouts, src, mine, backend_class(h, hub), job.host_of,
                               options=options).run(job.transfers)
        if on_timings is not None:
            on_timings(h, timings)

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
