"""Schedule generators: GPipe, 1F1B and eager-1F1B, optionally with split and delayed backward;
Zero Bubble's H1; over virtual stages interleaved 1F1B, ZB-V and DualPipeV.

GPipe, 1F1B, eager-1F1B and ZB-H1 share one shape: stage i runs W_i warm-up
forwards, then alternates one backward and one forward, then drains the remaining backwards.

* ``gpipe``:      W_i = M (all forwards, then all backwards);
* ``1f1b``:       W_i = min(M, S - i) (at most S - i microbatches in flight);
* ``eager-1f1b``: W_i = min(M, 2(S - i) - 1): forwards run early, so a
  stage has other microbatches' work to do while one microbatch's activation
  crosses to the next mesh (the paper's overlap-friendly schedule).
* ``interleaved-1f1b`` (``chunks=C``, virtual stages): each stage holds C model
  chunks, model stage ``c * S + i`` on stage i; 1F1B over them (``interleaved_order``).
* ``zb-h1``: Zero Bubble's H1 (Qi et al., ICLR 2024): 1F1B's warm-up (so 1F1B's
  peak memory: stage i holds at most S - i activations plus i weight-gradient
  states, at most S in all), the backward split, and stage i's ``BW m`` run right
  after ``BI (m + i)``: the last stages send their input gradients at once and
  do their weight gradients in the cool-down, where 1F1B leaves them idle. As in
  the authors' Megatron patch (branch ``zb-h1-quick-start``, which delays W "by
  rank" the same way; it also leaves steady-state backwards unsplit for tensor
  parallelism, which this generator does not model).
* ``zb-v`` and ``dualpipev`` (``V_SCHEDULES``): two model chunks per stage placed in a
  V (``placement="v"``), each with its own chunks, split and weight-gradient placement,
  so ``generate(kind, S, M)`` takes none of those options. ZB-V (Qi et al.,
  arXiv:2401.10241 section 6; ``zbv_order``) is zero bubble at 1F1B's peak memory when
  F, BI and BW take equal time. DualPipeV (DeepSeek's ``dualpipev.py``, DualPipe cut in
  half; ``dualpipev_order``, M >= 2S) pairs one chunk's forward with the other's
  backward in its steady state; the authors overlap such a pair, this IR runs it as
  the forward, then the backward. Their orders are the authors'; their transfers are
  placed by the rule below, as for every other generator.

Communication is inserted around compute: ``RECV_F m`` right before ``F m``
(stages > 0), ``SEND_F m`` right after it (stages < S-1); ``RECV_B m``
before the backward (stages < S-1), ``SEND_B m`` right after the backward
or, with ``split_backward``, right after ``BI m`` so the gradient leaves
before the weight-gradient work. ``delay_wgrad`` d (per stage) places
``BW m`` after the d compute actions that follow ``BI m`` (and their sends),
before the next receive: the delayed weight-gradient work fills the wait
for the next incoming transfer.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from ..errors import InvalidOptionError
from .ir import Action, ActionKind, Schedule


class ScheduleKind(NamedTuple):
    """A schedule family: its name, its warm-up rule (forwards stage ``i`` of ``S`` runs
    before its first backward, given ``M`` microbatches), one line for listings, and, for
    a family that places its own weight gradients, how many backward passes stage ``i``'s
    ``BW`` lags its ``BI`` (such a family always splits the backward)."""

    name: str
    warmup: Callable[[int, int, int], int]
    summary: str
    wgrad_lag: Callable[[int, int], int] | None = None


SCHEDULE_KINDS: dict[str, ScheduleKind] = {k.name: k for k in (
    ScheduleKind("gpipe", lambda S, M, i: M, "all forwards, then all backwards"),
    ScheduleKind("1f1b", lambda S, M, i: min(M, S - i), "at most S - i microbatches in flight"),
    ScheduleKind("eager-1f1b", lambda S, M, i: min(M, 2 * (S - i) - 1),
                 "forwards run early so transfers overlap compute (the paper's schedule)"),
    ScheduleKind("zb-h1", lambda S, M, i: min(M, S - i),
                 "1F1B with split backward, stage i's weight gradients i backwards late (Zero Bubble H1)",
                 wgrad_lag=lambda S, i: i),
)}
"""Every schedule the generators, the trainer and the CLI know, by name."""

SCHEDULES: tuple[str, ...] = tuple(SCHEDULE_KINDS)

VIRTUAL_SCHEDULES: dict[str, str] = {
    "interleaved-1f1b": "each stage holds C model chunks (virtual stages, placed in a loop), "
                        "1F1B over them: the fill and drain shrink by C (Megatron-LM's interleaved schedule)",
}
"""Schedules over virtual stages (``generate(..., chunks=C)``). The simulator, validator,
memory model, ``alpa-comm schedule`` and the in-process runner (``train.local_pipeline``)
take them; the distributed trainer does not yet. The schedules with two chunks of their
own in a V are ``V_SCHEDULES``."""


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule family called ``name``; an unknown name lists the known ones."""
    try:
        return SCHEDULE_KINDS[name]
    except KeyError:
        raise InvalidOptionError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}") from None


def warmup(kind: str, num_stages: int, num_microbatches: int, stage: int) -> int:
    return schedule_kind(kind).warmup(num_stages, num_microbatches, stage)


def compute_order(kind: str, num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The F/B order of one stage: warm-up forwards, then (B, F) pairs, then the drain."""
    w = warmup(kind, num_stages, num_microbatches, stage)
    order = [("F", m) for m in range(w)]
    for k in range(num_microbatches - w):
        order += [("B", k), ("F", w + k)]
    order += [("B", m) for m in range(num_microbatches - w, num_microbatches)]
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


class VScheduleKind(NamedTuple):
    """A schedule over two model chunks per stage placed in a V: its name, stage ``i``'s
    compute order (``order(S, M, i)``: (op, microbatch, chunk) with op F, B, BI or BW),
    the fewest microbatches it runs on ``S`` stages, and one line for listings."""

    name: str
    order: Callable[[int, int, int], list[tuple[str, int, int]]]
    min_microbatches: Callable[[int], int]
    summary: str


V_SCHEDULES: dict[str, VScheduleKind] = {k.name: k for k in (
    VScheduleKind("zb-v", zbv_order, lambda S: 1,
                  "two chunks per stage in a V, backward split, deferred weight gradients fill the gaps: "
                  "zero bubble at 1F1B's peak memory when F, BI and BW take equal time (Zero Bubble's ZB-V)"),
    VScheduleKind("dualpipev", dualpipev_order, lambda S: 2 * S,
                  "two chunks per stage in a V, the steady state pairs one chunk's forward with the "
                  "other's backward (DeepSeek's DualPipeV: DualPipe cut in half); M >= 2S"),
)}
"""Schedules over two model chunks per stage in a V (``placement="v"``: chunk 0 of stage
i is model stage i, chunk 1 is 2S - 1 - i, so the turn stays on the last stage). Each
has its own chunks (2), backward split and weight-gradient placement:
``generate(kind, S, M)``. DualPipeV needs M >= 2S (its steady state starts once every
stage holds both chunks' forwards; the authors assert ``num_chunks >= num_ranks * 2``);
ZB-V runs any M. The simulator, validator, memory model and the in-process runner
(``train.local_pipeline``) take them; the distributed trainer does not yet."""


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
        if not isinstance(v, int) or v <= 0:
            raise InvalidOptionError(f"number of {name} must be a positive integer, got {v!r}")


def _v_actions(order: list[tuple[str, int, int]], num_stages: int, stage: int) -> tuple[Action, ...]:
    """A V schedule's compute order with transfers placed as the other generators place
    them: ``RECV_F`` right before a forward and ``SEND_F`` right after it, ``RECV_B``
    right before a backward (``B`` or ``BI``) and ``SEND_B`` right after it, wherever
    the neighbouring model stage is on another stage. At the V's turn (chunk 0 of the
    last stage hands to its own chunk 1) nothing crosses a link, so there is none."""
    S = num_stages

    def mesh_of(v: int) -> int:  # V placement: model stage v on stage v, past the turn on 2S - 1 - v
        return v if v < S else 2 * S - 1 - v

    out: list[Action] = []
    for op, m, c in order:
        v = stage if c == 0 else 2 * S - 1 - stage
        before = v > 0 and mesh_of(v - 1) != stage
        after = v < 2 * S - 1 and mesh_of(v + 1) != stage
        if op == "BW":
            out.append(Action(ActionKind.BW, m, chunk=c))
            continue
        forward = op == "F"
        recv, send = (before, after) if forward else (after, before)
        if recv:
            out.append(Action(ActionKind.RECV_F if forward else ActionKind.RECV_B, m, chunk=c))
        out.append(Action(ActionKind(op), m, chunk=c))
        if send:
            out.append(Action(ActionKind.SEND_F if forward else ActionKind.SEND_B, m, chunk=c))
    return tuple(out)


def _generate_v(kind: str, num_stages: int, num_microbatches: int, delay_wgrad, chunks) -> Schedule:
    """A schedule of ``V_SCHEDULES``. Its chunks (2) and weight gradients are its own, so
    another ``chunks`` or any ``delay_wgrad`` is refused, naming the value."""
    _check_counts(num_stages, num_microbatches)
    if chunks not in (None, 2):
        raise InvalidOptionError(f"{kind} holds two model chunks per stage (in a V); chunks={chunks!r} "
                                 "does not apply: leave it out")
    if delay_wgrad is not None:
        raise InvalidOptionError(f"{kind} places its own weight gradients: delay_wgrad does not apply")
    family = V_SCHEDULES[kind]
    least = family.min_microbatches(num_stages)
    if num_microbatches < least:
        raise InvalidOptionError(f"{kind} needs at least {least} microbatches on {num_stages} stages, "
                                 f"got {num_microbatches}")
    return Schedule(tuple(_v_actions(family.order(num_stages, num_microbatches, i), num_stages, i)
                          for i in range(num_stages)), kind, "v")


def generate(kind: str, num_stages: int, num_microbatches: int, *, split_backward: bool = False,
             delay_wgrad: int | Sequence[int] | None = None, chunks: int | None = None) -> Schedule:
    """Build a schedule. ``delay_wgrad`` needs ``split_backward``; for a delay chosen by
    the cost model use ``weight_delay.auto_delay_schedule``. ``chunks``: model chunks per
    stage, given for the loop-placed schedules over virtual stages (``VIRTUAL_SCHEDULES``)
    only; the others have one, the V schedules (``V_SCHEDULES``) two of their own, and
    those split their backward as their authors do whatever ``split_backward`` says."""
    if kind in V_SCHEDULES:
        return _generate_v(kind, num_stages, num_microbatches, delay_wgrad, chunks)
    virtual = kind in VIRTUAL_SCHEDULES
    family = None if virtual else schedule_kind(kind)  # an unknown name fails before any other check
    _check_counts(num_stages, num_microbatches)
    if virtual:
        if not isinstance(chunks, int) or chunks < 2:
            raise InvalidOptionError(f"{kind} needs chunks >= 2 (model chunks per stage), got {chunks!r}")
        if num_microbatches % num_stages:
            raise InvalidOptionError(f"{kind} takes microbatches in groups of the {num_stages} stages: "
                                     f"{num_microbatches} microbatches is not a multiple of {num_stages}")
    elif chunks not in (None, 1):
        raise InvalidOptionError(f"{kind} has one model chunk per stage; chunks={chunks!r} needs one of "
                                 f"{', '.join(VIRTUAL_SCHEDULES)}")
    lagged = family is not None and family.wgrad_lag is not None  # the family places its own weight gradients
    if lagged and delay_wgrad is not None:
        raise InvalidOptionError(f"{kind} places its own weight gradients: delay_wgrad does not apply")
    if delay_wgrad is not None and not split_backward:
        raise InvalidOptionError("delay_wgrad needs split_backward (BW must be a separate action to delay it)")
    split_backward = split_backward or lagged
    S = num_stages
    C = chunks if virtual else 1
    V = S * C
    delays = [family.wgrad_lag(S, i) for i in range(S)] if lagged else _delays(delay_wgrad, S)

    def mesh_of(v: int) -> int:  # loop placement: model stage v on stage v mod S
        return v % S

    stages = []
    for i in range(S):
        out: list[Action] = []
        # [microbatch, actions still to wait, chunk]: compute actions for a delay, backwards for a lag
        pending: list[list[int]] = []

        def after_compute() -> None:
            for p in pending:
                p[1] -= 1
            while pending and pending[0][1] < 0:
                m_, _, c_ = pending.pop(0)
                out.append(Action(ActionKind.BW, m_, chunk=c_))

        order = (interleaved_order(S, num_microbatches, C, i) if virtual else
                 [(op, m, 0) for op, m in compute_order(kind, S, num_microbatches, i)])
        for op, m, c in order:
            v = c * S + i
            before = v > 0 and mesh_of(v - 1) != i   # the previous model stage is on another stage
            after = v < V - 1 and mesh_of(v + 1) != i
            if op == "F":
                if before:
                    out.append(Action(ActionKind.RECV_F, m, chunk=c))
                out.append(Action(ActionKind.F, m, chunk=c))
                if after:
                    out.append(Action(ActionKind.SEND_F, m, chunk=c))
                if not lagged:
                    after_compute()
                continue
            if after:
                out.append(Action(ActionKind.RECV_B, m, chunk=c))
            out.append(Action(ActionKind.BI if split_backward else ActionKind.B, m, chunk=c))
            if before:
                out.append(Action(ActionKind.SEND_B, m, chunk=c))
            if split_backward:
                pending.append([m, delays[i], c])
                pending.sort(key=lambda p: p[1])
            after_compute()
        out.extend(Action(ActionKind.BW, p[0], chunk=p[2]) for p in pending)
        stages.append(tuple(out))
    suffix = f" chunks={C}" if virtual else ""
    if split_backward and not lagged:
        suffix += " split" + (f" delay={delays}" if any(delays) else "")
    return Schedule(tuple(stages), kind + suffix)

