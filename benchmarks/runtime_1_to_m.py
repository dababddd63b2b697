"""One device -> 3 hosts x 4 devices, 64 MB, on the emulated cluster (400 Mbit/s NICs):
send_recv, local_allgather and broadcast side by side in one run, each against t,
the time of one copy through one NIC (measured, and nominal from the tc rate).

    sudo python benchmarks/runtime_1_to_m.py [--size-mb 64] [--nic 400mbit] [--repeat 3] [--out DIR]

Needs root and iproute2 (it builds the emulated cluster and removes it afterwards).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from alpa_comm import Cluster
from alpa_comm.runtime.worker import buffer_digest
from alpa_comm.report.tables import table
from alpa_comm.runtime.emulated.netns import rate_gbps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=64.0, help="payload in MiB (default 64)")
    p.add_argument("--nic", default="400mbit", help="NIC rate per host and direction (default 400mbit)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per method, after one warm-up (median)")
    p.add_argument("--out", default="benchmarks/results/emulated", help="where to write the markdown table")
    args = p.parse_args(argv)
    n = int(args.size_mb * (1 << 20))
    x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    nominal_t = n * 8 / (rate_gbps(args.nic) * 1e9)
    rows, runs = [], {}
    with Cluster.emulated(4, 4, nic=args.nic, timeout=120) as c:
        a = c.put(x, "1x1@0", "R")
        digest = buffer_digest(x)  # checked on the hosts: no data crosses the shaped NICs
        methods = [("one copy (1 -> 1 device)", "1x1@1", "send_recv"),
                   ("send_recv", "3x4@1,2,3", "send_recv"),
                   ("local_allgather", "3x4@1,2,3", "local_allgather"),
                   ("broadcast", "3x4@1,2,3", "broadcast")]
        for label, mesh, strategy in methods:
            times = []
            for i in range(args.repeat + 1):
                print(f"  {label}: run {i + 1}/{args.repeat + 1}{' (warm-up)' if i == 0 else ''}", file=sys.stderr,
                      flush=True)
                b = c.reshard(a, mesh, "R", strategy=strategy)
                if i == 0:
                    assert all(v == digest for v in c.checksums(b).values()), f"{label}: wrong data"
                else:
                    times.append(c.last.seconds)
                b.delete()
            runs[label] = (statistics.median(times), min(times), max(times), c.last.plan)
    t_measured = runs["one copy (1 -> 1 device)"][0]
    for label, (med, lo, hi, plan) in runs.items():
        chunks = plan.transfers[0].chunks if plan.strategy == "broadcast" else "-"
        rows.append([label, f"{med:.3f} s", f"{lo:.3f}-{hi:.3f}", chunks, f"{med / t_measured:.2f}",
                     f"{med / nominal_t:.2f}", f"{plan.predicted_seconds:.3f} s"])
    text = table(["method", "median", "range", "chunks", "x t (measured one copy)", "x t (nominal)",
                  "planner prediction"], rows)
    header = (f"{args.size_mb:g} MiB from 1 device to 3 hosts x 4 devices, emulated cluster, {args.nic} NICs; "
              f"nominal t = {nominal_t:.3f} s, measured one copy t = {t_measured:.3f} s; median of "
              f"{args.repeat} runs after a warm-up. Command: `python benchmarks/runtime_1_to_m.py`")
    print(header)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime_1_to_m.md").write_text(f"# Runtime, 1 -> 3x4\n\n{header}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
