"""Side-by-side comparison of schedules under one set of costs (used by ``alpa-comm schedule``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidOptionError
from .generators import SCHEDULES, V_SCHEDULES, VIRTUAL_SCHEDULES, generate, schedule_kind
from .ir import Schedule, edge_name
from .memory import memory
from .simulate import Costs, PipelineResult, simulate_schedule
from .weight_delay import auto_delay_schedule


def signal_bound(num_stages: int, num_microbatches: int, costs: Costs, kinds=SCHEDULES) -> float:
    """Best iteration time of any generated schedule (of ``kinds``) when transfers are free."""
    return min(simulate_schedule(generate(k, num_stages, num_microbatches, split_backward=s), costs,
                                 signal=True).iteration_time for k in kinds for s in (False, True)
               if not (s is False and schedule_kind(k).wgrad_lag))


def comm_limit(num_stages: int, num_microbatches: int, costs: Costs) -> float:
    """The fill and drain transfers are on every schedule's critical path: the first
    microbatch crosses S-1 boundaries forward and the last one S-1 backward, each
    transfer at its edge's time where ``costs.t_edge`` names it, else its sender's."""
    c = costs.resolve(num_stages)
    edges = costs.edge_times(num_stages)
    fill = sum(edges.get(edge_name("F", i, i + 1), c["comm"][i])
               + edges.get(edge_name("B", i + 1, i), c["comm_b"][i + 1]) for i in range(num_stages - 1))
    return signal_bound(num_stages, num_microbatches, costs) + fill


@dataclass
class Variant:
    label: str
    schedule: Schedule
    result: PipelineResult
    delays: list[int] | None = None


def build(kind: str, num_stages: int, num_microbatches: int, costs: Costs, split: bool, delay,
          chunks: int | None = None) -> Variant:
    """One schedule as the CLI options describe it (``delay`` may be 'auto', an int or None;
    ``chunks``: model chunks per stage, for a schedule over virtual stages)."""
    delays = None
    if kind in V_SCHEDULES:  # two chunks in a V, split and weight gradients of their own
        if delay is not None or chunks not in (None, 2):
            raise InvalidOptionError(f"{kind} places its own two chunks and weight gradients: "
                                     "--delay-wgrad and --model-chunks do not apply")
        sched = generate(kind, num_stages, num_microbatches)
        return Variant(kind, sched, simulate_schedule(sched, costs))
    if kind in VIRTUAL_SCHEDULES:
        if delay == "auto":
            raise InvalidOptionError(f"--delay-wgrad auto is not available for {kind} yet; give N")
        c = chunks or 2
        sched = generate(kind, num_stages, num_microbatches, split_backward=split or delay is not None,
                         delay_wgrad=delay, chunks=c)
        label = f"{kind} x{c} chunks" + (" + split" if split or delay is not None else "") + \
            (f" + delay {delay}" if delay else "")
        return Variant(label, sched, simulate_schedule(sched, costs))
    if chunks is not None:
        raise InvalidOptionError(f"--model-chunks applies to {', '.join(VIRTUAL_SCHEDULES)} only, not {kind}")
    if schedule_kind(kind).wgrad_lag is not None:  # places its own weight gradients
        if delay is not None:
            raise InvalidOptionError(f"{kind} places its own weight gradients: --delay-wgrad does not apply")
        sched = generate(kind, num_stages, num_microbatches)
        return Variant(kind, sched, simulate_schedule(sched, costs))
    if delay == "auto":
        sched, rep = auto_delay_schedule(kind, num_stages, num_microbatches, costs)
        delays = rep["delays"]
        label = f"{kind} + split + auto delay {delays}"
    else:
        sched = generate(kind, num_stages, num_microbatches, split_backward=split or delay is not None,
                         delay_wgrad=delay)
        label = kind + (" + split" if split or delay is not None else "") + (f" + delay {delay}" if delay else "")
    return Variant(label, sched, simulate_schedule(sched, costs), delays)


def compare(num_stages: int, num_microbatches: int, costs: Costs) -> list[Variant]:
    out = []
    for kind in SCHEDULES:
        if schedule_kind(kind).wgrad_lag is not None:
            out.append(build(kind, num_stages, num_microbatches, costs, True, None))
            continue
        out.append(build(kind, num_stages, num_microbatches, costs, False, None))
        out.append(build(kind, num_stages, num_microbatches, costs, True, None))
        out.append(build(kind, num_stages, num_microbatches, costs, True, "auto"))
    if num_microbatches % num_stages == 0:  # interleaved 1F1B takes microbatches in groups of S
        for kind in VIRTUAL_SCHEDULES:
            out.append(build(kind, num_stages, num_microbatches, costs, False, None, 2))
            out.append(build(kind, num_stages, num_microbatches, costs, True, 1, 2))
    for kind, family in V_SCHEDULES.items():
        if num_microbatches >= family.min_microbatches(num_stages):
            out.append(build(kind, num_stages, num_microbatches, costs, False, None))
    return out


def rows(variants: list[Variant], num_microbatches: int, bound: float) -> list[list[str]]:
    out = []
    for v in variants:
        mem = memory(v.schedule)
        out.append([v.label, f"{v.result.iteration_time:g}", f"{bound / v.result.iteration_time:.3f}",
                    f"{100 * v.result.bubble_fraction:.1f} %",
                    " ".join(f"{m.peak_activations:g}" for m in mem)])
    return out


HEADERS = ["schedule", "iteration time", "x signal bound (throughput)", "bubble", "peak activations per stage"]
