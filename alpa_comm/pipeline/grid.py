"""A schedule drawn as a grid around the actions an error points at (pure): the
validator's and the simulator's errors carry it, as torch.distributed.pipelining's
validator draws the pipeline order with the failing step marked."""
from __future__ import annotations

from .ir import Schedule, ScheduleError

GRID_WINDOW = 4
"""Actions drawn either side of the marked ones in ``draw_grid``."""


def draw_grid(schedule: Schedule, marks, window: int = GRID_WINDOW) -> str:
    """The schedule as a grid, a row per stage and a column per action index, around the
    ``marks`` ((stage, action index) pairs, or (stage, None) for a whole stage): a marked
    action is drawn ``>F3<``, a marked stage ``> stage i``, ``...`` where the grid is cut.
    What ``ScheduleError.grid`` holds, after torch.distributed.pipelining's validator."""
    marks = set(marks)
    rows = schedule.stages
    at = [k for _, k in marks if k is not None]
    longest = max((len(r) for r in rows), default=0)
    lo = max(0, min(at) - window) if at else 0
    hi = min(longest, max(at) + window + 1 if at else 2 * window + 1)
    cells = [[f">{r[k]}<" if (i, k) in marks else str(r[k]) if k < len(r) else "" for k in range(lo, hi)]
             for i, r in enumerate(rows)]
    widths = [max([len(str(lo + j))] + [len(c[j]) for c in cells]) for j in range(hi - lo)]
    labels = [("> " if (i, None) in marks else "  ") + f"stage {i}" for i in range(len(rows))]
    left, right = ("... " if lo else ""), (" ..." if hi < longest else "")
    width = max((len(x) for x in labels), default=0)

    def line(label: str, texts) -> str:
        return f"{label.ljust(width)} | {left}" + " ".join(t.rjust(w) for t, w in zip(texts, widths)) + right
    return "\n".join([line("  action", [str(lo + j) for j in range(hi - lo)])]
                     + [line(lab, c) for lab, c in zip(labels, cells)])


def schedule_error(schedule: Schedule, message: str, *marks) -> ScheduleError:
    """A ``ScheduleError`` with ``message`` (one line, as the CLI prints it) and the grid
    around ``marks`` (see ``draw_grid``) as its ``grid`` and a traceback note."""
    e = ScheduleError(message)
    e.grid = draw_grid(schedule, marks)
    e.__notes__ = [e.grid]
    return e
