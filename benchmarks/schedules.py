"""Pipeline schedules side by side: throughput relative to the signal upper bound.

S=4 stages, M=16 microbatches, t_bwd = 2 t_fwd, for several transfer times;
writes benchmarks/results/schedules/ (a markdown table and the 1F1B vs
eager-1F1B vs ZB-H1 timeline PNG of the issue's setting, t_comm = 0.5 t_fwd).

    python benchmarks/schedules.py [--out benchmarks/results/schedules]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alpa_comm.pipeline import Costs, generate, simulate_schedule
from alpa_comm.pipeline.compare import build, comm_limit, signal_bound
from alpa_comm.report.schedule_pictures import timeline_png
from alpa_comm.report.tables import table

S, M = 4, 16
VARIANTS = [("1f1b", False, None), ("1f1b", True, None), ("1f1b", True, "auto"),
            ("eager-1f1b", False, None), ("eager-1f1b", True, None), ("eager-1f1b", True, "auto"),
            ("zb-h1", True, None)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/schedules", help="output directory")
    p.add_argument("--t-comm", default="0,0.5,1,1.5,2", help="comma-separated transfer times (t_fwd = 1)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    comms = [float(x) for x in args.t_comm.split(",")]
    rows = []
    for v_kind, split, delay in VARIANTS:
        row = [None]
        for tc in comms:
            costs = Costs(1.0, 2.0, tc)
            v = build(v_kind, S, M, costs, split, delay)
            row[0] = v.label.split(" [")[0] if delay else v.label
            row.append(f"{signal_bound(S, M, costs) / v.result.iteration_time:.3f}")
        rows.append(row)
    rows.append(["limit (fill + drain transfers)"] + [f"{signal_bound(S, M, Costs(1, 2, tc)) / comm_limit(S, M, Costs(1, 2, tc)):.3f}"
                                                      for tc in comms])
    text = table(["schedule"] + [f"t_comm={tc:g}" for tc in comms], rows)
    md = out / "schedules.md"
    md.write_text(f"# Throughput as a fraction of the signal upper bound\n\nS={S}, M={M}, t_fwd=1, t_bwd=2 "
                  f"(BI = BW = 1 when split). Command: `python benchmarks/schedules.py`.\n\n{text}\n")
    print(text)
    costs = Costs(1.0, 2.0, 0.5)
    eager = build("eager-1f1b", S, M, costs, True, "auto")
    png = timeline_png([("1f1b", simulate_schedule(generate("1f1b", S, M), costs), S),
                        (eager.label, eager.result, S),
                        ("zb-h1", simulate_schedule(generate("zb-h1", S, M), costs), S)], out / "1f1b_vs_eager.png")
    print(f"\nwrote {md} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
