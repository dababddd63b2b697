"""The trainer's transfers over gloo and over alpa_comm's own TCP streams, side by side.

``DistributedPipeline(transport=...)`` picks what each host's mailbox moves its
transfers over. The two differ where a comm-heavy pipeline feels it: gloo runs one
thread per posted transfer whose chunks interleave on the wire and an epoll I/O
thread that wakes for each burst a paced link delivers; ``TcpBackend`` writes a
peer's messages one after another on one connection (FIFO per host pair), paced
at the host's NIC rate (``tcp.PACE_FACTOR``), and reads each message whole
(``MSG_WAITALL``). On one emulated cluster (4 hosts,
shaped NICs, a CPU cap per host), per schedule, the same pipeline with each
transport, and ZB-H1 with ``signal`` transfers (one byte each) as the
no-communication bound; configurations interleaved, each set up afresh and
warmed up per repeat. Every transport's losses must agree bit for bit.

    sudo .venv/bin/python benchmarks/transport_compare.py --nic 100mbit   # ~15 min

Writes results.md, results.json and transport_compare.png under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

from alpa_comm.report.tables import table
from alpa_comm.runtime.worker import TRANSPORTS
from alpa_comm.train.measure import iteration_seconds

import ut_regime as regime
from ut_regime import S, log

BOUND = ("zb-h1", "signal", "gloo")


def configurations(schedules: list[str], transports: list[str]) -> list[tuple[str, str, str]]:
    """(schedule, strategy, transport): every schedule over every transport, then the bound."""
    return [(s, "broadcast", t) for s in schedules for t in transports] + [BOUND]


def label(config: tuple[str, str, str]) -> str:
    kind, strategy, transport = config
    return f"{kind}+{strategy}" + ("" if strategy == "signal" else f" over {transport}")


def run(cluster, config, args) -> dict:
    kind, strategy, transport = config
    pipe = regime.pipeline(cluster, kind, strategy, args, transport)
    data = regime.data(args)
    for _ in range(args.warmup):
        pipe.step(next(data))
    results = [pipe.step(next(data)) for _ in range(args.steps)]
    iters = [iteration_seconds(r.per_host) for r in results]
    cpu = max(median(rec["cpu_seconds"] for r in results for rec in r.per_host if rec["stage"] == s)
              for s in range(S))
    return {"config": label(config), "iteration_seconds": median(iters), "iterations": iters,
            "busiest_host_cpu_over_cap": cpu / args.host_cpus, "losses": [r.loss for r in results]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/transport_compare")
    regime.add_options(p)
    p.add_argument("--schedules", default="zb-v,dualpipev", help="schedules to run over each transport")
    p.add_argument("--transports", default=",".join(TRANSPORTS), help="transports to compare, comma-separated")
    p.add_argument("--warmup", type=int, default=1, help="steps before timing, per set-up")
    p.add_argument("--repeats", type=int, default=3, help="times the whole interleaved set runs")
    args = p.parse_args(argv)
    regime.check_options(p, args, ("microbatches", "rows", "seq", "width", "layers", "steps", "repeats"))
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    args.transports = [t for t in args.transports.split(",") if t]
    bad = [t for t in args.transports if t not in TRANSPORTS]
    if bad or not args.transports:
        p.error(f"--transports: unknown {bad or args.transports!r}; choose from {', '.join(TRANSPORTS)}")
    schedules = [s for s in args.schedules.split(",") if s]
    configs = configurations(schedules, args.transports)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.monotonic()
    with regime.open_cluster(args) as cluster:
        for rep in range(args.repeats):
            for config in configs:
                log(f"[{time.monotonic() - t0:6.0f} s] repeat {rep + 1}/{args.repeats}: {label(config)}")
                row = run(cluster, config, args) | {"repeat": rep}
                log(f"    iteration {row['iteration_seconds']:.3f} s")
                rows.append(row)
    check_losses(rows, schedules)
    md = render(rows, args)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    plot(rows, args, out)
    print(md)
    log(f"wrote {out}/results.md, results.json and transport_compare.png")
    return 0


def check_losses(rows: list[dict], schedules: list[str]) -> None:
    """The same schedule must train to the same losses over every transport (same data,
    same weights: the transport moves bytes, it must not change them)."""
    for kind in schedules:
        for rep in sorted({r["repeat"] for r in rows}):
            per = {r["config"]: r["losses"] for r in rows
                   if r["repeat"] == rep and r["config"].startswith(f"{kind}+broadcast")}
            if len({json.dumps(v) for v in per.values()}) > 1:
                raise SystemExit(f"{kind}, repeat {rep + 1}: losses differ between transports: {per}")


def render(rows: list[dict], args) -> str:
    labels = list(dict.fromkeys(r["config"] for r in rows))
    repeats = sorted({r["repeat"] for r in rows})
    by = {(r["config"], r["repeat"]): r for r in rows}
    bound = label(BOUND)
    body = []
    for lab in labels:
        its = [by[(lab, k)]["iteration_seconds"] for k in repeats]
        frac = [by[(bound, k)]["iteration_seconds"] / by[(lab, k)]["iteration_seconds"] for k in repeats]
        cpu = median(by[(lab, k)]["busiest_host_cpu_over_cap"] for k in repeats)
        body.append([lab, f"{median(its):.3f} [{min(its):.3f}-{max(its):.3f}]",
                     f"{median(frac):.2f} [{min(frac):.2f}-{max(frac):.2f}]", f"{cpu:.2f}"])
    return ("# The trainer's transfers over gloo and over alpa_comm's TCP streams\n\n"
            f"U-Transformer ({args.layers} layers, width {args.width}), 4 emulated hosts x 2 devices, NIC "
            f"{args.nic}, {args.host_cpus} cores per host; {args.microbatches} microbatches of {args.rows} rows x "
            f"{args.seq} tokens. Configurations interleaved, each set up afresh per repeat, {args.warmup} warm-up "
            f"step(s), {args.steps} timed (median); {args.repeats} repeats, median [min-max]. Of the bound: "
            f"`{bound}` over the configuration, paired within a repeat. Host CPU / cap: the busiest host's CPU "
            "seconds per step over its core cap. Losses agree bit for bit across transports. Command: "
            f"`sudo .venv/bin/python benchmarks/transport_compare.py --nic {args.nic}"
            + (f" --repeats {args.repeats}" if args.repeats != 3 else "") + "`.\n\n"
            + table(["configuration", "iteration s", "of no-communication bound", "host CPU s / cap"], body) + "\n")


def plot(rows: list[dict], args, out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    labels = list(dict.fromkeys(r["config"] for r in rows))
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.45 * len(labels)))
    for i, lab in enumerate(labels):
        its = [r["iteration_seconds"] for r in rows if r["config"] == lab]
        ax.barh(i, median(its), color="tab:gray" if "signal" in lab else ("tab:blue" if "gloo" in lab else
                                                                             "tab:orange"))
        ax.plot(its, [i] * len(its), "k.", markersize=4)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"iteration seconds (median bar, dots: repeats), NIC {args.nic}")
    fig.tight_layout()
    fig.savefig(out / "transport_compare.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
