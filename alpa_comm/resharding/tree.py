"""Many arrays at once: one jointly balanced, coalesced plan for a whole pytree.

A model's parameters are hundreds of arrays; resharding them one by one pays
per-message latency hundreds of times and balances each array alone. Here the
unit tasks of all leaves are planned together:

1. every leaf is decomposed into unit tasks and jobs (as ``plan_resharding``);
2. jobs that would travel the same way — same strategy, same candidate sender
   hosts, same receiving hosts and device counts — are packed into flat
   buffers of at most ``bucket_bytes`` (first-fit decreasing): one message (or
   one chunked chain) instead of many, unpacked on arrival (the DeepSpeed
   lesson: few large messages, not many small ones);
3. all jobs, packed or not, are load-balanced and ordered jointly.

The cost model already charges latency per message and per chunk, so the
effect of packing is predicted, and the simulator sees it too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..dtypes import itemsize
from ..errors import InvalidOptionError, LostDataError
from ..gc_pause import gc_paused
from ..placement import Placement, Resharding
from ..topology import ClusterSpec
from ..validation import is_choice
from . import loadbalance as balancing
from .admission import MAX_INFLIGHT_BYTES
from .cache import HashedKey, IdentityKey, PlanCache, cache_for, cluster_key, move_key, raw_key
from .coalesce import (AUTO_BUCKET_MAX, AUTO_BUCKET_MIN, auto_bucket_bytes, bucket_option, bucket_within, pack_jobs,
                       stream_bytes_within)
from .kinds import PER_TASK_STRATEGIES
from .plan import Leaf, Transfer
from .planner import LowerBounds, build_transfers, check_options, group_jobs, host_operations, plan_for
from .strategies import AUTO, LOCAL_COPY, Job, JobMemo, jobs_for_task
from .unit_tasks import UnitTask, decompose

TREE_STRATEGIES = PER_TASK_STRATEGIES + (AUTO,)
"""Tree plans take every per-task kind and ``auto`` (Alpa's rewrite is per array: not here)."""
RAMP_PIECES = 8
RAMP_PIECE_MIN = 128 << 10
"""A sending host's first coalesced chain goes in up to ``RAMP_PIECES`` growing chunks
where it holds at least ``RAMP_PIECES x RAMP_PIECE_MIN`` bytes (``ramp_up``); its last
one as up to as many shrinking transfers (``ramp_down``)."""


LeafLayout = Resharding.between
"""A tree leaf's move from six values (``Resharding.between``; kept for older code)."""


@dataclass(frozen=True)
class TreePlan:
    """One jointly balanced plan for many arrays; reads like a ``ReshardingPlan`` with
    several ``leaves`` (transfers name their leaf)."""

    leaves: tuple[Leaf, ...]
    unit_tasks: tuple[tuple[UnitTask, ...], ...]  # per leaf, task ids local to the leaf
    transfers: tuple[Transfer, ...]
    cluster: ClusterSpec
    strategy: str
    loadbalance_used: str
    bucket_bytes: int | None
    predicted_seconds: float
    lower_bound_seconds: float
    latency_bound_seconds: float = 0.0  # max(bandwidth bound, latency rounds): see planner.LowerBounds
    host_operations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cache_hit: bool = False   # served from the plan cache
    strategy_asked: str | None = None  # "auto" when the planner chose ``strategy``
    admitted_seconds: float | None = None  # auto's ranking: ``admission.admitted_seconds`` (auto plans only)

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    @property
    def tasks_per_leaf(self) -> tuple[tuple[UnitTask, ...], ...]:
        return self.unit_tasks

    @property
    def messages(self) -> int:
        """Network transfers (packed ones count once)."""
        return sum(1 for t in self.transfers if t.kind != LOCAL_COPY)


# ------------------------------------------------------------------ pytrees
_CONTAINERS = (dict, list, tuple)


@functools.lru_cache(maxsize=256)
def _paths(prefix: str, n: int) -> tuple[str, ...]:
    """The paths of a flat list's ``n`` leaves (a weight sync flattens the same list every step)."""
    return tuple(f"{prefix}/{i}" for i in range(n))


def tree_flatten(tree, prefix: str = "", is_leaf=None) -> list[tuple[str, Any]]:
    """(path, leaf) pairs of nested dicts (keys sorted) and lists/tuples; ``is_leaf(node)``
    marks containers that are leaves themselves (e.g. a ``(mesh, "S01R")`` pair)."""
    if is_leaf is not None and is_leaf(tree):
        return [(prefix or "/", tree)]
    if type(tree) in (list, tuple) and not any(isinstance(v, _CONTAINERS) or is_leaf is not None and is_leaf(v)
                                               for v in tree):
        return list(zip(_paths(prefix, len(tree)), tree))  # a flat list of leaves: one step
    if isinstance(tree, dict):
        return [pl for k in sorted(tree, key=str) for pl in tree_flatten(tree[k], f"{prefix}/{k}", is_leaf)]
    if isinstance(tree, (list, tuple)):
        return [pl for i, v in enumerate(tree) for pl in tree_flatten(v, f"{prefix}/{i}", is_leaf)]
    return [(prefix or "/", tree)]


def tree_unflatten(like, values: Sequence, is_leaf=None):
    """``values`` (in ``tree_flatten`` order) arranged like ``like`` (``is_leaf``: as for
    ``tree_flatten``). A module-level recursion, not a nested closure: a function that
    names itself through its cell is a reference cycle, and it would hold ``values`` (a
    reshard's results, hundreds of MiB) until the garbage collector's next full pass."""
    return _build(like, iter(values), is_leaf)


def _build(node, it, is_leaf):
    if is_leaf is not None and is_leaf(node):
        return next(it)
    if isinstance(node, dict):
        built = {k: _build(node[k], it, is_leaf) for k in sorted(node, key=str)}
        return {k: built[k] for k in node}
    if isinstance(node, (list, tuple)):
        return type(node)(_build(v, it, is_leaf) for v in node)
    return next(it)


# ----------------------------------------------------------------- planning
def plan_resharding_tree(tree, *, cluster: ClusterSpec, strategy: str = "broadcast", loadbalance: str = "auto",
                         bucket_bytes: int | str | None = "auto", chunks: int | None = None, seed: int = 0,
                         dfs_budget_s: float = balancing.DEFAULT_DFS_BUDGET_S,
                         cache: bool | PlanCache = True, max_inflight_bytes: int | None = None,
                         vectored: bool = False, lost_hosts=()) -> TreePlan:
    """One plan for a pytree whose leaves are ``Resharding`` records.

    ``bucket_bytes``: ``"auto"`` (from latency and bandwidth), a byte count, or
    None/0 to plan jointly without packing. ``cache``: as for ``plan_resharding``
    (a weight sync that runs every step plans once). ``max_inflight_bytes``: the memory
    budget the executor will run the plan under; buckets are then at most half of it and a
    stream of large slices aims at half of it (``coalesce.bucket_within``,
    ``stream_bytes_within``). ``vectored``: the executor's transport sends a bucket's parts
    from where they lie and receives them where they belong (``runtime.backend.Backend.vectored``:
    one gathered message, nothing packed or unpacked), so no bucket is cut into ramped
    chunks to overlap a packing that does not happen (``ramp_up``), nor the last one into
    halving transfers (``ramp_down``): each piece would only add a message's fixed cost
    (``benchmarks/user_script.py``: 10 x 256 KiB moves faster than JAX's ``device_put``
    without them, slower with the halving pieces).

    ``lost_hosts``: hosts that take no part any more (a failover after they died: see
    ``without_hosts``): their devices neither send nor receive; a slice only they held
    raises ``LostDataError`` naming it.
    """
    if not is_choice(strategy, TREE_STRATEGIES):
        raise InvalidOptionError(f"strategy {strategy!r} is not available for trees; choose one of "
                                 f"{', '.join(TREE_STRATEGIES)}")
    check_options(cluster=cluster, loadbalance=loadbalance, chunks=chunks, seed=seed, dfs_budget_s=dfs_budget_s,
                  cache=cache, bucket_bytes=bucket_bytes, max_inflight_bytes=max_inflight_bytes, cluster_required=True)
    stream = stream_bytes_within(max_inflight_bytes)
    bucket = bucket_within(bucket_option(bucket_bytes, cluster), max_inflight_bytes)
    one_hop_bucket = (bucket_within(bucket_option(bucket_bytes, cluster, vectored=True), max_inflight_bytes)
                      if vectored and bucket else None)
    flat = tree_flatten(tree)
    store = cache_for(cache)
    vectored = bool(vectored)
    lost = frozenset(int(h) for h in lost_hosts)
    options = (cluster, strategy, loadbalance, bucket, chunks, seed, dfs_budget_s, stream, vectored, one_hop_bucket,
               lost)
    same = None
    if store is not None:  # the very leaves of an earlier call: recognised by identity
        same = IdentityKey(tuple(move for _, move in flat), ("tree", tuple(path for path, _ in flat)) + options)
        hit = store.get_alias(same)
        if hit is not None:
            return hit
    raw = raw_key("tree", tuple(flat), *options) if store is not None else None
    if raw is None:
        same = None  # leaves that do not hash may be mutable: never served by identity
    hit = store.get_alias(raw) if store is not None else None
    if hit is not None:  # the same call as before: no leaf parsed or resolved
        store.alias(same, store.alias_target(raw))
        return hit
    leaves = _leaves(flat, cluster)
    if not leaves:
        raise InvalidOptionError("the tree has no leaves")
    moves = tuple(move_key(leaf.resharding) for leaf in leaves)
    key = HashedKey(("tree", tuple((leaf.path, m) for leaf, m in zip(leaves, moves)), cluster_key(cluster), strategy,
                     loadbalance, bucket, chunks, seed, dfs_budget_s, stream, vectored, one_hop_bucket, lost))
    if store is not None:
        hit = store.get(key)
        if hit is not None:
            store.alias(raw, key)
            store.alias(same, key)
            return hit
    with gc_paused():
        per_leaf, layouts = _decompose_leaves(leaves, moves)
        if lost:
            per_leaf = without_hosts(leaves, per_leaf, layouts, lost, cluster)
        bounds = LowerBounds(None, cluster, [(per_leaf[first], len(same)) for first, same in layouts.items()])
        plan = plan_for(strategy, lambda s: _plan_tree(leaves, per_leaf, bounds, cluster, s, loadbalance, bucket,
                                                       chunks, seed, dfs_budget_s, stream, layouts, vectored,
                                                       one_hop_bucket),
                        bounds)
    if store is not None:
        store.put(key, plan)
        store.alias(raw, key)
        store.alias(same, key)
    return plan


def _decompose_leaves(leaves: tuple[Leaf, ...], moves: tuple[tuple, ...]
                      ) -> tuple[tuple[tuple[UnitTask, ...], ...], dict[int, list[int]]]:
    """Each leaf's unit tasks, and the leaves by layout: the first leaf of each distinct
    move (``move_key``) -> every leaf with that move. A model's layers repeat a few
    layouts, and leaves with one move have equal unit tasks (ids are per leaf), so each
    layout is decomposed once and its tasks shared."""
    first_of: dict[tuple, int] = {}
    layouts: dict[int, list[int]] = {}
    per_leaf = []
    for i, (leaf, m) in enumerate(zip(leaves, moves)):
        first = first_of.setdefault(m, i)
        layouts.setdefault(first, []).append(i)
        per_leaf.append(per_leaf[first] if first != i else
                        tuple(decompose(leaf.shape, itemsize(leaf.dtype), leaf.src_mesh, leaf.src_spec, leaf.dst_mesh,
                                        leaf.dst_spec)))
    return tuple(per_leaf), layouts


def without_hosts(leaves: tuple[Leaf, ...], per_leaf: tuple[tuple[UnitTask, ...], ...], layouts: dict[int, list[int]],
                  lost: frozenset, cluster: ClusterSpec) -> tuple[tuple[UnitTask, ...], ...]:
    """Each leaf's unit tasks without the devices of the ``lost`` hosts: a slice keeps the
    live replicas that hold it (the planner balances over them as over any replicas) and
    goes only to live devices that need it (a slice no live device needs is dropped; task
    ids are renumbered, as plans index tasks by id). A slice that live devices need and
    only lost hosts held cannot be moved: ``LostDataError`` names every such slice."""
    host = cluster.host_of
    out: list = [None] * len(per_leaf)
    missing = []
    for first, same in layouts.items():
        kept = []
        for t in per_leaf[first]:
            dst = tuple(d for d in t.dst_devices if host(d) not in lost)
            if not dst:
                continue
            src = tuple(d for d in t.src_devices if host(d) not in lost)
            if not src:
                missing += [(leaves[i].path, t.index) for i in same]
                continue
            kept.append(t._replace(id=len(kept), src_devices=src, dst_devices=dst))
        for i in same:
            out[i] = tuple(kept)
    if missing:
        shown = ", ".join(f"{path} {list(map(list, box))}" for path, box in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise LostDataError(f"hosts {sorted(lost)} held the only copies of {len(missing)} slice(s) the live "
                            f"hosts need: {shown}{more}", missing)
    return tuple(out)


def _leaves(flat: list[tuple[str, Any]], cluster: ClusterSpec) -> tuple[Leaf, ...]:
    """Each (path, move) as a ``Leaf``; equal moves (a model's layers repeat a few) are
    resolved once."""
    resolved: dict = {}
    out = []
    for path, move in flat:
        try:
            r = resolved.get(move)
        except TypeError:  # a move that does not hash: resolved on its own
            out.append(_leaf(path, move, cluster))
            continue
        if r is None:
            leaf = _leaf(path, move, cluster)
            resolved[move] = leaf.resharding
            out.append(leaf)
        else:
            out.append(Leaf(path, r))
    return tuple(out)


def _leaf(path: str, move, cluster: ClusterSpec) -> Leaf:
    if not isinstance(move, Resharding):
        raise InvalidOptionError(f"tree leaf {path} must be a Resharding (Resharding.between(...)), "
                                 f"got {type(move).__name__}")
    return Leaf(path, move.resolve(cluster, where=path))


def _plan_tree(leaves: tuple[Leaf, ...], per_leaf: tuple[tuple[UnitTask, ...], ...], bounds: LowerBounds,
               cluster, strategy, loadbalance, bucket, chunks, seed, dfs_budget_s,
               stream: int = MAX_INFLIGHT_BYTES, layouts: dict[int, list[int]] | None = None,
               vectored: bool = False, one_hop_bucket: int | None = None) -> TreePlan:
    """One strategy's plan of the leaves, whose unit tasks ``per_leaf`` are already known;
    ``layouts`` (``_decompose_leaves``): leaves with one move share their jobs, made once
    (jobs depend only on the task, the strategy, the cluster and ``chunks``)."""
    memos: dict[int, JobMemo] = {}  # one per element size: a memo's candidates take equal bytes for equal elements
    first_of = {i: first for first, same in (layouts or {}).items() for i in same}
    made: dict[int, list[Job]] = {}
    jobs: list[Job] = []
    job_leaf: list[int] = []
    for i, tasks in enumerate(per_leaf):
        first = first_of.get(i, i)
        mine = made.get(first)
        if mine is None:
            memo = memos.setdefault(itemsize(leaves[i].dtype), JobMemo(cluster))
            mine = made[first] = [j for t in tasks for j in jobs_for_task(t, strategy, cluster, chunks, memo)]
        jobs += mine
        job_leaf += [i] * len(mine)
    members: dict[int, list[tuple[Job, int, int | None]]] = {}
    if bucket:
        jobs, job_leaf, members = pack_jobs(jobs, job_leaf, bucket, cluster, chunks, stream, one_hop_bucket)
    jobs, job_leaf, members = group_jobs(jobs, job_leaf, members, cluster)
    sched = balancing.balance(jobs, loadbalance, seed=seed, dfs_budget_s=dfs_budget_s)
    transfers = build_transfers(jobs, job_leaf, members, per_leaf, sched, cluster)
    transfers = transfers if vectored else ramp_down(ramp_up(transfers, cluster), cluster)
    return TreePlan(leaves, per_leaf, tuple(transfers), cluster, strategy, sched.mode, bucket,
                    sched.makespan, bounds.bandwidth(strategy), bounds.latency_aware(strategy),
                    host_operations(transfers, cluster))


def ramp_up(transfers: list[Transfer], cluster: ClusterSpec) -> list[Transfer]:
    """Each sending host's first coalesced chain (``broadcast``) in up to ``RAMP_PIECES``
    chunks that start small and double (``Transfer.ramp``, ``kinds.base.chunk_bounds``):
    a bucket must be packed before it is sent, and nothing is on that host's wire while
    its first one is; so its first message leaves once a few parts are packed (the executor
    sends each chunk as soon as it is packed) and packing overlaps the wire from then on. Later buckets are packed while earlier ones are on the wire,
    so they keep the chunks the cost model chose (each chunk is a message)."""
    seen: set[int] = set()
    out = []
    for t in transfers:
        host = None if t.sender is None else cluster.host_of(t.sender)
        if t.parts and t.kind == "broadcast" and host not in seen:
            seen.add(host)
            pieces = min(RAMP_PIECES, len(t.parts))
            if t.nbytes >= RAMP_PIECES * RAMP_PIECE_MIN and pieces > t.chunks:
                t = t._replace(chunks=pieces, ramp=True)
        out.append(t)
    return out


def ramp_down(transfers: list[Transfer], cluster: ClusterSpec) -> list[Transfer]:
    """Each sending host's last coalesced chain (``broadcast``) as up to ``RAMP_PIECES``
    transfers that halve in size, each ending on a part boundary: a receiver places a leaf
    once the last transfer writing it has ended (``jax.buffers.ProgressivePlacer``), so
    the leaves of one big last bucket would all wait for its last byte and be placed one
    by one after it; split, the leaves of each piece are placed while the next pieces
    arrive, and only the last small piece's follow the last byte. Each piece keeps the
    chain and its share of the chunks; what depended on the bucket depends on every
    piece."""
    last: dict[int, int] = {}
    for i, t in enumerate(transfers):
        if t.parts and t.kind == "broadcast":
            last[cluster.host_of(t.sender)] = i
    split: dict[int, list[list]] = {}
    for i in last.values():
        t = transfers[i]
        if not t.ramp and t.nbytes >= RAMP_PIECES * RAMP_PIECE_MIN:
            groups = _halving_groups(t.parts, t.nbytes)
            if len(groups) > 1:
                split[i] = groups
    if not split:
        return transfers
    new_ids: dict[int, tuple[int, ...]] = {}
    out: list[Transfer] = []
    for i, t in enumerate(transfers):
        deps = tuple(d for old in t.deps for d in new_ids[old])
        if i not in split:
            new_ids[i] = (len(out),)
            out.append(t._replace(id=len(out), deps=deps))
            continue
        ids, done = [], 0
        for parts in split[i]:
            nbytes = sum(p.nbytes for p in parts)
            ids.append(len(out))
            out.append(t._replace(id=len(out), sender=parts[0].sender, parts=tuple(parts), nbytes=nbytes,
                                  chunks=max(1, -(-t.chunks * nbytes // t.nbytes)),
                                  start=t.start + t.duration * done / t.nbytes,
                                  duration=t.duration * nbytes / t.nbytes, deps=deps))
            done += nbytes
        new_ids[i] = tuple(ids)
    return out


def _halving_groups(parts, nbytes: int) -> list[list]:
    """``parts`` in order, cut at part boundaries into groups of about 1/2, 1/4, ... of
    ``nbytes`` (at most ``RAMP_PIECES`` groups; none is cut off while less than
    ``RAMP_PIECE_MIN`` would remain)."""
    groups: list[list] = [[]]
    left, target, size = nbytes, nbytes / 2, 0
    for p in parts:
        if size >= target and len(groups) < RAMP_PIECES and left >= RAMP_PIECE_MIN:
            groups.append([])
            target, size = left / 2, 0
        groups[-1].append(p)
        size += p.nbytes
        left -= p.nbytes
    return [g for g in groups if g]


__all__ = ["AUTO_BUCKET_MAX", "AUTO_BUCKET_MIN", "LeafLayout", "Placement", "Resharding", "TreePlan", "auto_bucket_bytes", "plan_resharding_tree",
           "tree_flatten", "tree_unflatten"]
