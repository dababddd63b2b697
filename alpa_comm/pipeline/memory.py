"""Memory model: live activations per stage, in units of one microbatch's activations
of a whole stage (with virtual stages, a chunk's are 1/C of that).

``F m`` stores one unit; a full backward ``B m`` frees it. With split
backward, ``BI m`` frees all but ``wgrad_fraction`` of it — the layer inputs
and output gradients the weight gradient still needs — and ``BW m`` frees the
rest; the number of microbatches waiting for their ``BW`` is the delayed
weight-gradient state.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import ActionKind, Schedule

DEFAULT_WGRAD_FRACTION = 0.5


@dataclass(frozen=True)
class StageMemory:
    peak_activations: float     # units of one microbatch's activations
    peak_pending_wgrad: int     # microbatches with BI done, BW not yet
    profile: tuple[float, ...]  # live units after each action of the stage


def memory(schedule: Schedule, wgrad_fraction: float = DEFAULT_WGRAD_FRACTION) -> list[StageMemory]:
    """Per stage; with virtual stages one chunk's microbatch is 1/C of a unit (a stage's
    C chunks together hold what one unvirtualized stage holds)."""
    out = []
    unit = 1.0 / schedule.num_chunks
    for acts in schedule.stages:
        live, pending, peak, peak_pending, prof = 0.0, 0, 0.0, 0, []
        for a in acts:
            if a.kind is ActionKind.F:
                live += unit
            elif a.kind is ActionKind.B:
                live -= unit
            elif a.kind is ActionKind.BI:
                live -= (1 - wgrad_fraction) * unit
                pending += 1
            elif a.kind is ActionKind.BW:
                live -= wgrad_fraction * unit
                pending -= 1
            peak = max(peak, live)
            peak_pending = max(peak_pending, pending)
            prof.append(live)
        out.append(StageMemory(round(peak, 9), peak_pending, tuple(prof)))
    return out
