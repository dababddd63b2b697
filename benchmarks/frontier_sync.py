"""Weight sync of frontier models (DeepSeek-V3, Kimi-K2, Qwen3-235B-A22B shapes), planned
and simulated at cluster scale, and the same layouts scaled down and run for real.

    python benchmarks/frontier_sync.py [--scenarios all|0,2] [--tiny] [--out DIR] [--json]
    sudo python benchmarks/frontier_sync.py --real [--real-nic 1gbit] [--repeat 3]

Planned (no root): each scenario of ``alpa_comm_bench.frontier_shapes.SCENARIOS``, a
model's ~1,000 leaves (stacked experts, bfloat16; an fp8 wire as 1-byte elements) from a
training layout (FSDP over all devices, or experts over hosts x FSDP inside) on 32-128
hosts x 8 devices to inference replicas (tensor parallel inside a host, experts over the
replica's hosts), on a cluster of 8 x 400 Gbit/s NICs per host with NVLink inside. Each
scenario runs in a fresh process, which reports:

* ``cold_s``: ``plan_resharding_tree(..., strategy="auto")`` with empty caches;
* ``cached_ms``: the same leaves planned again (median of 100 plan-cache hits), and
  ``cached_equal_ms``: an equal tree built anew, its first call (median of 5 trees);
* ``peak_mib``: the planner's peak resident memory above the process's before planning
  (``VmHWM`` reset through ``/proc/self/clear_refs``);
* ``simulated_s`` (``alpa_comm.sim.simulate``, the executor's admission rules) against
  ``bound_s``, the latency-aware lower bound (``plan.latency_bound_seconds``), and
  ``sim_runtime_s``, the simulator's own run time.

Marks: cold plan <= 5 s, cached <= 0.5 ms, simulated <= 1.10x the bound (``marks``).

``--real`` (root, ``flock /tmp/bench.lock``): DeepSeek-V3 and Kimi-K2 with every width
divided by 16 and 4 / 2 layers, on 4 emulated hosts x 2 devices (``Cluster.emulated``,
``--real-nic``), FSDP 2x2 -> one replica of 2 hosts (TP x EP) and EP x FSDP 2x2 -> two
replicas of 1 host; bf16 and fp8 leaves as their bit patterns (uint16 / uint8). Every
received shard is compared with NumPy's; the simulator's prediction of the same plan is
set beside the measured median.

Writes results.md (tables + command), results.json and results.png under ``--out``;
progress on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLD_MARK_S, CACHED_MARK_MS, SIM_MARK = 5.0, 0.5, 1.10
COLUMNS = ("scenario", "leaves", "unit_tasks", "model_gb", "transfers", "strategy", "cold_s", "cached_ms",
           "cached_equal_ms", "peak_mib", "simulated_s", "bound_s", "x_bound", "sim_runtime_s")
REAL_COLUMNS = ("case", "leaves", "model_mib", "nic", "measured_s", "simulated_s", "sim_error", "bound_s",
                "verified")


def marks(row: dict) -> dict:
    """Which of the issue's marks ``row`` meets: cold plan, cached plan, simulated / bound."""
    return {"cold": row["cold_s"] <= COLD_MARK_S, "cached": row["cached_ms"] <= CACHED_MARK_MS,
            "sim": row["x_bound"] <= SIM_MARK}


# ------------------------------------------------------------------ one scenario (its own process)
def _status(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if field == "VmHWM" else 0


def measure(scenario, model=None, cached_repeat: int = 100) -> dict:
    """Plan ``scenario`` cold, cached and simulate it (call in a fresh process for a cold plan)."""
    import gc

    from alpa_comm.resharding.tree import plan_resharding_tree
    from alpa_comm.sim import simulate
    from alpa_comm_bench.frontier_shapes import frontier_cluster, tree

    cluster = frontier_cluster(scenario)
    leaves = tree(scenario, model)
    gc.collect()
    before = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        pass
    t0 = time.perf_counter()
    plan = plan_resharding_tree(leaves, cluster=cluster, strategy="auto")
    cold = time.perf_counter() - t0
    peak = max(0, _status("VmHWM") - before)
    hits = []
    for _ in range(cached_repeat):
        t0 = time.perf_counter()
        again = plan_resharding_tree(leaves, cluster=cluster, strategy="auto")
        hits.append(time.perf_counter() - t0)
        assert again.cache_hit
    equal = []
    for _ in range(5):
        fresh = tree(scenario, model)
        t0 = time.perf_counter()
        again = plan_resharding_tree(fresh, cluster=cluster, strategy="auto")
        equal.append(time.perf_counter() - t0)
        assert again.cache_hit
    t0 = time.perf_counter()
    sim = simulate(plan)
    sim_runtime = time.perf_counter() - t0
    bound = plan.latency_bound_seconds
    return {"scenario": scenario.label, "model": scenario.model, "train": scenario.train,
            "train_hosts": scenario.train_hosts, "replicas": scenario.replicas,
            "replica_hosts": scenario.replica_hosts, "wire": scenario.wire, "hosts": scenario.hosts,
            "leaves": len(plan.leaves), "unit_tasks": sum(len(t) for t in plan.unit_tasks),
            "model_gb": plan.nbytes / 1e9, "transfers": len(plan.transfers), "strategy": plan.strategy,
            "cold_s": cold, "cached_ms": statistics.median(hits) * 1e3,
            "cached_equal_ms": statistics.median(equal) * 1e3, "peak_mib": peak / 2**20,
            "predicted_s": plan.predicted_seconds, "simulated_s": sim.makespan, "bound_s": bound,
            "bandwidth_bound_s": plan.lower_bound_seconds, "x_bound": sim.makespan / bound,
            "sim_runtime_s": sim_runtime, "cluster": cluster.describe()}


def _worker(arg: str) -> int:
    from alpa_comm_bench.frontier_shapes import SCENARIOS, TINY, Scenario

    cfg = json.loads(arg)
    s = Scenario(**cfg["scenario"]) if "scenario" in cfg else SCENARIOS[cfg["index"]]
    row = measure(s, TINY if s.model == "tiny" else None, cfg.get("cached_repeat", 100))
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def run_fresh(cfg: dict, timeout: float = 900) -> dict:
    """``measure`` in a new interpreter (empty plan caches, its own memory)."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)],
                         capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"scenario {cfg} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------ the scaled-down real run
REAL_CASES = (("deepseek-v3", 16, 4), ("kimi-k2", 16, 2))
"""(model, width divisor, layers) run for real."""


def real_runs(nic: str, repeat: int, say) -> list[dict]:
    import numpy as np

    from alpa_comm import Cluster
    from alpa_comm.placement import Placement
    from alpa_comm.sim import simulate
    from alpa_comm_bench.frontier_shapes import MODELS, Scenario, scaled, tree

    layouts = [Scenario("", "fsdp", 2, 1, 2, devices=2), Scenario("", "ep_fsdp", 2, 2, 1, "fp8", devices=2)]
    rows = []
    rng = np.random.default_rng(0)
    with Cluster.emulated(4, 2, nic=nic, timeout=300) as c:
        for model, factor, layers in REAL_CASES:
            m = scaled(MODELS[model], factor, layers)
            for lay in layouts:
                s = Scenario(model, lay.train, lay.train_hosts, lay.replicas, lay.replica_hosts, lay.wire, 2)
                moves = tree(s, m)
                data = [rng.integers(0, 1 << (8 * (1 if mv.dtype == "uint8" else 2)), mv.shape,
                                     dtype=np.uint8 if mv.dtype == "uint8" else np.uint16) for mv in moves]
                say(f"real: {s.label} ({m.name}): {len(moves)} leaves, "
                    f"{sum(d.nbytes for d in data) / 2**20:.0f} MiB: storing the sources")
                srcs = [c.put(d, mv.src_mesh, mv.src_spec) for d, mv in zip(data, moves)]
                dsts = [Placement(mv.dst_mesh, mv.dst_spec) for mv in moves]
                times, wrong, checked, plan = [], 0, 0, None
                for run in range(repeat + 1):
                    out = c.reshard_tree(srcs, dsts)
                    plan = c.last.plan
                    if run:
                        times.append(c.last.seconds)
                    if run == repeat:  # the last run's bytes against NumPy
                        for d, arr in zip(data, out):
                            boxes = Placement(arr.mesh, arr.spec).device_boxes(arr.shape)
                            for dev, shard in arr.shards().items():
                                checked += 1
                                want = d[tuple(slice(a, b) for a, b in boxes[dev])]
                                wrong += not np.array_equal(shard, want)
                    for arr in out:
                        arr.delete()
                    say(f"real: {s.label}: run {run + 1}/{repeat + 1}{' (warm-up)' if not run else ''}: "
                        f"{c.last.seconds:.3f} s")
                for a in srcs:
                    a.delete()
                measured = statistics.median(times)
                predicted = simulate(plan).makespan
                rows.append({"case": f"{m.name} {lay.train} 2x2 -> {lay.replicas} x {lay.replica_hosts}x2, {lay.wire}",
                             "leaves": len(moves), "model_mib": sum(d.nbytes for d in data) / 2**20, "nic": nic,
                             "measured_s": measured, "runs": times, "simulated_s": predicted,
                             "sim_error": predicted / measured - 1, "bound_s": plan.latency_bound_seconds,
                             "strategy": plan.strategy, "shards_checked": checked, "shards_wrong": wrong,
                             "verified": checked > 0 and wrong == 0})
                r = rows[-1]
                say(f"real: {r['case']}: measured {measured:.3f} s, simulated {predicted:.3f} s "
                    f"({100 * r['sim_error']:+.1f} %), verified {r['verified']}")
    return rows


# ------------------------------------------------------------------ report
def table(rows: list[dict]) -> str:
    from alpa_comm.report.tables import table as fmt

    def yes(ok):
        return "yes" if ok else "**no**"

    return fmt(["scenario", "leaves", "unit tasks", "GB", "transfers", "strategy", "cold plan (s)",
                "cached (ms)", "cached, equal tree anew (ms)", "planner peak (MiB)", "simulated (ms)",
                "bound (ms)", "x bound", "simulator run (s)", "marks: cold / cached / sim"],
               [[r["scenario"], r["leaves"], f"{r['unit_tasks']:,}", f"{r['model_gb']:.1f}", r["transfers"],
                 r["strategy"], f"{r['cold_s']:.2f}", f"{r['cached_ms']:.3f}", f"{r['cached_equal_ms']:.3f}",
                 f"{r['peak_mib']:.0f}", f"{r['simulated_s'] * 1e3:.2f}", f"{r['bound_s'] * 1e3:.2f}", f"{r['x_bound']:.4f}",
                 f"{r['sim_runtime_s']:.2f}", " / ".join(yes(v) for v in marks(r).values())] for r in rows])


def real_table(rows: list[dict]) -> str:
    from alpa_comm.report.tables import table as fmt

    return fmt(["case", "leaves", "MiB", "NIC", "measured (s)", "simulated (s)", "simulated vs measured",
                "bound (s)", "strategy", "bit-exact"],
               [[r["case"], r["leaves"], f"{r['model_mib']:.0f}", r["nic"], f"{r['measured_s']:.3f}",
                 f"{r['simulated_s']:.3f}", f"{100 * r['sim_error']:+.1f} %", f"{r['bound_s']:.3f}", r["strategy"],
                 "yes" if r["verified"] else "NO"] for r in rows])


def chart(rows: list[dict], real: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 3 + bool(real)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 0.45 * max(len(rows), 4) + 1.6))
    labels = [r["scenario"].replace(" TP/EP", "") for r in rows]
    ys = list(range(len(rows)))
    panels = [("cold plan (s)", [r["cold_s"] for r in rows], COLD_MARK_S),
              ("cached plan (ms)", [r["cached_ms"] for r in rows], CACHED_MARK_MS),
              ("simulated / latency-aware bound", [r["x_bound"] for r in rows], SIM_MARK)]
    for ax, (title, vals, mark) in zip(axes, panels):
        ax.barh(ys, vals, color=["tab:green" if v <= mark else "tab:red" for v in vals])
        ax.axvline(mark, color="black", linestyle="dashed", linewidth=0.8)
        ax.set_title(title + f" (mark {mark:g})", fontsize=8)
        ax.set_yticks(ys)
        ax.set_yticklabels(labels if ax is axes[0] else [], fontsize=7)
        ax.invert_yaxis()
    axes[2].set_xlim(0.95, max(SIM_MARK, max(v for v in panels[2][1])) * 1.02)
    if real:
        ax = axes[3]
        yr = list(range(len(real)))
        ax.barh([y - 0.2 for y in yr], [r["measured_s"] for r in real], 0.4, label="measured")
        ax.barh([y + 0.2 for y in yr], [r["simulated_s"] for r in real], 0.4, label="simulated")
        ax.set_yticks(yr)
        ax.set_yticklabels([r["case"] for r in real], fontsize=6)
        ax.invert_yaxis()
        ax.set_title(f"scaled down, 4 emulated hosts, {real[0]['nic']} (s)", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("frontier-model weight sync: planned, simulated (8 x 400 Gbit/s NICs per host)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Frontier-model weight sync (DeepSeek-V3, Kimi-K2, Qwen3-235B shapes): "
                                            "plan cold and cached, simulate, the bound, planner memory; --real runs "
                                            "the layouts scaled down on 4 emulated hosts")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--scenarios", default="all", help="comma-separated indices into "
                   "alpa_comm_bench.frontier_shapes.SCENARIOS, or 'all' (default)")
    p.add_argument("--tiny", action="store_true", help="plan a tiny DeepSeek-shaped model instead (seconds; the test)")
    p.add_argument("--real", action="store_true", help="also run the scaled-down layouts on the emulated cluster "
                   "(root; wrap in flock /tmp/bench.lock)")
    p.add_argument("--real-only", action="store_true", help="only the scaled-down run; keep the planned rows of "
                   "--out's results.json")
    p.add_argument("--real-nic", default="1gbit", help="NIC rate of the emulated hosts (default 1gbit)")
    p.add_argument("--repeat", type=int, default=3, help="timed real runs per case, after one warm-up (default 3)")
    p.add_argument("--out", default="benchmarks/results/frontier",
                   help="where results.md/.json/.png go, relative to the working directory "
                   "(default benchmarks/results/frontier)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    from alpa_comm_bench.frontier_shapes import SCENARIOS, Scenario

    out = Path(args.out)
    t_start = time.monotonic()

    def say(msg):
        print(f"[{time.monotonic() - t_start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    if args.tiny:
        cfgs = [{"scenario": vars(s), "cached_repeat": 20} for s in
                (Scenario("tiny", "fsdp", 4, 2, 2, devices=4), Scenario("tiny", "ep_fsdp", 4, 2, 2, "fp8", devices=4))]
    elif args.scenarios == "all":
        cfgs = [{"index": i} for i in range(len(SCENARIOS))]
    else:
        try:
            cfgs = [{"index": int(i)} for i in args.scenarios.split(",") if i]
        except ValueError:
            p.error(f"--scenarios takes indices or 'all', got {args.scenarios!r}")
        bad = [c["index"] for c in cfgs if not 0 <= c["index"] < len(SCENARIOS)]
        if bad:
            p.error(f"no scenario {bad}; there are {len(SCENARIOS)} (0-{len(SCENARIOS) - 1})")
    rows = []
    if args.real_only:
        rows = json.loads((out / "results.json").read_text())["rows"]
    else:
        for k, cfg in enumerate(cfgs):
            label = SCENARIOS[cfg["index"]].label if "index" in cfg else Scenario(**cfg["scenario"]).label
            say(f"planning {k + 1}/{len(cfgs)}: {label} (a fresh process)")
            rows.append(run_fresh(cfg))
            r = rows[-1]
            say(f"  {r['unit_tasks']:,} unit tasks: cold {r['cold_s']:.2f} s, cached {r['cached_ms']:.3f} ms, "
                f"simulated {r['x_bound']:.4f}x the bound (simulator {r['sim_runtime_s']:.2f} s), "
                f"peak {r['peak_mib']:.0f} MiB")
    real = real_runs(args.real_nic, args.repeat, say) if args.real or args.real_only else []
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/frontier_sync.py " + " ".join(argv if argv is not None else sys.argv[1:])
    cluster = ("each scenario's hosts (training + replicas) x 8 devices, " + rows[0]["cluster"].split(", ", 1)[1]
               if rows else "")
    (out / "results.json").write_text(json.dumps({"command": command.strip(), "cluster": cluster, "rows": rows,
                                                  "real_rows": real, "marks": {"cold_s": COLD_MARK_S,
                                                  "cached_ms": CACHED_MARK_MS, "x_bound": SIM_MARK}}, indent=1))
    text = f"`{command.strip()}`\n\nCluster: {cluster}.\n\n{table(rows)}\n"
    if real:
        text += f"\nScaled down, run for real on 4 emulated hosts x 2 devices:\n\n{real_table(real)}\n"
    (out / "results.md").write_text(text)
    chart(rows, real, out / "results.png")
    print(text)
    if args.json:
        print(json.dumps({"rows": [{k: r[k] for k in COLUMNS} for r in rows],
                          "real_rows": [{k: r[k] for k in REAL_COLUMNS} for r in real]}))
    return 0 if all(r["verified"] for r in real) else 1


if __name__ == "__main__":
    sys.exit(main())
