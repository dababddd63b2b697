"""Scale matrix: reshardings at 64, 256 and 1,024 hosts, planned and simulated, strategies
side by side, every row against the bandwidth bound and the latency-aware bound.

    python benchmarks/sim_scale.py [--hosts 64,256,1024] [--cases replicate,one-to-all]
                                   [--strategies broadcast,auto] [--json] [--out benchmarks/results/scale]

Hosts have 8 devices and 100 Gbit/s NICs; tensors are 1 GiB of float32. Cases
(the source mesh on the first half of the hosts, the destination on the second):

  shift             S0RR  -> S01RR   each source host feeds one destination host
  scatter           S0RR  -> S10RR   each source host feeds 8 destination hosts
  replicate         S0RR  -> S1RR    every destination host needs the whole tensor
  all-to-replicated S01RR -> RRR     every destination device needs the whole tensor
  one-to-all        one host's 8 devices -> every other host, replicated
  train-to-infer    FSDP-style S01R over 64 hosts -> 8 tensor-parallel replicas (RS1 on 8 hosts)
  layout-change     S0RR -> RS0R within one mesh over all hosts (same devices: an all-to-all;
                    up to 256 hosts, as it has hosts^2 unit tasks)

``broadcast`` is the paper's one chain per slice; ``auto`` picks among every kind
(``rotated_chains`` for many slices to the same hosts, ``double_tree`` for one slice to
very many). Each row: case, hosts, src, dst, strategy (``auto -> kind``), unit_tasks,
transfers, plan_seconds, simulate_seconds, makespan_seconds, lower_bound_seconds,
latency_bound_seconds, busiest_nic_bytes, ratio (to the bandwidth bound). Writes
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
SMALL_NIC_BYTES = 256 << 20
"""Cases whose busiest NIC carries less are drawn dotted: latency weighs, not bandwidth."""
CASES = ("shift", "scatter", "replicate", "all-to-replicated", "one-to-all", "layout-change", "train-to-infer")


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


def _csv(text: str, what: str, known=None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise SystemExit(f"error: --{what} is empty")
    bad = [x for x in items if known is not None and x not in known]
    if bad:
        raise SystemExit(f"error: unknown {what} {bad[0]!r}; choose from {', '.join(known)}")
    return items


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--hosts", default="64,256,1024",
                   help="comma-separated host counts, each >= 2 (default 64,256,1024)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (default: all)")
    p.add_argument("--strategies", default="broadcast,auto", help="comma-separated strategies (default broadcast,auto)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--out", default="benchmarks/results/scale", help="where to write scale.md/json/png")
    args = p.parse_args(argv)
    try:
        host_counts = [int(h) for h in _csv(args.hosts, "hosts")]
    except ValueError:
        raise SystemExit(f"error: --hosts must be integers, got {args.hosts!r}") from None
    if min(host_counts) < 2:
        raise SystemExit(f"error: --hosts must be >= 2, got {min(host_counts)}")
    wanted = _csv(args.cases, "cases", CASES)
    strategies = _csv(args.strategies, "strategies")
    work = [(n, name, spec, s) for n in host_counts for name, spec in cases(n).items() if name in wanted
            for s in strategies]
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
            label = f"{plan.strategy_asked} -> {plan.strategy}" if plan.strategy_asked else plan.strategy
            rows.append({"case": name, "hosts": n, "src": f"{sspec}@{src.split('@')[0]}",
                         "dst": f"{dspec}@{dst.split('@')[0]}", "strategy": label,
                         "unit_tasks": len(plan.unit_tasks), "transfers": len(plan.transfers),
                         "plan_seconds": t1 - t0, "simulate_seconds": t2 - t1, "makespan_seconds": res.makespan,
                         "lower_bound_seconds": plan.lower_bound_seconds,
                         "latency_bound_seconds": plan.latency_bound_seconds, "busiest_nic_bytes": busiest,
                         "ratio": res.makespan / plan.lower_bound_seconds})
            bar.step(f"{n} hosts, {name}, {label}: {rows[-1]['ratio']:.2f}x")
    text = table(["case", "hosts", "src", "dst", "strategy", "unit tasks", "transfers", "plan (s)", "simulate (s)",
                  "makespan (s)", "bound (s)", "latency-aware (s)", "busiest NIC (MiB)", "x bound"],
                 [[r["case"], r["hosts"], r["src"], r["dst"], r["strategy"], r["unit_tasks"], r["transfers"],
                   f"{r['plan_seconds']:.2f}", f"{r['simulate_seconds']:.2f}", f"{r['makespan_seconds']:.4f}",
                   f"{r['lower_bound_seconds']:.4f}", f"{r['latency_bound_seconds']:.4f}",
                   f"{r['busiest_nic_bytes'] / (1 << 20):.0f}", f"{r['ratio']:.2f}"] for r in rows])
    print(json.dumps(rows, indent=1) if args.json else text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = "Scale matrix: 8 devices and 100 Gbit/s per host, 1 GiB float32 (train-to-infer: 1 GiB, 64 -> 8 hosts)"
    command = " ".join(["python benchmarks/sim_scale.py", *(argv if argv is not None else sys.argv[1:])])
    (out / "scale.md").write_text(f"# {header}\n\nCommand: `{command}`\n\n{text}\n")
    (out / "scale.json").write_text(json.dumps(rows, indent=1))
    _png(rows, out / "scale.png")
    print(f"wrote {out / 'scale.md'}, {out / 'scale.json'}, {out / 'scale.png'}", file=sys.stderr)
    return 0


def _png(rows: list[dict], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    asked = list(dict.fromkeys(r["strategy"].split(" -> ")[0] for r in rows))
    names = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(asked), figsize=(5.5 * len(asked), 3.8), sharey=True, squeeze=False)
    for ax, strategy in zip(axes[0], asked):
        for name in names:
            pts = sorted((r["hosts"], r["ratio"]) for r in rows
                         if r["strategy"].split(" -> ")[0] == strategy and r["case"] == name)
            small = all(r["busiest_nic_bytes"] < SMALL_NIC_BYTES for r in rows if r["case"] == name)
            if pts:  # dotted: the busiest NIC carries < 256 MiB, so message latencies weigh
                ax.plot(*zip(*pts), marker="o", linestyle=":" if small else "-",
                        label=name + (" (< 256 MiB a NIC)" if small else ""))
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
