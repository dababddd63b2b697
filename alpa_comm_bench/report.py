"""``alpa-comm bench`` results for people: the table, the acceptance checks and the
files of a run (results.json, results.md, one bar chart per suite)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from alpa_comm.report.charts import suite_bars
from alpa_comm.report.tables import table
from alpa_comm.resharding.explain import fmt_seconds
from alpa_comm.resharding.strategies import carries_data

from .acceptance import acceptance, speedups
from .result import Result


def results_table(results: list[Result]) -> str:
    sp = speedups(results)
    rows = []
    for r in results:
        s = sp[(r.suite, r.case, r.method)]
        spread = f"{min(r.seconds):.3f}-{max(r.seconds):.3f}"
        base = next((s[b] for b in ("alpa", "per_array", "gather_broadcast", "jax_device_put") if b in s),
                    float("nan"))
        simulated = fmt_seconds(r.predicted_seconds) if r.predicted_seconds == r.predicted_seconds else "-"
        rows.append([r.suite, r.case, r.method, fmt_seconds(r.median_seconds), spread, f"{r.gbps:.3f}",
                     f"{r.median_seconds / r.lower_bound_seconds:.2f}" if carries_data(r.strategy) else "-",
                     f"{base:.2f}x", simulated,
                     "yes" if r.verified else ("n/a" if r.verified is None else "NO")])
    return table(["suite", "case", "method", "median", "spread (s)", "effective Gbit/s", "x lower bound",
                  "speedup vs alpa (weight-sync: per_array; processes: gather_broadcast / jax_device_put)", "simulator", "verified"], rows)


def write_bench_outputs(results: list[Result], cluster_desc: dict, out: Path) -> dict[str, Path]:
    """results.json (written atomically), results.md (checks and table) and one bar chart
    per suite in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    js = out / "results.json"
    tmp = js.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cluster": cluster_desc, "results": [
        {k: (None if v != v else v) for k, v in asdict(r).items() if k != "extra" or v}  # NaN: not simulated
        for r in results]}, indent=1))
    tmp.replace(js)
    paths["json"] = js
    md = out / "results.md"
    note = baseline_note(results)
    md.write_text(f"# alpa-comm bench\n\nCluster: {cluster_desc.get('description', '')}\n\n"
                  + (f"{note}.\n\n" if note else "") + f"{acceptance_table(results)}\n\n{results_table(results)}\n")
    paths["markdown"] = md
    for suite in dict.fromkeys(r.suite for r in results):
        rs = [r for r in results if r.suite == suite]
        cases = list(dict.fromkeys(r.case for r in rs))
        methods = list(dict.fromkeys(r.method for r in rs if carries_data(r.strategy)))
        paths[suite] = suite_bars(cases, methods, {(r.case, r.method): r.median_seconds for r in rs},
                                  out / f"{suite.replace('-', '_')}.png",
                                  f"measured {suite} ({cluster_desc.get('description', '')})",
                                  bounds={r.case: r.lower_bound_seconds for r in rs})
    return paths


def baseline_note(results: list[Result]) -> str:
    """Where the Alpa baselines came from (one line; empty without them)."""
    sources = dict.fromkeys(f"{r.method}: {r.extra['baseline']}" for r in results if r.extra.get("baseline"))
    return "Alpa baselines from " + "; ".join(sources) if sources else ""


def jax_refusals_table(refusals: list[dict]) -> str:
    """What JAX's own ``device_put`` did on each case, process by process."""
    return table(["case", "process", "JAX's device_put"],
                 [[r["case"], str(p["rank"]), p.get("error") or (p["outcome"] + (
                     "" if "correct" not in p else f", data {'correct' if p['correct'] else 'WRONG'}"))]
                  for r in refusals for p in r["processes"]])


def acceptance_table(results: list[Result]) -> str:
    return table(["check", "met", "detail"], [[c, "yes" if ok else "NO", d] for c, ok, d in acceptance(results)])
