"""What a distributed training run measured, in the simulator's terms.

Workers record every compute action and RECV wait (``StepRecord.events``) and
every transfer their communication threads ran (edge, microbatch, start, end),
with wall-clock stamps. From those: a Chrome trace of the real execution laid
out like the simulator's (one process per stage; compute, waits and
transfers as threads), the iteration time (first action to last, without the
optimizer update the simulator does not model), and ``Costs`` for
``pipeline.simulate`` built from measured stage times and edge times.
"""
from __future__ import annotations

import random
from collections import defaultdict
from statistics import mean, median
from typing import Sequence

from ..errors import InvalidArgumentError
from ..pipeline.edges import model_stage_meshes
from ..pipeline.ir import Schedule
from ..pipeline.simulate import Costs, simulate_schedule
from ..validation import positive_int

COMPUTE_KINDS = ("F", "B", "BI", "BW")


def iteration_seconds(per_host: list[dict]) -> float:
    """First action start to last action end over all hosts of one step (no update)."""
    spans = [(t0, t1) for rec in per_host for kind, _, t0, t1, *_ in rec["events"] if kind != "UPDATE"]
    return max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans) if spans else 0.0


def busy_factor(rec: dict) -> float:
    """How much longer a stage is busy than its compute actions alone take: its span
    minus the time it waited for data, over the sum of its compute actions. The
    rest is runtime work between actions (unpacking received buffers, dispatch,
    bookkeeping) that the simulator has no action for."""
    acts = [(k, t0, t1) for k, _, t0, t1, *_ in rec["events"] if k != "UPDATE"]
    if not acts:
        return 1.0
    span = max(t1 for _, _, t1 in acts) - min(t0 for _, t0, _ in acts)
    waits = sum(t1 - t0 for k, t0, t1 in acts if k.startswith("RECV"))
    compute = sum(t1 - t0 for k, t0, t1 in acts if k in COMPUTE_KINDS)
    return max(1.0, (span - waits) / compute) if compute > 0 else 1.0


COMM_THREADS = ("gloo_tcp_loop", "tcp-send-", "tcp-recv-", "mailbox", "transfer", "pack")
"""Names (prefixes) of a worker's threads that move data: gloo's I/O loop, ``TcpBackend``'s
streams, the mailbox's and the resharding executor's transfer and packing threads. Every
other thread computes (XLA's pool, the runner, which also unpacks arrivals) or runs Ray."""


def comm_cpu_seconds(rec: dict) -> float:
    """CPU seconds a host's communication threads (``COMM_THREADS``) spent in one step
    (from the record's ``cpu_by_thread``; 0 for a record without it). On hosts whose core
    cap their compute shares, this is compute time the transfers took."""
    return sum(v for name, v in rec.get("cpu_by_thread", {}).items() if name.startswith(COMM_THREADS))


def transfer_overlap(rec: dict) -> float:
    """The share of a host's sending time (its communication threads, data ready to
    last byte out) during which the host was computing: 1.0 when every transfer hid
    behind compute, 0.0 when compute always waited for them. Transfers overlap compute
    only where the schedule gives them compute to hide behind, so this reads a
    schedule's overlap, not the runtime's alone."""
    compute = sorted((t0, t1) for kind, _, t0, t1, *_ in rec["events"] if kind in COMPUTE_KINDS)
    total = hidden = 0.0
    for _, _, a, b in rec.get("transfers", []):
        total += b - a
        hidden += sum(max(0.0, min(b, t1) - max(a, t0)) for t0, t1 in compute)
    return hidden / total if total > 0 else 1.0


def stage_times(steps: list[list[dict]], num_stages: int, busy: bool = True) -> dict[str, list[float]]:
    """Median duration per stage of each compute kind over ``steps`` (each a list of
    host records); kinds a schedule does not use are absent. With ``busy`` each
    duration is scaled by the stage's ``busy_factor``, so the simulator charges
    the runtime's own work between actions too. Over virtual stages a stage's time is
    the sum of its model stages' medians: the whole stage, as ``Costs`` count it."""
    got = action_samples(steps, busy, by_model_stage=True)
    kinds = dict.fromkeys(kind for _, _, kind in got)
    return {kind: [sum(median(v) for (s_, _, k), v in got.items() if s_ == s and k == kind)
                   for s in range(num_stages)] for kind in kinds}


def costs_from(times: dict[str, list[float]], edge_seconds: dict[str, float], num_stages: int,
               mesh_of: Sequence[int] | None = None) -> Costs:
    """Simulator costs: measured compute per stage and each stage's outgoing edge
    time (the slowest of its forward edges and of its backward edges). Where both the
    whole backward and its halves were measured (two runs), each keeps its own time:
    the runs load their hosts differently, so the same two programs take different
    times. Edges are named by model stage; ``mesh_of[v]`` is the stage that sends for
    model stage ``v`` (default: the same number, one chunk per stage; over virtual
    stages ``edges.model_stage_meshes``)."""
    f = times.get("F", [0.0] * num_stages)
    if "B" in times:
        b = times["B"]
        bi, bw = (times["BI"], times["BW"]) if "BI" in times and "BW" in times else (None, None)
    else:
        bi, bw = times.get("BI", [0.0] * num_stages), times.get("BW", [0.0] * num_stages)
        b = [x + y for x, y in zip(bi, bw)]
    comm = {"F": [0.0] * num_stages, "B": [0.0] * num_stages}
    for name, sec in edge_seconds.items():
        direction, pair = name.split(":")
        src = int(pair.split("->")[0])
        src = src if mesh_of is None else mesh_of[src]
        comm[direction][src] = max(comm[direction][src], sec)
    return Costs(t_fwd=f, t_bwd=b, t_comm=comm["F"], t_bi=bi, t_bw=bw, t_comm_b=comm["B"], t_edge=edge_seconds,
                 edge_model_stages=num_stages if mesh_of is None else len(mesh_of))


def action_samples(steps: list[list[dict]], busy: bool = True,
                   by_model_stage: bool = False) -> dict[tuple, list[float]]:
    """Every measured duration of each (stage, compute kind) over ``steps``, in the
    order measured; with ``busy`` scaled by its host's ``busy_factor``. With
    ``by_model_stage`` keyed (stage, model stage, kind): over virtual stages a stage's
    chunks are different model stages (events without the label: the stage's own)."""
    got: dict[tuple, list[float]] = defaultdict(list)
    for per_host in steps:
        for rec in per_host:
            f = busy_factor(rec) if busy else 1.0
            for kind, _, t0, t1, *v in rec["events"]:
                if kind in COMPUTE_KINDS:
                    s = rec["stage"]
                    got[(s, v[0] if v else s, kind) if by_model_stage else (s, kind)].append((t1 - t0) * f)
    return dict(got)


def predict(schedule: Schedule, steps: list[list[dict]], edge_seconds: dict[str, float], signal: bool = False,
            draws: int = 64, seed: int = 0) -> float:
    """The simulator's iteration time for a measured run: the mean over ``draws``
    simulations in which every compute action takes a duration drawn from that
    model stage's measured durations of its kind, and transfers share their hosts'
    NICs (``edge_seconds`` by model-stage edge name).

    The records may come from runs of other schedules over the same model cut (as
    many model stages as ``schedule`` has; several runs' records pooled, e.g. the
    calibration's two one-chunk runs): each model stage keeps its own durations wherever it ran, and a
    whole backward missing from them is drawn as a ``BI`` plus a ``BW`` (the runner's
    ``B`` is those two programs back to back). Records of a
    one-chunk run serve a schedule over virtual stages (C chunks per stage, the model
    cut C times finer) too, each chunk's action charged 1/C of its stage's draw, as
    the simulator charges costs; that misses each action's fixed cost, which is why
    ``trainer.calibrate`` also measures a virtual-stage run where it can.

    Simulating with median (or mean) durations is optimistic: a stage waits for the
    slowest of the chains that feed it, so spread along dependency chains adds time
    that a single typical duration per action hides. Drawing every action's duration
    from the measured spread shows that cost; the NIC model adds transfers that
    contend for one host's link (a skip edge and its neighbour edge)."""
    positive_int(draws, "draws")
    S, C = schedule.num_stages, schedule.num_chunks
    by_stage = action_samples(steps, by_model_stage=True)
    samples: dict[tuple[int, str], list[float]] = defaultdict(list)
    for (_, v, kind), got in by_stage.items():
        samples[(v, kind)] += got
    measured = 1 + max((v for v, _ in samples), default=0)
    own = measured == schedule.num_virtual_stages  # model stages measured as this schedule cuts the model
    if not own and measured != S:
        raise InvalidArgumentError(f"the records hold {measured} model stages; schedule {schedule.name!r} has "
                                   f"{schedule.num_virtual_stages}: they do not come from a run over the same model "
                                   f"cut or from a one-chunk run")
    costs = costs_from(stage_times(steps, S), edge_seconds, S, model_stage_meshes(schedule) if own else None)
    rng = random.Random(seed)
    share = 1.0 if own else 1.0 / C  # from a one-chunk run a chunk is 1/C of the stage measured whole

    def where(stage: int, chunk: int) -> int:
        return schedule.virtual_stage(stage, chunk) if own else stage

    def measured(v: int, kind: str) -> bool:  # a whole backward measured only split counts
        return (v, kind) in samples or (kind == "B" and (v, "BI") in samples and (v, "BW") in samples)

    missing = sorted({(v, a.kind.name) for i, acts in enumerate(schedule.stages) for a in acts if a.is_compute
                      for v in [where(i, a.chunk)] if not measured(v, a.kind.name)})
    if missing:
        raise InvalidArgumentError(f"no measured duration for (model stage, kind) {missing[:4]}: the records do not "
                                   f"come from a run of this schedule")

    def action_time(stage: int, kind: str, mb: int, chunk: int = 0) -> float:
        v = where(stage, chunk)
        if (v, kind) not in samples:  # a whole backward measured only split: its halves
            return (rng.choice(samples[(v, "BI")]) + rng.choice(samples[(v, "BW")])) * share
        return rng.choice(samples[(v, kind)]) * share

    return mean(simulate_schedule(schedule, costs, signal=signal, shared_nic=True,
                                  action_time=action_time).iteration_time for _ in range(draws))


def predict_by_step(schedule: Schedule, steps: list[list[dict]], edge_seconds: dict[str, float],
                    signal: bool = False, draws: int = 64, seed: int = 0) -> float:
    """The median over ``steps`` of ``predict`` fed each step's records alone: the same
    statistic as a run's measured iteration time (its median step).

    ``predict`` over every step pools their durations. Where the machine slowed down
    for one step (a neighbour's burst on a shared host slows every worker at once),
    pooling spreads that step's slow actions over every simulated step, independently
    per action, and the prediction lands above even the slow step (GPT's ZB-V in
    session 24's 200 Mbit/s run: steps 8.37, 11.96 and 9.37 s, pooled prediction 13.01 s).
    Per step, time-correlated noise stays in the step it happened in."""
    if not steps:
        raise InvalidArgumentError(f"no steps to predict: got {steps!r}")
    return median(predict(schedule, [step], edge_seconds, signal=signal, draws=draws, seed=seed + i)
                  for i, step in enumerate(steps))
