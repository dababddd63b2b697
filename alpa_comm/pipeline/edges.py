"""Where pipeline stages meet: stage meshes, activation layouts and the resharding
plans between them (pure: no JAX, Ray or torch).

A stage runs on ``dp`` hosts x ``k`` local devices (hosts ``stage*dp .. stage*dp+dp-1``).
Activations have the microbatch as their leading dimension and use three
layouts:

* ``OUT_SPEC`` (``S01..``): what a stage's program produces, the batch split over
  all of the stage's devices;
* ``IN_SPEC`` (``S0..``): what the next program takes, the batch split over the
  data-parallel hosts and replicated over a host's devices (the full local batch
  on every device, as a tensor-parallel stage needs it);
* gradients travel back in ``OUT_SPEC`` on both sides.

So every forward edge is a real cross-mesh resharding (k-way replication at the
receiver: the case where broadcast beats send/recv), and the backward edge is
a plain shard-to-shard move. ``edge_plans`` plans every edge of a model once; the
workers run the same plans every microbatch.

Edges join model stages. With virtual stages a stage's mesh runs several of them (its
chunks, ``model_stage_meshes``): only edges between two meshes get a plan, those inside
one mesh are local hand-offs (``split_edges``, ``local_producers``).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import InvalidOptionError
from ..mesh import DeviceMesh
from ..resharding import plan_resharding
from ..resharding.plan import ReshardingPlan
from ..topology import ClusterSpec
from .ir import Action, ActionKind, Schedule, ScheduleError, edge_name

OUT = "out"   # batch over (hosts, devices)
IN = "in"     # batch over hosts, replicated over a host's devices


def spec_text(layout: str, ndim: int) -> str:
    """The sharding spec of an ``ndim``-dimensional activation in ``layout``."""
    return ("S01" if layout == OUT else "S0") + "R" * (ndim - 1)


def stage_hosts(stage: int, dp: int) -> list[int]:
    return list(range(stage * dp, stage * dp + dp))


def stage_mesh(stage: int, dp: int, devices_per_host: int) -> DeviceMesh:
    return DeviceMesh.on_hosts((dp, devices_per_host), stage_hosts(stage, dp), devices_per_host)


@dataclass(frozen=True)
class Edge:
    """Arrays one stage sends another per microbatch: ``direction`` "F" carries the
    producer's outputs named ``keys`` to the consumer, "B" their gradients back."""

    direction: str
    src: int
    dst: int
    keys: tuple[str, ...]

    @property
    def name(self) -> str:
        return edge_name(self.direction, self.src, self.dst)


def model_edges(consumes: list[dict[str, int]]) -> list[Edge]:
    """Every forward edge (producer -> consumer, keys) and its backward twin."""
    keys: dict[tuple[int, int], list[str]] = {}
    for dst, c in enumerate(consumes):
        for key, src in sorted(c.items()):
            if src >= dst:
                raise ScheduleError(f"stage {dst} consumes {key!r} from stage {src}: stages may only consume from "
                                    "earlier stages")
            keys.setdefault((src, dst), []).append(key)
    out = []
    for (src, dst), ks in sorted(keys.items()):
        out.append(Edge("F", src, dst, tuple(ks)))
        out.append(Edge("B", dst, src, tuple(ks)))
    return out


def model_stage_meshes(schedule: Schedule) -> list[int]:
    """The stage (mesh) each model stage runs on, by model stage: ``place(v)[0]``. Without
    virtual stages every model stage is its own stage; with them a mesh holds several
    (its chunks), and edges are planned between the meshes, not the model stages."""
    return [schedule.place(v)[0] for v in range(schedule.num_virtual_stages)]


def split_edges(edges: Sequence[Edge], mesh_of: Sequence[int]) -> tuple[list[Edge], list[Edge]]:
    """(planned, local): the edges whose two model stages sit on different meshes need a
    resharding plan; those inside one mesh (a V's turn, a skip that stays inside a stage)
    are local hand-offs between the mesh's runners and cross no link."""
    planned = [e for e in edges if mesh_of[e.src] != mesh_of[e.dst]]
    local = [e for e in edges if mesh_of[e.src] == mesh_of[e.dst]]
    return planned, local


def local_producers(consumes: Sequence[dict[str, int]], mesh_of: Sequence[int]) -> dict[int, list[int]]:
    """For each model stage, its producers on the same mesh: what its ``F`` takes by local
    hand-off (and its backward hands their input gradients back), with no action in the schedule."""
    return {v: sorted({u for u in c.values() if mesh_of[u] == mesh_of[v]}) for v, c in enumerate(consumes)}


def edge_hosts(e: Edge, dp: int, mesh_of: Sequence[int] | None = None) -> set[int]:
    """The hosts that take part in edge ``e``: both ends' meshes (``mesh_of``: model stage ->
    stage; None: each model stage its own stage)."""
    src, dst = (e.src, e.dst) if mesh_of is None else (mesh_of[e.src], mesh_of[e.dst])
    return set(stage_hosts(src, dp)) | set(stage_hosts(dst, dp))


def transfer_edge(key: tuple) -> str:
    """The name of the model-stage edge a transfer crosses, from its key
    (``Schedule.transfer_key``, as ``transfer_order`` lists them): what the distributed
    trainer's mailbox keys it by. Without virtual stages the key's stages are the model
    stages; with them its last field says which model stages it joins: a boundary ``b``
    (the adjacent edge ``b -> b + 1``, gradients back from ``b + 1``) or an explicit
    (source, destination) pair (a skip)."""
    direction, _, src, dst, edge = key
    if edge is None:
        return edge_name(direction, src, dst)
    if isinstance(edge, tuple):
        return edge_name(direction, *edge)
    return edge_name(direction, edge, edge + 1) if direction == "F" else edge_name(direction, edge + 1, edge)


def schedule_edges(schedule: Schedule) -> set[str]:
    """The names of the model-stage edges the schedule's SEND/RECV actions cross
    (``transfer_edge``): what must have a plan."""
    return {transfer_edge(schedule.transfer_key(i, a)) for i, acts in enumerate(schedule.stages)
            for a in acts if a.kind.is_comm}


def check_transfers(schedule: Schedule, planned: Sequence[Edge]) -> None:
    """The schedule moves data over exactly the planned edges: a model edge between two
    meshes that no transfer crosses (a skip ``with_skips`` was not given) or a transfer
    over no edge of the model is named here, before any host starts, not as a stage
    computing without its inputs mid-step."""
    moved, names = schedule_edges(schedule), {e.name for e in planned}
    missing, extra = sorted(names - moved), sorted(moved - names)
    if missing:
        raise ScheduleError(f"schedule {schedule.name!r} moves nothing over the model's edge(s) {missing[:4]}: "
                            "add the model's skips (with_skips(schedule, model.skips), the model built with "
                            f"{schedule.num_virtual_stages} stages)")
    if extra:
        raise ScheduleError(f"schedule {schedule.name!r} moves data over {extra[:4]}, which the model has no edge "
                            "for")


def edge_plans(edges: list[Edge], shapes: dict[tuple[int, str], tuple[int, ...]], dtype: str, dp: int,
               devices_per_host: int, cluster: ClusterSpec, strategy: str, loadbalance: str = "auto",
               mesh_of: Sequence[int] | None = None) -> dict[Edge, list[ReshardingPlan]]:
    """One resharding plan per (edge, key). ``shapes[(producer stage, key)]`` is the
    array's shape for one whole microbatch (all data-parallel replicas together).
    Edges join model stages; ``mesh_of`` maps each to the stage whose mesh runs it
    (``model_stage_meshes``; None: each model stage its own stage). An edge inside one
    mesh is a local hand-off and has no plan: passing one is an error."""
    plans: dict[Edge, list[ReshardingPlan]] = {}
    k = devices_per_host
    for e in edges:
        src_stage, dst_stage = (e.src, e.dst) if mesh_of is None else (mesh_of[e.src], mesh_of[e.dst])
        if src_stage == dst_stage:
            raise ScheduleError(f"edge {e.name} joins two model stages on stage {src_stage}: a local hand-off, "
                                "not a resharding (leave it out: split_edges)")
        per_key = []
        for key in e.keys:
            shape = tuple(shapes[(e.src if e.direction == "F" else e.dst, key)])
            if shape[0] % (dp * k):
                raise InvalidOptionError(f"activation {key!r} has {shape[0]} rows per microbatch, not divisible by "
                                         f"{dp} data-parallel hosts x {k} devices")
            nd = len(shape)
            src_layout, dst_layout = (OUT, IN) if e.direction == "F" else (OUT, OUT)
            per_key.append(plan_resharding(shape, dtype, stage_mesh(src_stage, dp, k), spec_text(src_layout, nd),
                                           stage_mesh(dst_stage, dp, k), spec_text(dst_layout, nd), cluster=cluster,
                                           strategy=strategy, loadbalance=loadbalance))
        plans[e] = per_key
    return plans


def link_seconds(plans: Iterable[ReshardingPlan], cluster: ClusterSpec, num_microbatches: int) -> float:
    """The least time one step's transfers hold the busiest NIC: per host, the bytes the
    edge plans (one microbatch each) send and receive through it, times the
    microbatches, over its rate; the most over hosts and directions. However well
    compute hides them, a step is no shorter; with the compute-only (``signal``) time
    it gives the physical bound of a pipeline on a cluster."""
    sent: dict[int, int] = defaultdict(int)
    recv: dict[int, int] = defaultdict(int)
    for plan in plans:
        s, r = plan.network_bytes()
        for h, n in s.items():
            sent[h] += n
        for h, n in r.items():
            recv[h] += n
    times = ([n / cluster.send_rate(h) for h, n in sent.items()]
             + [n / cluster.recv_rate(h) for h, n in recv.items()])
    return num_microbatches * max(times, default=0.0)


def with_skips(schedule: Schedule, skips: Sequence[tuple[int, int]]) -> Schedule:
    """Add SEND/RECV actions (with explicit peers) for non-adjacent edges.

    ``skips`` lists (producer, consumer) model stages, as ``PipelineModel.skips``
    (U-Transformer skip connections); a schedule generator only knows neighbours.
    The producer sends after each forward and receives the gradient before each
    backward (``B`` or ``BI``); the consumer mirrors it.

    Over virtual stages the model stages are chunks (``Schedule.place``): the actions
    go next to the producing and consuming chunk's forward and backward and name the
    peer's chunk (``SEND_F3@2.1``). A skip whose two model stages sit on one stage (in
    a V, the U-Transformer's skip from model stage k to 2S - 1 - k) crosses no link and
    gets no action: the runner hands it over locally, as it does the V's turn. The
    placement is kept; the name gains " +skips" where actions were added.
    """
    stages = [list(s) for s in schedule.stages]
    added = False
    for src, dst in skips:
        (i, c), (j, d) = schedule.place(src), schedule.place(dst)
        if i == j:
            continue
        added = True
        for stage, chunk, peer, peer_chunk, producer in ((i, c, j, d, True), (j, d, i, c, False)):
            out = []
            for a in stages[stage]:
                if a.chunk != chunk or a.kind not in (ActionKind.F, ActionKind.B, ActionKind.BI):
                    out.append(a)
                    continue
                forward = a.kind is ActionKind.F
                # the producer sends F and receives B; the consumer receives F and sends B
                if producer == forward:  # a send right after the action
                    out += [a, Action(ActionKind.SEND_F if forward else ActionKind.SEND_B, a.mb, peer, chunk,
                                      peer_chunk)]
                else:                    # a receive right before it
                    out += [Action(ActionKind.RECV_F if forward else ActionKind.RECV_B, a.mb, peer, chunk,
                                   peer_chunk), a]
            stages[stage] = out
    return Schedule(tuple(tuple(s) for s in stages), schedule.name + (" +skips" if added else ""),
                    schedule.placement)
