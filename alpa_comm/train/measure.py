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

from ..pipeline.ir import Schedule
from ..pipeline.simulate import Costs, simulate_schedule

COMPUTE_KINDS = ("F", "B", "BI", "BW")


def iteration_seconds(per_host: list[dict]) -> float:
    """First action start to last action end over all hosts of one step (no update)."""
    spans = [(t0, t1) for rec in per_host for kind, _, t0, t1 in rec["events"] if kind != "UPDATE"]
    return max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans) if spans else 0.0


def busy_factor(rec: dict) -> float:
    """How much longer a stage is busy than its compute actions alone take: its span
    minus the time it waited for data, over the sum of its compute actions. The
    rest is runtime work between actions (unpacking received buffers, dispatch,
    bookkeeping) that the simulator has no action for."""
    acts = [(k, t0, t1) for k, _, t0, t1 in rec["events"] if k != "UPDATE"]
    if not acts:
        return 1.0
    span = max(t1 for _, _, t1 in acts) - min(t0 for _, t0, _ in acts)
    waits = sum(t1 - t0 for k, t0, t1 in acts if k.startswith("RECV"))
    compute = sum(t1 - t0 for k, t0, t1 in acts if k in COMPUTE_KINDS)
    return max(1.0, (span - waits) / compute) if compute > 0 else 1.0


def transfer_overlap(rec: dict) -> float:
    """The share of a host's sending time (its communication threads, data ready to
    last byte out) during which the host was computing: 1.0 when every transfer hid
    behind compute, 0.0 when compute always waited for them. Transfers overlap compute
    only where the schedule gives them compute to hide behind, so this reads a
    schedule's overlap, not the runtime's alone."""
    compute = sorted((t0, t1) for kind, _, t0, t1 in rec["events"] if kind in COMPUTE_KINDS)
    total = hidden = 0.0
    for _, _, a, b in rec.get("transfers", []):
        total += b - a
        hidden += sum(max(0.0, min(b, t1) - max(a, t0)) for t0, t1 in compute)
    return hidden / total if total > 0 else 1.0


def stage_times(steps: list[list[dict]], num_stages: int, busy: bool = True) -> dict[str, list[float]]:
    """Median duration per stage of each compute kind over ``steps`` (each a list of
    host records); kinds a schedule does not use are absent. With ``busy`` each
    duration is scaled by the stage's ``busy_factor``, so the simulator charges
    the runtime's own work between actions too."""
    got = action_samples(steps, busy)
    kinds = dict.fromkeys(kind for _, kind in got)
    return {kind: [median(got[(s, kind)]) if (s, kind) in got else 0.0 for s in range(num_stages)]
            for kind in kinds}


def costs_from(times: dict[str, list[float]], edge_seconds: dict[str, float], num_stages: int) -> Costs:
    """Simulator costs: measured compute per stage and each stage's outgoing edge
    time (the slowest of its forward edges and of its backward edges). Where both the
    whole backward and its halves were measured (two runs), each keeps its own time:
    a split costs more than ``B`` (two programs)."""
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
        comm[direction][src] = max(comm[direction][src], sec)
    return Costs(t_fwd=f, t_bwd=b, t_comm=comm["F"], t_bi=bi, t_bw=bw, t_comm_b=comm["B"])


def action_samples(steps: list[list[dict]], busy: bool = True) -> dict[tuple[int, str], list[float]]:
    """Every measured duration of each (stage, compute kind) over ``steps``, in the
    order measured; with ``busy`` scaled by its host's ``busy_factor``."""
    got: dict[tuple[int, str], list[float]] = defaultdict(list)
    for per_host in steps:
        for rec in per_host:
            f = busy_factor(rec) if busy else 1.0
            for kind, _, t0, t1 in rec["events"]:
                if kind in COMPUTE_KINDS:
                    got[(rec["stage"], kind)].append((t1 - t0) * f)
    return dict(got)


def predict(schedule: Schedule, steps: list[list[dict]], edge_seconds: dict[str, float], signal: bool = False,
            draws: int = 64, seed: int = 0) -> float:
    """The simulator's iteration time for a measured run: the mean over ``draws``
    simulations in which every compute action takes a duration drawn from that
    stage's measured durations of its kind, and transfers share their hosts' NICs.
    The records come from one-chunk runs; a schedule over virtual stages (C chunks per
    stage, the model cut C times finer) charges each chunk's action 1/C of a draw, as
    the simulator charges costs, and each transfer a whole edge time.

    Simulating with median (or mean) durations is optimistic: a stage waits for the
    slowest of the chains that feed it, so spread along dependency chains adds time
    that a single typical duration per action hides. Drawing every action's duration
    from the measured spread shows that cost; the NIC model adds transfers that
    contend for one host's link (a skip edge and its neighbour edge)."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws!r}")
    S = schedule.num_stages
    costs = costs_from(stage_times(steps, S), edge_seconds, S)
    samples = action_samples(steps)
    missing = sorted({(i, a.kind.name) for i, acts in enumerate(schedule.stages) for a in acts
                      if a.is_compute and (i, a.kind.name) not in samples})
    if missing:
        raise ValueError(f"no measured duration for (stage, kind) {missing[:4]}: the records do not come from "
                         f"a run of this schedule")
    rng = random.Random(seed)
    share = 1.0 / schedule.num_chunks  # over virtual stages a chunk is 1/C of the stage measured whole

    def action_time(stage: int, kind: str, mb: int) -> float:
        return rng.choice(samples[(stage, kind)]) * share

    return mean(simulate_schedule(schedule, costs, signal=signal, shared_nic=True,
                                  action_time=action_time).iteration_time for _ in range(draws))
