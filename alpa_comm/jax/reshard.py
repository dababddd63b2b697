"""``reshard`` / ``reshard_tree``: a global ``jax.Array`` from one mesh to another, called by
every process of both meshes.

The source and destination ``NamedSharding`` become placements (``placement``) and one
plan is made (the same planner as everywhere); with this process's share of it and the
buffer layouts it is cached by the tree's shapes, types and shardings, so a weight sync
that repeats prepares once. This process runs its share with the runtime's
``HostExecutor`` over the group's backend: from its addressable source shards (read as
NumPy, or handed over by DLPack: ``buffers``) into fresh buffers for its addressable
destination devices, which become the result's shards. Processes in neither mesh do not
call. A peer that dies mid-transfer ends in a ``CommunicationError`` naming it, within
the group's timeout. Between separate JAX programs: ``programs``.
"""
from __future__ import annotations

import functools
import json
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_name
from ..errors import InvalidOptionError, PartialUpdateError
from ..gc_pause import gc_paused
from ..placement import Resharding
from ..resharding import plan_resharding
from ..resharding.host_job import HostJob
from ..resharding.staging import staged_bytes, staging_groups
from ..resharding.tree import plan_resharding_tree, tree_flatten, tree_unflatten
from ..runtime.backend import CommunicationError
from ..resharding.admission import MAX_INFLIGHT_BYTES
from ..runtime.executor import ExecutorOptions, HostExecutor, Layout, SlabLayout, numpy_dtype, slab_regions
from ..spec import ShardingSpec
from ..topology import ClusterSpec
from ..validation import positive_int
from . import programs
from .buffers import buffers_for
from .group import ProcessGroup, default_group
from .into import ReceiveInto, check_out, forget_host_copies, writable_shards
from .placement import JaxHosts, named_sharding, placement


def reshard(x, dst, *, group: ProcessGroup | None = None, strategy: str = "broadcast",
            wire_dtype=None, dtype=None, timeout: float | None = None, out=None,
            max_inflight_bytes: int | None = None, atomic: bool = False):
    """``x`` (a global ``jax.Array`` with a ``NamedSharding``) on ``dst`` (a
    ``NamedSharding``, or ``(mesh, "S01R")``), as this process sees it. ``wire_dtype``,
    ``dtype``, ``out``, ``max_inflight_bytes`` and ``atomic``: as for ``reshard_tree``. Between
    separate JAX programs a process that only sends passes ``dst=None`` (and gets None),
    one that only receives ``x=None``."""
    if dst is None and out is not None:
        dst = out.sharding
    got = reshard_tree(None if x is None else {"x": x}, None if dst is None else {"x": dst}, group=group,
                       strategy=strategy, timeout=timeout, bucket_bytes=None, wire_dtype=wire_dtype, dtype=dtype,
                       out=None if out is None else {"x": out}, max_inflight_bytes=max_inflight_bytes,
                       atomic=atomic)
    return None if got is None else got["x"]


def reshard_tree(tree, dst_tree, *, group: ProcessGroup | None = None, strategy: str = "broadcast",
                 bucket_bytes: int | str | None = "auto", wire_dtype=None, dtype=None,
                 timeout: float | None = None, out=None, max_inflight_bytes: int | None = None,
                 atomic: bool = False):
    """Every ``jax.Array`` leaf of ``tree`` onto the sharding at the same place in
    ``dst_tree`` (nested dicts/lists/tuples), in one jointly balanced plan (small arrays
    that travel the same way packed into one message up to ``bucket_bytes``).

    ``wire_dtype`` (e.g. ``"bfloat16"``): floating-point leaves travel in that type (the
    senders cast their shards, round to nearest even; half the bytes from float32);
    ``dtype``: the type the results have (default: each leaf's own), so a float32 model
    can be received as float32 after a bfloat16 trip, or kept in bfloat16.

    Between separate JAX programs (a group larger than this program, e.g. Ray actors of a
    trainer and of inference engines; see ``programs``), a process passes what it has:
    ``tree`` where it holds the source arrays, ``dst_tree`` (shardings in its own program)
    where it receives, None for the side it is not on; every member of the group calls.
    The sources' ``wire_dtype`` decides the wire type.

    ``out`` (a tree like ``dst_tree`` of ``jax.Array``s with the results' shapes, types
    and shardings, e.g. the previous step's weights): received into their memory and
    returned (the same objects, new values), so a receiver holds no second copy of the
    model (``into``); ``dst_tree`` may then be None (``out``'s shardings). The caller
    gives those arrays up, as with ``donate_argnums``. A call that fails mid-transfer
    deletes them (never half-written arrays left readable), unless ``atomic``: then each
    leaf's bytes land in staging memory of its own and are copied into its array once all
    are in, and a call that fails part of the way raises ``PartialUpdateError`` naming the
    leaves that hold the new values and those that hold their previous ones, every array
    usable (see ``into``).

    ``max_inflight_bytes`` (default ``MAX_INFLIGHT_BYTES``, 256 MiB): beyond the source
    arrays and the results, the buffers this process makes for the call (packed buckets,
    receives that cannot land in place) stay within it; buckets are at most half of it,
    so the next is packed while the previous is on the wire. Receiving into ``out`` with
    ``atomic``, the staging of the leaves counts too: the tree runs as groups of leaves in
    turn whose staging fits half of the budget on every process, the buffers of each
    group's plan within the other half (a leaf over half of it is staged whole, alone)."""
    budget = MAX_INFLIGHT_BYTES if max_inflight_bytes is None else positive_int(max_inflight_bytes,
                                                                                "max_inflight_bytes")
    if not isinstance(atomic, bool):
        raise InvalidOptionError(f"atomic must be True or False, got {atomic!r}")
    if atomic and out is None:
        raise InvalidOptionError("atomic=True is about receiving into out=: pass out (the arrays to receive into)")
    if out is not None and dst_tree is None:
        dst_tree = tree_unflatten(out, [y.sharding for _, y in tree_flatten(out)])
    with gc_paused():  # no collection pass stalls the wire mid-call (see gc_pause)
        return _reshard_tree(tree, dst_tree, group, strategy, bucket_bytes, wire_dtype, dtype, timeout, out, budget,
                             atomic)


def _reshard_tree(tree, dst_tree, group, strategy, bucket_bytes, wire_dtype, dtype, timeout, out, budget, atomic):
    import jax  # noqa: PLC0415

    group = group or default_group()
    if tree is None or dst_tree is None or group.world_size != jax.process_count():
        return _reshard_between_programs(tree, dst_tree, group, strategy, bucket_bytes, wire_dtype, dtype, timeout,
                                         out, budget, atomic)
    if group.rank != jax.process_index():
        raise InvalidOptionError(f"group rank {group.rank} is not this process's JAX process index "
                                 f"{jax.process_index()}: in one JAX program, rank p must be process p")
    leaves = tree_flatten(tree)
    dsts = dict(tree_flatten(dst_tree, is_leaf=_is_notation_pair))
    if set(dsts) != {p for p, _ in leaves}:
        raise InvalidOptionError(f"the destination tree's leaves {sorted(dsts)} do not match the array tree's "
                                 f"{sorted(p for p, _ in leaves)}")
    if out is None:
        prep = _prepare(leaves, dsts, group, strategy, bucket_bytes, wire_dtype, budget)
        io = buffers_for(group.buffers, prep.hosts, group.pool)
        layouts = io.layouts(prep.layouts)
        src = _sources(io, prep, prep.hosts, [x for _, x in leaves], prep.wires)
        placer = io.placer([(x.shape, x.dtype) for _, x in leaves], _want(dtype), prep.shardings, prep.hosts,
                           prep.wires, prep.writers)
        try:
            _run(prep, layouts, src, group, timeout, io, placer, budget=budget)
        except BaseException:
            placer.close()
            raise
        return tree_unflatten(tree, placer.results())
    whole = _tree_of(leaves, dsts, group, wire_dtype, budget)
    io = buffers_for(group.buffers, whole.hosts, group.pool)
    paths = [p for p, _ in leaves]
    into = _into(out, paths, [(x.shape, _want(dtype) or x.dtype) for _, x in leaves], whole.shardings, whole.wires,
                 whole.hosts, io, leaves, atomic)
    groups = whole.groups if atomic else [list(range(len(leaves)))]
    for k, g in enumerate(groups):
        part = [leaves[i] for i in g]
        prep = _prepare(part, dsts, group, strategy, bucket_bytes, wire_dtype, _plan_budget(budget, atomic))
        into.bind(len(part), dict(zip(g, range(len(g)))), prep.writers)
        src = _sources(io, prep, prep.hosts, [x for _, x in part], prep.wires)
        _in_turn(k, into, lambda: _run(prep, io.layouts(prep.layouts), src, group, timeout, io, into=into,
                                       budget=_plan_budget(budget, atomic)))
    return tree_unflatten(tree, into.results())


def _sources(io, share: "_Share", hosts: JaxHosts, arrays: list, wires: list) -> list:
    """The source shards of ``arrays`` (None: not held here) this host reads: none on a
    host that only receives."""
    if not share.sends:
        return [{}] * len(arrays)
    return [io.sources(x, hosts, wire) if x is not None else {} for x, wire in zip(arrays, wires)]


def _plan_budget(budget: int, atomic: bool) -> int:
    """What the plan and the executor may hold: receiving leaf by leaf, half of the budget
    (the staging of each group of leaves takes the other half: ``resharding.staging``)."""
    return max(1, budget // 2) if atomic else budget


def _in_turn(k: int, into: ReceiveInto, run) -> None:
    """Run group ``k`` of a call receiving into ``out``; a communication failure before its
    transfers start, after earlier groups committed, still says which leaves are new."""
    try:
        run()
    except PartialUpdateError:
        raise
    except CommunicationError as e:
        if not into.atomic or k == 0:
            raise
        into.close()
        raise _partial(str(e), into) from e


def _partial(message: str, into: ReceiveInto) -> PartialUpdateError:
    updated, unchanged = into.report()
    return PartialUpdateError(f"{message}; out: the new values in {_leaves(updated)}, the previous ones in "
                              f"{_leaves(unchanged)} (no leaf holds a mix; every array is usable; calling "
                              f"again moves the tree anew)", updated, unchanged)


def _want(dtype):
    return None if dtype is None else numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)


def _run(share: "_Share", layouts, src, group: ProcessGroup, timeout, io, placer=None,
         into: ReceiveInto | None = None, budget: int | None = None) -> list[dict]:
    """This host's share of a plan over the group's subgroup of its participants, in the
    memory ``io`` keeps buffers in (or into the previous arrays of ``into``, in place or
    leaf by leaf through staging); returns the received buffers per leaf (``placer``, if
    given, sees them first and each transfer as it ends). ``budget``: the executor's
    ``max_inflight_bytes``. A failure names the peer and the group's first failure;
    receiving ``into`` previous arrays in place, it deletes them (``_drop_out``), leaf by
    leaf it says which leaves hold the new values and which their previous ones
    (``_stop_staging``, ``PartialUpdateError``)."""
    job = share.job
    dst, in_place = io.destinations(layouts, share) if into is None else (into.buffers, {})
    if placer is not None:
        placer.start(dst)
    backend = group.backend(share.participants)
    done = placer.done if placer is not None else into.done if into is not None and into.atomic else None
    options = ExecutorOptions(timeout or group.timeout, job.min_rate, xp=io.xp, latency_s=job.latency_s,
                              in_place=in_place, max_inflight_bytes=budget, on_done=done)
    ex = HostExecutor(group.rank, layouts, src, dst, backend, job.host_of, options=options)
    try:
        ex.run(job.transfers)
    except CommunicationError as e:
        first = backend.report_failure(str(e))
        if backend.fresh_after_failure or into is not None:
            group.discard(share.participants)
        message = str(e) if first == str(e) else f"{e}; the group's first failure: {first}"
        if into is not None and not into.atomic:
            _drop_out(into, ex, io)
        elif into is not None:
            _stop_staging(into, ex, io)
            raise _partial(message, into) from e
        if first != str(e):
            raise CommunicationError(message) from e
        raise
    except BaseException:
        if into is not None:
            group.discard(share.participants)
            (_stop_staging if into.atomic else _drop_out)(into, ex, io)
        raise
    return dst


def _leaves(paths: list) -> str:
    """``paths`` for a message: all of them up to eight, else a count and the first few."""
    if not paths:
        return "no leaves"
    shown = ", ".join(paths[:8])
    return f"{len(paths)} leaves ({shown}{', ...' if len(paths) > 8 else ''})" if len(paths) > 1 else f"leaf {shown}"


def _drop_out(into: ReceiveInto, ex: HostExecutor, io) -> None:
    """After a call received in place failed mid-transfer (its subgroup closed): ``out`` is
    half-written, so its arrays are deleted (using one raises JAX's "Array has been
    deleted"), never returned or left readable as a mix of two versions; first the
    transfers still on their threads end, so nothing writes into freed memory."""
    ended = ex.join_dropped_threads(ex.timeout)
    if io.xp is not np and hasattr(io.xp, "cuda"):
        io.xp.cuda.runtime.deviceSynchronize()
    if ended:
        for y in into.arrays:
            y.delete()
    else:  # a writer is still alive: keep the memory, unusable, rather than free it under it
        _KEPT.extend(into.arrays)


def _stop_staging(into: ReceiveInto, ex: HostExecutor, io) -> None:
    """After a failed call (its subgroup closed): no leaf is committed any more, the
    transfers still on their threads end (their waits end at once), and the staging
    memory goes back, unless a writer is still alive: then it is kept, unusable, rather
    than handed to the next call under it. The committed leaves' host copies are
    refreshed."""
    into.close()
    ended = ex.join_dropped_threads(ex.timeout)
    if io.xp is not np and hasattr(io.xp, "cuda"):
        io.xp.cuda.runtime.deviceSynchronize()
    if not ended:
        _KEPT.extend(into.staged_buffers())
    for y, updated in zip(into.arrays, into.updated):
        if updated:
            forget_host_copies(y)


def _reshard_between_programs(tree, dst_tree, group: ProcessGroup, strategy, bucket_bytes, wire_dtype, dtype,
                              timeout, out=None, budget: int = MAX_INFLIGHT_BYTES, atomic: bool = False):
    """``reshard_tree`` where the two sides are different JAX programs (``programs``):
    exchange descriptions, plan the merged picture, run this process's share, and return
    the destination tree as this program sees it (None for a process that only sends).
    Where any receiver takes its tree leaf by leaf (``atomic``), every member runs the
    same groups of leaves in turn (``resharding.staging``)."""
    import jax  # noqa: PLC0415

    hosts = JaxHosts(jax.devices(), first_host=group.rank - jax.process_index())
    leaves = tree_flatten(tree) if tree is not None else []
    dst_leaves = tree_flatten(dst_tree, is_leaf=_is_notation_pair) if dst_tree is not None else []
    src_desc = None if tree is None else [
        [path, {"shape": list(x.shape), "dtype": dtype_name(np.dtype(x.dtype)),
                "wire": dtype_name(_wire_type(np.dtype(x.dtype), wire_dtype)),
                **programs.describe_sharding(x.sharding, hosts)}] for path, x in leaves]
    mine = {"first": hosts.first_host, "devices_per_host": hosts.devices_per_host, "src": src_desc,
            "dst": None if dst_tree is None else {path: programs.describe_sharding(d, hosts) for path, d in dst_leaves},
            "atomic": bool(atomic and out is not None and dst_tree is not None)}
    picture = programs.merge(group.exchange(programs.TOPIC, json.dumps(mine, sort_keys=True)))
    xs = dict(leaves)
    io = buffers_for(group.buffers, hosts, group.pool)
    shapes = {path: (tuple(d["shape"]), numpy_dtype(d["dtype"])) for path, d in picture["src"]}
    wires = {path: numpy_dtype(d["wire"]) for path, d in picture["src"]}
    paths = [path for path, _ in dst_leaves]
    shardings = [named_sharding(d, len(shapes[path][0])) for path, d in dst_leaves]
    into = None
    if out is not None and dst_tree is not None:
        into = _into(out, paths, [(shapes[p][0], _want(dtype) or shapes[p][1]) for p in paths], shardings,
                     [wires[p] for p in paths], hosts, io, leaves, atomic)
    split = picture["atomic"]
    key = (_group_key(group), strategy, bucket_bytes, budget, json.dumps(picture, sort_keys=True))
    groups = _cached(("groups",) + key, lambda: programs.staging_groups(picture, budget - _plan_budget(budget, True))
                     ) if split else [[path for path, _ in picture["src"]]]
    index = {p: j for j, p in enumerate(paths)}
    received: dict = {}  # path -> this process's buffers (receiving without out)
    for k, group_paths in enumerate(groups):
        part = programs.restricted(picture, group_paths) if split else picture
        prep = _cached(("programs", budget, split) + key + (tuple(group_paths) if split else (),),
                       lambda: _prepare_programs(part, group, strategy, bucket_bytes, _plan_budget(budget, split)))
        ours = {path: i for i, (path, first, _) in enumerate(prep.moves) if first == hosts.first_host}
        if into is not None:
            into.bind(len(prep.moves), {index[p]: i for p, i in ours.items()}, prep.writers)
        src = _sources(io, prep, hosts, [xs.get(path) for path, _, _ in prep.moves],
                       [numpy_dtype(wire) for _, _, wire in prep.moves])
        layouts = io.layouts(prep.layouts)
        if into is not None:
            _in_turn(k, into, lambda: _run(prep, layouts, src, group, timeout, io, into=into,
                                           budget=_plan_budget(budget, split)))
            continue
        dst = _run(prep, layouts, src, group, timeout, io, budget=_plan_budget(budget, split))
        received.update((p, dst[i]) for p, i in ours.items())
    if dst_tree is None:
        return None
    if into is not None:
        return tree_unflatten(dst_tree, into.results(), is_leaf=_is_notation_pair)
    got = io.place([shapes[p] for p in paths], _want(dtype), shardings, [received[p] for p in paths], hosts,
                   [wires[p] for p in paths])
    return tree_unflatten(dst_tree, got, is_leaf=_is_notation_pair)


_KEPT: list = []
"""Previous arrays or staging buffers of failed calls whose writers did not end in time:
kept alive, never reused (freeing them could let a late write land in memory another
call uses)."""


def _into(out, paths: list, results: list, shardings: list, wires: list, hosts, io, sources: list,
          atomic: bool) -> ReceiveInto:
    """``out``'s leaves checked against the results they take in place and the
    ``sources`` ((path, array) pairs) the call reads (``into.check_out``, each refusal
    naming the leaf), before anything moves, with their shards as writable views to
    commit into and staging buffers from ``io`` (``ReceiveInto``)."""
    given = dict(tree_flatten(out))
    if set(given) != set(paths):
        raise InvalidOptionError(f"out's leaves {sorted(given)} do not match the destination tree's {sorted(paths)}")
    arrays = [given[p] for p in paths]
    check_out(arrays, paths, [s for s, _ in results], [t for _, t in results], shardings, wires, sources)
    views = [writable_shards(y, hosts, io.carrier(wire), io.xp) for y, wire in zip(arrays, wires)]
    return ReceiveInto(arrays, paths, views, io.alloc, io.xp, atomic)


@dataclass
class _Share:
    """This host's part of a plan: its job, the hosts that take part, the buffer layouts."""

    job: HostJob
    participants: frozenset
    layouts: list

    @functools.cached_property
    def slab_regions(self) -> SlabLayout:
        """Where this host's destination buffers lie in a call's slab (worked out once)."""
        return slab_regions(self.layouts, self.job.is_local, self.job.transfers)

    @functools.cached_property
    def sends(self) -> bool:
        """Whether this host sends or copies anything (else it reads no source shards)."""
        local = self.job.is_local
        return any((t.sender is not None and local(t.sender)) or any(local(p.sender) for p in t.parts)
                   for t in self.job.transfers)

    @functools.cached_property
    def writers(self) -> dict[int, tuple[int, ...]]:
        """transfer id -> the leaves whose buffers on this host it writes (its own leaf, or
        its parts'), for transfers with a receiving device here: a leaf is complete here
        once all of them have ended. Every kind writes only its local receivers."""
        local = self.job.is_local
        out = {}
        for t in self.job.transfers:
            if t.parts:
                written = tuple(sorted({p.leaf for p in t.parts if any(local(r) for r in p.receivers)}))
            else:
                written = (t.leaf,) if any(local(r) for r in t.receivers) else ()
            if written:
                out[t.id] = written
        return out

    @classmethod
    def of(cls, plan, rank: int) -> "_Share":
        hosts = frozenset(h for leaf in plan.leaves for m in (leaf.resharding.src_mesh, leaf.resharding.dst_mesh)
                          for h in m.hosts)
        return cls(HostJob.for_host(plan, rank), hosts, [Layout.of(leaf) for leaf in plan.leaves])


@dataclass
class _ProgramsPrepared(_Share):
    moves: list  # (path, first rank of the destination program, wire dtype) per plan leaf


def _cluster(group: ProcessGroup, devices_per_host: int) -> ClusterSpec:
    """The network the planner plans for: the group's hosts and what it was told of the NICs."""
    return ClusterSpec(num_hosts=group.world_size, devices_per_host=devices_per_host, nic_send_gbps=group.nic_gbps,
                       latency_s=group.latency_s, chunk_gap_s=group.chunk_gap_s)


def _group_key(group: ProcessGroup) -> tuple:
    """What of the group a prepared call depends on."""
    return group.rank, group.world_size, group.nic_gbps, group.latency_s, group.vectored, group.chunk_gap_s


def _cached(key, make):
    """The prepared call under ``key`` (made by ``make()`` on a miss), the least recently
    used ones dropped beyond ``PREPARED_CACHE_SIZE``; a key that cannot be hashed (a
    sharding without a hash) is prepared afresh each call."""
    try:
        hit = _PREPARED.get(key)
    except TypeError:
        return make()
    if hit is None:
        hit = _PREPARED[key] = make()
        while len(_PREPARED) > PREPARED_CACHE_SIZE:
            _PREPARED.popitem(last=False)
    _PREPARED.move_to_end(key)
    return hit


def _prepare_programs(picture: dict, group: ProcessGroup, strategy, bucket_bytes, budget: int) -> _ProgramsPrepared:
    dph = picture["devices_per_host"]
    moves, reshardings = [], []
    for path, s in picture["src"]:
        ndim = len(s["shape"])
        src_mesh, src_spec = programs.placement_of(s, ndim, dph)
        for first, targets in picture["dst"].items():
            dst_mesh, dst_spec = programs.placement_of(targets[path], ndim, dph)
            moves.append((path, int(first), s["wire"]))
            reshardings.append(Resharding.between(tuple(s["shape"]), s["wire"], src_mesh, src_spec, dst_mesh,
                                                  dst_spec))
    cluster = _cluster(group, dph)
    plan = plan_resharding_tree(reshardings, cluster=cluster, strategy=strategy,
                                bucket_bytes=bucket_bytes, max_inflight_bytes=budget, vectored=group.vectored)
    return _ProgramsPrepared(**vars(_Share.of(plan, group.rank)), moves=moves)


@dataclass
class _Prepared(_Share):
    """Everything a call needs that depends only on the tree's shapes, types and shardings:
    made once per distinct call and cached, so a weight sync that repeats every step pays
    for planning, placements and layouts once (not only for the plan)."""

    hosts: JaxHosts
    shardings: list
    wires: list


_PREPARED: OrderedDict = OrderedDict()
PREPARED_CACHE_SIZE = 64


def _prepare(leaves, dsts: dict, group: ProcessGroup, strategy: str, bucket_bytes, wire_dtype,
             budget: int) -> _Prepared:
    key = (_group_key(group), strategy, bucket_bytes, str(wire_dtype), budget,
           tuple((path, x.shape, x.dtype, x.sharding, _hashable(dsts[path])) for path, x in leaves))
    return _cached(key, lambda: _prepare_afresh(leaves, dsts, group, strategy, bucket_bytes, wire_dtype, budget))


def _prepare_afresh(leaves, dsts: dict, group: ProcessGroup, strategy: str, bucket_bytes, wire_dtype,
                    budget: int) -> _Prepared:
    hosts, moves, shardings, wires = _moves(leaves, dsts, group, wire_dtype)
    cluster = _cluster(group, hosts.devices_per_host)
    if len(moves) == 1 and bucket_bytes is None:
        m = moves[0]
        plan = plan_resharding(m.shape, m.dtype, m.src_mesh, m.src_spec, m.dst_mesh, m.dst_spec, cluster=cluster,
                               strategy=strategy, max_inflight_bytes=budget)
    else:  # a list keeps the leaves in order: plan leaf i is leaves[i]
        plan = plan_resharding_tree(moves, cluster=cluster, strategy=strategy, bucket_bytes=bucket_bytes,
                                    max_inflight_bytes=budget, vectored=group.vectored)
    return _Prepared(**vars(_Share.of(plan, group.rank)), hosts=hosts, shardings=shardings, wires=wires)


def _moves(leaves, dsts: dict, group: ProcessGroup, wire_dtype) -> tuple[JaxHosts, list, list, list]:
    """This program's hosts, and per leaf its move (``Resharding``), its destination
    ``NamedSharding`` and the type it travels in."""
    import jax  # noqa: PLC0415

    hosts = JaxHosts(jax.devices())
    if hosts.num_processes > group.world_size:
        raise InvalidOptionError(f"the program has {hosts.num_processes} processes but the group only "
                                 f"{group.world_size}")
    moves, shardings, wires = [], [], []
    for path, x in leaves:
        sharding = named_sharding(dsts[path], x.ndim)
        src_mesh, src_spec = placement(x.sharding, x.ndim, hosts)
        dst_mesh, dst_spec = placement(sharding, x.ndim, hosts)
        wire = _wire_type(np.dtype(x.dtype), wire_dtype)
        moves.append(Resharding.between(tuple(x.shape), dtype_name(wire), src_mesh, src_spec, dst_mesh, dst_spec))
        shardings.append(sharding)
        wires.append(wire)
    return hosts, moves, shardings, wires


@dataclass
class _Tree:
    """A tree received into ``out``, whole: its hosts, destination shardings and wire
    types (to check and view ``out`` before anything moves) and the groups of leaves that
    leaf by leaf run in turn (``resharding.staging``: each group's staging within half
    the budget on every host)."""

    hosts: JaxHosts
    shardings: list
    wires: list
    groups: list


def _tree_of(leaves, dsts: dict, group: ProcessGroup, wire_dtype, budget: int) -> _Tree:
    key = ("tree", _group_key(group), str(wire_dtype), budget,
           tuple((path, x.shape, x.dtype, x.sharding, _hashable(dsts[path])) for path, x in leaves))

    def make() -> _Tree:
        hosts, moves, shardings, wires = _moves(leaves, dsts, group, wire_dtype)
        per_leaf = [staged_bytes(m, hosts.devices_per_host) for m in moves]
        return _Tree(hosts, shardings, wires, staging_groups(per_leaf, budget - _plan_budget(budget, True)))

    return _cached(key, make)


def _hashable(dst):
    """A destination as a cache key part: a sharding, or (mesh, spec text)."""
    return (dst[0], str(dst[1])) if _is_notation_pair(dst) else dst


def _is_notation_pair(node) -> bool:
    """A ``(mesh, "S01R")`` destination: one leaf, not a tuple of two."""
    return isinstance(node, tuple) and len(node) == 2 and isinstance(node[1], (str, ShardingSpec))


def _wire_type(own: np.dtype, wire_dtype) -> np.dtype:
    """The type a leaf travels in: ``wire_dtype`` for floating-point leaves, else its own."""
    if wire_dtype is None or not np.issubdtype(own, np.floating) and own.name != "bfloat16":
        return own
    return numpy_dtype(str(np.dtype(wire_dtype)) if not isinstance(wire_dtype, str) else wire_dtype)
