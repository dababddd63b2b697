"""Data-parallel gradient all-reduce: the backend's own all-reduce (gloo) against the
hand-written ring over send/recv, side by side in one run, same buckets, same hosts.

    sudo python benchmarks/allreduce.py [--hosts 4] [--size-mb 32] [--bucket-mb 4] [--nic 400mbit]
                                        [--repeat 5] [--cluster emulated|local] [--out DIR]

Each method all-reduces gradients of ``--size-mb`` MiB (float32, transformer-shaped:
many small arrays and a few large ones, packed into ``--bucket-mb`` buckets) over
groups of 2 and of all hosts. The bound is the bandwidth-optimal ring's NIC time,
2 (n-1)/n x bytes / NIC rate. Every run's result is checked against the NumPy mean.
Writes a markdown table, JSON and a PNG to ``--out``.
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
from alpa_comm.report.progress import Progress
from alpa_comm.report.tables import table
from alpa_comm.runtime.allreduce import ALLREDUCE_METHODS
from alpa_comm.runtime.emulated.netns import rate_gbps


def gradient_sizes(total_bytes: int) -> list[int]:
    """Element counts of a transformer's gradients: per layer four matrices and six vectors."""
    d = 256
    layer = [3 * d * d, d * d, 4 * d * d, 4 * d * d, 3 * d, d, 4 * d, d, d, d]
    out = []
    while sum(out) * 4 < total_bytes:
        out += layer
    return out


def _on_host(worker, hosts, method, sizes, bucket_bytes, repeat, seed):
    """Runs in each host worker: warm-up plus ``repeat`` timed all-reduces; checks the result."""
    from alpa_comm.runtime.allreduce import allreduce_mean

    rng = np.random.default_rng(seed + worker.host)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    times, out = [], None
    start_together = np.zeros(1, np.float32)
    for i in range(repeat + 1):
        worker.backend.allreduce_sum(start_together, hosts, 1 << 21, 60)  # the group's own barrier
        t0 = time.perf_counter()
        out = allreduce_mean(worker.backend, arrays, hosts, tag_base=1 << 22, bucket_bytes=bucket_bytes,
                             timeout=120, method=method)
        if i:
            times.append(time.perf_counter() - t0)
    return times, [float(a[:4].sum()) for a in out]  # a fingerprint of the result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4, help="hosts (default 4)")
    p.add_argument("--size-mb", type=float, default=32, help="gradient MiB per host (default 32)")
    p.add_argument("--bucket-mb", type=float, default=4, help="bucket MiB (default 4, the trainer's)")
    p.add_argument("--nic", default="400mbit", help="emulated NIC rate per host and direction (default 400mbit)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per method after one warm-up (default 5)")
    p.add_argument("--cluster", default="emulated", choices=["emulated", "local"],
                   help="emulated (root + iproute2: shaped NICs; default) or local (loopback, no NIC limit)")
    p.add_argument("--out", default="benchmarks/results/allreduce", help="where to write table, JSON and PNG")
    args = p.parse_args(argv)
    import ray  # noqa: PLC0415

    sizes = gradient_sizes(int(args.size_mb * (1 << 20)))
    nbytes = 4 * sum(sizes)
    groups = [list(range(2)), list(range(args.hosts))] if args.hosts > 2 else [list(range(args.hosts))]
    rate = rate_gbps(args.nic) * 1e9 / 8 if args.cluster == "emulated" else None
    results = []
    with Cluster.open(args.cluster, args.hosts, 1, nic=args.nic, timeout=120) as cluster, \
            Progress(len(groups) * len(ALLREDUCE_METHODS), "allreduce") as bar:
        for hosts in groups:
            seed = len(hosts)
            fingerprints = {}
            for method in ALLREDUCE_METHODS:
                runs = ray.get([cluster.workers[h].run.remote(_on_host, hosts, method, sizes,
                                                              int(args.bucket_mb * (1 << 20)), args.repeat, seed)
                                for h in hosts])
                per_run = [max(r[0][i] for r in runs) for i in range(args.repeat)]  # the slowest host counts
                fingerprints[method] = runs[0][1]
                n = len(hosts)
                bound = 2 * (n - 1) / n * nbytes / rate if rate else None
                med = statistics.median(per_run)
                results.append({"hosts": n, "method": method, "median_s": med, "min_s": min(per_run),
                                "max_s": max(per_run), "bound_s": bound, "nbytes": nbytes,
                                "buckets": int(np.ceil(nbytes / (args.bucket_mb * (1 << 20))))})
                bar.step(f"{n} hosts, {method}: {med:.3f} s")
            a, b = (np.array(fingerprints[m]) for m in ALLREDUCE_METHODS)
            if not np.allclose(a, b, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"the methods disagree on {len(hosts)} hosts: {a[:3]} vs {b[:3]}")
    rows = []
    for r in results:
        ring = next(x for x in results if x["hosts"] == r["hosts"] and x["method"] == "ring")
        rows.append([r["hosts"], r["method"], f"{r['median_s']:.3f}", f"{r['min_s']:.3f}-{r['max_s']:.3f}",
                     f"{r['bound_s']:.3f}" if r["bound_s"] else "-",
                     f"{r['median_s'] / r['bound_s']:.2f}" if r["bound_s"] else "-",
                     f"{ring['median_s'] / r['median_s']:.2f}x"])
    text = table(["hosts", "method", "median (s)", "range (s)", "ring bound (s)", "x bound", "speed vs ring"], rows)
    header = (f"All-reduce of {nbytes / (1 << 20):.1f} MiB of float32 gradients ({len(sizes)} arrays) in "
              f"{args.bucket_mb:g} MiB buckets, {args.cluster} cluster"
              + (f", {args.nic} NICs" if args.cluster == "emulated" else "") + f"; median of {args.repeat} runs "
              "(each the slowest host's time) after a warm-up.")
    print(header + "\n\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "allreduce.md").write_text(f"# {header}\n\nCommand: `{' '.join(['python', *sys.argv])}`\n\n{text}\n")
    (out / "allreduce.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    from alpa_comm.report.charts import suite_bars  # noqa: PLC0415

    png = suite_bars([f"{n} hosts" for n in dict.fromkeys(r["hosts"] for r in results)], list(ALLREDUCE_METHODS),
                     {(f"{r['hosts']} hosts", r["method"]): r["median_s"] for r in results}, out / "allreduce.png",
                     f"all-reduce of {nbytes / (1 << 20):.0f} MiB in {args.bucket_mb:g} MiB buckets, {args.cluster}"
                     + (f", {args.nic}" if args.cluster == "emulated" else "") + " (dashed: ring bound)",
                     bounds={f"{r['hosts']} hosts": r["bound_s"] for r in results if r["bound_s"]}, log=False)
    print(f"\nwrote {out / 'allreduce.md'}, {out / 'allreduce.json'}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
