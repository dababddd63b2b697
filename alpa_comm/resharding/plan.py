"""The plan types: ``Transfer`` (one scheduled piece of communication), ``Part`` (a
unit task inside a coalesced transfer), ``Leaf`` (one array of a plan) and
``ReshardingPlan``, with their JSON form (docs/plan-json.md).

A plan is plain data: executors, the simulator and the Alpa adapter all read the
same object or its JSON form. ``planner`` builds them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import InvalidOptionError
from ..mesh import DeviceMesh
from ..placement import Placement, Resharding, ReshardingFields
from ..spec import Box, ShardingSpec
from ..topology import ClusterSpec
from .kinds import transfer_kind
from .strategies import ALLGATHER
from .unit_tasks import UnitTask

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
    ramp: bool = False  # chunks that start small and double (``kinds.base.chunk_bounds``)

    @property
    def end(self) -> float:
        return self.start + self.duration

    def to_dict(self) -> dict:
        return {"id": self.id, "task": self.task, "kind": self.kind, "sender": self.sender,
                "receivers": list(self.receivers), "index": [list(p) for p in self.index],
                "nbytes": self.nbytes, "chunks": self.chunks, "start": self.start,
                "duration": self.duration, "deps": list(self.deps), "leaf": self.leaf,
                "parts": [p.to_dict() for p in self.parts], "ramp": self.ramp}

    @classmethod
    def from_dict(cls, d: dict) -> "Transfer":
        return cls(d["id"], d["task"], d["kind"], d["sender"], tuple(d["receivers"]),
                   tuple(tuple(p) for p in d["index"]), d["nbytes"], d["chunks"], d["start"],
                   d["duration"], tuple(d["deps"]), d.get("leaf", 0),
                   tuple(Part.from_dict(p) for p in d.get("parts", ())), d.get("ramp", False))


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
    lower_bound_seconds: float  # bandwidth: every NIC's bytes at its rate, plus one latency
    latency_bound_seconds: float = 0.0  # max(bandwidth bound, messages that must cross in sequence)
    search_complete: bool = True
    host_operations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cache_hit: bool = False   # served from the plan cache (not part of the JSON form)
    strategy_asked: str | None = None  # "auto" when the planner chose ``strategy``
    admitted_seconds: float | None = None  # auto's ranking: ``admission.admitted_seconds`` (auto plans only)

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

    @property
    def ratio_to_latency_bound(self) -> float:
        bound = max(self.lower_bound_seconds, self.latency_bound_seconds)
        return self.predicted_seconds / bound if bound else 1.0

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
            # a merged transfer delivers each of its parts: one entry per part's task
            for task_id, sender, receivers in ([(p.task, p.sender, p.receivers) for p in t.parts]
                                               or [(t.task, t.sender, t.receivers)]):
                task = self.unit_tasks[task_id]
                e = by_key.setdefault((task_id, sender), {
                    "task": task_id, "index": [list(p) for p in task.index],
                    "src_devices": list(task.src_devices), "dst_devices": [], "nbytes": task.nbytes,
                    "sender": sender, "strategy": t.kind, "transfers": []})
                e["dst_devices"].extend(receivers)
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
            "strategy": self.strategy, **({"strategy_asked": self.strategy_asked} if self.strategy_asked else {}),
            "loadbalance": self.loadbalance,
            "loadbalance_used": self.loadbalance_used, "chunks": self.chunks,
            "search_complete": self.search_complete,
            "predicted_seconds": self.predicted_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "latency_bound_seconds": self.latency_bound_seconds,
            **({"admitted_seconds": self.admitted_seconds} if self.admitted_seconds is not None else {}),
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
            latency_bound_seconds=d.get("latency_bound_seconds", d["lower_bound_seconds"]),
            search_complete=d["search_complete"],
            host_operations={int(h): tuple(v) for h, v in d["host_operations"].items()},
            strategy_asked=d.get("strategy_asked"), admitted_seconds=d.get("admitted_seconds"))

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
