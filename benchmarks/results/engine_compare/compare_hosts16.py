"""16 emulated hosts: each case's measured seconds (median of its runs) per launch, old
tree against new; the median over launches."""
import json, glob, statistics
rows = {}
for v in ("old", "new"):
    for f in sorted(glob.glob(f"benchmarks/results/engine_compare/runs/h16_{v}_*/results.json")):
        for r in json.load(open(f))["rows"]:
            rows.setdefault(r["case"], {}).setdefault(v, []).append(r["measured_seconds"])
print("| case | old (s) | new (s) | new/old | launches |\n|---|---:|---:|---:|---:|")
for k, x in rows.items():
    a, b = statistics.median(x["old"]), statistics.median(x["new"])
    print(f"| {k} | {a:.3f} | {b:.3f} | {b/a:.2f} | {len(x['old'])}+{len(x['new'])} |")
