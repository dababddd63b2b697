"""Where the pipeline predictor's error comes from, offline, from saved calibration runs.

``benchmarks/train_pipeline.py`` saves every calibration run of ``--schedule auto``
(``calibration_<model>.json``: each step's records, its measured step time, the edge
times). For each run this predicts the run itself three ways and compares with its
measured median step time:

* **draws**: ``train.measure.predict`` as the trainer uses it (each action's duration
  drawn independently from its model stage's measured spread, shared NICs);
* **replay**: each timed step's own measured durations, action by action (no
  independent draws), shared NICs;
* **replay, own links**: the same with every stage pair on its own link instead of
  one NIC per host and direction.

Where replay is off the measurement, the error is the NIC model's or the runtime's, not
the draws'; where the two replays bracket the measurement, how transfers share a NIC
is what the simulator has to get right.

A second table replays each run with every transfer free (what the schedule's compute
takes with that run's own action durations) against the replay with transfers: the share
of the step the schedule leaves exposed to its transfers.

    .venv/bin/python benchmarks/predictor_check.py benchmarks/results/train_emulated_100mbit

Writes results.md, results.json and errors.png under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from alpa_comm.pipeline import generate, simulate_schedule
from alpa_comm.pipeline.edges import model_stage_meshes, with_skips
from alpa_comm.report.tables import table
from alpa_comm.train import measure
from alpa_comm.train.distributed import abstract_model

S = 4  # train_pipeline.py's stages


def replay(sched, steps: list, edge_s: dict, shared_nic: bool = True, signal: bool = False) -> float:
    """Mean over the timed steps of the simulation with that step's measured durations
    (``signal``: with every transfer free, the schedule's compute alone)."""
    costs = measure.costs_from(measure.stage_times(steps, S), edge_s, S,
                               model_stage_meshes(sched) if sched.virtual else None)
    out = []
    for per_host in steps:
        took = {}
        for rec in per_host:
            for kind, mb, t0, t1, *v in rec["events"]:
                if kind in measure.COMPUTE_KINDS:
                    took[(v[0] if v else rec["stage"], kind, mb)] = t1 - t0

        def action_time(stage, kind, mb, chunk=0, took=took):
            return took[(sched.virtual_stage(stage, chunk) if sched.virtual else stage, kind, mb)]
        out.append(simulate_schedule(sched, costs, shared_nic=shared_nic, signal=signal,
                                     action_time=action_time).iteration_time)
    return statistics.mean(out)


def check(result_dir: Path) -> list[dict]:
    saved = json.loads((result_dir / "results.json").read_text())
    rows = []
    for model_name, info in saved["models"].items():
        path = result_dir / f"calibration_{model_name}.json"
        if not path.exists():
            print(f"{path}: missing (a run before calibration records were saved); skipped", file=sys.stderr)
            continue
        runs = json.loads(path.read_text())
        if not all("seconds" in r for r in runs):
            print(f"{path}: no measured step times (a run before session 20); skipped", file=sys.stderr)
            continue
        split = next(r for r in runs if r["split"] and r["model_stages"] == S)
        for r in runs:
            model = abstract_model(model_name, r["model_stages"], info["model_kwargs"])
            sched = with_skips(generate(r["kind"], S, saved["args"]["microbatches"], split_backward=r["split"],
                                        chunks=r["chunks"]), model.skips)
            edge_s = r["edge_s"] or split["edge_s"]
            got = statistics.median(r["seconds"])
            rows.append({"run": result_dir.name, "nic": saved["args"]["nic"], "model": model_name,
                         "schedule": f"{r['kind']} ({'split' if r['split'] else 'whole'})", "measured_s": got,
                         "draws_s": measure.predict(sched, r["records"], edge_s),
                         "replay_s": replay(sched, r["records"], edge_s),
                         "replay_own_links_s": replay(sched, r["records"], edge_s, shared_nic=False),
                         "replay_no_transfers_s": replay(sched, r["records"], edge_s, signal=True)})
            print(f"  {model_name} {rows[-1]['schedule']}: measured {got:.2f} s", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="result directories of benchmarks/train_pipeline.py")
    p.add_argument("--out", default="benchmarks/results/predictor_check")
    args = p.parse_args(argv)
    for d in args.results:
        if not (Path(d) / "results.json").exists():
            p.error(f"{d}: no results.json (a directory benchmarks/train_pipeline.py wrote)")
    rows = []
    for d in args.results:
        print(f"{d}:", file=sys.stderr, flush=True)
        rows += check(Path(d))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def err(r, key):
        return f"{(r[key] - r['measured_s']) / r['measured_s']:+.0%}"
    md = ["# The pipeline predictor against its own calibration runs\n",
          "Each calibration run of `--schedule auto` predicted from its own records: draws (the trainer's "
          "predictor), replay (each step's measured durations, shared NICs), replay with a link per stage "
          "pair. Errors: (predicted - measured) / measured. Command: `.venv/bin/python "
          "benchmarks/predictor_check.py " + " ".join(args.results) + "`.\n",
          table(["run", "NIC", "model", "calibration run", "measured s", "draws", "replay", "replay, own links"],
                [[r["run"], r["nic"], r["model"], r["schedule"], f"{r['measured_s']:.2f}", err(r, "draws_s"),
                  err(r, "replay_s"), err(r, "replay_own_links_s")] for r in rows]),
          "\n## What the schedule leaves exposed\n",
          "Each run replayed with its own durations and every transfer free: what its compute alone "
          "takes in that schedule. *Exposed*: (replay - replay without transfers) / measured, the share of "
          "the step the schedule leaves transfers in the way. The rest of a run's distance from its "
          "no-communication bound is the actions themselves running longer (not comparable here: the "
          "bound's repeats ran at other times, and the machine drifts).\n",
          table(["run", "NIC", "model", "calibration run", "measured s", "replay s", "replay, no transfers s",
                 "exposed"],
                [[r["run"], r["nic"], r["model"], r["schedule"], f"{r['measured_s']:.2f}", f"{r['replay_s']:.2f}",
                  f"{r['replay_no_transfers_s']:.2f}",
                  f"{(r['replay_s'] - r['replay_no_transfers_s']) / r['measured_s']:.0%}"] for r in rows])]
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out)
    print("\n".join(md))
    print(f"wrote {out}/results.md, results.json and errors.png", file=sys.stderr)
    return 0


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    labels = [f"{r['model'][:4]} {r['nic']} {r['schedule']}" for r in rows]
    for k, (key, name) in enumerate((("draws_s", "draws"), ("replay_s", "replay"),
                                     ("replay_own_links_s", "replay, own links"))):
        ax.barh([i + 0.27 * (k - 1) for i in range(len(rows))],
                [100 * (r[key] - r["measured_s"]) / r["measured_s"] for r in rows], height=0.27, label=name)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("prediction error, % of the measured step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "errors.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
