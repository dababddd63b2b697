"""``plan_resharding``: the whole planning pipeline, and the plan it returns.

decompose -> jobs per strategy -> load balance + order -> transfers with times.
A ``ReshardingPlan`` is plain data: executors, the simulator and the Alpa
adapter all read the same object or its JSON form (see docs/plan-json.md).
"""
from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from ..dtypes import itemsize
from ..errors import InvalidOptionError
from ..mesh import DeviceMesh, devices_per_host_needed
from ..placement import Placement, Resharding, ReshardingFields
from ..spec import Box, ShardingSpec
from ..topology import ClusterSpec
from . import loadbalance as balancing
from .kinds import transfer_kind
from .strategies import (ALLGATHER, ALPA, STRATEGIES, Job, JobMemo, allgather_job, alpa_local_allgather_spec,
                         jobs_for_task, lower_bound_payload)
from .unit_tasks import UnitTask, decompose

SCHEMA_VERSION = 1


class Part(NamedTuple):
    """One unit task carried inside a coalesced (bucketed) transfer."""

    leaf: int
    task: int
    index: Box
    sender: int
    receivers: tuple[int, ...]
    nbytes: int

    def to_dict(self) -> dict:
        return {"leaf": self.leaf, "task": self.task, "index": [list(p) for p in self.index], "sender": self.sender,
                "receivers": list(self.receivers), "nbytes": self.nbytes}

    @classmethod
    def from_dict(cls, d: dict) -> "Part":
        return cls(d["leaf"], d["task"], tuple(tuple(p) for p in d["index"]), d["sender"], tuple(d["receivers"]),
                   d["nbytes"])


class Transfer(NamedTuple):
    """One scheduled piece of communication.

    ``kind`` is the strategy that moves it (``send_recv``, ``local_allgather``,
    ``global_allgather``, ``broadcast``, ``signal``), ``local_copy`` (intra-host
    copy from a local replica) or ``allgather`` (Alpa's follow-up all-gather
    among ``receivers``; ``sender`` is None and ``task`` is -1). ``receivers``
    are in chain order for broadcasts. Every receiver ends up holding ``index``.

    In a tree plan (``tree.plan_resharding_tree``) ``leaf`` names the array; a
    coalesced transfer has ``task`` -2, an empty ``index`` and ``parts``: the
    unit tasks packed into its one flat buffer, each with its own sender device
    (on the transfer's sending host) and receivers.
    """

    id: int
    task: int
    kind: str
    sender: int | None
    receivers: tuple[int, ...]
    index: Box
    nbytes: int
    chunks: int
    start: float
    duration: float
    deps: tuple[int, ...] = ()
    leaf: int = 0
    parts: tuple[Part, ...] = ()

    @property
    def end(self) -> float:
        return self.start + self.duration

    def to_dict(self) -> dict:
        return {"id": self.id, "task": self.task, "kind": self.kind, "sender": self.sender,
                "receivers": list(self.receivers), "index": [list(p) for p in self.index],
                "nbytes": self.nbytes, "chunks": self.chunks, "start": self.start,
                "duration": self.duration, "deps": list(self.deps), "leaf": self.leaf,
                "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, d: dict) -> "Transfer":
        return cls(d["id"], d["task"], d["kind"], d["sender"], tuple(d["receivers"]),
                   tuple(tuple(p) for p in d["index"]), d["nbytes"], d["chunks"], d["start"],
                   d["duration"], tuple(d["deps"]), d.get("leaf", 0),
                   tuple(Part.from_dict(p) for p in d.get("parts", ())))


@dataclass(frozen=True)
class Leaf(ReshardingFields):
    """One array of a plan: its path in the tree (``"/"`` for a single array), its
    resolved move, and the spec the network delivers when it differs from the
    destination's (Alpa's local-allgather rewrite)."""

    path: str
    resharding: Resharding
    sent_spec: ShardingSpec | None = None

    @property
    def sent(self) -> Placement:
        """Where the network's bytes land: the destination, or Alpa's rewritten layout."""
        return Placement(self.dst_mesh, self.sent_spec or self.dst_spec)


@dataclass(frozen=True)
class ReshardingPlan(ReshardingFields):
    """Everything an executor needs to run one cross-mesh resharding (a one-leaf plan:
    ``leaves`` and ``tasks_per_leaf`` read as for a tree plan)."""

    resharding: Resharding    # resolved: meshes and specs are objects
    cluster: ClusterSpec
    strategy: str
    loadbalance: str          # as asked
    loadbalance_used: str     # what ran (auto resolves to dfs or greedy)
    chunks: int | None        # as asked (None = auto per task)
    sent_spec: ShardingSpec   # the spec the network delivers (differs from dst_spec for alpa)
    unit_tasks: tuple[UnitTask, ...]
    transfers: tuple[Transfer, ...]
    predicted_seconds: float
    lower_bound_seconds: float
    search_complete: bool = True
    host_operations: dict[int, tuple[int, ...]] = field(default_factory=dict)


    @property
    def leaves(self) -> tuple[Leaf, ...]:
        return (Leaf("/", self.resharding, self.sent_spec if self.sent_spec != self.dst_spec else None),)

    @property
    def tasks_per_leaf(self) -> tuple[tuple[UnitTask, ...], ...]:
        return (self.unit_tasks,)

    # ------------------------------------------------------------------ views
    @property
    def ratio_to_lower_bound(self) -> float:
        return self.predicted_seconds / self.lower_bound_seconds if self.lower_bound_seconds else 1.0

    def network_bytes(self) -> tuple[dict[int, int], dict[int, int]]:
        """Bytes each host sends and receives through its NIC(s) (intra-host excluded)."""
        sent: dict[int, int] = {}
        recv: dict[int, int] = {}
        for t in self.transfers:
            for a, b, n in host_flows(t, self.cluster):
                sent[a] = sent.get(a, 0) + n
                recv[b] = recv.get(b, 0) + n
        return sent, recv

    def entries(self) -> list[dict]:
        """The JSON contract's ``unit_tasks``: one entry per (unit task, sender)."""
        by_key: dict[tuple[int, int], dict] = {}
        for t in self.transfers:
            if t.kind == ALLGATHER:
                continue
            task = self.unit_tasks[t.task]
            e = by_key.setdefault((t.task, t.sender), {
                "task": t.task, "index": [list(p) for p in task.index],
                "src_devices": list(task.src_devices), "dst_devices": [], "nbytes": task.nbytes,
                "sender": t.sender, "strategy": t.kind, "transfers": []})
            e["dst_devices"].extend(t.receivers)
            e["transfers"].append(t.id)
        for e in by_key.values():
            e["dst_devices"].sort()
        return [by_key[k] for k in sorted(by_key)]

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "shape": list(self.shape), "dtype": self.dtype,
            "src_mesh": self.src_mesh.to_dict(), "src_spec": str(self.src_spec),
            "dst_mesh": self.dst_mesh.to_dict(), "dst_spec": str(self.dst_spec),
            "sent_spec": str(self.sent_spec),
            "cluster": self.cluster.to_dict(),
            "strategy": self.strategy, "loadbalance": self.loadbalance,
            "loadbalance_used": self.loadbalance_used, "chunks": self.chunks,
            "search_complete": self.search_complete,
            "predicted_seconds": self.predicted_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "unit_tasks": self.entries(),
            "tasks": [{"id": u.id, "index": [list(p) for p in u.index], "src_devices": list(u.src_devices),
                       "dst_devices": list(u.dst_devices), "nbytes": u.nbytes} for u in self.unit_tasks],
            "transfers": [t.to_dict() for t in self.transfers],
            "host_operations": {str(h): list(ops) for h, ops in sorted(self.host_operations.items())},
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "ReshardingPlan":
        if d.get("schema_version") != SCHEMA_VERSION:
            raise InvalidOptionError(f"plan JSON schema_version {d.get('schema_version')!r} is not {SCHEMA_VERSION}")
        return cls(
            resharding=Resharding.between(
                tuple(d["shape"]), d["dtype"], DeviceMesh.from_dict(d["src_mesh"]), ShardingSpec.parse(d["src_spec"]),
                DeviceMesh.from_dict(d["dst_mesh"]), ShardingSpec.parse(d["dst_spec"])),
            cluster=ClusterSpec.from_dict(d["cluster"]), strategy=d["strategy"],
            loadbalance=d["loadbalance"], loadbalance_used=d["loadbalance_used"], chunks=d["chunks"],
            sent_spec=ShardingSpec.parse(d["sent_spec"]),
            unit_tasks=tuple(UnitTask(u["id"], tuple(tuple(p) for p in u["index"]), tuple(u["src_devices"]),
                                      tuple(u["dst_devices"]), u["nbytes"]) for u in d["tasks"]),
            transfers=tuple(Transfer.from_dict(t) for t in d["transfers"]),
            predicted_seconds=d["predicted_seconds"], lower_bound_seconds=d["lower_bound_seconds"],
            search_complete=d["search_complete"],
            host_operations={int(h): tuple(v) for h, v in d["host_operations"].items()})

    @classmethod
    def from_json(cls, text: str) -> "ReshardingPlan":
        return cls.from_dict(json.loads(text))

    # ---------------------------------------------------------------- explain
    def explain(self, max_transfers: int = 12) -> str:
        """A readable summary: what moves, who sends, how long, how close to the limit."""
        from .explain import explain_plan  # noqa: PLC0415 - keeps the dataclass module small

        return explain_plan(self, max_transfers)


def host_flows(t: Transfer, cluster: ClusterSpec) -> list[tuple[int, int, int]]:
    """(sending host, receiving host, bytes) of every NIC crossing of a transfer."""
    return transfer_kind(t.kind).host_flows(t, cluster)


# --------------------------------------------------------------------- planning
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


def lower_bound(tasks: Sequence[UnitTask], cluster: ClusterSpec, payload: int | None = None) -> float:
    """Physical limit of a resharding on ``cluster`` whatever the strategy.

    * each receiving host must take in, through its NIC, every slice one of its
      devices needs and none of its devices holds;
    * every such slice must leave some source host at least once, so the
      source hosts' NICs together must push all of them.
    ``payload`` replaces each slice's size (the signal strategy moves 1 byte).
    """
    rx_need: dict[int, float] = {}
    out_bytes = 0.0
    senders: set[int] = set()
    longest = 0.0
    hosts_of: dict[tuple, frozenset] = {}
    lacking_of: dict[tuple, tuple] = {}
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
        for h in lacking:
            rx_need[h] = rx_need.get(h, 0.0) + n
        out_bytes += n
        senders |= src_hosts
        if n / rate > longest:
            longest = n / rate
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
    ``strategy`` (default ``broadcast``), ``loadbalance`` (default ``auto``),
    ``chunks`` (broadcast chunks per slice; None = per task from the cost
    model), ``seed`` (of the randomized greedy), ``dfs_budget_s``.
    """
    # Planning allocates hundreds of thousands of small immutable tuples and no
    # cycles; the cyclic GC would rescan them all repeatedly (a third of the time
    # on 25,000 tasks), so it is paused for the duration.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _plan(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec, **kwargs)
    finally:
        if was_enabled:
            gc.enable()


def _plan(shape: Sequence[int], dtype, src_mesh, src_spec, dst_mesh, dst_spec, *,
                    cluster: ClusterSpec | None = None, strategy: str = "broadcast",
                    loadbalance: str = "auto", chunks: int | None = None, seed: int = 0,
                    dfs_budget_s: float = balancing.DEFAULT_DFS_BUDGET_S) -> ReshardingPlan:
    if strategy not in STRATEGIES:
        raise InvalidOptionError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if loadbalance not in balancing.LOADBALANCE_MODES:
        raise InvalidOptionError(
            f"unknown loadbalance mode {loadbalance!r}; choose one of {', '.join(balancing.LOADBALANCE_MODES)}")
    if chunks is not None and (not isinstance(chunks, int) or chunks <= 0):
        raise InvalidOptionError(f"chunks must be a positive integer or None (auto), got {chunks!r}")
    if cluster is None:
        cluster = smallest_cluster(src_mesh, dst_mesh)
    move = Resharding.between(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec).resolve(cluster)
    shape, src, sspec, dst, dspec = move.shape, move.src_mesh, move.src_spec, move.dst_mesh, move.dst_spec
    size = itemsize(move.dtype)

    final_tasks = decompose(shape, size, src, sspec, dst, dspec)
    sent_spec, gather_dim = dspec, None
    if strategy == ALPA:
        sent_spec, gather_dim = alpa_local_allgather_spec(dspec, dst, shape)
    tasks = final_tasks if sent_spec == dspec else decompose(shape, size, src, sspec, dst, sent_spec)
    per_task = "send_recv" if strategy == ALPA else strategy

    memo = JobMemo(cluster)
    jobs: list[Job] = [j for t in tasks for j in jobs_for_task(t, per_task, cluster, chunks, memo)]
    if gather_dim is not None:
        jobs += _alpa_allgathers(jobs, shape, size, dst, dspec, gather_dim, cluster)
    sched = balancing.balance(jobs, loadbalance, seed=seed, dfs_budget_s=dfs_budget_s)
    transfers = _transfers(jobs, tasks, sched, cluster)
    return ReshardingPlan(
        resharding=move, cluster=cluster, strategy=strategy, loadbalance=loadbalance, loadbalance_used=sched.mode,
        chunks=chunks, sent_spec=sent_spec, unit_tasks=tuple(tasks), transfers=tuple(transfers),
        predicted_seconds=sched.makespan,
        lower_bound_seconds=lower_bound(final_tasks, cluster, lower_bound_payload(strategy)),
        search_complete=sched.complete, host_operations=_host_operations(transfers, cluster))


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


def _transfers(jobs: Sequence[Job], tasks: Sequence[UnitTask], sched: balancing.JobOrder,
               cluster: ClusterSpec) -> list[Transfer]:
    """Concrete transfers in schedule order; the sending device on the chosen host is
    the least-loaded replica there (ties: lowest id), which spreads work over devices."""
    device_load: dict[int, int] = {}
    job_to_transfer: dict[int, int] = {}
    local_of: dict[tuple, list[int]] = {}
    out: list[Transfer] = []
    starts = sched.starts
    order = sorted(sched.sequence, key=lambda p: (starts[p[0]], p[0]))
    host_of = cluster.host_of
    for j, c in order:
        job = jobs[j]
        cand = job.candidates[c]
        sender = None
        if job.kind != ALLGATHER:
            devs = tasks[job.task].src_devices
            local = local_of.get((devs, cand.host))
            if local is None:
                local = local_of[(devs, cand.host)] = [d for d in devs if host_of(d) == cand.host]
            sender = local[0] if len(local) == 1 else min(local, key=lambda d: (device_load.get(d, 0), d))
            device_load[sender] = device_load.get(sender, 0) + job.nbytes
        job_to_transfer[j] = len(out)
        out.append(Transfer(len(out), job.task, job.kind, sender, job.receivers, job.index, job.nbytes,
                            cand.chunks, starts[j], cand.duration,
                            tuple(job_to_transfer[d] for d in job.deps) if job.deps else ()))
    return out


def _host_operations(transfers: Sequence[Transfer], cluster: ClusterSpec) -> dict[int, tuple[int, ...]]:
    """For each host, the ids of the transfers it takes part in, in start order."""
    ops: dict[int, list[int]] = {}
    for t in transfers:  # already in start order
        hosts = {cluster.host_of(r) for r in t.receivers}
        if t.sender is not None:
            hosts.add(cluster.host_of(t.sender))
        for h in sorted(hosts):
            ops.setdefault(h, []).append(t.id)
    return {h: tuple(v) for h, v in sorted(ops.items())}
