"""``plan_resharding``: the planning pipeline for one array.

decompose -> jobs per strategy (transfer kinds) -> load balance + order ->
transfers with times -> a ``ReshardingPlan``. ``tree`` runs the same steps
jointly for many arrays.
"""
from __future__ import annotations

import dataclasses
import math
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Callable, Sequence, Tuple, TypeVar

from ..dtypes import itemsize
from ..errors import InvalidOptionError, InvalidTypeError
from ..gc_pause import gc_paused
from ..mesh import DeviceMesh, devices_per_host_needed
from ..placement import Placement, Resharding
from ..spec import ShardingSpec
from ..topology import ClusterSpec
from ..validation import is_int, non_negative_number, one_of, positive_int
from . import loadbalance as balancing
from .admission import MAX_CONCURRENT, MAX_INFLIGHT_BYTES, admitted_seconds
from .cache import PlanCache, cache_for, cluster_key, move_key, raw_key
from .coalesce import bucket_option, bucket_within, check_bucket_bytes, pack_jobs, stream_bytes_within
from .kinds import TRANSFER_KINDS, transfer_kind
from .plan import Part, ReshardingPlan, Transfer
from .strategies import (ALLGATHER, ALPA, AUTO, LOCAL_COPY, STRATEGIES, Job, JobMemo, allgather_job, alpa_local_allgather_spec,
                         auto_candidates, jobs_for_task, lower_bound_payload)
from .unit_tasks import UnitTask, decompose

Plan = TypeVar("Plan")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_TASK, _INDEX, _RECEIVERS, _NBYTES, _SENDER = (attrgetter("task"), attrgetter("index"), attrgetter("receivers"),
                                               attrgetter("nbytes"), attrgetter("sender"))


def smallest_cluster(src_mesh, dst_mesh, **kw) -> ClusterSpec:
    """The smallest cluster holding both meshes (text like ``'2x4@0,1'`` or ``DeviceMesh``).

    Keyword arguments are passed to ``ClusterSpec``; ``devices_per_host`` and
    ``num_hosts`` default to what the meshes need.
    """
    meshes = (src_mesh, dst_mesh)
    dph = kw.pop("devices_per_host", None)
    if dph is None:
        dph = max(m.devices_per_host if isinstance(m, DeviceMesh) else devices_per_host_needed(m) for m in meshes)
    hosts = max(max(DeviceMesh.parse(m, dph).hosts) for m in meshes) + 1
    return ClusterSpec(num_hosts=kw.pop("num_hosts", None) or hosts, devices_per_host=dph, **kw)


TaskGroups = Sequence[Tuple[Sequence[UnitTask], int]]
"""Unit tasks as (tasks, how many times they occur): a model's layers repeat the same
leaf layouts, so a tree's bounds pass over each distinct leaf's tasks once."""


def lower_bound(tasks: Sequence[UnitTask], cluster: ClusterSpec, payload: int | None = None) -> float:
    """Physical limit of a resharding on ``cluster`` whatever the strategy.

    * each receiving host must take in, through its NIC, every slice one of its
      devices needs and none of its devices holds;
    * every such slice must leave some source host at least once, so the
      source hosts' NICs together must push all of them.
    ``payload`` replaces each slice's size (the signal strategy moves 1 byte).
    """
    return grouped_lower_bound(((tasks, 1),), cluster, payload)


def grouped_lower_bound(groups: TaskGroups, cluster: ClusterSpec, payload: int | None = None) -> float:
    """``lower_bound`` of every task of ``groups``, each group counted as often as it
    occurs (byte sums are integers, so the result equals the pass over every copy)."""
    rx_need: dict[int, float] = {}
    out_bytes = 0.0
    senders: set[int] = set()
    longest = 0.0
    hosts_of: dict[tuple, frozenset] = {}
    lacking_of: dict[tuple, tuple] = {}
    for tasks, times in groups:
        for t in tasks:
            n = t.nbytes if payload is None else payload
            key = (t.src_devices, t.dst_devices)
            lack = lacking_of.get(key)
            if lack is None:
                src_hosts = hosts_of.get(t.src_devices)
                if src_hosts is None:
                    src_hosts = hosts_of[t.src_devices] = frozenset(cluster.host_of(d) for d in t.src_devices)
                dst_hosts = hosts_of.get(t.dst_devices)
                if dst_hosts is None:
                    dst_hosts = hosts_of[t.dst_devices] = frozenset(cluster.host_of(d) for d in t.dst_devices)
                lacking = tuple(sorted(dst_hosts - src_hosts))
                rate = (min(max(cluster.send_rate(h) for h in src_hosts), min(cluster.recv_rate(h) for h in lacking))
                        if lacking else 0.0)
                lack = lacking_of[key] = (lacking, src_hosts, rate)
            lacking, src_hosts, rate = lack
            if not lacking:
                continue
            if n / rate > longest:
                longest = n / rate
            n *= times
            for h in lacking:
                rx_need[h] = rx_need.get(h, 0.0) + n
            out_bytes += n
            senders |= src_hosts
    if not rx_need:
        return 0.0
    rx_bound = max(b / cluster.recv_rate(h) for h, b in rx_need.items())
    tx_bound = out_bytes / sum(cluster.send_rate(h) for h in senders)
    return cluster.latency_s + max(rx_bound, tx_bound, longest)


def plan_resharding(shape: Sequence[int], dtype, src_mesh, src_spec, dst_mesh, dst_spec, **kwargs
                    ) -> ReshardingPlan:
    """Plan moving a ``shape``/``dtype`` tensor from (src_mesh, src_spec) to (dst_mesh, dst_spec).

    Meshes may be ``DeviceMesh`` objects or text (``'2x4@0,1'``); specs may be
    ``ShardingSpec`` objects or text (``'S0RR'``). Keyword options:
    ``cluster`` (default: the smallest holding both meshes, 10 Gbit/s NICs),
    ``strategy`` (default ``broadcast``; ``auto`` plans with every kind that moves
    data and keeps the fastest predicted plan), ``loadbalance`` (default ``auto``),
    ``chunks`` (broadcast chunks per slice; None = per task from the cost
    model), ``seed`` (of the randomized greedy), ``dfs_budget_s``, ``cache``
    (default True: the same resharding planned again is served from
    ``cache.PLAN_CACHE``; False plans afresh; or a ``PlanCache`` of your own),
    ``bucket_bytes`` (default ``"auto"``: pieces smaller than a bucket that travel
    between the same hosts the same way go as one message of at most that many bytes,
    ``coalesce``; a byte count; None plans every piece as its own message; Alpa's
    baselines never coalesce), ``max_inflight_bytes`` (the memory budget the executor
    will run the plan under: buckets are then at most half of it and streams of large
    slices aim at half of it; default: ``MAX_INFLIGHT_BYTES``).
    """
    with gc_paused():  # hundreds of thousands of small tuples, no cycles: see gc_pause
        return _plan(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec, **kwargs)


def check_options(*, cluster, loadbalance, chunks, seed, dfs_budget_s, cache, bucket_bytes, max_inflight_bytes,
                  cluster_required: bool = False) -> None:
    """Every planning option but the strategy, checked before any is hashed into a cache
    key or used, so a bad one is named here instead of failing deep inside the planner
    (a ``TypeError`` from a comparison, an unhashable key); one array and a tree of them
    check theirs alike.

    Raises:
        InvalidTypeError: ``cluster`` is not a ``ClusterSpec`` (None is one where not
            ``cluster_required``), or ``cache`` is not a bool, None or ``PlanCache``.
        InvalidOptionError: any other option out of its range, named with its value.
    """
    if not (isinstance(cluster, ClusterSpec) or (cluster is None and not cluster_required)):
        raise InvalidTypeError(f"cluster must be a ClusterSpec{'' if cluster_required else ' or None'}, "
                               f"got {cluster!r}")
    one_of(loadbalance, balancing.LOADBALANCE_MODES, "loadbalance mode")
    if chunks is not None and (not is_int(chunks) or chunks <= 0):
        raise InvalidOptionError(f"chunks must be a positive integer or None (auto), got {chunks!r}")
    if seed is not None and not is_int(seed):
        raise InvalidOptionError(f"seed must be an integer, got {seed!r}")
    non_negative_number(dfs_budget_s, "dfs_budget_s", unit="seconds")
    if not (cache is None or isinstance(cache, (bool, PlanCache))):
        raise InvalidTypeError(f"cache must be True, False or a PlanCache, got {cache!r}")
    check_bucket_bytes(bucket_bytes)
    if max_inflight_bytes is not None:
        positive_int(max_inflight_bytes, "max_inflight_bytes")


def _plan(shape: Sequence[int], dtype, src_mesh, src_spec, dst_mesh, dst_spec, *,
          cluster: ClusterSpec | None = None, strategy: str = "broadcast", loadbalance: str = "auto",
          chunks: int | None = None, seed: int = 0, dfs_budget_s: float = balancing.DEFAULT_DFS_BUDGET_S,
          cache: bool | PlanCache = True, bucket_bytes: int | str | None = "auto",
          max_inflight_bytes: int | None = None) -> ReshardingPlan:
    one_of(strategy, STRATEGIES, "strategy")
    check_options(cluster=cluster, loadbalance=loadbalance, chunks=chunks, seed=seed, dfs_budget_s=dfs_budget_s,
                  cache=cache, bucket_bytes=bucket_bytes, max_inflight_bytes=max_inflight_bytes)
    store = cache_for(cache)
    raw = (raw_key("plan", shape, str(dtype), src_mesh, src_spec, dst_mesh, dst_spec, cluster, strategy, loadbalance,
                   chunks, seed, dfs_budget_s, bucket_bytes, max_inflight_bytes) if store is not None else None)
    hit = store.get_alias(raw) if store is not None else None
    if hit is not None:  # the same call as before: nothing parsed or resolved
        return hit
    if cluster is None:
        cluster = smallest_cluster(src_mesh, dst_mesh)
    # Alpa's messages as Alpa sends them; else buckets of at most half the budget
    bucket = None if strategy == ALPA else bucket_within(bucket_option(bucket_bytes, cluster), max_inflight_bytes)
    move = Resharding.between(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec).resolve(cluster)
    stream = stream_bytes_within(max_inflight_bytes)
    key = ("plan", move_key(move), cluster_key(cluster), strategy, loadbalance, chunks, seed, dfs_budget_s, bucket,
           stream)
    if store is not None:
        hit = store.get(key)
        if hit is not None:
            store.alias(raw, key)
            return hit
    final_tasks = decompose(move.shape, itemsize(move.dtype), move.src_mesh, move.src_spec, move.dst_mesh,
                            move.dst_spec)
    bounds = LowerBounds(final_tasks, cluster)
    plan = plan_for(strategy, lambda s: _plan_move(move, cluster, s, loadbalance, chunks, seed, dfs_budget_s,
                                                   final_tasks, bounds, bucket, stream), bounds)
    if store is not None:
        store.put(key, plan)
        store.alias(raw, key)
    return plan


AUTO_GOOD_ENOUGH = 1.15
"""``auto`` stops trying kinds at the first plan predicted within this factor of its
latency-aware bound even one transfer at a time (``predicted_seconds``, which overlaps
nothing): no other kind can win more than that."""
AUTO_MAX_JOBS = 250_000
"""``auto`` skips a kind that would make more jobs than this (send/recv of a large
all-to-replicated: millions of messages, slow to plan and never the fastest there)."""


def auto_order(tasks: Sequence[UnitTask], cluster: ClusterSpec, groups: TaskGroups | None = None
               ) -> list[tuple[str, int]]:
    """(kind, jobs it would make) of every kind ``auto`` may use here, cheapest to plan
    first: kinds that merge jobs into few transfers, then by job count, then listing
    order. Kinds that plan as a chain would for these tasks (``auto_min_hosts``) are left out.
    ``groups`` (``TaskGroups``) stands for ``tasks`` where given."""
    shapes: dict[int, tuple[int, int]] = {}  # id(dst devices) -> (hosts, devices); tasks share tuples
    per_shape: dict[tuple[int, int], int] = {}  # (hosts, devices) -> tasks of that shape
    for group, times in (groups if groups is not None else ((tasks, 1),)):
        for t in group:
            hd = shapes.get(id(t.dst_devices))
            if hd is None:
                hd = shapes[id(t.dst_devices)] = (len({cluster.host_of(d) for d in t.dst_devices}),
                                                  len(t.dst_devices))
            per_shape[hd] = per_shape.get(hd, 0) + times
    counts = {s: sum(transfer_kind(s).jobs_per_task(*hd) * n for hd, n in per_shape.items())
              for s in auto_candidates()}
    widest = max((hd[0] for hd in shapes.values()), default=0)
    rank = {s: i for i, s in enumerate(counts)}
    return sorted(((s, n) for s, n in counts.items() if transfer_kind(s).auto_min_hosts <= max(1, widest)),
                  key=lambda sc: (not transfer_kind(sc[0]).groups_jobs, sc[1], rank[sc[0]]))


def plan_for(strategy: str, plan_with: Callable[[str], Plan], bounds: "LowerBounds") -> Plan:
    """``plan_with(strategy)``, or for ``auto`` the plan with the smallest admitted time
    (``admission.admitted_seconds``: as the executor and the simulator admit transfers,
    many at once) over the kinds that move data, labelled ``strategy_asked="auto"``; ties
    go to the smaller one-at-a-time prediction (``predicted_seconds``).

    ``auto`` plans kinds cheapest first (``auto_order``), stops once a plan is predicted
    within ``AUTO_GOOD_ENOUGH`` of its latency-aware bound even one transfer at a time, and
    skips kinds that would make more than ``AUTO_MAX_JOBS`` jobs once it has a plan: at
    1,024 hosts that keeps it to a few seconds where planning every kind would take minutes."""
    if strategy != AUTO:
        return plan_with(strategy)
    best, best_key = None, None
    for s, jobs in auto_order(bounds.tasks, bounds.cluster, bounds.groups):
        if best is not None and jobs > AUTO_MAX_JOBS:
            continue
        plan = plan_with(s)
        key = (admitted_seconds(plan.transfers, plan.cluster, best_key[0] if best else math.inf),
               plan.predicted_seconds)
        if best is None or key < best_key:
            best, best_key = plan, key
        if plan.predicted_seconds <= AUTO_GOOD_ENOUGH * plan.latency_bound_seconds:
            break
    return dataclasses.replace(best, strategy_asked=AUTO, admitted_seconds=best_key[0])


def rounds_to_reach(n: float, fan: int = MAX_CONCURRENT) -> int:
    """Rounds in which something held by one party reaches ``n`` parties, each party that
    has it reaching at most ``fan`` more per round: the least r with (fan + 1)^r >= n."""
    r, reach = 0, 1
    while reach < n:
        reach *= fan + 1
        r += 1
    return r


def latency_rounds(tasks: Sequence[UnitTask], cluster: ClusterSpec, fan: int = MAX_CONCURRENT) -> int:
    """Messages that must cross one after another, whatever the plan.

    Every message costs at least the latency, and a host has at most ``fan`` messages
    in flight at once (``admission.MAX_CONCURRENT``, as the executor and the simulator
    admit them). So per round of messages, the hosts holding a slice can grow at most
    (fan + 1)-fold, and so can the source hosts whose data has reached a host:

    * a slice held on S hosts and needed on L others takes log_(fan+1)((S + L) / S) rounds;
    * a host that needs slices whose source hosts form k pairwise disjoint sets (each
      must be heard from, directly or through relays) takes log_(fan+1)(k + 1) rounds:
      a host that needs pieces from 100 hosts takes at least two rounds.
    """
    rounds = 0
    needs: dict[int, dict[frozenset, None]] = {}
    hosts_of: dict[tuple, frozenset] = {}

    def hosts(devices: tuple) -> frozenset:
        h = hosts_of.get(devices)
        if h is None:
            h = hosts_of[devices] = frozenset(cluster.host_of(d) for d in devices)
        return h

    seen: set[tuple] = set()
    for t in tasks:
        key = (t.src_devices, t.dst_devices)
        if key in seen:
            continue
        seen.add(key)
        src, dst = hosts(t.src_devices), hosts(t.dst_devices)
        lacking = dst - src
        if not lacking:
            continue
        rounds = max(rounds, rounds_to_reach((len(src) + len(lacking)) / len(src), fan))
        for h in lacking:
            needs.setdefault(h, {})[src] = None
    packed: dict[frozenset, int] = {}  # hosts often need the same source sets
    for sets in needs.values():
        key = frozenset(sets)
        k = packed.get(key)
        if k is None:
            taken: set[int] = set()
            k = 0
            for s in sorted(sets, key=len):  # greedy: any disjoint family is a valid bound
                if taken.isdisjoint(s):
                    taken |= s
                    k += 1
            packed[key] = k
        rounds = max(rounds, rounds_to_reach(k + 1, fan))
    return rounds


class LowerBounds:
    """The lower bounds of one set of unit tasks for a strategy, computed once per
    payload: ``auto`` plans the same tasks with several kinds, and a bound is a pass over
    all of them.

    ``bandwidth(strategy)`` (also ``self(strategy)``) is the NIC bound; ``latency_aware``
    adds what latency forces: max(bandwidth bound, ``latency_rounds`` x latency), which
    is what a transfer of a few KiB should be compared with."""

    def __init__(self, tasks: Sequence[UnitTask] | None, cluster: ClusterSpec, groups: TaskGroups | None = None):
        """``groups`` (``TaskGroups``): the tasks as distinct lists with how often each
        occurs (a tree whose leaves repeat layouts), passed over once each; ``tasks``
        may then be None (``self.tasks`` lists every copy, group by group, on demand)."""
        self.cluster, self._memo = cluster, {}
        self._tasks = tasks
        self.groups = groups if groups is not None else ((tasks, 1),)
        self._rounds: int | None = None

    @property
    def tasks(self) -> Sequence[UnitTask]:
        if self._tasks is None:
            self._tasks = [t for tasks, times in self.groups for _ in range(times) for t in tasks]
        return self._tasks

    def __call__(self, strategy: str) -> float:
        return self.bandwidth(strategy)

    def bandwidth(self, strategy: str) -> float:
        payload = lower_bound_payload(strategy)
        if payload not in self._memo:
            self._memo[payload] = grouped_lower_bound(self.groups, self.cluster, payload)
        return self._memo[payload]

    def latency_aware(self, strategy: str) -> float:
        if self._rounds is None:
            self._rounds = latency_rounds([t for tasks, _ in self.groups for t in tasks], self.cluster)
        return max(self.bandwidth(strategy), self._rounds * self.cluster.latency_s)


def _plan_move(move: Resharding, cluster: ClusterSpec, strategy: str, loadbalance: str, chunks: int | None,
               seed: int, dfs_budget_s: float, final_tasks: Sequence[UnitTask],
               bounds: LowerBounds, bucket: int | None = None,
               stream: int = MAX_INFLIGHT_BYTES) -> ReshardingPlan:
    """One strategy's plan of ``move``, whose unit tasks ``final_tasks`` are already known;
    pieces that travel between the same hosts the same way go as one message of at most
    ``bucket`` bytes (``coalesce``)."""
    shape, src, sspec, dst, dspec = move.shape, move.src_mesh, move.src_spec, move.dst_mesh, move.dst_spec
    size = itemsize(move.dtype)
    sent_spec, gather_dim = dspec, None
    if strategy == ALPA:
        sent_spec, gather_dim = alpa_local_allgather_spec(dspec, dst, shape)
    tasks = final_tasks if sent_spec == dspec else decompose(shape, size, src, sspec, dst, sent_spec)
    per_task = "send_recv" if strategy == ALPA else strategy

    memo = JobMemo(cluster)
    jobs: list[Job] = [j for t in tasks for j in jobs_for_task(t, per_task, cluster, chunks, memo)]
    if gather_dim is not None:
        jobs += _alpa_allgathers(jobs, shape, size, dst, dspec, gather_dim, cluster)
    job_leaf, members = [0] * len(jobs), {}
    if bucket and gather_dim is None:
        jobs, job_leaf, members = pack_jobs(jobs, job_leaf, bucket, cluster, chunks, stream)
    jobs, job_leaf, members = group_jobs(jobs, job_leaf, members, cluster)
    sched = balancing.balance(jobs, loadbalance, seed=seed, dfs_budget_s=dfs_budget_s)
    transfers = build_transfers(jobs, job_leaf, members, (tasks,), sched, cluster)
    return ReshardingPlan(
        resharding=move, cluster=cluster, strategy=strategy, loadbalance=loadbalance, loadbalance_used=sched.mode,
        chunks=chunks, sent_spec=sent_spec, unit_tasks=tuple(tasks), transfers=tuple(transfers),
        predicted_seconds=sched.makespan,
        lower_bound_seconds=bounds.bandwidth(strategy), latency_bound_seconds=bounds.latency_aware(strategy),
        search_complete=sched.complete, host_operations=host_operations(transfers, cluster))


def plan_from_sends(shape: Sequence[int], dtype, src_mesh, src_spec, dst_mesh, dst_spec,
                    sends: Sequence[tuple[int, int, tuple]], *, cluster: ClusterSpec,
                    strategy: str = ALPA) -> ReshardingPlan:
    """A plan that sends exactly ``sends`` — (sender device, receiver device, index box),
    in order, re-sends included — then, for ``strategy="alpa"``, Alpa's all-gathers.

    Not planned: a baseline taken from another system's compiled messages (Alpa 0.2.3's
    own strategy and task compiler, ``integrations.alpa_baseline``), so the bench runs and
    predicts what that system really sends. Each box must be a unit task of the spec
    actually sent (Alpa's local all-gather rewrite for ``alpa``) held by the sender and
    needed by the receiver; the receiver's copy is overwritten by every re-send."""
    if strategy not in (ALPA, "send_recv"):
        raise InvalidOptionError(f"plans from sends are 'alpa' or 'send_recv', not {strategy!r}")
    move = Resharding.between(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec).resolve(cluster)
    size = itemsize(move.dtype)
    sent_spec, gather_dim = move.dst_spec, None
    if strategy == ALPA:
        sent_spec, gather_dim = alpa_local_allgather_spec(move.dst_spec, move.dst_mesh, move.shape)
    tasks = decompose(move.shape, size, move.src_mesh, move.src_spec, move.dst_mesh, sent_spec)
    by_box = {}
    for t in tasks:
        for r in t.dst_devices:
            by_box[(tuple(map(tuple, t.index)), r)] = t
    jobs: list[Job] = []
    for sender, receiver, box in sends:
        t = by_box.get((tuple(map(tuple, box)), int(receiver)))
        if t is None or int(sender) not in t.src_devices:
            raise InvalidOptionError(f"send of {box} from device {sender} to device {receiver} is not a slice of "
                                     f"{sent_spec} that the sender holds and the receiver needs")
        s_host, r_host = cluster.host_of(int(sender)), cluster.host_of(int(receiver))
        k = LOCAL_COPY if s_host == r_host else "send_recv"
        cand = transfer_kind(k).candidate(t.nbytes, t.num_elements, s_host, {r_host: [int(receiver)]}, cluster, None)
        jobs.append(Job(t.id, k, (int(receiver),), t.nbytes, t.index, (cand,)))
    if gather_dim is not None:
        jobs += _alpa_allgathers(jobs, move.shape, size, move.dst_mesh, move.dst_spec, gather_dim, cluster)
    sched = balancing.balance(jobs, "naive")  # one candidate per job, in the given order
    transfers = build_transfers(jobs, [0] * len(jobs), {}, (tasks,), sched, cluster)
    final = decompose(move.shape, size, move.src_mesh, move.src_spec, move.dst_mesh, move.dst_spec)
    bounds = LowerBounds(final, cluster)
    return ReshardingPlan(
        resharding=move, cluster=cluster, strategy=strategy, loadbalance="fixed", loadbalance_used="fixed",
        chunks=None, sent_spec=sent_spec, unit_tasks=tuple(tasks), transfers=tuple(transfers),
        predicted_seconds=sched.makespan, lower_bound_seconds=bounds.bandwidth(strategy),
        latency_bound_seconds=bounds.latency_aware(strategy), search_complete=True,
        host_operations=host_operations(transfers, cluster))


def _alpa_allgathers(jobs: Sequence[Job], shape, size, dst: DeviceMesh, dspec: ShardingSpec, gather_dim: int,
                     cluster: ClusterSpec) -> list[Job]:
    """One all-gather per group of destination devices that differ only along ``gather_dim``."""
    boxes = Placement(dst, dspec).device_boxes(shape)
    groups: dict[tuple, list[int]] = {}
    for coord, dev in dst.coords():
        key = tuple(c for m, c in enumerate(coord) if m != gather_dim)
        groups.setdefault(key, []).append(dev)
    delivering: dict[int, list[int]] = {}
    for i, j in enumerate(jobs):
        for r in j.receivers:
            delivering.setdefault(r, []).append(i)
    out = []
    for members in groups.values():
        box = boxes[members[0]]
        nbytes = size * math.prod(b - a for a, b in box)
        deps = sorted({i for m in members for i in delivering.get(m, [])})
        out.append(allgather_job(members, box, nbytes, deps, cluster))
    return out


def group_jobs(jobs: list[Job], job_leaf: list[int], members: dict, cluster: ClusterSpec):
    """Let every kind that merges jobs (``TransferKind.combine``) merge its own."""
    for kind in {j.kind for j in jobs}:
        if transfer_kind(kind).groups_jobs:
            jobs, job_leaf, members = transfer_kind(kind).combine(jobs, job_leaf, members, cluster)
    return jobs, job_leaf, members


def build_transfers(jobs: Sequence[Job], job_leaf: Sequence[int], members: dict,
                    tasks_per_leaf: Sequence[Sequence[UnitTask]], sched: balancing.JobOrder,
                    cluster: ClusterSpec) -> list[Transfer]:
    """Concrete transfers in schedule order. The sending device on the chosen host is the
    least-loaded replica there (ties: lowest id), which spreads work over devices; a
    merged job becomes one transfer whose ``parts`` carry its unit tasks (each from its
    own sender: the job's host, or the one ``combine`` chose)."""
    device_load: dict[int, int] = {}
    job_to_transfer: dict[int, int] = {}
    local_of: dict[tuple, list[int]] = {}
    host_of = cluster.host_of

    def pick_senders(items) -> list[int]:
        """The sending device of each (source devices, host, bytes): the least-loaded one
        of those devices on that host (one pass: a ring carries hundreds of thousands)."""
        local_get, out = local_of.get, []
        for devs, host, nbytes in items:
            key = (id(devs), host)  # the tasks (and their device tuples) live through planning
            local = local_get(key)
            if local is None:
                local = local_of[key] = [d for d in devs if host_of(d) == host]
            d = local[0] if len(local) == 1 else min(local, key=lambda d: (device_load.get(d, 0), d))
            device_load[d] = device_load.get(d, 0) + nbytes
            out.append(d)
        return out

    out: list[Transfer] = []
    starts = sched.starts
    for j, c in sorted(sched.sequence, key=lambda p: (starts[p[0]], p[0])):
        job, cand = jobs[j], jobs[j].candidates[c]
        job_to_transfer[j] = len(out)
        deps = tuple(job_to_transfer[d] for d in job.deps) if job.deps else ()
        if j in members:
            ms = members[j]
            senders = pick_senders((tasks_per_leaf[leaf][m.task].src_devices, cand.host if host is None else host,
                                    m.nbytes) for m, leaf, host in ms)
            mj = list(map(_FIRST, ms))
            parts = tuple(map(tuple.__new__, repeat(Part), zip(map(_SECOND, ms), map(_TASK, mj), map(_INDEX, mj),
                                                               senders, map(_RECEIVERS, mj), map(_NBYTES, mj))))
            out.append(Transfer(len(out), -2, job.kind, parts[0].sender, job.receivers, (), job.nbytes,
                                cand.chunks, starts[j], cand.duration, deps, 0, parts))
            continue
        leaf = job_leaf[j]
        sender = (None if job.kind == ALLGATHER else
                  pick_senders([(tasks_per_leaf[leaf][job.task].src_devices, cand.host, job.nbytes)])[0])
        out.append(Transfer(len(out), job.task, job.kind, sender, job.receivers, job.index, job.nbytes, cand.chunks,
                            starts[j], cand.duration, deps, leaf))
    return rotate_shared_chains(out, cluster)


def rotate_shared_chains(transfers: list[Transfer], cluster: ClusterSpec) -> list[Transfer]:
    """The k-th transfer (in plan order) of a kind that passes its receiving hosts in
    order (``TransferKind.rotates_shared_receivers``) among those with the same receiving
    hosts starts its chain k hosts further on. Otherwise every chain of, say, eight
    slices to the same eight hosts enters at the same host: it takes all eight slices
    first while the executor admits two at a time there, and the pairs pass the chain in a
    convoy (measured on 16 emulated hosts: 1.48x slower than rotated). Homogeneous hosts
    see the same cost either way; the sending host's own devices stay first.

    The rotation is chosen by bytes, not by count alone: each chain enters at the host
    that has so far been entered by the fewest bytes of the chains to the same hosts (a
    tie goes to the next in turn, so equal transfers still rotate one host at a time). A
    chain's hosts but the last forward what they receive, so by count a tree whose large
    and small transfers alternate sent every large one in at the same host, which then
    forwarded all of them while the last host forwarded nothing (two 42 MB chains and six
    small ones, two hosts to two at 1 Gbit/s: 1.6x the simulated time, which cannot tell
    the two orders apart)."""
    host_of = cluster.host_of
    seen: dict[tuple, list] = {}  # key -> [chains so far, bytes entered per rotation]
    out = []
    for t in transfers:
        kind = TRANSFER_KINDS.get(t.kind)
        if kind is None or not kind.rotates_shared_receivers or t.sender is None:
            out.append(t)
            continue
        s = host_of(t.sender)
        groups: dict[int, list[int]] = {}
        for r in t.receivers:
            groups.setdefault(host_of(r), []).append(r)
        hosts = [h for h in groups if h != s]
        key = (t.kind, s in groups, tuple(sorted(hosts)))
        n = max(1, len(hosts))
        count, entered = seen.setdefault(key, [0, [0] * n])
        k = min(range(n), key=lambda r: (entered[r], (r - count) % n))
        seen[key][0] = count + 1
        entered[k] += t.nbytes
        if k:
            order = ([s] if s in groups else []) + hosts[k:] + hosts[:k]
            t = t._replace(receivers=tuple(r for h in order for r in groups[h]))
        out.append(t)
    return out


def host_operations(transfers: Sequence[Transfer], cluster: ClusterSpec) -> dict[int, tuple[int, ...]]:
    """For each host, the ids of the transfers it takes part in, in start order."""
    ops: dict[int, list[int]] = {}
    for t in transfers:  # already in start order
        hosts = {cluster.host_of(r) for r in t.receivers}
        if t.sender is not None:
            hosts.add(cluster.host_of(t.sender))
        hosts.update(map(cluster.host_of, set(map(_SENDER, t.parts))))  # a merged transfer's own senders
        for h in sorted(hosts):
            ops.setdefault(h, []).append(t.id)
    return {h: tuple(v) for h, v in sorted(ops.items())}
