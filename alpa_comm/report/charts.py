"""Charts: suite bars in the style of the paper's Figures 5, 6 and 8, and a plan's Gantt chart."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._extras import require
from ..resharding.explain import fmt_seconds
from ..resharding.resources import INTRA, RECEIVE, SEND, host_and_side
from ..sim.simulate import SimResult


def suite_bars(cases: Sequence[str], methods: Sequence[str], seconds: dict[tuple[str, str], float],
               path: str | Path, title: str, ylabel: str = "seconds", bounds: dict[str, float] | None = None,
               log: bool = True) -> Path:
    """Grouped bars: one group per case, one bar per method; optional lower-bound ticks;
    a log axis by default (suites span orders of magnitude)."""
    matplotlib = require("matplotlib")  # optional: the extra 'plot' named when absent

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


MAX_GANTT_BARS = 4000
"""Above this many (transfer, NIC side) bars, or 64 hosts, a plan is drawn aggregated."""


def kind_colors() -> dict[str, str]:
    """One color per transfer kind, in registry order (a new kind gets its own)."""
    from ..resharding.kinds import TRANSFER_KINDS  # noqa: PLC0415

    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
               "#ff7f0e", "#7f7f7f", "#aec7e8", "#98df8a"]
    return {name: palette[i % len(palette)] for i, name in enumerate(TRANSFER_KINDS)}


def gantt_png(result: SimResult, path: str | Path, title: str = "") -> Path:
    """Hosts as rows (send side above, receive side below), bars colored by kind; a large
    plan (over ``MAX_GANTT_BARS`` bars or 64 hosts) as a heat map of NIC busy time per host
    and time bin, which draws in a second where bars would take minutes."""
    matplotlib = require("matplotlib")  # optional: the extra 'plot' named when absent

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    bars = [(e, *host_and_side(r)) for e in result.timeline for r in e.resources]
    bars = [(e, h, side) for e, h, side in bars if side != INTRA]
    hosts = sorted({h for _, h, _ in bars})
    heading = title or f"simulated timeline, makespan {fmt_seconds(result.makespan)}"
    if len(bars) > MAX_GANTT_BARS or len(hosts) > 64:
        fig = _busy_heatmap(plt, bars, hosts, result.makespan,
                            f"{heading}: {len(result.timeline):,} transfers on {len(hosts)} hosts, aggregated")
    else:
        fig = _bars(plt, bars, hosts, heading)
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bars(plt, bars, hosts, heading: str):
    colors = kind_colors()
    row = {h: i for i, h in enumerate(hosts)}
    fig, ax = plt.subplots(figsize=(11, 0.8 + 0.45 * max(1, len(hosts))))
    spans: dict[tuple[float, str], list[tuple[float, float]]] = {}
    for e, h, side in bars:
        y = row[h] + (0.42 if side == RECEIVE else 0.0)
        spans.setdefault((y, e.kind), []).append((e.start, e.end - e.start))
    for (y, kind), xs in spans.items():
        ax.broken_barh(xs, (y - 0.19, 0.38), facecolors=colors.get(kind, "#333333"), edgecolor="white",
                       linewidth=0.3)
    kinds = sorted({k for _, k in spans}, key=list(colors).index)
    ax.set_yticks([row[h] + 0.21 for h in hosts])
    ax.set_yticklabels([f"host {h}\n(send / receive)" for h in hosts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(heading, fontsize=9)
    if kinds:
        from matplotlib.patches import Patch  # noqa: PLC0415

        ax.legend(handles=[Patch(color=colors[k], label=k) for k in kinds], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars, never over them
    fig.tight_layout()
    return fig


def _busy_heatmap(plt, bars, hosts, makespan: float, heading: str, bins: int = 400):
    """Fraction of each time bin each host's send and receive side is busy."""
    import numpy as np  # noqa: PLC0415

    span = makespan or 1.0
    row = {h: i for i, h in enumerate(hosts)}
    fine = bins * 8
    grids = {}
    for side in ("send", "receive"):
        pick = [(row[h], e.start, e.end) for e, h, s in bars if (s == SEND) == (side == "send")]
        diff = np.zeros((len(hosts), fine + 1))
        if pick:
            r, a, b = (np.array(x) for x in zip(*pick))
            np.add.at(diff, (r, np.clip((a / span * fine).astype(int), 0, fine)), 1)
            np.add.at(diff, (r, np.clip((b / span * fine).astype(int), 0, fine)), -1)
        busy = np.minimum(np.cumsum(diff, axis=1)[:, :fine], 1.0)
        grids[side] = busy.reshape(len(hosts), bins, 8).mean(axis=2)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, (side, grid) in zip(axes, grids.items()):
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1,
                       extent=(0, span, len(hosts) - 0.5, -0.5))
        ax.set_title(f"NIC {side} side", fontsize=9)
        ax.set_xlabel("seconds")
    axes[0].set_ylabel(f"host (rows: {hosts[0]}..{hosts[-1]})" if hosts else "host")
    fig.colorbar(im, ax=axes, fraction=0.03, label="fraction of the time bin busy")
    fig.suptitle(heading, fontsize=9)
    return fig


def loss_png(losses, path: str | Path, title: str, window: int = 10) -> Path:
    """A training loss curve, with its running mean over ``window`` steps."""
    matplotlib = require("matplotlib")  # optional: the extra 'plot' named when absent

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
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
