"""1-to-m on the emulated cluster: one copy to one host against the chunked broadcast to
each of the suite's meshes, at several sizes, in one run; the chunk count the planner
picks (or the ones given with --chunks, to measure what a chunk costs).

    python benchmarks/results/one_to_m/measure.py --nic 400mbit --sizes 32,256 --repeat 3 \
        --out DIR [--cases 1x2,4x2] [--chunks auto,8,128]

Needs root and iproute2 (it builds the emulated cluster and removes it afterwards).
Writes DIR/results.json; ``report.py`` turns one or more into a table and a PNG.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from alpa_comm import Cluster
from alpa_comm.runtime.worker import buffer_digest
from alpa_comm.suites import one_to_m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nic", default="400mbit", help="NIC rate per host and direction (default 400mbit)")
    p.add_argument("--sizes", default="32", help="tensor sizes in MiB, comma-separated (default 32)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case after one warm-up (median)")
    p.add_argument("--cases", default="", help="1-to-m cases to run, e.g. 1x2,4x2 (default all but 1x1)")
    p.add_argument("--chunks", default="auto", help="chunk counts: auto (the planner's) and/or numbers")
    p.add_argument("--label", default="", help="a label stored with the results (e.g. before/after)")
    p.add_argument("--out", required=True, help="directory for results.json")
    args = p.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    chunk_opts = [None if c == "auto" else int(c) for c in args.chunks.split(",")]
    wanted = [c for c in args.cases.split(",") if c]
    rows = []
    with Cluster.emulated(5, 4, nic=args.nic, timeout=120) as c:
        for mb in sizes:
            cases = [k for k in one_to_m(int(mb * (1 << 20))) if k.name != "1x1" and (not wanted or k.name in wanted)]
            n = cases[0].resharding.shape[0]
            x = np.random.default_rng(0).random(n, dtype=np.float32)
            a = c.put(x, "1x1@0", "R")
            digest = buffer_digest(x)  # checked on the hosts: no data crosses the shaped NICs
            jobs = [("one copy", "1x1@1", "send_recv", None)]
            jobs += [(k.name, k.resharding.dst_mesh, "broadcast", ch) for k in cases for ch in chunk_opts]
            for name, mesh, strategy, ch in jobs:
                times = []
                for i in range(args.repeat + 1):
                    print(f"  {mb:g} MiB {name} chunks={ch or 'auto'}: run {i + 1}/{args.repeat + 1}"
                          f"{' (warm-up)' if i == 0 else ''}", file=sys.stderr, flush=True)
                    b = c.reshard(a, mesh, "R", strategy=strategy, chunks=ch)
                    if i == 0:
                        if not all(v == digest for v in c.checksums(b).values()):
                            raise SystemExit(f"{name}: wrong data")
                    else:
                        times.append(c.last.seconds)
                    b.delete()
                plan = c.last.plan
                rows.append(dict(size_mb=mb, case=name, strategy=strategy, asked_chunks=ch,
                                 chunks=max(t.chunks for t in plan.transfers), median_s=statistics.median(times),
                                 min_s=min(times), max_s=max(times), times_s=times,
                                 predicted_s=plan.predicted_seconds))
            a.delete()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = dict(nic=args.nic, repeat=args.repeat, label=args.label, when=time.strftime("%Y-%m-%d"),
               command=" ".join(["python", "benchmarks/results/one_to_m/measure.py"] + (argv or sys.argv[1:])),
               rows=rows)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        one = next(o for o in rows if o["size_mb"] == r["size_mb"] and o["case"] == "one copy")
        print(f"{r['size_mb']:g} MiB {r['case']:>8} K={r['chunks']:>4} {r['median_s']:.3f} s "
              f"({r['min_s']:.3f}-{r['max_s']:.3f}) x{r['median_s'] / one['median_s']:.3f} pred {r['predicted_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
