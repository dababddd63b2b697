"""Planner speed: how long planning takes for a resharding with ~25,000 unit tasks.

Case: a (6144, 4608, 1024) float32 tensor from a 64-host mesh (64x8, spec S0RS1)
to a 48-host mesh (48x8, spec RS0S1) of 8-device hosts: 64 x 48 x 8 = 24,576
unit tasks. Times decomposition + job building + load balancing + plan
assembly, beyond interpreter start-up, for each load-balance mode (the plan
cache bypassed), and then the same resharding planned again through the plan
cache (median of 20 hits: parsing and checking the inputs, one lookup), and from
the on-disk store as a new process would find it (empty memory, median of 5 loads).

    python benchmarks/planner_speed.py [--repeat 3] [--modes greedy,size,naive]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.report.tables import table
from alpa_comm.resharding.cache import PlanCache
from alpa_comm.runtime.plan_store import DiskPlanStore

SHAPE = (6144, 4608, 1024)
SRC = "64x8@" + ",".join(map(str, range(64)))
DST = "48x8@" + ",".join(map(str, range(64, 112)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="timed runs per mode (median reported)")
    p.add_argument("--modes", default="greedy,size,naive", help="comma-separated load-balance modes")
    p.add_argument("--strategy", default="broadcast", help="strategy to plan with")
    args = p.parse_args(argv)
    cluster = ClusterSpec(num_hosts=112, devices_per_host=8, nic_send_gbps=100)
    rows = []
    for mode in args.modes.split(","):
        times = []
        for i in range(args.repeat):
            print(f"  {mode}: run {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            plan = plan_resharding(SHAPE, "float32", SRC, "S0RS1", DST, "RS0S1", cluster=cluster,
                                   strategy=args.strategy, loadbalance=mode, cache=False)
            times.append(time.perf_counter() - t0)
        # The same resharding again, through the plan cache (primed once first).
        cache = PlanCache()
        plan_resharding(SHAPE, "float32", SRC, "S0RS1", DST, "RS0S1", cluster=cluster, strategy=args.strategy,
                        loadbalance=mode, cache=cache)
        hits = []
        for _ in range(20):
            t0 = time.perf_counter()
            again = plan_resharding(SHAPE, "float32", SRC, "S0RS1", DST, "RS0S1", cluster=cluster,
                                    strategy=args.strategy, loadbalance=mode, cache=cache)
            hits.append(time.perf_counter() - t0)
            assert again.cache_hit
        hit = statistics.median(hits)
        with tempfile.TemporaryDirectory() as tmp:
            store = DiskPlanStore(tmp)
            plan_resharding(SHAPE, "float32", SRC, "S0RS1", DST, "RS0S1", cluster=cluster, strategy=args.strategy,
                            loadbalance=mode, cache=PlanCache(store=store))
            loads = []
            for _ in range(5):
                t0 = time.perf_counter()
                again = plan_resharding(SHAPE, "float32", SRC, "S0RS1", DST, "RS0S1", cluster=cluster,
                                        strategy=args.strategy, loadbalance=mode, cache=PlanCache(store=store))
                loads.append(time.perf_counter() - t0)
                assert again.cache_hit
        disk = statistics.median(loads)
        first = statistics.median(times)
        rows.append([mode, len(plan.unit_tasks), len(plan.transfers), f"{first:.3f} s",
                     f"{min(times):.3f} s", f"{hit * 1e3:.2f} ms ({100 * hit / first:.2f} %)",
                     f"{disk * 1e3:.1f} ms ({100 * disk / first:.1f} %)",
                     f"{plan.predicted_seconds:.3f} s", f"{plan.ratio_to_lower_bound:.3f}"])
    print(f"Planning {'x'.join(map(str, SHAPE))} float32, {SRC.split('@')[0]} S0RS1 -> {DST.split('@')[0]} RS0S1, "
          f"strategy {args.strategy}, on {cluster.describe()}")
    print(table(["loadbalance", "unit tasks", "transfers", "median plan time", "best", "planned again (cache)",
                 "from disk (new process)", "predicted", "ratio to bound"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
