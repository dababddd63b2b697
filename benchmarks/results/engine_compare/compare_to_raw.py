"""Per run, each case's alpa_comm (TCP) median over the same run's raw TCP median (the
transport alone: the executor's share made independent of how loaded the machine was);
median of that ratio over runs, old against new."""
import json, glob, statistics, sys
pat = sys.argv[1] if len(sys.argv) > 1 else "dp"
def ratios(v):
    out = {}
    for f in sorted(glob.glob(f"benchmarks/results/engine_compare/runs/{pat}_{v}_*/results.json")):
        d = {(r["suite"], r["case"], r["method"]): r["median_seconds"] for r in json.load(open(f))["results"]}
        for (s, c, m), t in d.items():
            if m == "alpa_comm" and (s, c, "raw") in d and d[(s, c, "raw")]:
                out.setdefault(c, []).append(t / d[(s, c, "raw")])
    return out
o, n = ratios("old"), ratios("new")
print("| case | old: alpa_comm / raw | new: alpa_comm / raw | runs |\n|---|---:|---:|---:|")
for c in o:
    print(f"| {c} | {statistics.median(o[c]):.3f} | {statistics.median(n[c]):.3f} | {len(o[c])}+{len(n[c])} |")
