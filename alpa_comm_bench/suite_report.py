"""A simulated reference suite for people: tables, and the files of a run (markdown,
JSON, bar chart)."""
from __future__ import annotations

import json
from pathlib import Path

from alpa_comm.report.charts import suite_bars
from alpa_comm.report.tables import table
from alpa_comm.resharding.explain import fmt_bytes, fmt_seconds
from alpa_comm.topology import ClusterSpec

from .simulated import Row


def suite_table(rows: list[Row]) -> str:
    base = {(r.case, r.method): r.seconds for r in rows}
    out = []
    for r in rows:
        vs = []
        for b in ("alpa_send_recv", "alpa"):
            if (r.case, b) in base:
                vs.append(f"{base[(r.case, b)] / r.seconds:.2f}x")
        out.append([r.case, r.method, fmt_seconds(r.seconds), f"{r.gbps:.2f}",
                    f"{r.seconds / r.lower_bound:.2f}" if r.lower_bound else "-", *vs])
    headers = ["case", "method", "simulated", "effective Gbit/s", "x lower bound"]
    if any((r.case, "alpa_send_recv") in base for r in rows):
        headers.append("speedup vs alpa_send_recv")
    headers.append("speedup vs alpa")
    return table(headers, out)


def wide_table(rows: list[Row]) -> str:
    cases = list(dict.fromkeys(r.case for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows))
    by = {(r.case, r.method): r for r in rows}
    out = []
    for c in cases:
        any_row = by[(c, methods[0])]
        out.append([c, fmt_bytes(any_row.nbytes), fmt_seconds(any_row.lower_bound)]
                   + [fmt_seconds(by[(c, m)].seconds) for m in methods])
    return table(["case", "size", "lower bound", *methods], out)


def baseline_note(rows: list[Row]) -> str:
    """Where the Alpa baselines of ``rows`` came from (one line; empty without them)."""
    sources = dict.fromkeys(f"{r.method}: {r.source}" for r in rows if r.source)
    return "Alpa baselines from " + "; ".join(sources) if sources else ""


def write_suite_outputs(name: str, rows: list[Row], cluster: ClusterSpec, out_dir: Path) -> dict[str, Path]:
    """The simulated suite as markdown tables, JSON and a bar chart PNG in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    md = out_dir / f"{stem}.md"
    note = baseline_note(rows)
    md.write_text(f"# Simulated {name} suite\n\nCluster: {cluster.describe()}\n\n"
                  + (f"{note}.\n\n" if note else "") + f"{wide_table(rows)}\n\n{suite_table(rows)}\n")
    js = out_dir / f"{stem}.json"
    js.write_text(json.dumps({"cluster": cluster.to_dict(), "results": [
        {"suite": r.suite, "case": r.case, "method": r.method, "simulated_seconds": r.seconds,
         "predicted_seconds": r.predicted, "lower_bound_seconds": r.lower_bound, "nbytes": r.nbytes,
         "host_sent": r.host_sent, "host_received": r.host_received, **({"baseline": r.source} if r.source else {})}
        for r in rows]}, indent=1))
    cases = list(dict.fromkeys(r.case for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows if r.moves_data))
    png = suite_bars(cases, methods, {(r.case, r.method): r.seconds for r in rows}, out_dir / f"{stem}.png",
                     f"simulated {name} suite ({cluster.describe()})",
                     bounds={r.case: r.lower_bound for r in rows})
    return {"markdown": md, "json": js, "png": png}
