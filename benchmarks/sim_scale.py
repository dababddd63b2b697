"""Simulator scale: plan (greedy) + simulate one resharding between two 512-host meshes.

Cases (8 devices per host, 1,024 hosts, 100 Gbit/s NICs):
  * shift:      (4096, 1024, 64) float32, 512x8 S0RR -> 512x8 S01RR: 4,096 point-to-point
                slices, every source host feeding its partner host;
  * scatter:    (4096, 1024, 64) float32, 512x8 S0RR -> 512x8 S10RR: 4,096 slices, every
                source host feeding 8 destination hosts and every destination host fed by 8;
  * replicate:  (4096, 1024, 64) float32, 512x8 S0RR -> 512x8 S1RR: every destination host
                needs the whole tensor: 512 slices, each to all 512 destination hosts.

Each case with each strategy side by side (``broadcast``: one chain per slice;
``rotated_chains``: the slices that go to the same hosts as one ring).

    python benchmarks/sim_scale.py [--cases shift,scatter,replicate] [--strategies broadcast,rotated_chains]
"""
from __future__ import annotations

import argparse
import sys
import time

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.report.tables import table
from alpa_comm.sim import simulate

SRC = "512x8@" + ",".join(map(str, range(512)))
DST = "512x8@" + ",".join(map(str, range(512, 1024)))
CASES = {"shift": ("S0RR", "S01RR"), "scatter": ("S0RR", "S10RR"), "replicate": ("S0RR", "S1RR")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="shift,scatter,replicate", help="comma-separated: " + ",".join(CASES))
    p.add_argument("--strategies", default="broadcast,rotated_chains",
                   help="comma-separated strategies, side by side (default broadcast,rotated_chains)")
    args = p.parse_args(argv)
    cluster = ClusterSpec(num_hosts=1024, devices_per_host=8, nic_send_gbps=100)
    rows = []
    for name in args.cases.split(","):
        src_spec, dst_spec = CASES[name]
        for strategy in args.strategies.split(","):
            print(f"  {name}, {strategy}: planning ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            plan = plan_resharding((4096, 1024, 64), "float32", SRC, src_spec, DST, dst_spec, cluster=cluster,
                                   strategy=strategy, loadbalance="greedy", cache=False)
            t1 = time.perf_counter()
            print(f"  {name}, {strategy}: simulating {len(plan.transfers)} transfers ...", file=sys.stderr,
                  flush=True)
            res = simulate(plan)
            t2 = time.perf_counter()
            rows.append([name, f"{src_spec} -> {dst_spec}", strategy, len(plan.unit_tasks), len(plan.transfers),
                         f"{t1 - t0:.2f} s", f"{t2 - t1:.2f} s", f"{t2 - t0:.2f} s",
                         f"{res.makespan:.4f} s", f"{res.makespan / plan.lower_bound_seconds:.2f}"])
    print(f"512-host -> 512-host meshes, {cluster.describe()}")
    print(table(["case", "specs", "strategy", "unit tasks", "transfers", "plan (greedy)", "simulate", "total",
                 "simulated makespan", "x lower bound"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
