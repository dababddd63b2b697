"""``alpa-comm plan`` and ``alpa-comm simulate``: one resharding or a reference suite,
planned (cost model) or played on the flow-level network simulator."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .. import suites
from ..report.tables import table
from ..resharding.explain import fmt_bytes, fmt_seconds
from ..resharding.strategies import carries_data
from . import needs
from .options import add_resharding_args, alpa_baseline, plan_from_args, reject_unused, suite_cluster
from .values import output_dir, output_file, png_path


LARGE_PLAN = 10_000
"""Plans with this many transfers take seconds to simulate: say so on stderr first."""


def register(sub) -> None:
    p = sub.add_parser("plan", help="plan one cross-mesh resharding (or a reference suite) and explain it",
                       description="Plan a cross-mesh resharding: unit tasks, strategy, sender choice and order, "
                                   "predicted time vs the physical lower bound.")
    add_resharding_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (docs/plan-json.md)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate a resharding (or a reference suite) on a flow-level network model",
                       description="Plan, then execute the plan on a flow-level network simulator (max-min fair "
                                   "NIC sharing, the plan's per-host order): makespan, per-host bytes and busy "
                                   "time, timeline. --suite runs every method side by side on the paper's testbed.")
    add_resharding_args(p)
    p.add_argument("--out", type=output_dir, help="suite mode: directory for the markdown table, JSON and PNG")
    p.add_argument("--trace", type=output_file, help="single case: write a Chrome trace JSON here")
    p.add_argument("--png", type=png_path, help="single case: write a Gantt chart PNG here ('.png' added if missing)")
    p.set_defaults(func=cmd_simulate)


def cmd_plan(args) -> int:
    if args.suite:
        return _plan_suite(args)
    plan = plan_from_args(args)
    print(plan.to_json(indent=1) if args.json else plan.explain())
    return 0


def _plan_suite(args) -> int:
    cluster = suite_cluster(args)
    suite = suites.suite(args.suite)
    cases = suite.cases(args.last_dim, args.size_mb)
    compiled = alpa_baseline(args, cases, cluster.devices_per_host)
    results, sources = [], {}
    t0 = time.monotonic()
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] planning case {case.name} ...", file=sys.stderr, flush=True)
        row = {}
        for m in suite.methods:
            row[m.name], source = suites.plan_method(case, m, cluster, seed=args.seed, chunks=args.chunks,
                                                     compiled_sends=compiled)
            if source:
                sources[m.name] = source
        results.append((case, row))
    print(f"planned {len(cases)} cases x {len(suite.methods)} methods in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    if args.json:
        out = [{"suite": case.suite, "case": case.name, "method": name, "predicted_seconds": plan.predicted_seconds,
                "lower_bound_seconds": _bound(row), **({"baseline": sources[name]} if name in sources else {})}
               for case, row in results for name, plan in row.items()]
        print(json.dumps(out, indent=1))
        return 0
    print(f"Suite {args.suite} on {cluster.describe()}")
    print("Each cell: predicted time, and in brackets its ratio to the physical lower bound.\n")
    headers = ["case", "src -> dst", "size", "lower bound"] + [m.name for m in suite.methods]
    rows = []
    for case, row in results:
        any_plan = next(iter(row.values()))
        bound = _bound(row)
        cells = [case.name, f"{case.src_spec}@{case.src_mesh.split('@')[0]} -> "
                            f"{case.dst_spec}@{case.dst_mesh.split('@')[0]}",
                 fmt_bytes(any_plan.nbytes), fmt_seconds(bound)]
        cells += [f"{fmt_seconds(p.predicted_seconds)} ({p.predicted_seconds / bound:.2f})" for p in row.values()]
        rows.append(cells)
    print(table(headers, rows))
    print("\nMethods: " + "; ".join(f"{m.name} = {m.note}" for m in suite.methods))
    if sources:
        print("Alpa baselines from: " + "; ".join(f"{name}: {src}" for name, src in sources.items()))
    return 0


def _bound(row: dict) -> float:
    """The case's physical lower bound: the same for every method that moves data."""
    return next(p for p in row.values() if carries_data(p.strategy)).lower_bound_seconds


def cmd_simulate(args) -> int:
    from ..sim import simulate  # noqa: PLC0415
    from ..sim.simulate import effective_gbps  # noqa: PLC0415

    if args.suite:
        reject_unused(args, {"trace": "--trace", "png": "--png"}, "with --suite (use --out for its table and PNG)")
        needs.png(args.out)
        simulated, report = needs.bench("simulated"), needs.bench("suite_report")
        cluster = suite_cluster(args)
        compiled = alpa_baseline(args, suites.suite_cases(args.suite, args.last_dim, args.size_mb),
                                 cluster.devices_per_host)
        t0 = time.monotonic()
        rows = simulated.run_suite(args.suite, cluster, args.last_dim, args.size_mb, args.seed,
                                   progress=lambda line: print(line, file=sys.stderr, flush=True),
                                   compiled_sends=compiled)
        print(f"simulated in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        print(f"Simulated {args.suite} suite on {cluster.describe()}\n")
        print(report.wide_table(rows))
        print()
        print(report.suite_table(rows))
        if report.baseline_note(rows):
            print(f"\n{report.baseline_note(rows)}.")
        if args.out:
            paths = report.write_suite_outputs(args.suite, rows, cluster, Path(args.out))
            print("\nwrote " + ", ".join(str(p) for p in paths.values()))
        return 0
    reject_unused(args, {"out": "--out"}, "without --suite (use --trace or --png for one resharding)")
    needs.png(args.png)
    plan = plan_from_args(args)
    if len(plan.transfers) >= LARGE_PLAN:
        print(f"simulating {len(plan.transfers):,} transfers on {plan.cluster.num_hosts} hosts ...",
              file=sys.stderr, flush=True)
    res = simulate(plan)
    print(plan.explain(max_transfers=0))
    print(f"\n  simulated: {fmt_seconds(res.makespan)}  ({effective_gbps(plan.nbytes, res.makespan):.2f} Gbit/s "
          f"effective, " + (f"{res.makespan / plan.lower_bound_seconds:.2f}x the lower bound)\n"
                            if plan.lower_bound_seconds else "no byte crosses a NIC)\n"))
    rows = [[h, fmt_bytes(res.host_sent.get(h, 0)), fmt_bytes(res.host_received.get(h, 0)),
             f"{100 * res.host_busy_fraction.get(h, 0):.0f} %"] for h in sorted(res.host_busy_fraction)]
    print(table(["host", "NIC sent", "NIC received", "NIC busy"], rows, markdown=False))
    if args.trace:
        from ..report.trace import write_chrome_trace  # noqa: PLC0415

        print(f"\nChrome trace: {write_chrome_trace(res, args.trace)} (open in https://ui.perfetto.dev)")
    if args.png:
        from ..report.charts import gantt_png  # noqa: PLC0415

        print(f"Gantt chart: {gantt_png(res, args.png)}")
    return 0
