"""The simulator against a measured run: every plan of an ``alpa-comm bench`` run re-planned
on the run's calibrated cluster and simulated two ways, beside its measured median.

    python benchmarks/sim_vs_measured.py RESULTS_JSON [--out DIR]

``admission`` plays the plan by the executor's own admission rules
(``resharding/admission.py``: two long transfers per NIC in plan order, latency-bound ones
outside those windows, 32 a host), the simulator's default; ``one at a time`` plays every
host resource strictly one transfer after another (``simulate(plan, window=1,
max_concurrent=1)``), the load balancer's own model. Alpa's baselines are left out
(their plans come from Alpa's compiled messages, which need its harness). Writes
``sim_vs_measured.md`` (the table, the errors, the command) next to RESULTS_JSON or to
``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from alpa_comm import ClusterSpec, suites  # noqa: E402
from alpa_comm.report.tables import table  # noqa: E402
from alpa_comm.sim import simulate  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("results", help="results.json of an alpa-comm bench run (cluster suites)")
    p.add_argument("--out", help="folder for sim_vs_measured.md (default: next to the results)")
    args = p.parse_args(argv)
    path = Path(args.results)
    if not path.is_file():
        raise SystemExit(f"error: no such results file: {path}")
    run = json.loads(path.read_text())
    c = run["cluster"]
    # runs before latency_s was recorded say it only in the description ("... latency 350 us")
    latency = c.get("latency_s") or float(c["description"].rsplit("latency ", 1)[1].split()[0]) * 1e-6
    cluster = ClusterSpec(num_hosts=c["hosts"], devices_per_host=c["devices_per_host"],
                          nic_send_gbps=c["calibrated_nic_gbps"], latency_s=latency)
    rows, errors = [], {"admission": [], "one at a time": []}
    for r in run["results"]:
        if r["method"] in suites.ALPA_BASELINES or r["suite"] not in suites.SUITES:
            continue
        suite = suites.suite(r["suite"])
        size = suites.n_to_m_last_dim(c["size_mb"]) if suite.sized_by == "last_dim" else c["size_mb"]
        case = next(k for k in suite.cases(size, c["size_mb"]) if k.name == r["case"])
        method = next(m for m in suite.methods if m.name == r["method"])
        plan, _ = suites.plan_method(case, method, cluster)
        both = {"admission": simulate(plan).makespan, "one at a time": simulate(plan, window=1, max_concurrent=1).makespan}
        measured = r["median_seconds"]
        for k, v in both.items():
            errors[k].append(v / measured - 1)
        rows.append([r["suite"], r["case"], r["method"], f"{measured:.3f}", f"{min(r['seconds']):.3f}-{max(r['seconds']):.3f}",
                     f"{both['admission']:.3f}", f"{both['one at a time']:.3f}"])
    if not rows:
        raise SystemExit(f"error: {path} has no planned methods to simulate")
    lines = [f"# The simulator against a measured run ({c['description']})", "",
             f"Command: `python benchmarks/sim_vs_measured.py {args.results}`", ""]
    for k, errs in errors.items():
        worst = max(errs, key=abs)
        lines.append(f"* {k}: mean |error| {100 * statistics.mean(map(abs, errs)):.1f} %, worst {100 * worst:+.0f} %")
    lines += ["", table(["suite", "case", "method", "measured (s)", "runs (s)", "admission (s)",
                                  "one at a time (s)"], rows)]
    out = Path(args.out) if args.out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_vs_measured.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6 + len(errors)]))
    print(f"wrote {out / 'sim_vs_measured.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
