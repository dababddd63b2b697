"""Schedule generators, in two parts as torch.distributed.pipelining writes them: each
family gives only its compute order (per stage, (op, microbatch, chunk)); one lowering
pass (``lower``: ``place_weight_gradients``, then ``insert_communication``) turns the
orders into the schedule IR. Every family is one entry of one registry,
``SCHEDULE_KINDS``: its name, its order, where its chunks sit (``placement``), how many
chunks a stage holds and who places its weight gradients.

The one-chunk families share one shape: stage i runs W_i warm-up forwards, then
alternates one backward and one forward, then drains the remaining backwards.

* ``gpipe``:      W_i = M (all forwards, then all backwards);
* ``1f1b``:       W_i = min(M, S - i) (at most S - i microbatches in flight);
* ``eager-1f1b``: W_i = min(M, 2(S - i) - 1): forwards run early, so a
  stage has other microbatches' work to do while one microbatch's activation
  crosses to the next mesh (the paper's overlap-friendly schedule).
* ``zb-h1``: Zero Bubble's H1 (Qi et al., ICLR 2024): 1F1B's warm-up (so 1F1B's
  peak memory: stage i holds at most S - i activations plus i weight-gradient
  states, at most S in all), the backward split, and stage i's ``BW m`` run right
  after ``BI (m + i)``: the last stages send their input gradients at once and
  do their weight gradients in the cool-down, where 1F1B leaves them idle. As in
  the authors' Megatron patch (branch ``zb-h1-quick-start``, which delays W "by
  rank" the same way; it also leaves steady-state backwards unsplit for tensor
  parallelism, which this generator does not model).

Over virtual stages (several model chunks per stage):

* ``interleaved-1f1b`` (``chunks=C``, placed in a loop: model stage ``c * S + i`` on
  stage i): 1F1B over the chunks (``interleaved_order``).
* ``zb-v`` and ``dualpipev``: two model chunks per stage placed in a V
  (``placement="v"``), each with its own chunks, split and weight-gradient placement,
  so ``generate(kind, S, M)`` takes none of those options. ZB-V (Qi et al.,
  arXiv:2401.10241 section 6; ``zbv_order``) is zero bubble at 1F1B's peak memory when
  F, BI and BW take equal time. DualPipeV (DeepSeek's ``dualpipev.py``, DualPipe cut in
  half; ``dualpipev_order``, M >= 2S) pairs one chunk's forward with the other's
  backward in its steady state; the authors overlap such a pair, this IR runs it as
  the forward, then the backward. Their orders are the authors'; their transfers are
  placed by the same pass as every other family's.

The lowering. Weight gradients (``place_weight_gradients``), for a family whose order
has whole backwards and a caller who splits them: ``delay_wgrad`` d (per stage) places
``BW m`` after the d compute actions that follow ``BI m``; ZB-H1 places it after the
stage's lag of backwards. Communication (``insert_communication``), wherever the
neighbouring model stage sits on another stage: ``RECV_F m`` right before ``F m``,
``SEND_F m`` right after it; ``RECV_B m`` right before the backward (``B`` or ``BI``),
``SEND_B m`` right after it, so the gradient leaves before the weight-gradient work.
A ``BW`` moves nothing. So a delayed ``BW`` lands after the sends of the compute
action before it and ahead of the next receive: the delayed weight-gradient work fills
the wait for the next incoming transfer. At a V's turn (chunk 0 of the last stage
hands to its own chunk 1) nothing crosses a link, so there is no action.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import InvalidOptionError
from ..validation import positive_int
from .ir import PLACEMENTS, Action, ActionKind, Schedule, model_stage, stage_of

Order = List[Tuple[str, int, int]]
"""One stage's compute order: (op, microbatch, chunk), op one of F, B, BI, BW."""

DEFAULT_CHUNKS = 2
"""The model chunks per stage front ends (the CLI, the trainer) give a family whose
chunks are the caller's (``ScheduleKind.chunks`` None) when none are named."""

WGRAD = ("caller", "lag", "order")
"""Who places a family's weight gradients: ``caller`` (``split_backward`` and
``delay_wgrad`` say), ``lag`` (the backward always split, stage i's ``BW`` a fixed lag
of backwards after its ``BI``), ``order`` (the family's order names ``BI`` and ``BW``)."""


def _one_chunk_order(warm: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Warm-up forwards, then (B, F) pairs, then the drain."""
    order = [("F", m) for m in range(warm)]
    for k in range(num_microbatches - warm):
        order += [("B", k), ("F", warm + k)]
    order += [("B", m) for m in range(num_microbatches - warm, num_microbatches)]
    return order


def warmup(kind: str, num_stages: int, num_microbatches: int, stage: int) -> int:
    """Forwards stage ``stage`` runs before its first backward, for a one-chunk family."""
    family = schedule_kind(kind)
    if family.warmup is None:
        raise InvalidOptionError(f"{kind} has no warm-up rule (its stages hold {family.chunks or 'several'} model "
                                 "chunks): its order is schedule_kind(kind).order")
    return family.warmup(num_stages, num_microbatches, stage)


def compute_order(kind: str, num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The F/B order of one stage of a one-chunk family: warm-up forwards, then (B, F)
    pairs, then the drain."""
    return _one_chunk_order(warmup(kind, num_stages, num_microbatches, stage), num_microbatches)


def _warmup_order(rule: Callable[[int, int, int], int]) -> Callable[[int, int, int, int], Order]:
    """The ``ScheduleKind.order`` of a one-chunk family with warm-up ``rule``."""
    def order(num_stages: int, num_microbatches: int, chunks: int, stage: int) -> Order:
        warm = rule(num_stages, num_microbatches, stage)
        return [(op, m, 0) for op, m in _one_chunk_order(warm, num_microbatches)]
    return order


def interleaved_order(num_stages: int, num_microbatches: int, chunks: int, stage: int) -> list[tuple[str, int, int]]:
    """The (op, microbatch, chunk) order of one stage in interleaved 1F1B (Narayanan et
    al., SC'21; Megatron-LM's ``forward_backward_pipelining_with_interleaving``):
    microbatches go in groups of S, each group through chunk 0, then chunk 1, ...;
    backwards take the chunks in reverse. Stage i warms up with (S - i - 1) * 2 +
    (C - 1) * S forwards, then alternates one forward and one backward."""
    S, M, C = num_stages, num_microbatches, chunks
    total = M * C

    def nth(k: int, backward: bool) -> tuple[int, int]:
        group, within = divmod(k, S * C)
        c = (within // S) % C
        return group * S + k % S, (C - 1 - c) if backward else c

    w = min((S - stage - 1) * 2 + (C - 1) * S, total)
    order = [("F", *nth(k, False)) for k in range(w)]
    for k in range(total - w):
        order += [("F", *nth(w + k, False)), ("B", *nth(k, True))]
    order += [("B", *nth(k, True)) for k in range(total - w, total)]
    return order


class _Emitter:
    """One stage's compute order as (op, microbatch, chunk), built op by op the way the
    authors' code counts: each op of each chunk takes that chunk's microbatches in order,
    ``B`` and ``BI`` share one count, a ``BI`` leaves its weight gradient pending, and a
    ``BW`` runs the oldest pending one of its chunk (of either chunk for ``None``)."""

    def __init__(self) -> None:
        self.order: list[tuple[str, int, int]] = []
        self.next: dict[tuple[str, int], int] = {}
        self.pending: list[tuple[int, int]] = []  # (microbatch, chunk): BI done, BW not yet

    def count(self, op: str, chunk: int) -> int:
        return self.next.get((op, chunk), 0)

    def pending_of(self, chunk: int) -> int:
        return sum(1 for _, c in self.pending if c == chunk)

    def __call__(self, op: str, chunk: int | None) -> None:
        if op == "BW":
            k = next((k for k, (_, c) in enumerate(self.pending) if chunk in (None, c)), None)
            if k is not None:  # with none pending a W does nothing, as in the authors' code
                m, c = self.pending.pop(k)
                self.order.append(("BW", m, c))
            return
        key = ("B" if op == "BI" else op, chunk)
        m = self.next.get(key, 0)
        self.next[key] = m + 1
        self.order.append((op, m, chunk))
        if op == "BI":
            self.pending.append((m, chunk))


def zbv_order(num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int, int]]:
    """The (op, microbatch, chunk) order of one stage in ZB-V (Qi et al., "Zero Bubble
    Pipeline Parallelism", arXiv:2401.10241 section 6; the ICLR 2024 version has no ZB-V):
    the hand-made pattern for T_F = T_B = T_W, as torch.distributed.pipelining's
    ``ScheduleZBVZeroBubble`` writes it (the authors' Megatron code searches a greedy
    order from measured costs instead, which this does not model).

    Stage i warms up with 2(S - i) - 1 chunk-0 forwards, then i (F1, F0) pairs, then
    S - i (F1, BI1, BW1); the steady state repeats (F0, BI0, BW0, F1, BI1, BW1); the
    cool-down runs i (BI0, BI1) and S - i (BI0, BW0), then the weight gradients left,
    chunk 1's first. Every forward after the warm-up follows a completed BW, so no
    stage ever holds more than the 2S chunk-microbatches of its warm-up: S whole-stage
    ones, 1F1B's peak. With equal times the deferred BW fill exactly the gaps of the
    input-gradient chain, so each stage runs without a gap from its first action to its
    last (zero bubble) once M >= 2S - 1. For fewer microbatches the pattern is built
    for 2S - 1 and the missing ones dropped, as torch does: still valid, with gaps."""
    S, i = num_stages, stage
    n = max(num_microbatches, 2 * S - 1)
    emit = _Emitter()
    for _ in range(2 * (S - i) - 1):
        emit("F", 0)
    for _ in range(i):
        emit("F", 1), emit("F", 0)
    for _ in range(S - i):
        emit("F", 1), emit("BI", 1), emit("BW", 1)
    while emit.count("F", 1) < emit.count("F", 0) or emit.count("F", 0) < n:
        if emit.count("F", 0) < n:
            emit("F", 0)
        emit("BI", 0), emit("BW", 0), emit("F", 1), emit("BI", 1), emit("BW", 1)
    for _ in range(i):
        emit("BI", 0), emit("BI", 1)
    for _ in range(S - i):
        emit("BI", 0), emit("BW", 0)
    for c in (1, 0):
        while emit.pending_of(c):
            emit("BW", c)
    return [(op, m, c) for op, m, c in emit.order if m < num_microbatches]


def dualpipev_order(num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int, int]]:
    """The (op, microbatch, chunk) order of one stage in DualPipeV (DeepSeek-AI,
    github.com/deepseek-ai/DualPipe ``dualpipev.py``; Sea AI Lab's "cut-in-half" of
    DualPipe: S stages hold 2S model stages in a V, one direction of microbatches).

    The eight steps of ``DualPipeV.step`` for rank i: (1) 2(S - i - 1) chunk-0 forwards;
    (2) i + 1 (F0, F1); (3) S - i - 1 (BI1, BW, F1): split backwards whose W runs at
    once; (4) the main step, M - 2S + i + 1 times (F0 & B1, F1 & B0), each pair a
    forward of one chunk and a full backward of the other; (5) S - i - 1 (B1, F1 & B0);
    (6) i + 1 (B1, B0), the backwards from the middle one on split (from the pair's B1
    on odd ranks, from its B0 on even ones) with their W deferred; (7) S - i - 1 (BW,
    BI0); (8) the i + 1 weight gradients left. A BW takes the oldest deferred W, of
    either chunk. The authors overlap each pair ``F & B`` (one's computation with the
    other's communication, and with ``overlapped_forward_backward`` the computations
    too); this IR runs one compute action at a time, so a pair runs as F, then B."""
    S, i, M = num_stages, stage, num_microbatches
    emit = _Emitter()
    for _ in range(2 * (S - i - 1)):
        emit("F", 0)
    for _ in range(i + 1):
        emit("F", 0), emit("F", 1)
    for _ in range(S - i - 1):
        emit("BI", 1), emit("BW", None), emit("F", 1)
    for _ in range(M - 2 * S + i + 1):
        emit("F", 0), emit("B", 1), emit("F", 1), emit("B", 0)
    for _ in range(S - i - 1):
        emit("B", 1), emit("F", 1), emit("B", 0)
    split = False
    for k in range(i + 1):
        split = split or (k == (i + 1) // 2 and i % 2 == 1)
        emit("BI" if split else "B", 1)
        split = split or (k == (i + 1) // 2 and i % 2 == 0)
        emit("BI" if split else "B", 0)
    for _ in range(S - i - 1):
        emit("BW", None), emit("BI", 0)
    for _ in range(i + 1):
        emit("BW", None)
    return emit.order


# ------------------------------------------------------------------ lowering


def place_weight_gradients(order: Order, delay: int, count_forwards: bool = True) -> Order:
    """``order`` with each whole backward split: ``B m`` becomes ``BI m``, and ``BW m``
    follows the ``delay`` compute actions after it (``count_forwards`` False: the
    ``delay`` backwards after it, ZB-H1's lag); those still pending at the end close
    the order, the soonest due first."""
    out: Order = []
    pending: list[list[int]] = []  # [microbatch, actions still to wait, chunk], the soonest due first
    for op, m, c in order:
        backward = op == "B"
        out.append(("BI" if backward else op, m, c))
        if backward:
            pending.append([m, delay, c])
            pending.sort(key=lambda p: p[1])
        if backward or count_forwards:
            for p in pending:
                p[1] -= 1
            while pending and pending[0][1] < 0:
                m_, _, c_ = pending.pop(0)
                out.append(("BW", m_, c_))
    out.extend(("BW", m_, c_) for m_, _, c_ in pending)
    return out


def insert_communication(orders: Sequence[Order], placement: str = "loop",
                         chunks: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Every stage's compute order with its transfers, where the neighbouring model
    stage sits on another stage (``placement``, ``chunks`` per stage): ``RECV_F`` right
    before a forward and ``SEND_F`` right after it, ``RECV_B`` right before a backward
    (``B`` or ``BI``) and ``SEND_B`` right after it; a ``BW`` moves nothing."""
    S = len(orders)
    last = S * chunks - 1
    stages = []
    for i, order in enumerate(orders):
        out: list[Action] = []
        for op, m, c in order:
            kind = ActionKind(op)
            if kind is ActionKind.BW:
                out.append(Action(kind, m, chunk=c))
                continue
            v = model_stage(placement, S, i, c)
            before = v > 0 and stage_of(placement, S, v - 1) != i     # the previous model stage is elsewhere
            after = v < last and stage_of(placement, S, v + 1) != i
            forward = kind is ActionKind.F
            recv, send = (before, after) if forward else (after, before)
            if recv:
                out.append(Action(ActionKind.RECV_F if forward else ActionKind.RECV_B, m, chunk=c))
            out.append(Action(kind, m, chunk=c))
            if send:
                out.append(Action(ActionKind.SEND_F if forward else ActionKind.SEND_B, m, chunk=c))
        stages.append(tuple(out))
    return tuple(stages)


def lower(family: "ScheduleKind", orders: Sequence[Order], chunks: int,
          delays: Sequence[int] | None = None) -> Schedule:
    """The schedule of ``family``'s per-stage compute ``orders``: with ``delays`` (one per
    stage) each whole backward split and its weight gradient placed
    (``place_weight_gradients``), then the transfers inserted (``insert_communication``).
    The name says what the caller chose: the chunks where they are the caller's, the
    split and delays where the caller placed them."""
    if delays is not None:
        orders = [place_weight_gradients(o, d, count_forwards=family.wgrad == "caller")
                  for o, d in zip(orders, delays)]
    name = family.name + (f" chunks={chunks}" if family.chunks is None else "")
    if delays is not None and family.wgrad == "caller":
        name += " split" + (f" delay={list(delays)}" if any(delays) else "")
    return Schedule(insert_communication(orders, family.placement, chunks), name, family.placement)


# ------------------------------------------------------------------ the registry


def _any_count(num_stages: int) -> int:
    return 1


@dataclass(frozen=True)
class ScheduleKind:
    """A schedule family: all a generator, a runner or a command needs to know of it.

    ``name`` and ``summary`` (one line) for listings; ``order(S, M, C, i)``: stage ``i``'s
    compute order (``Order``) over ``S`` stages, ``M`` microbatches and ``C`` chunks per
    stage, with whole backwards (``B``) unless the family places its weight gradients
    itself (``wgrad="order"``); ``placement`` (``ir.PLACEMENTS``): where chunk ``c`` of a
    stage sits; ``chunks``: model chunks per stage (None: the caller's, at least 2);
    ``wgrad`` (``WGRAD``): who places the weight gradients, with ``wgrad_lag(S, i)``
    backwards between stage ``i``'s ``BI`` and ``BW`` for ``lag``;
    ``min_microbatches(S)``: the fewest microbatches it runs; ``microbatch_groups``: it
    takes microbatches in groups of ``S``; ``warmup(S, M, i)``: a one-chunk family's
    warm-up forwards (``order`` follows from it)."""

    name: str
    summary: str
    order: Callable[[int, int, int, int], Order]
    placement: str = "loop"
    chunks: Optional[int] = 1
    wgrad: str = "caller"
    wgrad_lag: Optional[Callable[[int, int], int]] = None
    min_microbatches: Callable[[int], int] = _any_count
    microbatch_groups: bool = False
    warmup: Optional[Callable[[int, int, int], int]] = None

    def __post_init__(self):
        if self.placement not in PLACEMENTS or self.wgrad not in WGRAD or (self.wgrad == "lag") != (
                self.wgrad_lag is not None) or (self.placement == "v" and self.chunks != 2):
            raise InvalidOptionError(f"schedule family {self.name!r}: placement {self.placement!r} (one of "
                                     f"{PLACEMENTS}; 'v' holds 2 chunks, not {self.chunks!r}), wgrad "
                                     f"{self.wgrad!r} (one of {WGRAD}; 'lag' and only it with a wgrad_lag)")

    @property
    def virtual(self) -> bool:
        """Whether its stages hold several model chunks (virtual stages)."""
        return self.chunks != 1

    def runs_at(self, num_stages: int, num_microbatches: int) -> bool:
        """Whether it can be generated for these sizes (its fewest microbatches, its groups
        of ``num_stages``): what a caller that tries every family filters by."""
        return num_microbatches >= self.min_microbatches(num_stages) and not (
            self.microbatch_groups and num_microbatches % num_stages)

    @property
    def own_wgrad(self) -> bool:
        """Whether it places its own weight gradients (``split_backward`` and
        ``delay_wgrad`` do not apply; its backward is always split)."""
        return self.wgrad != "caller"


def _warmup_family(name: str, rule: Callable[[int, int, int], int], summary: str, **kw) -> ScheduleKind:
    return ScheduleKind(name, summary, _warmup_order(rule), warmup=rule, **kw)


SCHEDULE_KINDS: Dict[str, ScheduleKind] = {k.name: k for k in (
    _warmup_family("gpipe", lambda S, M, i: M, "all forwards, then all backwards"),
    _warmup_family("1f1b", lambda S, M, i: min(M, S - i), "at most S - i microbatches in flight"),
    _warmup_family("eager-1f1b", lambda S, M, i: min(M, 2 * (S - i) - 1),
                   "forwards run early so transfers overlap compute (the paper's schedule)"),
    _warmup_family("zb-h1", lambda S, M, i: min(M, S - i),
                   "1F1B with split backward, stage i's weight gradients i backwards late (Zero Bubble H1)",
                   wgrad="lag", wgrad_lag=lambda S, i: i),
    ScheduleKind("interleaved-1f1b",
                 "each stage holds C model chunks (virtual stages, placed in a loop), 1F1B over them: the fill "
                 "and drain shrink by C (Megatron-LM's interleaved schedule)",
                 interleaved_order, chunks=None, microbatch_groups=True),
    ScheduleKind("zb-v",
                 "two chunks per stage in a V, backward split, deferred weight gradients fill the gaps: zero "
                 "bubble at 1F1B's peak memory when F, BI and BW take equal time (Zero Bubble's ZB-V)",
                 lambda S, M, C, i: zbv_order(S, M, i), placement="v", chunks=2, wgrad="order"),
    ScheduleKind("dualpipev",
                 "two chunks per stage in a V, the steady state pairs one chunk's forward with the other's "
                 "backward (DeepSeek's DualPipeV: DualPipe cut in half); M >= 2S",
                 lambda S, M, C, i: dualpipev_order(S, M, i), placement="v", chunks=2, wgrad="order",
                 min_microbatches=lambda S: 2 * S),
)}
"""Every schedule family, by name: the one registry the generators, the simulator's
comparison, ``--schedule auto``, the trainer and the CLI's ``--schedule`` choices read.
A new family is one entry (its compute order and how it is placed); the lowering
inserts its transfers. DualPipeV needs M >= 2S (its steady state starts once every
stage holds both chunks' forwards; the authors assert ``num_chunks >= num_ranks * 2``);
interleaved 1F1B takes microbatches in groups of S."""

SCHEDULE_NAMES: Tuple[str, ...] = tuple(SCHEDULE_KINDS)
"""Every registered name: what ``generate`` and every ``--schedule`` take."""

SCHEDULES: Tuple[str, ...] = tuple(k for k, f in SCHEDULE_KINDS.items() if not f.virtual)
"""The families with one model chunk per stage (what Alpa's clock table runs too)."""

VIRTUAL_SCHEDULES: Dict[str, ScheduleKind] = {k: f for k, f in SCHEDULE_KINDS.items() if f.chunks is None}
"""The families over virtual stages whose chunks per stage the caller gives
(``generate(..., chunks=C)``); a view of ``SCHEDULE_KINDS``."""

V_SCHEDULES: Dict[str, ScheduleKind] = {k: f for k, f in SCHEDULE_KINDS.items() if f.placement == "v"}
"""The families with two chunks of their own per stage in a V (``placement="v"``: chunk
0 of stage i is model stage i, chunk 1 is 2S - 1 - i, so the turn stays on the last
stage); a view of ``SCHEDULE_KINDS``."""


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule family called ``name``; an unknown name lists the known ones."""
    try:
        return SCHEDULE_KINDS[name]
    except (KeyError, TypeError):
        raise InvalidOptionError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}") from None


def chunks_for(kind: str, chunks: int | None = None) -> int | None:
    """The chunks a front end passes ``generate`` for ``kind``: the caller's ``chunks``,
    or ``DEFAULT_CHUNKS`` for a family whose chunks are the caller's when none are named."""
    return DEFAULT_CHUNKS if chunks is None and schedule_kind(kind).chunks is None else chunks


# ------------------------------------------------------------------ generate


def _delays(delay_wgrad, num_stages: int) -> list[int]:
    if delay_wgrad is None:
        return [0] * num_stages
    if isinstance(delay_wgrad, int):
        values = [delay_wgrad] * num_stages
    else:
        values = list(delay_wgrad)
    if len(values) != num_stages or any(not isinstance(v, int) or v < 0 for v in values):
        raise InvalidOptionError(f"delay_wgrad must be a non-negative int or one per stage ({num_stages}), "
                                 f"got {delay_wgrad!r}")
    return values


def _check_counts(num_stages, num_microbatches) -> None:
    """Stages and microbatches are positive integers, or the one that is not is named."""
    for name, v in (("stages", num_stages), ("microbatches", num_microbatches)):
        positive_int(v, f"number of {name}")


def _chunks(family: ScheduleKind, chunks) -> int:
    """The chunks per stage ``family`` runs with, given the caller's ``chunks``."""
    if family.chunks is None:
        if not isinstance(chunks, int) or chunks < 2:
            raise InvalidOptionError(f"{family.name} needs chunks >= 2 (model chunks per stage), got {chunks!r}")
        return chunks
    if chunks in (None, family.chunks):
        return family.chunks
    if family.chunks == 1:
        raise InvalidOptionError(f"{family.name} has one model chunk per stage; chunks={chunks!r} needs one of "
                                 f"{', '.join(VIRTUAL_SCHEDULES)}")
    raise InvalidOptionError(f"{family.name} holds {'two' if family.chunks == 2 else family.chunks} model chunks "
                             f"per stage" + (" (in a V)" if family.placement == "v" else "")
                             + f"; chunks={chunks!r} does not apply: leave it out")


def _check_microbatches(family: ScheduleKind, num_stages: int, num_microbatches: int) -> None:
    least = family.min_microbatches(num_stages)
    if num_microbatches < least:
        raise InvalidOptionError(f"{family.name} needs at least {least} microbatches on {num_stages} stages, "
                                 f"got {num_microbatches}")
    if family.microbatch_groups and num_microbatches % num_stages:
        raise InvalidOptionError(f"{family.name} takes microbatches in groups of the {num_stages} stages: "
                                 f"{num_microbatches} microbatches is not a multiple of {num_stages}")


def _wgrad_delays(family: ScheduleKind, num_stages: int, split_backward: bool, delay_wgrad) -> list[int] | None:
    """Per stage, how late the lowering places each weight gradient; None where it splits
    no backward (kept whole, or split by the family's own order)."""
    if family.own_wgrad:
        if delay_wgrad is not None:
            raise InvalidOptionError(f"{family.name} places its own weight gradients: delay_wgrad does not apply")
        return [family.wgrad_lag(num_stages, i) for i in range(num_stages)] if family.wgrad == "lag" else None
    if delay_wgrad is not None and not split_backward:
        raise InvalidOptionError("delay_wgrad needs split_backward (BW must be a separate action to delay it)")
    return _delays(delay_wgrad, num_stages) if split_backward else None


def generate(kind: str, num_stages: int, num_microbatches: int, *, split_backward: bool = False,
             delay_wgrad: int | Sequence[int] | None = None, chunks: int | None = None) -> Schedule:
    """Build the schedule of family ``kind`` (``SCHEDULE_KINDS``): its compute order per
    stage, lowered (``lower``). ``split_backward`` and ``delay_wgrad`` (which needs it;
    for a delay chosen by the cost model use ``weight_delay.auto_delay_schedule``) apply
    to the families whose weight gradients the caller places; those that place their own
    (ZB-H1, the V schedules) split their backward whatever ``split_backward`` says.
    ``chunks``: model chunks per stage, given for a family whose chunks are the caller's
    (interleaved 1F1B) and otherwise left out (or its own count)."""
    family = schedule_kind(kind)  # an unknown name fails before any other check
    _check_counts(num_stages, num_microbatches)
    C = _chunks(family, chunks)
    _check_microbatches(family, num_stages, num_microbatches)
    delays = _wgrad_delays(family, num_stages, split_backward, delay_wgrad)
    return lower(family, [family.order(num_stages, num_microbatches, C, i) for i in range(num_stages)], C, delays)
