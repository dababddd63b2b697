"""Table and PNG of 1-to-m runs (``measure.py``): each case's median against one copy to
one host, by size, before and after (the ``label`` of each run).

    python benchmarks/results/one_to_m/report.py RUN_DIR/results.json ... --out benchmarks/results/one_to_m

Writes OUT/results.json (every run, as measured), OUT/results.md and OUT/one_to_m.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alpa_comm.report.tables import table


def ratios(run: dict) -> list[dict]:
    """Each broadcast row of a run with its ratio to the run's one copy of the same size."""
    one = {r["size_mb"]: r["median_s"] for r in run["rows"] if r["case"] == "one copy"}
    return [dict(r, one_copy_s=one[r["size_mb"]], ratio=r["median_s"] / one[r["size_mb"]])
            for r in run["rows"] if r["case"] != "one copy"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="results.json files written by measure.py")
    p.add_argument("--out", required=True, help="directory for results.json, results.md, one_to_m.png")
    args = p.parse_args(argv)
    runs = [json.loads(Path(f).read_text()) for f in args.runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    rows, series = [], {}
    for run in runs:
        for r in ratios(run):
            rows.append([run["label"], run["nic"], f"{r['size_mb']:g}", r["case"], r["chunks"],
                         f"{r['one_copy_s']:.3f}", f"{r['median_s']:.3f}", f"{r['min_s']:.3f}-{r['max_s']:.3f}",
                         f"{r['ratio']:.3f}"])
            series.setdefault((run["label"], r["case"]), []).append((r["size_mb"], r["ratio"]))
    text = table(["code", "NIC", "MiB", "case", "chunks", "one copy (s)", "broadcast (s)", "range (s)",
                  "x one copy"], rows)
    commands = "\n".join(f"- {run['label']}: `{run['command']}` ({run['when']}, median of {run['repeat']} "
                         "runs after a warm-up)" for run in runs)
    (out / "results.md").write_text(
        "# 1-to-m on the emulated cluster: broadcast against one copy\n\n"
        "One device sends a float32 vector to each 1-to-m mesh (hosts x devices) through a chunked chain; "
        "one copy is the same vector to one device of one host. Each run has its own one copy.\n\n"
        f"{commands}\n\n{text}\n")
    import matplotlib  # noqa: PLC0415 - only for the PNG
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cases = sorted({c for _, c in series})
    colors = {c: f"C{i}" for i, c in enumerate(cases)}
    for (label, case), pts in sorted(series.items()):
        pts.sort()
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", color=colors[case],
                linestyle="--" if label == "before" else "-", label=f"{case} ({label})")
    ax.axhline(1.03, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tensor size (MiB)")
    ax.set_ylabel("broadcast / one copy")
    ax.set_title(f"1-to-m broadcast at {runs[0]['nic']} (emulated): dashed before, solid after")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "one_to_m.png", dpi=110)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
