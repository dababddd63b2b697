"""Timeline exports: Chrome trace JSON (opens in Perfetto / chrome://tracing) and a PNG Gantt chart."""
from __future__ import annotations

import json
from pathlib import Path

from ..resharding.strategies import describe_resource
from .simulate import SimResult

KIND_COLORS = {
    "broadcast": "#1f77b4", "send_recv": "#d62728", "local_allgather": "#2ca02c", "global_allgather": "#9467bd",
    "local_copy": "#8c8c8c", "allgather": "#ff7f0e", "signal": "#17becf",
}


def chrome_trace(result: SimResult) -> dict:
    """One process per host, one thread per host resource (tx, rx, intra)."""
    events = []
    seen = set()
    for e in result.timeline:
        for res in e.resources:
            host, kind = divmod(res, 3)
            tid = kind
            if (host, tid) not in seen:
                seen.add((host, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": host, "tid": tid,
                               "args": {"name": describe_resource(res).split(".")[1]}})
                events.append({"ph": "M", "name": "process_name", "pid": host, "tid": tid,
                               "args": {"name": f"host {host}"}})
            events.append({"ph": "X", "name": f"{e.kind} task {e.task}", "cat": e.kind, "pid": host, "tid": tid,
                           "ts": e.start * 1e6, "dur": max(0.0, e.end - e.start) * 1e6,
                           "args": {"transfer": e.transfer, "bytes": e.nbytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: SimResult, path: str | Path) -> Path:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(chrome_trace(result)))
    tmp.replace(path)  # never leave a half-written trace behind
    return path


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
    ax.set_yticklabels([f"host {h}\n(tx / rx)" for h in hosts], fontsize=7)
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
