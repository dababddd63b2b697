"""Choosing the schedule for the measured regime (``--schedule auto``).

Which schedule wins depends on the ratio of transfer to compute on each edge, on skip
connections and on memory: ZB-H1 wins where transfers are free, eager-1F1B with a
weight-gradient delay where they are not, a V schedule where the fill dominates and
the runner holds two chunks per stage. No rule of thumb covers every regime, but the
simulator does: every candidate family is built, given the runner's edges, predicted
with the costs the caller measured, and ranked; the fastest that fits the memory cap
wins. The caller supplies the two steps that depend on where it runs (how a candidate
becomes the runnable schedule, e.g. with a model's skip edges, and how a schedule's
time is predicted, e.g. a Monte Carlo over measured durations), so this module stays
pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import InvalidOptionError
from ..validation import non_negative_number, positive_number
from .generators import SCHEDULE_KINDS, chunks_for, generate
from .ir import Schedule
from .memory import memory
from .simulate import Costs
from .weight_delay import auto_backward

TIE = 0.005
"""Predicted times within this fraction of the fastest that fits count as a tie with it,
broken by the lower peak memory, then by the simpler schedule (fewer programs: whole
backwards first)."""


@dataclass(frozen=True)
class Candidate:
    """One schedule ``auto`` considers: a family and its options, as ``generate`` takes them."""

    label: str
    kind: str
    split_backward: bool = False
    delay_wgrad: tuple[int, ...] | None = None
    chunks: int | None = None

    def generate(self, num_stages: int, num_microbatches: int) -> Schedule:
        return generate(self.kind, num_stages, num_microbatches, split_backward=self.split_backward,
                        delay_wgrad=None if self.delay_wgrad is None else list(self.delay_wgrad), chunks=self.chunks)


def candidates(num_stages: int, num_microbatches: int, costs: Costs, virtual: bool = False) -> list[Candidate]:
    """Every family the runner can run: each one-chunk family with its backward whole and,
    where the cost model finds a weight-gradient delay that helps (``auto_backward``),
    with that delay; ZB-H1 as it is; with ``virtual`` (a runner that holds several model
    chunks per stage) also the V schedules and interleaved 1F1B where the microbatch
    count allows them."""
    S, M = num_stages, num_microbatches
    out: list[Candidate] = []
    for kind, family in SCHEDULE_KINDS.items():
        if family.virtual:
            continue
        out.append(Candidate(kind, kind))
        if family.own_wgrad:  # ZB-H1 places its own weight gradients
            continue
        delays = auto_backward(kind, S, M, costs)
        if delays is not None:
            out.append(Candidate(f"{kind} + delay {list(delays)}", kind, True, tuple(delays)))
    if virtual:  # the V schedules first, then those whose chunks are the caller's
        for kind, family in sorted(SCHEDULE_KINDS.items(), key=lambda kv: kv[1].chunks is None):
            if family.virtual and family.runs_at(S, M):
                chunks = chunks_for(kind)
                out.append(Candidate(kind if chunks is None else f"{kind} x{chunks} chunks", kind, chunks=chunks))
    return out


@dataclass(frozen=True)
class Ranked:
    """A candidate with its runnable schedule, predicted iteration time and peak memory
    (the largest stage's peak live activations, in whole-stage microbatches)."""

    candidate: Candidate
    schedule: Schedule
    predicted_s: float
    peak_activations: float
    fits: bool


def check_memory_cap(memory_cap) -> None:
    """A cap is a positive, finite number of whole-stage microbatches (or None: no cap)."""
    if memory_cap is not None:
        positive_number(memory_cap, "memory cap", unit="microbatches per stage")


def rank(cands: Sequence[Candidate], num_stages: int, num_microbatches: int,
         predict: Callable[[Schedule], float], runnable: Callable[[Schedule], Schedule] = lambda s: s,
         memory_cap: float | None = None, wgrad_fraction: float = 0.5) -> list[Ranked]:
    """Every candidate built (``runnable`` turns the generated schedule into the one the
    runner executes, e.g. adding skip edges, and may validate it), predicted and sorted:
    those that fit ``memory_cap`` (peak live activations per stage, whole-stage
    microbatches) first, then by predicted time, ties (``TIE``) by peak memory and then
    fewer programs. ``wgrad_fraction``: the share of a microbatch's activation state its
    weight-gradient half keeps after ``BI`` (``memory``'s; a runner that measured it
    passes its own)."""
    check_memory_cap(memory_cap)
    out = []
    for c in cands:
        sched = runnable(c.generate(num_stages, num_microbatches))
        peak = max(m.peak_activations for m in memory(sched, wgrad_fraction))
        out.append(Ranked(c, sched, float(predict(sched)), peak, memory_cap is None or peak <= memory_cap + 1e-9))
    best = min((r.predicted_s for r in out if r.fits), default=0.0)

    def key(r: Ranked):
        tied = r.predicted_s <= best * (1 + TIE)
        # a whole backward (one action to dispatch and record) before a split one (two)
        return (not r.fits, not tied, r.predicted_s if not tied else 0.0, r.peak_activations,
                r.schedule.split_backward, r.predicted_s)
    return sorted(out, key=key)


def choose(ranked: Sequence[Ranked]) -> Ranked:
    """The first ranked candidate; an error naming the cap and the least peak when none fits."""
    if not ranked:
        raise InvalidOptionError("no schedule to choose from")
    if not ranked[0].fits:
        least = min(r.peak_activations for r in ranked)
        raise InvalidOptionError(f"no schedule fits the memory cap: the least peak of any candidate is {least:g} "
                                 f"microbatches per stage ({min(ranked, key=lambda r: r.peak_activations).candidate.label})")
    return ranked[0]


TRIAL_MARGIN = 0.2
"""``finalists``: candidates predicted within this fraction of the fastest that fits are
measured before the pick. The predictor draws each action's time from runs of other
schedules, and how busy a schedule keeps its hosts changes those times: on the emulated
cluster the measured fastest was predicted up to 1.16x the predicted pick (GPT, 200
Mbit/s: ZB-H1 predicted 1.13-1.16x eager-1F1B, measured 0.95-0.98x), and single
predictions erred by up to 25 % against each other (U-Transformer, 200 Mbit/s: ZB-V
predicted 1.26x DualPipeV, measured 1.01x), so the margin is wider than the first."""


def check_trial_margin(margin) -> None:
    """A trial margin is a finite fraction >= 0 (not a bool)."""
    non_negative_number(margin, "trial margin")


def finalists(ranked: Sequence[Ranked], margin: float = TRIAL_MARGIN) -> list[Ranked]:
    """The candidates worth measuring: those that fit the cap, predicted within ``margin``
    of the fastest that fits, in ranked order. The predicted pick (``choose``) and its
    ties are always among them: ``rank`` counts times within ``TIE`` as a tie, so a
    margin below it is taken as ``TIE``."""
    check_trial_margin(margin)
    fit = [r for r in ranked if r.fits]
    if not fit:
        return []
    best = min(r.predicted_s for r in fit)
    return [r for r in fit if r.predicted_s <= best * (1 + max(margin, TIE)) + 1e-12]


TRIAL_ROUNDS = 3
"""``contenders``: a trial measures again, in rounds, the finalists its steps cannot yet
tell from the fastest, at most this many rounds in all. On the emulated cluster two
steps of one schedule differ by up to 12 % (U-Transformer, 200 Mbit/s: ZB-V's calibration
steps 9.43, 9.98 and 10.60 s), so one round of two steps cannot order schedules a few
percent apart: DualPipeV measured 0.9 % faster than ZB-V in such a round and ran 8 %
slower over the benchmark's repeats that followed."""

SEPARATION = 2.0
"""Standard errors by which a finalist's median must trail the leader's before ``contenders``
lets it go."""


def contenders(steps: dict[str, Sequence[float]]) -> list[str]:
    """Of the measured finalists (label -> every step time measured for it, over all
    rounds), those still in contention: the leader (the lowest median) and every one whose
    median is not ``SEPARATION`` standard errors behind it (ties included). The noise is
    pooled from all of them: each step's relative deviation from its own finalist's
    median (a finalist with one step adds none; with no spread measured at all, every
    finalist strictly behind the leader is let go). The standard error is a mean's,
    sqrt(1/n_a + 1/n_b) times that noise, applied to medians: an approximate test (a
    median's error is about 1.25x a mean's for normal noise, so the bar is nearer 1.6 of
    its standard errors), kept simple because a few steps cannot give more. Returns
    labels, the leader first, then by median."""
    import math  # noqa: PLC0415
    from statistics import median  # noqa: PLC0415

    meds = {k: median(v) for k, v in steps.items() if v}
    if not meds:
        return []
    order = sorted(meds, key=lambda k: meds[k])
    spread = [k for k, v in steps.items() if len(v) > 1]
    devs = [x / meds[k] - 1.0 for k in spread for x in steps[k]]
    sigma = math.sqrt(sum(d * d for d in devs) / max(1, len(devs) - len(spread))) if devs else 0.0
    lead = order[0]
    out = [lead]
    for k in order[1:]:
        se = sigma * math.sqrt(1.0 / len(steps[k]) + 1.0 / len(steps[lead])) * meds[lead]
        if meds[k] - meds[lead] <= SEPARATION * se:
            out.append(k)
    return out


def choose_measured(ranked: Sequence[Ranked], measured: dict[str, float]) -> Ranked:
    """The pick after a trial: of the candidates with a measured iteration time
    (``measured``: candidate label -> seconds), the fastest; times within ``TIE`` of it
    go to the lower peak memory, then to the earlier ranked. Without any measurement,
    the predicted pick (``choose``). Each time is a median over a few steps (a calibration
    run's steps count; ``contenders`` decides who gets more), taken minutes apart:
    finalists the steps cannot separate are within the machine's noise of each other,
    so the pick is as good as that."""
    timed = [(k, r) for k, r in enumerate(ranked) if r.candidate.label in measured and r.fits]
    if not timed:
        return choose(ranked)
    best = min(measured[r.candidate.label] for _, r in timed)
    tied = [(k, r) for k, r in timed if measured[r.candidate.label] <= best * (1 + TIE)]
    return min(tied, key=lambda kr: (kr[1].peak_activations, kr[0]))[1]


HEADERS = ["schedule", "predicted time", "x fastest", "peak activations", "fits cap", "pick"]
"""The ranking's columns: the predicted time is in the costs' unit (seconds where they were
measured), "x fastest" relative to the fastest candidate that fits the cap."""


MEASURED_HEADERS = ["measured time", "measured in"]
"""With a trial, two more columns before "pick": each finalist's measured iteration time
and where its steps came from (a calibration run of the same schedule, trial rounds, or
both: "calibration + trial x2")."""


def table_rows(ranked: Sequence[Ranked], measured: dict[str, tuple[float, str]] | None = None,
               pick: Ranked | None = None) -> list[list[str]]:
    """Rows for ``report.tables.table``: the ranking as printed, the pick marked (``pick``,
    default the first ranked). With ``measured`` (label -> (seconds, where)), the
    ``MEASURED_HEADERS`` columns too, "-" for a candidate not measured."""
    best = min((r.predicted_s for r in ranked if r.fits), default=0.0)
    if pick is None:
        pick = ranked[0] if ranked and ranked[0].fits else None
    rows = []
    for r in ranked:
        row = [r.candidate.label, f"{r.predicted_s:.4g}", f"{r.predicted_s / best:.3f}" if best else "-",
               f"{r.peak_activations:g}", "yes" if r.fits else "no"]
        if measured is not None:
            got = measured.get(r.candidate.label)
            row += [f"{got[0]:.4g}", got[1]] if got else ["-", "-"]
        rows.append(row + ["<-" if r is pick else ""])
    return rows
