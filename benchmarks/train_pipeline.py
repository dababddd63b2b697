"""End-to-end pipeline training on the emulated cluster: schedules x strategies, interleaved.

One emulated cluster (4 hosts, one stage each, shaped NICs, a CPU cap per host
that the transport threads share with compute). Configurations: 1F1B with Alpa's
resharding (the baseline); with broadcast, eager-1F1B with the calibrated
weight-gradient delay, ZB-H1, and the schedules over two chunks per stage
(interleaved 1F1B, ZB-V, DualPipeV; the model is cut into 8 stages for them);
the same eager-1F1B, ZB-H1 and ZB-V with ``signal`` (one byte per transfer: the
no-communication bound is the fastest of them in each repeat); and whatever
``--schedule auto`` picks. Per model:

1. **Auto and calibration**: what ``alpa-comm train --schedule auto`` does, on the
   same cluster: its calibration runs (``trainer.calibrate``: eager-1F1B split and
   whole, interleaved 1F1B x2, ZB-V), then every family ranked
   (``trainer.rank_schedules``), the finalists (predicted within
   ``auto_schedule.TRIAL_MARGIN`` of the fastest) measured for a few steps
   (``trainer.trial_finalists``; a calibration run of the same schedule counts)
   and the measured fastest picked. Its pick is then measured, like every other
   configuration, as the configuration that runs the same schedule, or as a
   configuration added for it. Its first run
   (eager-1F1B split, broadcast) also chooses the weight-gradient delay of the
   eager-1F1B configurations (``auto_backward``: the least delay per stage that
   shortens the iteration, or an unsplit backward where no delay does) and gives
   the regime: per stage, XLA's forward flop count over the measured forward time
   against the host's matmul rate under the same cap (``arith_fraction``), per
   edge its transfer time alone over the sending stage's forward
   (``transfer_over_forward``). Every calibration run's records are saved
   (``calibration_<model>.json``) so the predictor can be checked offline.
2. **Interleaved repeats**: the configurations one after another (A B C ... A B
   C ...), each set up afresh, warmed up, then timed for ``--steps`` iterations;
   the whole set ``--repeats`` times, so slow drift of the machine spreads over
   every configuration instead of landing on one. Speed-ups and auto's share of
   the fastest configuration are paired within a repeat; the median and the
   min-max across repeats are reported.
3. **Prediction**: every (configuration, repeat) is simulated from its own
   measured action durations and edge times (``train.measure.predict_by_step``:
   shared NICs, each timed step simulated with durations drawn from that step's
   measured spread, the median over steps, as the measured iteration time is the
   median step) beside the plain simulation from median durations; the prediction
   from every step's durations pooled is kept in results.json
   (``simulated_pooled_seconds``).

    sudo .venv/bin/python benchmarks/train_pipeline.py --steps 3 --repeats 2   # ~70 min on a slow day

Writes results.md / results.json (one row per model, configuration and repeat),
speedup.png, memory.png, calibration_<model>.json and Chrome traces of the baseline and of auto's pick.
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
from alpa_comm.pipeline.edges import model_stage_meshes, with_skips
from alpa_comm.pipeline.memory import memory
from alpa_comm.pipeline.weight_delay import auto_backward
from alpa_comm.report.tables import table
from alpa_comm.report.trace import write_chrome_trace
from alpa_comm.train.data import synthetic
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster, abstract_model
from alpa_comm.train.measure import (comm_cpu_seconds, costs_from, iteration_seconds, predict, predict_by_step,
                                    stage_times, transfer_overlap)
from alpa_comm.train.trainer import (TrainConfig, calibrate as train_calibrate, calibration_from, data_stream,
                                    models_by_size, pick_schedule, rank_schedules, trial_finalists)

S = 4
# label -> (schedule kind, split backward, delay ("auto": chosen by calibration), strategy, chunks per stage)
CONFIGS = {
    "1f1b+alpa": ("1f1b", False, None, "alpa", None),
    "eager-1f1b+delay+broadcast": ("eager-1f1b", True, "auto", "broadcast", None),
    "zb-h1+broadcast": ("zb-h1", False, None, "broadcast", None),
    "interleaved-1f1b+broadcast": ("interleaved-1f1b", False, None, "broadcast", 2),
    "zb-v+broadcast": ("zb-v", False, None, "broadcast", None),
    "dualpipev+broadcast": ("dualpipev", False, None, "broadcast", None),
    "eager-1f1b+delay+signal": ("eager-1f1b", True, "auto", "signal", None),
    "zb-h1+signal": ("zb-h1", False, None, "signal", None),
    "zb-v+signal": ("zb-v", False, None, "signal", None),
}
BASELINE = "1f1b+alpa"
SIGNAL = [label for label, c in CONFIGS.items() if c[3] == "signal"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def schedule_for(model_name: str, kw: dict, M: int, kind: str, split: bool, delay, chunks=None):
    """The schedule with the skips of the model cut into one stage per chunk of every stage."""
    sched = generate(kind, S, M, split_backward=split, delay_wgrad=delay, chunks=chunks)
    return with_skips(sched, build_model(model_name, sched.num_virtual_stages, **kw).skips)


def run_config(cluster, model_name, kw, M, rows, sched, strategy, warmup, steps) -> dict:
    """Set up, warm up and time one configuration; everything measured, nothing derived."""
    pipe = DistributedPipeline(cluster, model_name, S, sched, microbatch_size=rows, model_kwargs=kw,
                               strategy=strategy, optimizer="sgd", lr=0.01)
    data = synthetic(M, rows, kw["seq"], seed=0)
    for _ in range(warmup):
        pipe.step(next(data))
    records = [pipe.step(next(data)).per_host for _ in range(steps)]
    return {"pipe": pipe, "records": records, "edge_s": pipe.time_edges(repeats=3), "link_s": pipe.link_seconds()}


def regime_of(run: dict, pipe, M: int) -> dict:
    """Delay and regime from auto's eager-1F1B calibration run (split backward, broadcast)."""
    times = stage_times(run["records"], S)
    raw = stage_times(run["records"], S, busy=False)
    # delays where a delay helps; None where none does (the backward then stays whole)
    delay = auto_backward("eager-1f1b", S, M, costs_from(times, run["edge_s"], S))
    fwd = raw["F"]
    stages = []
    for r in sorted(pipe.regime(), key=lambda r: r["stage"]):
        s = r["stage"]
        achieved = r["forward_flops"] / fwd[s] if fwd[s] else 0.0
        stages.append({"stage": s, "forward_flops": r["forward_flops"], "forward_seconds": fwd[s],
                       "achieved_flops_per_s": achieved, "matmul_flops_per_s": r["matmul_flops_per_s"],
                       "arith_fraction": achieved / r["matmul_flops_per_s"]})
    edges = {name: {"seconds": sec, "over_forward": sec / fwd[int(name.split(":")[1].split("->")[0])]}
             for name, sec in run["edge_s"].items()}
    return {"delay": delay, "stages": stages, "edges": edges, "edge_s": run["edge_s"]}


def choose_auto(cluster, model_name, kw, M, rows) -> dict:
    """What ``alpa-comm train --schedule auto`` does on this cluster: its own calibration
    (``trainer.calibrate``), every family ranked by the predictor over those
    measurements (``trainer.rank_schedules``), the finalists measured
    (``trainer.trial_finalists``) and the measured fastest picked. Returns the pick, the
    ranking, what the trial measured, every calibration run (saved, so the predictor can
    be checked offline) and the regime read from its eager-1F1B split run (the run that
    also picks the delay)."""
    cfg = auto_config(model_name, kw, M, rows)
    runs, regime = [], {}

    def on_run(run, pipe):
        runs.append(run)
        if run["split"] and run["model_stages"] == S:
            regime.update(regime_of(run, pipe, M))

    model = abstract_model(model_name, S, cfg.model_kwargs())
    data = data_stream(cfg)
    cal = train_calibrate(cfg, cluster, model, data, log=sys.stderr, model_for=models_by_size(cfg), on_run=on_run)
    got = rank_auto(cfg, cal, lambda ranked: trial_finalists(cfg, cluster, ranked, data, cal.runs, log=sys.stderr))
    log(got["ranking"].rstrip())
    return {**got, "runs": runs, "regime": regime}


def auto_config(model_name, kw, M, rows) -> TrainConfig:
    """The ``alpa-comm train --schedule auto`` configuration the benchmark's sizes make."""
    return TrainConfig(model=model_name, stages=S, layers=kw["layers"], width=kw["d"], heads=kw["heads"],
                       seq=kw["seq"], microbatches=M, microbatch_size=rows, strategy="broadcast", cluster="emulated",
                       optimizer="sgd", lr=0.01, data="synthetic", schedule="auto")


def rank_auto(cfg: TrainConfig, cal, trial=None) -> dict:
    """What ``--schedule auto`` does over a calibration, keeping every ranked candidate:
    the pick (``label``, ``schedule``, ``predicted_seconds``), the ranking table as text
    (``ranking``), the list (``ranked``) and what ``trial(ranked)`` measured
    (``measured``: label -> (seconds, where)); without ``trial`` (offline) the pick is
    the predicted one."""
    import io  # noqa: PLC0415

    ranking = io.StringIO()
    model = abstract_model(cfg.model, S, cfg.model_kwargs())
    ranked = rank_schedules(cfg, model, cal.costs, cal.predict, cal.wgrad_fraction, models_by_size(cfg))
    measured = trial(ranked) if trial is not None else {}
    pick = pick_schedule(ranked, ranking, measured)
    return {"label": pick.candidate.label, "schedule": pick.schedule, "predicted_seconds": pick.predicted_s,
            "ranking": ranking.getvalue(), "ranked": ranked, "measured": measured}


def rerank(saved: dict, out: Path) -> None:
    """``--rerank``: auto's ranking again from the saved calibration runs with today's
    predictor (``trainer.calibration_from``), beside each candidate's measured median
    where a configuration ran its schedule; no cluster."""
    a = saved["args"]
    for model_name, info in saved["models"].items():
        path = out / f"calibration_{model_name}.json"
        if not path.exists():
            log(f"{model_name}: no {path} (a run before calibration records were saved); skipped")
            continue
        cfg = auto_config(model_name, info["model_kwargs"], a["microbatches"], a["rows"])
        got = rank_auto(cfg, calibration_from(json.loads(path.read_text()), cfg))
        summ = summarize(saved, model_name)
        configs, _ = configurations(model_name, info["model_kwargs"], a["microbatches"], info["delay"], got)
        by_text = {}
        for label, (sched, strategy) in configs.items():
            if strategy == "broadcast" and label in summ:
                by_text.setdefault(sched.to_text(), label)
        fastest = min(s["iteration_seconds"] for l, s in summ.items() if l not in SIGNAL)
        trial = info["auto"].get("trial") or {}
        rows = []
        for r in got["ranked"]:
            label = by_text.get(r.schedule.to_text())
            it = summ[label]["iteration_seconds"] if label else None
            tried = trial.get(r.candidate.label)
            rows.append([r.candidate.label, f"{r.predicted_s:.3f}", f"{tried[0]:.3f} ({tried[1]})" if tried else "-",
                         f"{it:.3f}" if it else "-", f"{fastest / it:.3f}" if it else "-"])
        print(f"\n## {model_name}: ranking from the saved calibration (today's predictor): predicted pick "
              f"{got['label']} (the run picked {info['auto']['pick']}"
              + (", the measured fastest of its trial" if trial else "") + ")\n")
        print(table(["candidate", "predicted s", "run's trial s", "measured s (median)", "measured, of fastest"],
                    rows))


def configurations(model_name, kw, M, delay, auto) -> tuple[dict, str]:
    """label -> (schedule, strategy) for every configuration, and the label that measures
    auto's pick: the configuration that runs the same schedule, or one added for it."""
    out = {}
    for label, (kind, split, d, strategy, chunks) in CONFIGS.items():
        if d == "auto":
            split, d = delay is not None, delay
        out[label] = (schedule_for(model_name, kw, M, kind, split, d, chunks), strategy)
    text = auto["schedule"].to_text()
    same = [label for label, (sched, strategy) in out.items() if strategy == "broadcast" and sched.to_text() == text]
    if same:
        return out, same[0]
    label = f"auto: {auto['label']}+broadcast"
    out[label] = (auto["schedule"], "broadcast")
    return out, label


def measure(cluster, model_name, kw, M, rows, configs, args, t_start) -> tuple[list[dict], dict]:
    """Every configuration ``args.repeats`` times, interleaved. Returns one row per
    (configuration, repeat) and the last repeat's records of each configuration."""
    rows_out, last = [], {}
    for rep in range(args.repeats):
        for label, (sched, strategy) in configs.items():
            log(f"[{time.monotonic() - t_start:6.0f} s] {model_name} repeat {rep + 1}/{args.repeats}: {label}")
            run = run_config(cluster, model_name, kw, M, rows, sched, strategy, args.warmup, args.steps)
            recs, signal = run["records"], strategy == "signal"
            iters = [iteration_seconds(r) for r in recs]
            costs = costs_from(stage_times(recs, S), run["edge_s"], S, model_stage_meshes(sched))
            row = {"model": model_name, "config": label, "repeat": rep, "iteration_seconds": median(iters),
                   "iterations": iters,
                   "simulated_seconds": predict_by_step(sched, recs, run["edge_s"], signal=signal),
                   "simulated_pooled_seconds": predict(sched, recs, run["edge_s"], signal=signal),
                   "simulated_medians_seconds": simulate_schedule(sched, costs, signal=signal).iteration_time,
                   "cpu_seconds": [median(rec["cpu_seconds"] for r in recs for rec in r if rec["stage"] == s)
                                   for s in range(S)],
                   "comm_cpu_seconds": [median(comm_cpu_seconds(rec) for r in recs for rec in r if rec["stage"] == s)
                                        for s in range(S)],
                   "transfer_overlap": [median(transfer_overlap(rec) for r in recs for rec in r if rec["stage"] == s)
                                        for s in range(S)],
                   "stage_seconds": stage_times(recs, S, busy=False), "edge_seconds": run["edge_s"],
                   "link_seconds": run["link_s"],
                   "schedule": sched.name, "strategy": strategy}
            rows_out.append(row)
            log(f"    iteration {row['iteration_seconds']:.3f} s (simulated {row['simulated_seconds']:.3f} s)")
            last[label] = {"records": recs, "sched": sched, "edge_s": run["edge_s"]}
    return rows_out, last


def peak_memory(last: dict) -> dict:
    """Peak live activation bytes per stage, measured and by the memory model."""
    out = {}
    for label, run in last.items():
        recs, sched = run["records"], run["sched"]
        peak = [max(rec["peak_live_bytes"] for r in recs for rec in r if rec["stage"] == s) for s in range(S)]
        model_bytes = []
        for s in range(S):
            per_mb = next(rec["state_bytes"] for rec in recs[-1] if rec["stage"] == s)
            f = per_mb.get("F", 0)
            frac = per_mb.get("BI", 0) / f if f else 0.0
            model_bytes.append(memory(sched, wgrad_fraction=frac)[s].peak_activations * f)
        out[label] = {"measured": peak, "model": model_bytes}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/train_emulated")
    p.add_argument("--nic", default="200mbit", help="emulated NIC rate per host and direction (default 200mbit: "
                   "each edge's transfer 0.3-1.0 of its sender's forward at the default sizes)")
    p.add_argument("--devices-per-host", type=int, default=2)
    p.add_argument("--host-cpus", type=float, default=0.5,
                   help="CPU cores per emulated host (default 0.5: four hosts share this 2-core machine evenly)")
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--rows", type=int, default=16, help="rows per microbatch")
    p.add_argument("--seq", type=int, default=64, help="tokens per row")
    p.add_argument("--width", type=int, default=256, help="model width d (both models)")
    p.add_argument("--ut-layers", type=int, default=8,
                   help="U-Transformer layers (2L; default 8: one per model stage of the schedules with two "
                        "chunks per stage, two per stage of the others)")
    p.add_argument("--gpt-layers", type=int, default=8,
                   help="GPT layers (default 8: one per model stage of the schedules with two chunks per stage)")
    p.add_argument("--models", default="utransformer,gpt")
    p.add_argument("--warmup", type=int, default=1, help="steps before timing, each time a configuration is set up")
    p.add_argument("--steps", type=int, default=5, help="timed steps per configuration and repeat")
    p.add_argument("--repeats", type=int, default=3, help="times the whole interleaved set runs")
    p.add_argument("--render", action="store_true", help="only rewrite results.md and the PNGs from results.json")
    p.add_argument("--rerank", action="store_true",
                   help="only rank auto's candidates again from the saved calibration_<model>.json with today's "
                        "predictor, beside the measured medians in results.json (no cluster)")
    args = p.parse_args(argv)
    for name in ("devices_per_host", "microbatches", "rows", "seq", "width", "ut_layers", "gpt_layers", "steps",
                 "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    unknown = sorted(set(args.models.split(",")) - {"utransformer", "gpt"})
    if unknown:
        p.error(f"--models: unknown {', '.join(map(repr, unknown))}; choose from utransformer, gpt")
    for name in ("ut_layers", "gpt_layers"):
        if getattr(args, name) < 2 * S:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: the schedules with two chunks per stage cut "
                    f"the model into {2 * S} stages; give at least {2 * S} layers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if (args.rerank or args.render) and not (out / "results.json").exists():
        p.error(f"--{'rerank' if args.rerank else 'render'} reads {out / 'results.json'}, which does not exist: "
                f"run the benchmark with --out {out} first")
    if args.rerank:
        rerank(json.loads((out / "results.json").read_text()), out)
        return 0
    if args.render:
        saved = json.loads((out / "results.json").read_text())
        for k, v in saved["args"].items():
            setattr(args, k, v)
        write_outputs(saved, args, out)
        return 0
    saved = {"args": {k: getattr(args, k) for k in ("nic", "devices_per_host", "host_cpus", "microbatches", "rows",
                                                   "seq", "width", "ut_layers", "gpt_layers", "warmup", "steps",
                                                   "repeats")},
             "rows": [], "models": {}}
    t_start = time.monotonic()
    with PipelineCluster.emulated(S, args.devices_per_host, nic=args.nic, timeout=60, cpu=args.host_cpus) as cluster:
        for model_name in args.models.split(","):
            layers = args.ut_layers if model_name == "utransformer" else args.gpt_layers
            kw = {"layers": layers, "d": args.width, "heads": 4, "seq": args.seq}
            log(f"[{time.monotonic() - t_start:6.0f} s] {model_name}: --schedule auto (its calibration runs also "
                f"give the delay and the regime)")
            auto = choose_auto(cluster, model_name, kw, args.microbatches, args.rows)
            regime = auto["regime"]
            fractions = ", ".join(f"{s['arith_fraction']:.2f}" for s in regime["stages"])
            ratios = ", ".join(f"{k} {e['over_forward']:.2f}" for k, e in regime["edges"].items())
            log(f"    delay {regime['delay']}; arith fraction {fractions}; transfer/forward {ratios}")
            (out / f"calibration_{model_name}.json").write_text(json.dumps(auto["runs"]))
            configs, auto_label = configurations(model_name, kw, args.microbatches, regime["delay"], auto)
            log(f"    auto picked {auto['label']}: measured as {auto_label}")
            rows, last = measure(cluster, model_name, kw, args.microbatches, args.rows, configs, args, t_start)
            saved["rows"] += rows
            saved["models"][model_name] = {"model_kwargs": kw, "delay": regime["delay"],
                                           "regime_stages": regime["stages"], "regime_edges": regime["edges"],
                                           "peak_memory": peak_memory(last),
                                           "auto": {"pick": auto["label"], "config": auto_label,
                                                    "predicted_seconds": auto["predicted_seconds"],
                                                    "trial": auto["measured"], "ranking": auto["ranking"]}}
            for label, tag in ((BASELINE, "baseline"), (auto_label, "auto")):
                write_chrome_trace(last[label]["records"][-2:], out / f"trace_{model_name}_{tag}.json")
    write_outputs(saved, args, out)
    return 0


# ------------------------------------------------------------------ outputs
def summarize(saved: dict, model_name: str) -> dict:
    """Per configuration: median iteration, speed-up over the baseline and fraction of
    the signal bound (each paired within a repeat: median, min, max), simulator errors."""
    rows = [r for r in saved["rows"] if r["model"] == model_name]
    by = {(r["config"], r["repeat"]): r for r in rows}
    repeats = sorted({r["repeat"] for r in rows})
    out = {}
    for label in dict.fromkeys(r["config"] for r in rows):
        it = [by[(label, k)]["iteration_seconds"] for k in repeats]
        speed = [by[(BASELINE, k)]["iteration_seconds"] / by[(label, k)]["iteration_seconds"] for k in repeats]
        bound = [min(by[(s, k)]["iteration_seconds"] for s in SIGNAL) for k in repeats]
        frac = [b / by[(label, k)]["iteration_seconds"] for b, k in zip(bound, repeats)]
        err = [(by[(label, k)]["simulated_seconds"] - by[(label, k)]["iteration_seconds"])
               / by[(label, k)]["iteration_seconds"] for k in repeats]
        err0 = [(by[(label, k)]["simulated_medians_seconds"] - by[(label, k)]["iteration_seconds"])
                / by[(label, k)]["iteration_seconds"] for k in repeats]
        hidden = [median(by[(label, k)].get("transfer_overlap", [1.0] * S)[s] for k in repeats) for s in range(S)]
        best = [min(by[(c, k)]["iteration_seconds"] for c in dict.fromkeys(r["config"] for r in rows)
                    if c not in SIGNAL) for k in repeats]
        link = by[(label, repeats[0])].get("link_seconds")
        if link is None:  # a run from before rows kept it: plan the configuration again, offline
            link = offline_link_seconds(saved, model_name, label)
        cpu = [max(by[(label, k)]["cpu_seconds"]) / saved["args"]["host_cpus"] for k in repeats]
        comm = [max(by[(label, k)]["comm_cpu_seconds"]) / saved["args"]["host_cpus"] for k in repeats
                if "comm_cpu_seconds" in by[(label, k)]]  # rows from before it was kept have none
        fill = None if label in SIGNAL else fill_seconds(saved["models"][model_name].get("regime_edges", {}))
        phys = (None if link is None else
                median(max(b, link) / by[(label, k)]["iteration_seconds"] for b, k in zip(bound, repeats)))
        out[label] = {"of_best": median(b / i for b, i in zip(best, it)), "iteration_seconds": median(it),
                      "link_seconds": link, "fill_seconds": fill, "cpu_floor_seconds": median(cpu),
                      "comm_cpu_seconds": median(comm) if comm else None,
                      "of_physical": phys,
                      "transfer_overlap": hidden, "iteration_range": [min(it), max(it)],
                      "speedup": median(speed), "speedup_range": [min(speed), max(speed)],
                      "of_signal": median(frac), "of_signal_range": [min(frac), max(frac)],
                      "sim_error": max(err, key=abs), "sim_error_medians": max(err0, key=abs)}
    return out


def fill_seconds(edges: dict) -> float | None:
    """The transfers on the fill and drain path: the first microbatch's forward crosses
    every forward edge before the last stage can start, the last one's gradient every
    backward edge before the first stage can finish its last input gradient. Their sum
    over the one-chunk edges (``F:s->s+1`` and ``B:s+1->s``, each timed alone in the
    calibration run, with broadcast) is how much later than in the no-communication run
    that path ends where nothing else hides it: an estimate of what communication costs
    a pipeline whose signal run has no slack on that path, not a bound (a schedule with
    slack there, or a bottleneck stage that never waits, hides part of it). None where an
    edge was not timed."""
    try:
        return sum(edges[f"F:{s}->{s + 1}"]["seconds"] + edges[f"B:{s + 1}->{s}"]["seconds"] for s in range(S - 1))
    except KeyError:
        return None


def offline_link_seconds(saved: dict, model_name: str, label: str) -> float | None:
    """``link_seconds`` of a configuration of ``CONFIGS`` planned again without a cluster
    (the bytes depend on the placement and the edges, not on delays or splits); None
    for one added for auto."""
    if label not in CONFIGS:
        return None
    from alpa_comm.runtime.launch import emulated_spec  # noqa: PLC0415
    from alpa_comm.train.distributed import plan_pipeline  # noqa: PLC0415

    a, kw = saved["args"], saved["models"][model_name]["model_kwargs"]
    kind, _, _, strategy, chunks = CONFIGS[label]
    spec = emulated_spec(S, a["devices_per_host"], a["nic"])
    sched = schedule_for(model_name, kw, a["microbatches"], kind, False, None, chunks)
    return plan_pipeline(model_name, kw, sched, a["rows"], 1, spec, strategy).link_seconds()


def write_outputs(saved: dict, args, out: Path) -> None:
    a = saved["args"]
    md = ["# Pipeline training on the emulated cluster\n",
          f"{S} hosts (one stage each) x {a['devices_per_host']} JAX CPU devices, NICs {a['nic']}, "
          f"{a['host_cpus']} CPU cores per host (transport threads inside the cap); {a['microbatches']} microbatches "
          f"of {a['rows']} rows x {a['seq']} tokens, width {a['width']}. Configurations "
          f"interleaved, each set up afresh per repeat, {a['warmup']} warm-up step(s) then {a['steps']} timed "
          f"steps (median), the whole set {a['repeats']} times; speed-ups paired within a repeat, median "
          f"[min-max] across repeats. Command: `sudo .venv/bin/python benchmarks/train_pipeline.py`.\n"]
    summaries = {}
    for model_name, info in saved["models"].items():
        summ = summaries[model_name] = summarize(saved, model_name)
        kw = info["model_kwargs"]
        delay = info["delay"] or "none helps: backward kept whole"
        md.append(f"\n## {model_name} ({kw['layers']} layers, width {kw['d']}; weight-gradient delay: {delay})\n")
        md.append("Regime (calibration run, eager-1F1B split + broadcast): arithmetic share of each stage's "
                  "forward, and each edge's transfer alone over its sending stage's forward:\n")
        md.append(table(["stage", "forward GFLOP", "forward s", "achieved GFLOP/s", "matmul GFLOP/s (host, capped)",
                         "arith fraction"],
                        [[s["stage"], f"{s['forward_flops'] / 1e9:.2f}", f"{s['forward_seconds']:.3f}",
                          f"{s['achieved_flops_per_s'] / 1e9:.1f}", f"{s['matmul_flops_per_s'] / 1e9:.1f}",
                          f"{s['arith_fraction']:.2f}"] for s in info["regime_stages"]]))
        md.append("")
        md.append(table(["edge", "transfer alone s", "transfer / forward"],
                        [[k, f"{e['seconds']:.3f}", f"{e['over_forward']:.2f}"] for k, e in info["regime_edges"].items()]))
        md.append("")
        md.append(table(["configuration", "iteration s", "vs 1f1b+alpa", "of fastest", "of signal bound",
                         "link bound s", "fill s", "of physical bound", "host CPU s / cap", "comm threads CPU s / cap",
                         "simulated error",
                         "error, median-duration sim", "sending time hidden by compute, per stage"],
                        [[label, f"{s['iteration_seconds']:.3f} [{s['iteration_range'][0]:.3f}-"
                                 f"{s['iteration_range'][1]:.3f}]",
                          f"{s['speedup']:.2f}x [{s['speedup_range'][0]:.2f}-{s['speedup_range'][1]:.2f}]",
                          "-" if label in SIGNAL else f"{s['of_best']:.3f}",
                          f"{s['of_signal']:.2f} [{s['of_signal_range'][0]:.2f}-{s['of_signal_range'][1]:.2f}]",
                          "-" if s["link_seconds"] is None else f"{s['link_seconds']:.2f}",
                          "-" if s.get("fill_seconds") is None else f"{s['fill_seconds']:.2f}",
                          "-" if s["of_physical"] is None else f"{s['of_physical']:.2f}",
                          f"{s['cpu_floor_seconds']:.2f}",
                          "-" if s.get("comm_cpu_seconds") is None else f"{s['comm_cpu_seconds']:.2f}",
                          f"{s['sim_error']:+.0%}", f"{s['sim_error_medians']:+.0%}",
                          " ".join(f"{h:.2f}" for h in s["transfer_overlap"])] for label, s in summ.items()]))
        by_step = all("simulated_pooled_seconds" in r for r in saved["rows"] if r["model"] == model_name)
        how = ("each timed step simulated from its own durations, the median over steps" if by_step else
               "every timed step's durations pooled (a run from before `predict_by_step`)")
        md.append(f"\n(simulated error: the worst over repeats of (simulated - measured) / measured, {how}. "
                  "Link bound: the "
                  "least time a step's transfers hold the busiest NIC, bytes over rate (`DistributedPipeline."
                  "link_seconds`; edge transfers, not the data-parallel mean); physical bound: the larger of it "
                  "and the signal bound, per repeat. Fill: the one-chunk edges' transfers, each timed alone with "
                  "broadcast, that the first microbatch's forward and the last one's backward cross in turn: an "
                  "estimate of what the fill and drain add to the signal bound where the signal run has no slack "
                  "on that path (not a bound). Host CPU s / cap: the busiest host's CPU seconds per step "
                  "(compute, transport threads, runtime, the optimizer update included) over its core cap: the "
                  "least wall time that host's work takes under the cap. Comm threads CPU s / cap: the largest over "
                  "hosts (not necessarily the busiest host) of the CPU seconds per step on threads that move data "
                  "(`train.measure.COMM_THREADS`: gloo's I/O loop, the mailbox's and the executor's transfer and "
                  "packing threads) over the cap; unpacking arrivals runs on the runner's thread and is not in it.)\n")
        mem = info["peak_memory"]
        md.append("Peak live activation MiB per stage, measured / memory model (last repeat):\n")
        md.append(table(["configuration"] + [f"stage {s}" for s in range(S)],
                        [[label] + [f"{b / 2**20:.1f} / {m / 2**20:.1f}" for b, m in zip(v["measured"], v["model"])]
                         for label, v in mem.items() if "signal" not in label]))
        auto = info["auto"]
        a_s = summ[auto["config"]]
        fastest = min((l for l in summ if l not in SIGNAL), key=lambda l: summ[l]["iteration_seconds"])
        trial = auto.get("trial") or {}
        in_trial = (f", {trial[auto['pick']][0]:.3f} s measured (median of its steps in: "
                    f"{trial[auto['pick']][1]})" if auto["pick"] in trial else "")
        md.append(f"\n**{model_name}: `--schedule auto` picked {auto['pick']} "
                  f"(predicted {auto['predicted_seconds']:.3f} s{in_trial}), measured as `{auto['config']}`: "
                  f"{a_s['iteration_seconds']:.3f} s, {a_s['of_best']:.3f} of the "
                  f"fastest measured configuration per repeat (fastest by median: `{fastest}`), {a_s['of_signal']:.2f} "
                  f"of the no-communication bound (the fastest signal run), {a_s['speedup']:.2f}x 1F1B + Alpa.**\n")
        md.append("`--schedule auto`'s ranking (from its own calibration runs" + (" and its trial of the finalists"
                  if trial else "") + ", before any configuration ran):\n")
        md.append("```\n" + auto["ranking"].rstrip() + "\n```\n")
    saved["summary"] = summaries
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(saved, indent=1))
    plot(saved, out)
    print("\n".join(md))
    log(f"wrote {out}/results.md, results.json, speedup.png, memory.png and traces")


def _figure(models: list, height: float, width: float = 6.0):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(models), figsize=(width * len(models), height), squeeze=False)
    return plt, fig, axes[0]


def plot(saved: dict, out: Path) -> None:
    models = list(saved["models"])
    if not models:
        return
    most = max(len(saved["summary"][m]) for m in models)
    plt, fig, axes = _figure(models, 4.6, max(6.0, 0.8 * most))
    for ax, model_name in zip(axes, models):
        summ = saved["summary"][model_name]
        labels = list(summ)
        x = np.arange(len(labels))
        med = [summ[l]["speedup"] for l in labels]
        lo = [m - summ[l]["speedup_range"][0] for m, l in zip(med, labels)]
        hi = [summ[l]["speedup_range"][1] - m for m, l in zip(med, labels)]
        ax.bar(x - 0.2, med, 0.4, yerr=[lo, hi], capsize=3, label="measured (median, min-max over repeats)")
        rows = [r for r in saved["rows"] if r["model"] == model_name]
        base = median(r["simulated_seconds"] for r in rows if r["config"] == BASELINE)
        ax.bar(x + 0.2, [base / median(r["simulated_seconds"] for r in rows if r["config"] == l) for l in labels],
               0.4, alpha=0.6, label="simulated from measured durations")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(x)
        picked = saved["models"][model_name].get("auto", {}).get("config")
        ax.set_xticklabels([l.replace("+", "\n+") + ("\n(auto's pick)" if l == picked else "") for l in labels],
                           fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("speed-up over 1f1b+alpa")
        ax.set_title(model_name, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)

    plt, fig, axes = _figure(models, 3.2)
    for ax, model_name in zip(axes, models):
        for label, v in saved["models"][model_name]["peak_memory"].items():
            if "signal" in label:
                continue
            line, = ax.plot(range(S), [b / 2**20 for b in v["measured"]], marker="o", label=label)
            ax.plot(range(S), [b / 2**20 for b in v["model"]], ls="--", color=line.get_color(), lw=0.8)
        ax.set_xticks(range(S))
        ax.set_xlabel("stage")
        ax.set_ylabel("peak live activations (MiB; dashed: model)")
        ax.set_title(model_name, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
