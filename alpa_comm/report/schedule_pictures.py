"""Pictures of a simulated schedule: ASCII in the terminal, a PNG like the paper's
Figure 4 (rows = stages, colors = F/B/BI/BW, transfers drawn). Chrome traces: ``report.trace``."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._extras import require
from ..pipeline.simulate import PipelineResult

COLORS = {"F": "#4c72b0", "B": "#dd8452", "BI": "#c44e52", "BW": "#8172b3"}


def _label(e) -> str:
    chunk = getattr(e, "chunk", 0)
    return f"{e.kind if e.kind in ('F', 'B') else e.kind.lower()}{e.mb}" + (f".{chunk}" if chunk else "")


def ascii_timeline(result: PipelineResult, num_stages: int, quantum: float | None = None, width: int = 160) -> str:
    """One row per stage; each compute action printed as its label over its duration,
    idle time as '.'.

    Lossless: time is scaled to fit ``width`` characters only while every action still
    gets a column per character of its label plus one; otherwise the rows grow wider
    (the legend says so) rather than letting short actions overwrite each other."""
    if not result.events:
        return ""
    if quantum is None:
        timed = [e for e in result.events if e.end > e.start]
        longest = max(len(_label(e)) for e in result.events)
        shortest = min((e.end - e.start for e in timed), default=result.iteration_time or 1.0)
        quantum = min((result.iteration_time or shortest) / width, shortest / (longest + 1))
    q = quantum
    cols = int(round(result.iteration_time / q)) + 1
    rows = []
    for i in range(num_stages):
        line = ["."] * cols
        for e in (e for e in result.events if e.stage == i):
            a, b = int(round(e.start / q)), max(int(round(e.start / q)) + 1, int(round(e.end / q)))
            line[a:b] = list(_label(e)[:b - a].ljust(b - a, "="))
        rows.append(f"stage {i} |" + "".join(line))
    wide = f"; widened to {cols} columns so every action shows" if cols > width + 1 else ""
    legend = f"(1 column = {q:g} time units{wide}; F forward, B backward, bi input-grad, bw weight-grad, . idle)"
    return "\n".join(rows + [legend])


def timeline_png(panels: Sequence[tuple[str, PipelineResult, int]], path: str | Path) -> Path:
    """One panel per (title, result, num_stages), stacked, on a shared time axis."""
    matplotlib = require("matplotlib")  # optional: the extra 'plot' named when absent

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    tmax = max(r.iteration_time for _, r, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 0.7 + 0.55 * sum(s for _, _, s in panels)), squeeze=False)
    for ax, (title, res, S) in zip(axes[:, 0], panels):
        for e in res.events:
            ax.barh(e.stage, e.end - e.start, left=e.start, height=0.62, color=COLORS[e.kind], edgecolor="white",
                    linewidth=0.5)
            if e.end - e.start >= tmax / 90:
                ax.text((e.start + e.end) / 2, e.stage, str(e.mb), ha="center", va="center", fontsize=6,
                        color="white")
        for t in res.transfers:
            if t.end > t.start:
                y = t.src + (0.38 if t.dst > t.src else -0.38)
                ax.plot([t.start, t.end], [y, y], color="#555555", linewidth=2, solid_capstyle="butt")
        ax.set_yticks(range(S))
        ax.set_yticklabels([f"stage {i}" for i in range(S)], fontsize=7)
        ax.set_ylim(S - 0.45, -0.55)
        ax.set_xlim(0, tmax * 1.01)
        ax.set_title(f"{title}: iteration {res.iteration_time:g}, bubble {100 * res.bubble_fraction:.0f} %",
                     fontsize=8, loc="left")
    handles = [Patch(color=c, label=k) for k, c in COLORS.items()]
    handles.append(Patch(color="#555555", label="transfer (under a row: to the next stage, over it: to the previous)"))
    axes[0, 0].legend(handles=handles, fontsize=6, ncol=5, loc="lower right", bbox_to_anchor=(1.0, 1.12))
    axes[-1, 0].set_xlabel("time")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
