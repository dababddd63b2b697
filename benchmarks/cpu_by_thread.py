"""Where each emulated host's CPU goes during a training step, by thread, with and without data.

On the emulated cluster a host's compute and its transport share one core cap, so
any CPU a transfer costs is compute time lost: a schedule that hides every
transfer still runs slower than its ``signal`` twin (one byte per transfer) by
what the transfers cost the host. Per configuration (schedule x strategy), one
emulated cluster, a warm-up step, then ``--steps`` steps; per host, the CPU
seconds per step of each thread group, read from the workers' own records
(``cpu_by_thread``; the threads name themselves): XLA's compute pool, the runner
(the worker's main thread: dispatch, unpacking arrivals, the optimizer), gloo's
I/O loop, the mailbox's and executor's transfer threads, the rest (Ray).

    sudo .venv/bin/python benchmarks/cpu_by_thread.py --nic 100mbit   # ~5 min

Writes results.md, results.json and cpu_by_thread.png under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

from alpa_comm.report.tables import table
from alpa_comm.runtime.emulated.netns import command_line, emulation_knobs
from alpa_comm.runtime.worker import TRANSPORTS

import ut_regime as regime
from ut_regime import S, log

GROUPS = {  # group -> thread names (prefixes), first match wins; the runner is the worker's main thread
    "XLA compute": ("tf_XLAEigen",),
    "runner": ("ray::",),
    "gloo I/O": ("gloo_tcp_loop",),
    "tcp I/O": ("tcp-send-", "tcp-recv-"),
    "mailbox + executor": ("mailbox", "transfer", "pack"),
}
OTHER = "other (Ray)"


def group_of(name: str) -> str:
    return next((g for g, prefixes in GROUPS.items() if name.startswith(prefixes)), OTHER)


def grouped(by_thread: dict[str, float]) -> dict[str, float]:
    out = dict.fromkeys([*GROUPS, OTHER], 0.0)
    for name, seconds in by_thread.items():
        out[group_of(name)] += seconds
    return out


def measure(cluster, kind: str, strategy: str, args) -> dict:
    pipe = regime.pipeline(cluster, kind, strategy, args, args.transport)
    data = regime.data(args)
    pipe.step(next(data))
    steps = [pipe.step(next(data)) for _ in range(args.steps)]
    hosts = []
    for s in range(S):
        recs = [rec for r in steps for rec in r.per_host if rec["stage"] == s]
        groups = [grouped(rec["cpu_by_thread"]) for rec in recs]
        hosts.append({g: median(x[g] for x in groups) for g in groups[0]}
                     | {"total": median(rec["cpu_seconds"] for rec in recs)})
    return {"config": f"{kind}+{strategy}", "step_seconds": median(r.seconds for r in steps), "hosts": hosts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/cpu_by_thread")
    regime.add_options(p)
    p.add_argument("--configs", default="dualpipev:broadcast,dualpipev:signal,zb-v:broadcast,zb-v:signal",
                   help="schedule:strategy pairs, comma-separated")
    p.add_argument("--transport", default="gloo", choices=TRANSPORTS, help="what the mailboxes move transfers over")
    args = p.parse_args(argv)
    args.command = command_line("benchmarks/cpu_by_thread.py", list(sys.argv[1:] if argv is None else argv))
    regime.check_options(p, args)
    configs = [tuple(c.split(":")) for c in args.configs.split(",") if c]
    if any(len(c) != 2 for c in configs):
        p.error(f"--configs: give schedule:strategy pairs, got {args.configs!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.monotonic()
    with regime.open_cluster(args) as cluster:
        for i, (kind, strategy) in enumerate(configs):
            log(f"[{time.monotonic() - t0:5.0f} s] {i + 1}/{len(configs)}: {kind}+{strategy}")
            rows.append(measure(cluster, kind, strategy, args))
    md = render(rows, args)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "emulation": emulation_knobs(), "rows": rows},
                                                 indent=1))
    plot(rows, args, out)
    print(md)
    log(f"wrote {out}/results.md, results.json and cpu_by_thread.png")
    return 0


def render(rows: list[dict], args) -> str:
    cols = [*GROUPS, OTHER]
    body = [[r["config"], s, f"{r['step_seconds']:.2f}"] + [f"{h[g]:.2f}" for g in cols]
            + [f"{h['total']:.2f}", f"{h['total'] / args.host_cpus:.2f}"]
            for r in rows for s, h in enumerate(r["hosts"])]
    return ("# CPU per training step, by thread\n\n"
            f"U-Transformer ({args.layers} layers, width {args.width}), 4 emulated hosts x 2 devices, NIC {args.nic}, "
            f"{args.host_cpus} cores per host, transfers over {args.transport}; {args.microbatches} microbatches of "
            f"{args.rows} rows x {args.seq} tokens; median of {args.steps} steps after one warm-up. "
            "CPU seconds per step, per host, by thread group (the workers' own `cpu_by_thread` records); "
            "total: the host's process CPU (every thread); over cap: "
            f"the least wall time that CPU takes under the cap. Command: `{args.command}`.\n\n"
            + table(["configuration", "host", "step s"] + cols + ["total CPU s", "total / cap s"], body) + "\n")


def plot(rows: list[dict], args, out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cols = [*GROUPS, OTHER]
    labels = [f"{r['config']} h{s}" for r in rows for s in range(S)]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.28 * len(labels)))
    left = [0.0] * len(labels)
    for g in cols:
        vals = [h[g] for r in rows for h in r["hosts"]]
        ax.barh(range(len(labels)), vals, left=left, label=g)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"CPU seconds per step (NIC {args.nic}, cap {args.host_cpus} core per host)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "cpu_by_thread.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
