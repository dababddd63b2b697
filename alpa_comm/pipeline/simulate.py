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
NIC and every transfer into a host on its receiving NIC, where transfers in
flight at once share it fairly (a U-Transformer stage sends to its neighbour
and over its skip edge through the same NIC, both at once, as TCP shares a
link); ``Costs.t_edge`` gives each model-stage edge its own measured time (the
skip edge and the neighbour edge move different tensors); and
``action_time`` gives each compute action its own duration, so a Monte Carlo
over measured durations (``train.measure.predict``) sees what variance along
dependency chains costs — a chain waits for its slowest link, which mean
durations do not show.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

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


class _Links:
    """Transfers in flight, as fluids. A channel (a directed stage pair) carries its
    transfers one after another, in the order they were sent — one connection, as
    gloo's pair or a TCP socket carries messages. The transfers at the head of their
    channels share the resources they cross max-min fairly: each channel alone
    (``shared_nic=False``), or the sender's outgoing and the receiver's incoming NIC
    (``shared_nic=True``), so a stage's neighbour edge and its skip edge each go at
    half speed while both are in flight, as TCP shares a link, and neither waits
    for the other. A transfer's work is its time alone on an idle link."""

    def __init__(self, shared_nic: bool):
        self.shared_nic = shared_nic
        self.queues: dict[tuple[int, int], list[list]] = {}  # channel -> [key, work left, start, src, dst, kind, mb]
        self.rate: dict[tuple[int, int], float] = {}         # channel -> its head's share of the link
        self.now = 0.0

    def _resources(self, channel: tuple[int, int]) -> tuple:
        src, dst = channel
        return (("out", src), ("in", dst)) if self.shared_nic else (channel,)

    def _share(self) -> None:
        """Max-min fair rates of the channels' heads (progressive filling, capacity 1)."""
        active = [ch for ch, q in self.queues.items() if q]
        users: dict = {}
        for ch in active:
            for r in self._resources(ch):
                users.setdefault(r, []).append(ch)
        cap = dict.fromkeys(users, 1.0)
        self.rate = {}
        while len(self.rate) < len(active):
            level, tight = min((cap[r] / n, r) for r, chs in users.items()
                               if (n := sum(ch not in self.rate for ch in chs)))
            for ch in users[tight]:
                if ch not in self.rate:
                    self.rate[ch] = level
                    for r in self._resources(ch):
                        cap[r] -= level

    def advance(self, to: float) -> None:
        """Move the fluids on to time ``to`` (no transfer completes before it)."""
        dt = to - self.now
        if dt > 0:
            for ch, rate in self.rate.items():
                self.queues[ch][0][1] -= rate * dt
        self.now = max(self.now, to)

    def send(self, key: tuple, work: float, src: int, dst: int, kind: str, mb: int) -> None:
        q = self.queues.setdefault((src, dst), [])
        q.append([key, work, self.now, src, dst, kind, mb])
        if len(q) == 1:
            self._share()

    def next_completion(self) -> tuple[float, tuple[int, int]] | None:
        """(time, channel) of the head transfer that completes first, if any is in flight."""
        best = None
        for ch, rate in self.rate.items():
            head = self.queues[ch][0]
            t = self.now if head[1] <= 0 else self.now + head[1] / rate
            if best is None or t < best[0]:
                best = (t, ch)
        return best

    def complete(self, channel: tuple[int, int]) -> tuple[tuple, TransferEvent]:
        """Finish the head of ``channel`` (at ``now``); the next in its queue starts."""
        key, _, start, src, dst, kind, mb = self.queues[channel].pop(0)
        if self.queues[channel]:
            self.queues[channel][0][2] = self.now
        self._share()
        return key, TransferEvent(src, dst, kind, mb, start, self.now)


def simulate_schedule(schedule: Schedule, costs: Costs = Costs(), signal: bool = False, shared_nic: bool = False,
                      action_time: Callable[[int, str, int, int], float] | None = None) -> PipelineResult:
    """Run ``schedule``; raises ``ScheduleError`` naming every blocked stage on a deadlock.

    Events are taken in time order: a stage's next action at its clock, or the first
    transfer to complete (``_Links``), whichever comes first. ``shared_nic``: transfers
    out of a host share its NIC, transfers into a host share its NIC (else each directed
    stage pair is its own link). A transfer takes its edge's time alone
    (``Costs.t_edge``, by model-stage edge name) or else its sending stage's
    ``t_comm``/``t_comm_b``. ``action_time(stage, kind, mb, chunk)``: each compute
    action's duration (else the stage's cost of that kind; with virtual stages each of
    a stage's C chunks costs 1/C of it, and each transfer between model stages costs a
    whole ``t_comm``: the activation at a chunk boundary is as large)."""
    S = schedule.num_stages
    c = costs.resolve(S)
    by_edge = costs.edge_model_stages in (None, schedule.num_virtual_stages)
    edge_time = dict(costs.t_edge or ()) if by_edge else {}
    share = 1.0 / schedule.num_chunks
    t = [0.0] * S
    pc = [0] * S
    busy = [0.0] * S
    waiting: dict[tuple, int] = {}  # transfer key -> the stage blocked on its RECV
    arrival: dict[tuple, float] = {}
    events: list[Event] = []
    transfers: list[TransferEvent] = []
    links = _Links(shared_nic)
    ready = [(0.0, i) for i in range(S) if schedule.stages[i]]
    heapq.heapify(ready)
    while True:
        done = links.next_completion()
        if done is not None and (not ready or done[0] <= ready[0][0]):
            links.advance(done[0])
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
        links.advance(t[i])
        a = schedule.stages[i][pc[i]]
        if a.is_compute:
            d = c[a.kind][i] * share if action_time is None else action_time(i, a.kind, a.mb, a.chunk)
            events.append(Event(i, a.kind, a.mb, t[i], t[i] + d, a.chunk))
            t[i] += d
            busy[i] += d
        elif a.kind.is_send:
            direction = a.kind[-1]
            d = 0.0 if signal else edge_time.get(schedule.send_edge(i, a), c["comm" if direction == "F" else "comm_b"][i])
            links.send(schedule.transfer_key(i, a), d, i, schedule.peer(i, a), direction, a.mb)
        else:
            key = schedule.transfer_key(i, a)
            if key not in arrival:
                waiting[key] = i  # blocked until the transfer completes
                continue
            t[i] = max(t[i], arrival[key])
        pc[i] += 1
        if pc[i] < len(schedule.stages[i]):
            heapq.heappush(ready, (t[i], i))
    blocked = [f"stage {i} at action {pc[i]} ({schedule.stages[i][pc[i]]})"
               for i in range(S) if pc[i] < len(schedule.stages[i])]
    if blocked:
        raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    end = max(t + [tr.end for tr in transfers] + [0.0])
    transfers.sort(key=lambda tr: (tr.start, tr.src, tr.dst))
    return PipelineResult(end, busy, sorted(events, key=lambda e: (e.start, e.stage)), transfers)
