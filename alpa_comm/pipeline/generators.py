"""Schedule generators: GPipe, 1F1B and eager-1F1B, optionally with split and delayed backward.

All three share one shape: stage i runs W_i warm-up forwards, then alternates
one backward and one forward, then drains the remaining backwards.

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
"""Schedules over virtual stages (``generate(..., chunks=C)``). The simulator, validator
and memory model take them; the trainer and the CLI's listings do not yet."""


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


def generate(kind: str, num_stages: int, num_microbatches: int, *, split_backward: bool = False,
             delay_wgrad: int | Sequence[int] | None = None, chunks: int = 1) -> Schedule:
    """Build a schedule. ``delay_wgrad`` needs ``split_backward``; for a delay chosen by
    the cost model use ``weight_delay.auto_delay_schedule``. ``chunks``: model chunks per
    stage, for the schedules over virtual stages (``VIRTUAL_SCHEDULES``) only."""
    virtual = kind in VIRTUAL_SCHEDULES
    family = None if virtual else schedule_kind(kind)  # an unknown name fails before any other check
    for name, v in (("stages", num_stages), ("microbatches", num_microbatches)):
        if not isinstance(v, int) or v <= 0:
            raise InvalidOptionError(f"number of {name} must be a positive integer, got {v!r}")
    if virtual:
        if not isinstance(chunks, int) or chunks < 2:
            raise InvalidOptionError(f"{kind} needs chunks >= 2 (model chunks per stage), got {chunks!r}")
        if num_microbatches % num_stages:
            raise InvalidOptionError(f"{kind} takes microbatches in groups of the {num_stages} stages: "
                                     f"{num_microbatches} microbatches is not a multiple of {num_stages}")
    elif chunks != 1:
        raise InvalidOptionError(f"{kind} has one model chunk per stage; chunks={chunks!r} needs one of "
                                 f"{', '.join(VIRTUAL_SCHEDULES)}")
    lagged = family is not None and family.wgrad_lag is not None  # the family places its own weight gradients
    if lagged and delay_wgrad is not None:
        raise InvalidOptionError(f"{kind} places its own weight gradients: delay_wgrad does not apply")
    if delay_wgrad is not None and not split_backward:
        raise InvalidOptionError("delay_wgrad needs split_backward (BW must be a separate action to delay it)")
    split_backward = split_backward or lagged
    S = num_stages
    C = chunks
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

