"""Alpa conformance: alpa_comm's adapter on Alpa 0.2.3's own code, case by case.

    python benchmarks/alpa_conformance.py [--json] [--out benchmarks/results/alpa_conformance]

For every case (Alpa's n-to-m and 1-to-m suites at the paper's sizes, three tensors on
one stage boundary, meshes sliced inside hosts), Alpa 0.2.3's real
``CrossMeshCommunicator`` is built from its ``XlaShardedPipelineComputation`` stages and
``PipeDreamFlush`` schedule, twice: ``alpa`` = Alpa as shipped (send/recv, its ``normal``
load balance and local all-gather rewrite) and ``alpa_comm`` = after
``comm_optimization="alpa_comm"`` (our plan of the whole boundary as Alpa's broadcast
strategy). Alpa's own task compilers turn each into send/recv tasks or broadcast groups,
which are executed on NumPy buffers (the suites at a small size with the same tiles) and
every destination tile is compared with the reference.

Row keys: case, mode, verified, max_host_in_bytes, max_host_out_bytes (busiest NIC at
the paper's size; a broadcast group is counted as NCCL's chain through its hosts),
transfers (NCCL operations: sends or broadcast groups), resent (messages repeating an
earlier one), predicted_seconds (at the paper's testbed, 10 Gbit/s NICs and 20 us per
message: the busiest NIC side's bytes / rate + its messages x latency — the same model for
both modes). ``--json`` prints the rows as a JSON list; otherwise a table, and with
``--out`` also results.json, results.md and results.png.

Needs Alpa's wheel (``pip download --no-deps alpa==0.2.3``, fetched once into
``$ALPA_COMM_CACHE`` or ~/.cache/alpa_comm).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from alpa_comm.report.tables import table
from alpa_comm.resharding.explain import fmt_bytes, fmt_seconds

MODES = ("alpa", "alpa_comm")
SCRIPT = r'''
import json, sys
load_package(ALPA_ROOT)
from alpa_comm.integrations import alpa as adapter
from alpa_comm.integrations.alpa_harness import conformance
adapter.install()
cases = conformance.cases()
rows = []
for i, case in enumerate(cases):
    print(f"[{i + 1}/{len(cases)}] {case['name']}", file=sys.stderr, flush=True)
    rows += [conformance.run_case(case, mode) for mode in MODES]
print(json.dumps(rows))
'''
KEYS = ("case", "mode", "verified", "max_host_in_bytes", "max_host_out_bytes", "transfers", "resent",
        "predicted_seconds")


def run() -> list[dict]:
    from alpa_comm.integrations.alpa_harness.loader import run_in_subprocess
    from alpa_comm.integrations.alpa_harness.sources import alpa_root

    alpa_root()  # fetch (or find) the wheel first, with its own error
    done = run_in_subprocess(f"MODES = {MODES!r}\n" + SCRIPT, timeout=900, stream_stderr=True)
    if done.returncode != 0:
        raise SystemExit(f"the harness failed: {done.stderr.strip().splitlines()[-1] if done.stderr else ''}")
    return [{k: r.get(k) for k in KEYS} | ({"error": r["error"]} if "error" in r else {})
            for r in json.loads(done.stdout)]


def summary(rows: list[dict]) -> str:
    by = {(r["case"], r["mode"]): r for r in rows}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        a, o = by[(case, "alpa")], by[(case, "alpa_comm")]
        busiest = [max(r["max_host_in_bytes"], r["max_host_out_bytes"]) for r in (a, o)]
        out.append([case, "yes" if a["verified"] and o["verified"] else "NO",
                    fmt_bytes(busiest[0]), fmt_bytes(busiest[1]), f"{a['transfers']} ({a['resent']} re-sent)",
                    str(o["transfers"]), fmt_seconds(a["predicted_seconds"]), fmt_seconds(o["predicted_seconds"]),
                    f"{a['predicted_seconds'] / o['predicted_seconds']:.2f}x" if o["predicted_seconds"] else "-"])
    return table(["case", "verified (both)", "busiest NIC: alpa", "alpa_comm", "transfers: alpa", "alpa_comm",
                  "predicted: alpa", "alpa_comm", "speedup"], out)


def write(rows: list[dict], out: Path) -> list[Path]:
    from alpa_comm.report.charts import suite_bars

    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "results.json", out / "results.md"
    js.write_text(json.dumps(rows, indent=1))
    md.write_text("# Alpa conformance (Alpa 0.2.3's own code)\n\n`python benchmarks/alpa_conformance.py --out "
                  f"{out}`\n\n{summary(rows)}\n")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    png = suite_bars(cases, MODES, {(r["case"], r["mode"]): r["predicted_seconds"] for r in rows},
                     out / "results.png", "Alpa 0.2.3 as shipped vs comm_optimization='alpa_comm' "
                     "(Alpa's own compiled tasks; 10 Gbit/s, 20 us per message)")
    return [js, md, png]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.add_argument("--out", type=Path, help="directory for results.json, results.md and results.png")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = run()
    print(f"{len(rows)} rows in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(summary(rows))
    if args.out:
        for path in write(rows, args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
