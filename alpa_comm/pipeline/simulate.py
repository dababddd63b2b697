"""Execute a schedule with compute and transfer times.

Each stage runs its actions in order. Compute takes its time; a SEND puts a
transfer on the directed link (src stage -> dst stage), which carries one
transfer at a time in the order they were sent, and the stage goes on; a RECV
waits until that transfer has arrived. So transfers overlap with compute
exactly where the schedule leaves other work between a SEND and the matching
RECV — and nowhere else. ``signal=True`` makes every transfer free: the upper
bound the paper measures with one-byte messages.

Three refinements let the simulator predict a real run rather than an ideal one:
``shared_nic`` puts every transfer out of a host on that host's one sending
NIC and every transfer into a host on its receiving NIC, where all transfers in
flight share them fairly (the trainer's mailbox runs each transfer on its own
thread, so a U-Transformer stage's neighbour edge and skip edge, or two
microbatches on one edge, move at once, as TCP shares a link);
``Costs.t_edge`` gives each model-stage edge its own measured time (the skip
edge and the neighbour edge move different tensors); and
``action_time`` gives each compute action its own duration, so a Monte Carlo
over measured durations (``train.measure.predict``) sees what variance along
dependency chains costs — a chain waits for its slowest link, which mean
durations do not show.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from .grid import schedule_error
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
    layout than forward ones), else the same as ``t_comm``. ``t_edge``: the time of a
    transfer over one model-stage edge ("F:0->3", as ``ir.edge_name`` names it; a
    mapping or (name, seconds) pairs), where it differs from its sender's: a
    U-Transformer stage's skip edge carries more or less than its neighbour edge.
    ``edge_model_stages``: into how many model stages those names cut the model; a
    schedule that cuts it otherwise (virtual stages simulated with one-chunk
    measurements) names other edges, so its transfers take their senders' times.
    """

    t_fwd: float | Sequence[float] = 1.0
    t_bwd: float | Sequence[float] = 2.0
    t_comm: float | Sequence[float] = 0.0
    t_bi: float | Sequence[float] | None = None
    t_bw: float | Sequence[float] | None = None
    t_comm_b: float | Sequence[float] | None = None
    t_edge: Mapping[str, float] | tuple[tuple[str, float], ...] | None = None
    edge_model_stages: int | None = None

    def __post_init__(self):
        if self.t_edge is not None:  # hashable, as the rest of a frozen dataclass
            edges = tuple(sorted(dict(self.t_edge).items()))
            bad = [(k, v) for k, v in edges if not v >= 0]
            if bad:
                raise ScheduleError(f"t_edge must be >= 0, got {bad[0][0]!r}: {bad[0][1]!r}")
            object.__setattr__(self, "t_edge", edges)

    def resolve(self, n: int) -> dict[str, list[float]]:
        f = _per_stage(self.t_fwd, n, "t_fwd")
        b = _per_stage(self.t_bwd, n, "t_bwd")
        bi = _per_stage(self.t_bi, n, "t_bi") if self.t_bi is not None else [x / 2 for x in b]
        bw = _per_stage(self.t_bw, n, "t_bw") if self.t_bw is not None else [x - y for x, y in zip(b, bi)]
        comm = _per_stage(self.t_comm, n, "t_comm")
        comm_b = _per_stage(self.t_comm_b, n, "t_comm_b") if self.t_comm_b is not None else comm
        return {"F": f, "B": b, "BI": bi, "BW": bw, "comm": comm, "comm_b": comm_b}

    def edge_times(self, num_model_stages: int) -> dict[str, float]:
        """``t_edge`` as a dict, for a schedule over ``num_model_stages`` model stages;
        empty where the names cut the model otherwise (``edge_model_stages``)."""
        if self.edge_model_stages not in (None, num_model_stages):
            return {}
        return dict(self.t_edge or ())


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


@dataclass
class _Flow:
    """A transfer on a link: ``work`` seconds alone left as of ``since``, going at ``rate``."""
    key: tuple
    work: float
    start: float
    src: int
    dst: int
    kind: str
    mb: int
    since: float = 0.0
    rate: float = 0.0
    finish: float = float("inf")


class _Links:
    """Transfers in flight, as fluids sharing the resources they cross max-min fairly.

    ``shared_nic=False`` (the paper's model): each directed stage pair is its own link
    and carries its transfers one after another, in send order. ``shared_nic=True``
    (the distributed trainer's runtime): every transfer in flight is a flow of its own
    through the sender's outgoing and the receiver's incoming NIC — the mailbox runs
    each transfer on its own thread and their chunks interleave on the wire — so a
    stage's neighbour edge and its skip edge each go at half speed while both are in
    flight, as do two microbatches queued on one edge. A transfer's work is its time
    alone on an idle link."""

    def __init__(self, shared_nic: bool):
        self.shared_nic = shared_nic
        # channel -> its transfers, the head in flight; a channel is a stage pair (one
        # transfer at a time, in send order) or, over shared NICs, a single transfer
        self.queues: dict[tuple, list[_Flow]] = {}
        self.now = 0.0

    def _resources(self, channel: tuple) -> tuple:
        src, dst = channel[:2]
        return (("out", src), ("in", dst)) if self.shared_nic else ((src, dst),)

    def _share(self) -> None:
        """Max-min fair rates of the channels' heads (progressive filling, capacity 1).
        A head whose rate changes is brought up to ``now`` and gets a new finish time;
        one whose rate stays keeps its own, so a transfer alone ends at exactly its
        start plus its time."""
        users: dict = {}
        for ch in self.queues:
            for r in self._resources(ch):
                users.setdefault(r, []).append(ch)
        cap = dict.fromkeys(users, 1.0)
        rate: dict[tuple, float] = {}
        while len(rate) < len(self.queues):
            level, tight = min((cap[r] / n, r) for r, chs in users.items()
                               if (n := sum(ch not in rate for ch in chs)))
            for ch in users[tight]:
                if ch not in rate:
                    rate[ch] = level
                    for r in self._resources(ch):
                        cap[r] -= level
        for ch, r in rate.items():
            f = self.queues[ch][0]
            if r != f.rate:
                f.work -= f.rate * (self.now - f.since)
                f.since, f.rate = self.now, r
                f.finish = self.now + max(f.work, 0.0) / r

    def send(self, key: tuple, work: float, src: int, dst: int, kind: str, mb: int) -> None:
        q = self.queues.setdefault((src, dst, key) if self.shared_nic else (src, dst), [])
        q.append(_Flow(key, work, self.now, src, dst, kind, mb))
        if len(q) == 1:
            q[0].start = q[0].since = self.now
            self._share()

    def next_completion(self) -> tuple[float, tuple] | None:
        """(time, channel) of the head transfer that completes first, if any is in flight."""
        return min(((q[0].finish, ch) for ch, q in self.queues.items()), default=None, key=lambda x: x[0])

    def complete(self, channel: tuple) -> tuple[tuple, TransferEvent]:
        """Finish the head of ``channel`` at its finish time; the next in its queue starts."""
        q = self.queues[channel]
        f = q.pop(0)
        self.now = max(self.now, f.finish)
        if q:
            q[0].start = q[0].since = self.now
        else:
            del self.queues[channel]
        self._share()
        return f.key, TransferEvent(f.src, f.dst, f.kind, f.mb, f.start, self.now)


def simulate_schedule(schedule: Schedule, costs: Costs = Costs(), signal: bool = False, shared_nic: bool = False,
                      action_time: Callable[[int, str, int, int], float] | None = None) -> PipelineResult:
    """Run ``schedule``; raises ``ScheduleError`` naming every blocked stage on a deadlock.

    Events are taken in time order: a stage's next action at its clock, or the first
    transfer to complete (``_Links``), whichever comes first. ``shared_nic``: every
    transfer in flight shares its sender's outgoing and its receiver's incoming NIC with
    the others (else each directed stage pair is its own link, one transfer at a time).
    A transfer takes its edge's time alone (``Costs.t_edge``, by model-stage edge name)
    or else its sending stage's ``t_comm``/``t_comm_b``. ``action_time(stage, kind, mb,
    chunk)``: each compute action's duration (else the stage's cost of that kind; with
    virtual stages each of a stage's C chunks costs 1/C of it, and each transfer between
    model stages costs a whole ``t_comm``: the activation at a chunk boundary is as
    large)."""
    S = schedule.num_stages
    c = costs.resolve(S)
    edge_time = costs.edge_times(schedule.num_virtual_stages)
    share = 1.0 / schedule.num_chunks
    t = [0.0] * S
    pc = [0] * S
    busy = [0.0] * S
    waiting: dict[tuple, int] = {}  # transfer key -> the stage blocked on its RECV
    arrival: dict[tuple, float] = {}
    sent: set[tuple] = set()
    events: list[Event] = []
    transfers: list[TransferEvent] = []
    links = _Links(shared_nic)
    ready = [(0.0, i) for i in range(S) if schedule.stages[i]]
    heapq.heapify(ready)
    while True:
        done = links.next_completion()
        if done is not None and (not ready or done[0] <= ready[0][0]):
            key, tr = links.complete(done[1])
            transfers.append(tr)
            arrival[key] = tr.end
            if key in waiting:
                i = waiting.pop(key)
                t[i] = max(t[i], tr.end)
                heapq.heappush(ready, (t[i], i))
            continue
        if not ready:
            break
        _, i = heapq.heappop(ready)
        links.now = max(links.now, t[i])
        a = schedule.stages[i][pc[i]]
        if a.is_compute:
            d = c[a.kind][i] * share if action_time is None else action_time(i, a.kind, a.mb, a.chunk)
            events.append(Event(i, a.kind, a.mb, t[i], t[i] + d, a.chunk))
            t[i] += d
            busy[i] += d
        elif a.kind.is_send:
            key = schedule.transfer_key(i, a)
            if key in sent:
                raise ScheduleError(f"stage {i} sends {a} twice (transfer {key})")
            sent.add(key)
            direction = a.kind[-1]
            own = c["comm" if direction == "F" else "comm_b"][i]
            d = 0.0 if signal else edge_time.get(schedule.send_edge(i, a), own)
            links.send(key, d, i, schedule.peer(i, a), direction, a.mb)
        else:
            key = schedule.transfer_key(i, a)
            if key not in arrival:
                waiting[key] = i  # blocked until the transfer completes
                continue
            t[i] = max(t[i], arrival[key])
        pc[i] += 1
        if pc[i] < len(schedule.stages[i]):
            heapq.heappush(ready, (t[i], i))
    stuck = [(i, pc[i]) for i in range(S) if pc[i] < len(schedule.stages[i])]
    if stuck:
        raise schedule_error(schedule, "schedule deadlocks: " + "; ".join(
            f"stage {i} at action {k} ({schedule.stages[i][k]})" for i, k in stuck), *stuck)
    end = max(t + [tr.end for tr in transfers] + [0.0])
    transfers.sort(key=lambda tr: (tr.start, tr.src, tr.dst))
    return PipelineResult(end, busy, sorted(events, key=lambda e: (e.start, e.stage)), transfers)
