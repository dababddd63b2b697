"""Run a reference suite through planner + simulator, every method side by side."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import suites
from ..topology import ClusterSpec
from ..report.tables import table
from ..resharding import plan_resharding
from ..resharding.strategies import carries_data
from ..resharding.explain import fmt_bytes, fmt_seconds
from .simulate import effective_gbps, simulate


@dataclass
class Row:
    suite: str
    case: str
    method: str
    seconds: float
    predicted: float
    lower_bound: float
    nbytes: int
    host_sent: dict
    host_received: dict

    @property
    def gbps(self) -> float:
        return effective_gbps(self.nbytes, self.seconds)


def run_suite(name: str, cluster: ClusterSpec, last_dim: int = 512, size_mb: float = 1024, seed: int = 0,
              progress=sys.stderr) -> list[Row]:
    cases = suites.suite_cases(name, last_dim, size_mb)
    methods = suites.suite(name).methods
    rows = []
    for i, case in enumerate(cases):
        if progress:
            print(f"[{i + 1}/{len(cases)}] {name} case {case.name}: {len(methods)} methods", file=progress, flush=True)
        for m in methods:
            plan = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh,
                                   case.dst_spec, cluster=cluster, strategy=m.strategy, loadbalance=m.loadbalance,
                                   seed=seed)
            res = simulate(plan)
            bound = plan.lower_bound_seconds if carries_data(m.strategy) else None
            rows.append(Row(name, case.name, m.name, res.makespan, plan.predicted_seconds, bound or 0.0,
                            plan.nbytes, res.host_sent, res.host_received))
    # the signal rows get the real data's bound for their ratio
    bounds = {r.case: r.lower_bound for r in rows if r.lower_bound}
    for r in rows:
        if not r.lower_bound:
            r.lower_bound = bounds.get(r.case, 0.0)
    return rows


def best_broadcast(rows: list[Row], case: str) -> Row:
    return min((r for r in rows if r.case == case and ("broadcast" in r.method or r.method.startswith("bc_"))),
               key=lambda r: r.seconds)


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


def write_outputs(name: str, rows: list[Row], cluster: ClusterSpec, out_dir: Path) -> dict[str, Path]:
    from ..report.charts import suite_bars  # noqa: PLC0415 - matplotlib only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    md = out_dir / f"{stem}.md"
    md.write_text(f"# Simulated {name} suite\n\nCluster: {cluster.describe()}\n\n"
                  f"{wide_table(rows)}\n\n{suite_table(rows)}\n")
    js = out_dir / f"{stem}.json"
    js.write_text(json.dumps({"cluster": cluster.to_dict(), "results": [
        {"suite": r.suite, "case": r.case, "method": r.method, "simulated_seconds": r.seconds,
         "predicted_seconds": r.predicted, "lower_bound_seconds": r.lower_bound, "nbytes": r.nbytes,
         "host_sent": r.host_sent, "host_received": r.host_received} for r in rows]}, indent=1))
    cases = list(dict.fromkeys(r.case for r in rows))
    methods = [m for m in dict.fromkeys(r.method for r in rows) if m != "signal"]
    png = suite_bars(cases, methods, {(r.case, r.method): r.seconds for r in rows}, out_dir / f"{stem}.png",
                     f"simulated {name} suite ({cluster.describe()})",
                     bounds={r.case: r.lower_bound for r in rows})
    return {"markdown": md, "json": js, "png": png}
