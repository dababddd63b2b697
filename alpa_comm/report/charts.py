"""Charts: suite bars in the style of the paper's Figures 5, 6 and 8, and a plan's Gantt chart."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..sim.simulate import SimResult


def suite_bars(cases: Sequence[str], methods: Sequence[str], seconds: dict[tuple[str, str], float],
               path: str | Path, title: str, ylabel: str = "seconds", bounds: dict[str, float] | None = None,
               log: bool = True) -> Path:
    """Grouped bars: one group per case, one bar per method; optional lower-bound ticks;
    a log axis by default (suites span orders of magnitude)."""
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
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


KIND_COLORS = {
    "broadcast": "#1f77b4", "send_recv": "#d62728", "local_allgather": "#2ca02c", "global_allgather": "#9467bd",
    "local_copy": "#8c8c8c", "allgather": "#ff7f0e", "signal": "#17becf",
}


def gantt_png(result: SimResult, path: str | Path, title: str = "") -> Path:
    """Hosts as rows (send side above, receive side below), bars colored by kind."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    hosts = sorted({(r // 3) for e in result.timeline for r in e.resources})
    row = {h: i for i, h in enumerate(hosts)}
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * max(1, len(hosts))))
    used = set()
    for e in result.timeline:
        for res in e.resources:
            h, kind = divmod(res, 3)
            y = row[h] + (0.0 if kind == 0 else 0.42 if kind == 1 else 0.21)
            ax.barh(y, e.end - e.start, left=e.start, height=0.38 if kind < 2 else 0.2,
                    color=KIND_COLORS.get(e.kind, "#333333"), edgecolor="white", linewidth=0.3,
                    label=e.kind if e.kind not in used else None)
            used.add(e.kind)
    ax.set_yticks([row[h] + 0.21 for h in hosts])
    ax.set_yticklabels([f"host {h}\n(send / receive)" for h in hosts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(title or f"simulated timeline, makespan {result.makespan:.3f} s", fontsize=9)
    if used:
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def loss_png(losses, path: str | Path, title: str, window: int = 10) -> Path:
    """A training loss curve, with its running mean over ``window`` steps."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.2))
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss")
    if len(losses) >= window:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, lw=1.6, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
