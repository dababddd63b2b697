"""Bar charts of suite results in the style of the paper's Figures 5, 6 and 8."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


def suite_bars(cases: Sequence[str], methods: Sequence[str], seconds: dict[tuple[str, str], float],
               path: str | Path, title: str, ylabel: str = "seconds", bounds: dict[str, float] | None = None) -> Path:
    """Grouped bars: one group per case, one bar per method; optional lower-bound ticks."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 2), 3.8))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        xs = [c + (i - (len(methods) - 1) / 2) * width for c in range(len(cases))]
        ax.bar(xs, [seconds.get((case, m), 0.0) for case in cases], width, label=m)
    if bounds:
        for c, case in enumerate(cases):
            if case in bounds:
                ax.hlines(bounds[case], c - 0.45, c + 0.45, colors="black", linestyles="dashed", linewidth=0.8,
                          label="lower bound" if c == 0 else None)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
