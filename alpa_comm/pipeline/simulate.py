"""Execute a schedule with compute and transfer times.

Each stage runs its actions in order. Compute takes its time; a SEND puts a
transfer on the directed link (src stage -> dst stage), which carries one
transfer at a time in the order they were sent, and the stage goes on; a RECV
waits until that transfer has arrived. So transfers overlap with compute
exactly where the schedule leaves other work between a SEND and the matching
RECV — and nowhere else. ``signal=True`` makes every transfer free: the upper
bound the paper measures with one-byte messages.

Two refinements let the simulator predict a real run rather than an ideal one:
``shared_nic`` puts every transfer out of a host on that host's one sending
NIC and every transfer into a host on its receiving NIC (a U-Transformer stage
sends to its neighbour and over its skip edge through the same NIC), and
``action_time`` gives each compute action its own duration, so a Monte Carlo
over measured durations (``train.measure.predict``) sees what variance along
dependency chains costs — a chain waits for its slowest link, which mean
durations do not show.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .ir import Schedule, ScheduleError


def _per_stage(value, n: int, name: str) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(values) != n:
        raise ScheduleError(f"{name} has {len(values)} values for {n} stages")
    if any(v < 0 for v in values):
        raise ScheduleError(f"{name} must be >= 0, got {value!r}")
    return [float(v) for v in values]


@dataclass(frozen=True)
class Costs:
    """Per-stage compute times and per-transfer time (scalars or one value per stage).

    ``t_bi``/``t_bw`` default to half of ``t_bwd`` each. ``t_comm`` is the time of
    one transfer out of a stage (per sending stage when a list); ``t_comm_b``, when
    given, is the time of a gradient transfer (backward edges may move a different
    layout than forward ones), else the same as ``t_comm``.
    """

    t_fwd: float | Sequence[float] = 1.0
    t_bwd: float | Sequence[float] = 2.0
    t_comm: float | Sequence[float] = 0.0
    t_bi: float | Sequence[float] | None = None
    t_bw: float | Sequence[float] | None = None
    t_comm_b: float | Sequence[float] | None = None

    def resolve(self, n: int) -> dict[str, list[float]]:
        f = _per_stage(self.t_fwd, n, "t_fwd")
        b = _per_stage(self.t_bwd, n, "t_bwd")
        bi = _per_stage(self.t_bi, n, "t_bi") if self.t_bi is not None else [x / 2 for x in b]
        bw = _per_stage(self.t_bw, n, "t_bw") if self.t_bw is not None else [x - y for x, y in zip(b, bi)]
        comm = _per_stage(self.t_comm, n, "t_comm")
        comm_b = _per_stage(self.t_comm_b, n, "t_comm_b") if self.t_comm_b is not None else comm
        return {"F": f, "B": b, "BI": bi, "BW": bw, "comm": comm, "comm_b": comm_b}


@dataclass(frozen=True)
class Event:
    stage: int
    kind: str
    mb: int
    start: float
    end: float
    chunk: int = 0


@dataclass(frozen=True)
class TransferEvent:
    src: int
    dst: int
    kind: str  # "F" (activation) or "B" (gradient)
    mb: int
    start: float
    end: float


@dataclass
class PipelineResult:
    iteration_time: float
    busy: list[float]
    events: list[Event] = field(default_factory=list)
    transfers: list[TransferEvent] = field(default_factory=list)

    @property
    def bubble_fraction(self) -> float:
        total = self.iteration_time * len(self.busy)
        return 1.0 - sum(self.busy) / total if total > 0 else 0.0

    def throughput(self, num_microbatches: int) -> float:
        return num_microbatches / self.iteration_time if self.iteration_time > 0 else float("inf")


def _book(calendars: list[list[tuple[float, float]]], ready: float, duration: float) -> float:
    """The earliest start >= ``ready`` at which every calendar (a NIC's booked
    intervals) is free for ``duration``; books it. Stages are simulated one after
    another, not in time order, so a NIC's bookings can arrive out of time order:
    a transfer takes the first gap that fits, as the real NIC would carry it then."""
    if duration <= 0:
        return ready
    start = ready
    moved = True
    while moved:
        moved = False
        for cal in calendars:
            for a, b in cal:
                if a < start + duration and start < b:
                    start, moved = b, True
    for cal in calendars:
        cal.append((start, start + duration))
    return start


def simulate_schedule(schedule: Schedule, costs: Costs = Costs(), signal: bool = False, shared_nic: bool = False,
                      action_time: Callable[[int, str, int, int], float] | None = None) -> PipelineResult:
    """Run ``schedule``; raises ``ScheduleError`` naming every blocked stage on a deadlock.

    ``shared_nic``: a host's NIC carries one transfer at a time per direction (else
    each directed stage pair is its own link). ``action_time(stage, kind, mb, chunk)``:
    each compute action's duration (else the stage's cost of that kind; with virtual
    stages each of a stage's C chunks costs 1/C of it, and each transfer between model
    stages costs a whole ``t_comm``: the activation at a chunk boundary is as large)."""
    S = schedule.num_stages
    c = costs.resolve(S)
    share = 1.0 / schedule.num_chunks
    t = [0.0] * S
    pc = [0] * S
    busy = [0.0] * S
    link_free: dict[tuple[int, int], float] = {}
    nic_busy: dict[tuple[str, int], list[tuple[float, float]]] = {}
    arrival: dict[tuple, float] = {}
    events: list[Event] = []
    transfers: list[TransferEvent] = []
    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for i in range(S):
            acts = schedule.stages[i]
            while pc[i] < len(acts):
                a = acts[pc[i]]
                if a.is_compute:
                    d = c[a.kind][i] * share if action_time is None else action_time(i, a.kind, a.mb, a.chunk)
                    events.append(Event(i, a.kind, a.mb, t[i], t[i] + d, a.chunk))
                    t[i] += d
                    busy[i] += d
                elif a.kind.is_send:
                    peer = schedule.peer(i, a)
                    direction = a.kind[-1]
                    d = 0.0 if signal else c["comm" if direction == "F" else "comm_b"][i]
                    if shared_nic:
                        start = _book([nic_busy.setdefault(("out", i), []), nic_busy.setdefault(("in", peer), [])],
                                      t[i], d)
                    else:
                        link = (i, peer)
                        start = max(t[i], link_free.get(link, 0.0))
                        link_free[link] = start + d
                    end = start + d
                    arrival[schedule.transfer_key(i, a)] = end
                    transfers.append(TransferEvent(i, peer, direction, a.mb, start, end))
                else:
                    key = schedule.transfer_key(i, a)
                    if key not in arrival:
                        break  # blocked: the matching SEND has not been issued yet
                    t[i] = max(t[i], arrival[key])
                pc[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [f"stage {i} at action {pc[i]} ({schedule.stages[i][pc[i]]})"
                       for i in range(S) if pc[i] < len(schedule.stages[i])]
            raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    end = max(t + [tr.end for tr in transfers] + [0.0])
    return PipelineResult(end, busy, sorted(events, key=lambda e: (e.start, e.stage)), transfers)
