"""Side-by-side comparison of schedules under one set of costs (used by ``alpa-comm schedule``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidOptionError
from .generators import SCHEDULE_KINDS, SCHEDULES, VIRTUAL_SCHEDULES, chunks_for, generate, schedule_kind
from .ir import Schedule, edge_name
from .memory import memory
from .simulate import Costs, PipelineResult, simulate_schedule
from .weight_delay import auto_delay_schedule


def signal_bound(num_stages: int, num_microbatches: int, costs: Costs, kinds=SCHEDULES) -> float:
    """Best iteration time of any generated schedule (of ``kinds``) when transfers are free."""
    return min(simulate_schedule(generate(k, num_stages, num_microbatches, split_backward=s), costs,
                                 signal=True).iteration_time for k in kinds for s in (False, True)
               if not (s is False and schedule_kind(k).own_wgrad))


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


def check_options(kind: str, delay, chunks) -> None:
    """The options (``--delay-wgrad``: None, 'auto', N or one per stage; ``--model-chunks``)
    family ``kind`` takes, or the one it does not, named: what every front end checks
    before it builds anything."""
    family = schedule_kind(kind)
    if chunks is not None and family.chunks is not None and chunks != family.chunks:
        if family.virtual:
            raise InvalidOptionError(f"{family.name} holds {family.chunks} model chunks per stage of its own: "
                                     "--model-chunks does not apply")
        raise InvalidOptionError(f"--model-chunks applies to {', '.join(VIRTUAL_SCHEDULES)} only, not {family.name}")
    if family.own_wgrad and delay is not None:
        raise InvalidOptionError(f"{family.name} places its own weight gradients: --delay-wgrad does not apply")
    if family.virtual and delay == "auto":
        raise InvalidOptionError(f"--delay-wgrad auto is not available for {family.name} yet; give N")


def build(kind: str, num_stages: int, num_microbatches: int, costs: Costs, split: bool, delay,
          chunks: int | None = None) -> Variant:
    """One schedule as the CLI options describe it (``delay`` may be 'auto', an int or None;
    ``chunks``: model chunks per stage, for a family whose chunks are the caller's, default
    ``DEFAULT_CHUNKS``). Any registered family."""
    family = schedule_kind(kind)
    check_options(kind, delay, chunks)
    if family.own_wgrad:  # places its own weight gradients (and, in a V, its own two chunks)
        sched = generate(kind, num_stages, num_microbatches)
        return Variant(kind, sched, simulate_schedule(sched, costs))
    chunks = chunks_for(kind, chunks)
    split = split or delay is not None
    delays = None
    if delay == "auto":
        sched, rep = auto_delay_schedule(kind, num_stages, num_microbatches, costs)
        delays = rep["delays"]
        label = f"{kind} + split + auto delay {delays}"
    else:
        sched = generate(kind, num_stages, num_microbatches, split_backward=split, delay_wgrad=delay, chunks=chunks)
        label = kind + (f" x{chunks} chunks" if family.chunks is None else "") + (" + split" if split else "") + \
            (f" + delay {delay}" if delay else "")
    return Variant(label, sched, simulate_schedule(sched, costs), delays)


def compare(num_stages: int, num_microbatches: int, costs: Costs) -> list[Variant]:
    """Every family the sizes allow, in registry order: whole, split and auto-delayed
    backward where the caller places the weight gradients (over virtual stages: whole
    and split with delay 1, as auto delaying is not available there), as it is where
    the family places them."""
    out = []
    for kind, family in SCHEDULE_KINDS.items():
        if not family.runs_at(num_stages, num_microbatches):
            continue
        if family.own_wgrad:
            out.append(build(kind, num_stages, num_microbatches, costs, False, None))
        elif family.virtual:
            out.append(build(kind, num_stages, num_microbatches, costs, False, None))
            out.append(build(kind, num_stages, num_microbatches, costs, True, 1))
        else:
            out.append(build(kind, num_stages, num_microbatches, costs, False, None))
            out.append(build(kind, num_stages, num_microbatches, costs, True, None))
            out.append(build(kind, num_stages, num_microbatches, costs, True, "auto"))
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
