"""Scale matrix: reshardings at 64, 256 and 1,024 hosts, planned and simulated, each
strategy side by side, every row against the bandwidth lower bound.

    python benchmarks/scale_matrix.py [--hosts 64,256,1024] [--strategies broadcast,rotated_chains]
                                      [--json] [--out benchmarks/results/scale]

Hosts have 8 devices and 100 Gbit/s NICs; tensors are 1 GiB of float32. Cases
(the source mesh on the first half of the hosts, the destination on the second):

  shift            S0RR  -> S01RR   each source host feeds one destination host
  scatter          S0RR  -> S10RR   each source host feeds 8 destination hosts
  replicate        S0RR  -> S1RR    every destination host needs the whole tensor
  all-to-replicated S01RR -> RRR    every destination device needs the whole tensor
  one-to-all       one host's 8 devices -> every other host, replicated
  train-to-infer   FSDP-style S01R over 64 hosts -> 8 tensor-parallel replicas (RS1 on 8 hosts)
  layout-change    S0RR -> RS0R within one mesh over all hosts (same devices: an all-to-all;
                   up to 256 hosts, as it has hosts^2 unit tasks)

Each row: case, hosts,
src, dst, strategy, unit_tasks, transfers, plan_seconds, simulate_seconds,
makespan_seconds, lower_bound_seconds, busiest_nic_bytes, ratio. Writes
scale.md, scale.json and scale.png (ratio to the bound against hosts).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.report.progress import Progress
from alpa_comm.report.tables import table
from alpa_comm.sim import simulate

SHAPE = (4096, 1024, 64)  # 1 GiB of float32


def _mesh(first: int, count: int) -> str:
    return f"{count}x8@" + ",".join(map(str, range(first, first + count)))


def cases(hosts: int) -> dict[str, tuple]:
    half = hosts // 2
    src, dst = _mesh(0, half), _mesh(half, half)
    out = {"shift": (SHAPE, src, "S0RR", dst, "S01RR"),
           "scatter": (SHAPE, src, "S0RR", dst, "S10RR"),
           "replicate": (SHAPE, src, "S0RR", dst, "S1RR"),
           "all-to-replicated": (SHAPE, src, "S01RR", dst, "RRR"),
           "one-to-all": (SHAPE, _mesh(0, 1), "S0RR", _mesh(1, hosts - 1), "RRR")}
    if hosts <= 256:  # an all-to-all: hosts^2 unit tasks (a million at 1,024 hosts)
        out["layout-change"] = (SHAPE, _mesh(0, hosts), "S0RR", _mesh(0, hosts), "RS0R")
    if hosts >= 72:
        out["train-to-infer"] = ((8192, 8192, 4), _mesh(0, 64), "S01RR", _mesh(64, 8), "RS1R")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="64,256,1024", help="comma-separated host counts (default 64,256,1024)")
    p.add_argument("--strategies", default="broadcast,rotated_chains", help="comma-separated strategies")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--out", default="benchmarks/results/scale", help="where to write scale.md/json/png")
    args = p.parse_args(argv)
    host_counts = [int(h) for h in args.hosts.split(",")]
    strategies = args.strategies.split(",")
    work = [(n, name, spec, s) for n in host_counts for name, spec in cases(n).items() for s in strategies]
    rows = []
    with Progress(len(work), "scale", unit="plan") as bar:
        for n, name, (shape, src, sspec, dst, dspec), strategy in work:
            cluster = ClusterSpec(num_hosts=n, devices_per_host=8, nic_send_gbps=100)
            t0 = time.perf_counter()
            plan = plan_resharding(shape, "float32", src, sspec, dst, dspec, cluster=cluster, strategy=strategy,
                                   loadbalance="greedy", cache=False)
            t1 = time.perf_counter()
            res = simulate(plan)
            t2 = time.perf_counter()
            busiest = max(list(res.host_sent.values()) + list(res.host_received.values()) + [0])
            rows.append({"case": name, "hosts": n, "src": f"{sspec}@{src.split('@')[0]}",
                         "dst": f"{dspec}@{dst.split('@')[0]}", "strategy": strategy,
                         "unit_tasks": len(plan.unit_tasks), "transfers": len(plan.transfers),
                         "plan_seconds": t1 - t0, "simulate_seconds": t2 - t1, "makespan_seconds": res.makespan,
                         "lower_bound_seconds": plan.lower_bound_seconds, "busiest_nic_bytes": busiest,
                         "ratio": res.makespan / plan.lower_bound_seconds})
            bar.step(f"{n} hosts, {name}, {strategy}: {rows[-1]['ratio']:.2f}x")
    if args.json:
        print(json.dumps(rows, indent=1))
    text = table(["case", "hosts", "src", "dst", "strategy", "unit tasks", "transfers", "plan (s)", "simulate (s)",
                  "makespan (s)", "bound (s)", "busiest NIC (MiB)", "x bound"],
                 [[r["case"], r["hosts"], r["src"], r["dst"], r["strategy"], r["unit_tasks"], r["transfers"],
                   f"{r['plan_seconds']:.2f}", f"{r['simulate_seconds']:.2f}", f"{r['makespan_seconds']:.4f}",
                   f"{r['lower_bound_seconds']:.4f}", f"{r['busiest_nic_bytes'] / (1 << 20):.0f}",
                   f"{r['ratio']:.2f}"] for r in rows])
    if not args.json:
        print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = "Scale matrix: 8 devices and 100 Gbit/s per host, 1 GiB float32 (train-to-infer: 1 GiB, 64 -> 8 hosts)"
    (out / "scale.md").write_text(f"# {header}\n\nCommand: `python benchmarks/scale_matrix.py {' '.join(argv or sys.argv[1:])}`\n\n{text}\n")
    (out / "scale.json").write_text(json.dumps(rows, indent=1))
    _png(rows, out / "scale.png")
    print(f"wrote {out / 'scale.md'}, {out / 'scale.json'}, {out / 'scale.png'}", file=sys.stderr)
    return 0


def _png(rows: list[dict], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    names = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(strategies), figsize=(5.5 * len(strategies), 3.8), sharey=True, squeeze=False)
    for ax, strategy in zip(axes[0], strategies):
        for name in names:
            pts = sorted((r["hosts"], r["ratio"]) for r in rows if r["strategy"] == strategy and r["case"] == name)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.axhline(1.25, color="black", linestyle="dashed", linewidth=0.8, label="1.25x the bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("hosts")
        ax.set_title(strategy, fontsize=9)
    axes[0][0].set_ylabel("simulated time / bandwidth bound")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
