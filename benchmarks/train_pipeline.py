"""End-to-end pipeline training on the emulated cluster: schedules x strategies side by side.

One emulated cluster (4 hosts, one stage per host, shaped NICs); for each model,
in one run: 1F1B + Alpa's resharding (the baseline), 1F1B + broadcast,
eager-1F1B + broadcast (split backward), eager-1F1B + delayed weight gradients
(delay chosen by the cost model fed with the measured times) + broadcast, and
the same two schedules with 'signal' (one byte per transfer: the
no-communication upper bound). For every configuration: measured iteration
time and throughput, the simulator's prediction from the measured stage and
edge times, and peak live activation bytes per stage beside the memory model.

    sudo .venv/bin/python benchmarks/train_pipeline.py [--out benchmarks/results/train_emulated]

Writes results.md / results.json, throughput.png, memory.png and Chrome traces of
the baseline and of eager-1F1B + delay (broadcast).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np

from alpa_comm.models import build_model
from alpa_comm.pipeline import generate, simulate_schedule
from alpa_comm.pipeline.memory import memory
from alpa_comm.pipeline.weight_delay import auto_delay
from alpa_comm.report.tables import table
from alpa_comm.train.data import synthetic
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster
from alpa_comm.pipeline.edges import with_skips
from alpa_comm.report.trace import write_chrome_trace
from alpa_comm.train.measure import costs_from, iteration_seconds, stage_times

S = 4
# (label, schedule kind, split backward, delay ("auto": from measured costs), strategy)
CONFIGS = [
    ("1f1b + alpa (baseline)", "1f1b", False, None, "alpa"),
    ("1f1b + broadcast", "1f1b", False, None, "broadcast"),
    ("eager-1f1b split + broadcast", "eager-1f1b", True, None, "broadcast"),
    ("eager-1f1b + delay + broadcast", "eager-1f1b", True, "auto", "broadcast"),
    ("1f1b + signal", "1f1b", False, None, "signal"),
    ("eager-1f1b + delay + signal", "eager-1f1b", True, "auto", "signal"),
]
BASELINE, OURS = CONFIGS[0][0], CONFIGS[3][0]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_config(cluster, model_name, kw, M, rows, kind, split, delay, strategy, warmup, steps):
    model = build_model(model_name, S, **kw)
    sched = with_skips(generate(kind, S, M, split_backward=split, delay_wgrad=delay), model.skips)
    pipe = DistributedPipeline(cluster, model_name, S, sched, microbatch_size=rows, model_kwargs=kw,
                               strategy=strategy, optimizer="sgd", lr=0.01)
    data = synthetic(M, rows, kw["seq"], seed=0)
    for _ in range(warmup):
        pipe.step(next(data))
    records, walls = [], []
    for _ in range(steps):
        res = pipe.step(next(data))
        records.append(res.per_host)
        walls.append(res.seconds)
    edges = pipe.time_edges(repeats=3)
    times = stage_times(records, S)                   # busy time per action (runtime work included)
    raw = stage_times(records, S, busy=False)         # the compute programs alone
    costs = costs_from(times, edges, S)
    iters = [iteration_seconds(r) for r in records]
    t_iter = median(iters)
    predicted = simulate_schedule(sched, costs, signal=strategy == "signal").iteration_time
    peak = [max(rec["peak_live_bytes"] for r in records for rec in r if rec["stage"] == s) for s in range(S)]
    peak_n = [max(rec["peak_live"] for r in records for rec in r if rec["stage"] == s) for s in range(S)]
    # the memory model: peak units of one microbatch's forward state, where BI keeps the
    # measured fraction of it (matmul inputs + output gradients) until BW
    per_mb = [next(rec["state_bytes"] for rec in records[-1] if rec["stage"] == s) for s in range(S)]
    model_bytes = []
    for s in range(S):
        f = per_mb[s].get("F", 0)
        frac = per_mb[s].get("BI", 0) / f if f else 0.0
        model_bytes.append(memory(sched, wgrad_fraction=frac)[s].peak_activations * f)
    return {"schedule": sched.name, "strategy": strategy, "iteration_s": t_iter, "step_wall_s": median(walls),
            "samples_per_s": M * rows / t_iter, "predicted_s": predicted, "stage_times": times, "compute_times": raw, "edge_s": edges,
            "peak_live_bytes": peak, "peak_live_microbatches": peak_n,
            "model_peak_bytes": model_bytes, "state_bytes_per_microbatch": per_mb,
            "records": records, "sched": sched}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/train_emulated")
    p.add_argument("--nic", default="400mbit")
    p.add_argument("--devices-per-host", type=int, default=2)
    p.add_argument("--host-cpus", type=float, default=0.5,
                   help="CPU cores per emulated host (default 0.5: four hosts share this 2-core machine evenly)")
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--rows", type=int, default=128, help="rows per microbatch (U-Transformer)")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--width", type=int, default=32, help="U-Transformer width")
    p.add_argument("--ut-layers", type=int, default=4, help="U-Transformer layers (2L)")
    p.add_argument("--gpt-layers", type=int, default=4)
    p.add_argument("--gpt-width", type=int, default=16, help="GPT width (default 16: its one edge per stage "
                   "needs narrower layers than the U-Transformer to reach transfer/forward >= 0.3)")
    p.add_argument("--gpt-rows", type=int, default=256)
    p.add_argument("--models", default="utransformer,gpt")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--render", action="store_true", help="only rewrite results.md and the PNGs from results.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.render:
        saved = json.loads((out / "results.json").read_text())
        for k, v in saved.pop("_args", {}).items():
            setattr(args, k, v)
        write_outputs(saved, args, out)
        return 0
    results: dict[str, dict] = {}
    t_start = time.monotonic()
    with PipelineCluster.emulated(S, args.devices_per_host, nic=args.nic, timeout=60, cpu=args.host_cpus) as cluster:
        for model_name in args.models.split(","):
            ut = model_name == "utransformer"
            kw = {"layers": args.ut_layers if ut else args.gpt_layers, "d": args.width if ut else args.gpt_width,
                  "heads": 4, "seq": args.seq}
            rows = args.rows if ut else args.gpt_rows
            per = results.setdefault(model_name, {"model_kwargs": kw, "rows": rows, "configs": {}})
            measured_costs = None
            for label, kind, split, delay, strategy in CONFIGS:
                if delay == "auto":
                    # the least delay that helps, by simulation with this run's measured costs
                    delay = auto_delay(kind, S, args.microbatches, measured_costs)
                log(f"[{time.monotonic() - t_start:6.0f} s] {model_name}: {label} (delay {delay})")
                r = run_config(cluster, model_name, kw, args.microbatches, rows, kind, split, delay, strategy,
                               args.warmup, args.steps)
                r["delay"] = delay
                if label == "eager-1f1b split + broadcast":
                    measured_costs = costs_from(r["stage_times"], r["edge_s"], S)
                per["configs"][label] = r
                log(f"    iteration {r['iteration_s']:.3f} s (simulated {r['predicted_s']:.3f} s), "
                    f"{r['samples_per_s']:.1f} samples/s")
    write_outputs(results, args, out)
    return 0


def write_outputs(results, args, out: Path) -> None:
    md = ["# Pipeline training on the emulated cluster\n",
          f"{S} hosts (one stage each) x {args.devices_per_host} JAX CPU devices, NICs {args.nic}, "
          f"{args.host_cpus} CPU cores per host; "
          f"{args.microbatches} microbatches of {args.seq} tokens per row; "
          f"median of {args.steps} steps after {args.warmup} warm-up steps. Command: "
          f"`sudo .venv/bin/python benchmarks/train_pipeline.py`.\n"]
    summary = {}
    for model_name, per in results.items():
        cfgs = per["configs"]
        base, ours = cfgs[BASELINE], cfgs[OURS]
        # the signal bound: the faster of the signal runs (no communication, best schedule)
        sig = min((r for label, r in cfgs.items() if r["strategy"] == "signal"), key=lambda r: r["iteration_s"])
        fwd = ours["compute_times"]["F"]
        comm = [max([v for k, v in ours["edge_s"].items() if k.startswith(f"F:{s}->")] or [0.0]) for s in range(S)]
        kw = per["model_kwargs"]
        md.append(f"\n## {model_name} ({kw['layers']} layers, width {kw['d']}, {per['rows']} rows per microbatch)\n")
        md.append("Transfer time / forward time per sending stage (eager + delay, broadcast): " +
                  ", ".join(f"stage {s}: {comm[s]:.3f}/{fwd[s]:.3f} s = {comm[s] / fwd[s]:.2f}" for s in range(S - 1)) + "\n")
        rows = []
        for label, r in cfgs.items():
            err = (r["predicted_s"] - r["iteration_s"]) / r["iteration_s"]
            rows.append([label, f"{r['iteration_s']:.3f}", f"{r['samples_per_s']:.1f}",
                         f"{base['iteration_s'] / r['iteration_s']:.2f}x", f"{sig['iteration_s'] / r['iteration_s']:.2f}",
                         f"{r['predicted_s']:.3f}", f"{err:+.0%}"])
        md.append(table(["configuration", "iteration s", "samples/s", "vs baseline", "of signal bound",
                         "simulated s", "sim error"], rows))
        md.append("\nPeak live activation bytes per stage, measured (the backward state of every live "
                  "microbatch, counted on the worker) / predicted by the memory model (`pipeline.memory`: peak "
                  "units of one microbatch's forward state, BI keeping the measured fraction of it until BW):\n")
        mrows = []
        for label in ("1f1b + broadcast", "eager-1f1b split + broadcast", OURS):
            r = cfgs[label]
            mrows.append([label] + [f"{b / 2**20:.1f} / {m / 2**20:.1f}" for b, m in
                                    zip(r["peak_live_bytes"], r["model_peak_bytes"])])
        md.append(table(["schedule (MiB measured / model)"] + [f"stage {s}" for s in range(S)], mrows))
        summary[model_name] = {"speedup_vs_baseline": base["iteration_s"] / ours["iteration_s"],
                               "fraction_of_signal": sig["iteration_s"] / ours["iteration_s"],
                               "comm_over_fwd": [c / f for c, f in zip(comm, fwd)][:S - 1]}
        md.append(f"\n**{model_name}: eager-1F1B + delay + broadcast = {summary[model_name]['speedup_vs_baseline']:.2f}x "
                  f"the baseline, {summary[model_name]['fraction_of_signal']:.2f} of the signal bound.**\n")
        if "records" in base:
            write_chrome_trace(base["records"][-2:], out / f"trace_{model_name}_baseline.json")
            write_chrome_trace(ours["records"][-2:], out / f"trace_{model_name}_eager_delay.json")
    (out / "results.md").write_text("\n".join(md) + "\n")
    clean = {m: {"model_kwargs": per["model_kwargs"], "rows": per.get("rows"), "summary": summary[m],
                 "configs": {label: {k: v for k, v in r.items() if k not in ("records", "sched")}
                             for label, r in per["configs"].items()}} for m, per in results.items()}
    clean["_args"] = {k: getattr(args, k) for k in ("nic", "devices_per_host", "host_cpus", "microbatches", "seq",
                                                   "steps", "warmup")}
    (out / "results.json").write_text(json.dumps(clean, indent=1))
    plot(results, out)
    print("\n".join(md))
    log(f"wrote {out}/results.md, results.json, throughput.png, memory.png and traces")


def _per_model_figure(results, path: Path, height: float, draw) -> None:
    """One panel per model, ``draw(ax, per)`` filling each."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), height), squeeze=False)
    for ax, (model_name, per) in zip(axes[0], results.items()):
        draw(ax, per)
        ax.set_title(model_name, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(results, out: Path) -> None:
    def throughput(ax, per):
        cfgs = per["configs"]
        labels = list(cfgs)
        x = np.arange(len(labels))
        ax.bar(x - 0.2, [cfgs[l]["samples_per_s"] for l in labels], 0.4, label="measured")
        ax.bar(x + 0.2, [cfgs[l]["samples_per_s"] * cfgs[l]["iteration_s"] / cfgs[l]["predicted_s"] for l in labels],
               0.4, label="simulated from measured times", alpha=0.6)
        ax.set_xticks(x)
        ax.set_xticklabels([l.replace(" + ", "\n+ ") for l in labels], fontsize=6)
        ax.set_ylabel("samples / s")

    def memory_panel(ax, per):
        for label in ("1f1b + broadcast", "eager-1f1b split + broadcast", OURS):
            r = per["configs"][label]
            line, = ax.plot(range(S), [b / 2**20 for b in r["peak_live_bytes"]], marker="o", label=label)
            ax.plot(range(S), [b / 2**20 for b in r["model_peak_bytes"]], ls="--", color=line.get_color(), lw=0.8)
        ax.set_xticks(range(S))
        ax.set_xlabel("stage")
        ax.set_ylabel("peak live activations (MiB; dashed: model)")

    _per_model_figure(results, out / "throughput.png", 3.8, throughput)
    _per_model_figure(results, out / "memory.png", 3.2, memory_panel)


if __name__ == "__main__":
    sys.exit(main())
