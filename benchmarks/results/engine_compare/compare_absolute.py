"""Median over runs of each (suite, case, method)'s median seconds, old against new."""
import json, statistics, sys, glob
def load(v, pat):
    out = {}
    for f in sorted(glob.glob(f"benchmarks/results/engine_compare/runs/{pat}_{v}_*/results.json")):
        for r in json.load(open(f))["results"]:
            if r.get("median_seconds") is None or not r.get("verified", True): continue
            out.setdefault((r["suite"], r["case"], r["method"]), []).append(r["median_seconds"])
    return out
pat = sys.argv[1]
o, n = load("old", pat), load("new", pat)
print(f"| suite | case | method | old (ms) | new (ms) | new/old |\n|---|---|---|---:|---:|---:|")
for k in sorted(set(o) & set(n)):
    if not k[2].startswith("alpa_comm") and "raw" not in k[2]: continue
    a, b = statistics.median(o[k]) * 1e3, statistics.median(n[k]) * 1e3
    print(f"| {k[0]} | {k[1]} | {k[2]} | {a:.3f} | {b:.3f} | {b/a:.2f} |")
