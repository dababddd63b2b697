"""What a pipeline edge's transfer costs its hosts' CPU, at several NIC rates.

On the emulated cluster the transport's threads share each host's core cap with
compute, so CPU a transfer spends is compute time lost. Bytes cost CPU (copies,
syscalls, the kernel's TCP path); if the CPU per byte also grows as the link gets
slower, something waits by working (a poll, a wakeup per packet). Per NIC rate:
a fresh emulated cluster (2 hosts, ``--host-cpus`` each), a two-stage GPT
pipeline with broadcast, every edge run alone ``--repeats`` times
(``DistributedPipeline.edge_costs``) over each of ``--transports`` on the same
cluster (gloo; alpa_comm's own TCP streams): seconds, the bytes' time at the link
rate, and the CPU its hosts spent, per MB moved, with the transport's own I/O
threads apart.

    sudo .venv/bin/python benchmarks/transport_cpu.py               # ~4 min

Writes results.md, results.json and cpu_per_mb.png under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from alpa_comm.errors import AlpaCommError
from alpa_comm.pipeline import generate
from alpa_comm.report.tables import table
from alpa_comm.runtime.emulated.netns import check_cpu_cores, command_line, emulation_knobs, rate_gbps
from alpa_comm.runtime.launch import emulated_spec
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster


IO_THREADS = {"gloo": "gloo_tcp_loop", "tcp": "tcp-"}
"""Per transport, the name (prefix) of its I/O threads: gloo's TCP transport's epoll loop
(receives, and sends that do not fit the socket at once); ``TcpBackend``'s sending and
receiving thread per stream (``tcp-send-<peer>.<stream>``, ``tcp-recv-...``). Every
other thread of a worker is the executor's or Ray's."""


def io_cpu(transport: str, by_thread: dict[str, float]) -> float:
    return sum(v for n, v in by_thread.items() if n.startswith(IO_THREADS[transport]))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(nic: str, args) -> list[dict]:
    kw = {"layers": 2, "d": args.width, "heads": 4, "seq": args.seq}
    rate = emulated_spec(2, 2, nic).send_rate(0)  # bytes/s, as the planner sees the link
    rows = []
    with PipelineCluster.emulated(2, 2, nic=nic, timeout=60, cpu=args.host_cpus) as cluster:
        for transport in args.transports:
            pipe = DistributedPipeline(cluster, "gpt", 2, generate("1f1b", 2, 2), microbatch_size=args.rows,
                                       model_kwargs=kw, strategy="broadcast", transport=transport)
            got = pipe.edge_costs(repeats=args.repeats)
            rows += [{"nic": nic, "transport": transport, "edge": name, "mb": c["bytes"] / 1e6,
                      "seconds": c["seconds"], "wire_seconds": c["bytes"] / rate, "cpu_seconds": c["cpu_seconds"],
                      "io_cpu_seconds": io_cpu(transport, c["cpu_by_thread"]),
                      "cpu_s_per_mb": c["cpu_seconds"] / (c["bytes"] / 1e6) if c["bytes"] else 0.0}
                     for name, c in got.items()]
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/transport_cpu")
    p.add_argument("--nics", default="400mbit,200mbit,100mbit", help="NIC rates, comma-separated (tc syntax)")
    p.add_argument("--host-cpus", type=float, default=0.5, help="CPU cores per emulated host (default 0.5)")
    p.add_argument("--rows", type=int, default=16, help="rows per microbatch")
    p.add_argument("--seq", type=int, default=64, help="tokens per row")
    p.add_argument("--width", type=int, default=256, help="model width d")
    p.add_argument("--repeats", type=int, default=5, help="runs of each edge (median)")
    p.add_argument("--transports", default="gloo,tcp",
                   help=f"transports to compare, comma-separated ({', '.join(IO_THREADS)})")
    args = p.parse_args(argv)
    args.command = command_line("benchmarks/transport_cpu.py", list(sys.argv[1:] if argv is None else argv))
    args.transports = [t for t in args.transports.split(",") if t]
    for t in args.transports:
        if t not in IO_THREADS:
            p.error(f"--transports: unknown transport {t!r}; choose from {', '.join(IO_THREADS)}")
    for name in ("rows", "seq", "width", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.rows % 2:
        p.error(f"--rows must divide over a host's 2 devices, got {args.rows}")
    try:
        check_cpu_cores(args.host_cpus)
    except AlpaCommError as e:
        p.error(f"--host-cpus: {e}")
    nics = [n for n in args.nics.split(",") if n]
    for n in nics:
        try:
            rate_gbps(n)
        except AlpaCommError as e:
            p.error(f"--nics: cannot read rate {n!r} ({e})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.monotonic()
    for i, nic in enumerate(nics):
        log(f"[{time.monotonic() - t0:5.0f} s] {i + 1}/{len(nics)}: NIC {nic}")
        rows += measure(nic, args)
    md = ["# Transport CPU per MB at several NIC rates\n",
          f"2 emulated hosts x 2 devices, {args.host_cpus} cores each; a GPT edge of {args.rows} x {args.seq} x "
          f"{args.width} float32 per microbatch, broadcast, each edge alone, median of {args.repeats}. CPU: both "
          "hosts' processes (every thread) during the run; the transport's I/O threads (gloo: `gloo_tcp_loop`; "
          "tcp: `tcp-send-*`, `tcp-recv-*`) apart, by `runtime.thread_cpu`. Both transports on the same cluster. "
          f"Command: `{args.command}`.\n",
          table(["NIC", "transport", "edge", "MB through NICs", "seconds", "bytes at link rate, s",
                 "CPU s (both hosts)", "CPU s per MB", "of it the transport's I/O threads, s per MB"],
                [[r["nic"], r["transport"], r["edge"], f"{r['mb']:.2f}", f"{r['seconds']:.3f}",
                  f"{r['wire_seconds']:.3f}", f"{r['cpu_seconds']:.3f}", f"{r['cpu_s_per_mb']:.4f}",
                  f"{r['io_cpu_seconds'] / r['mb']:.4f}" if r["mb"] else "-"] for r in rows])]
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "emulation": emulation_knobs(), "rows": rows},
                                                 indent=1))
    plot(rows, out)
    print("\n".join(md))
    log(f"wrote {out}/results.md, results.json and cpu_per_mb.png")
    return 0


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for key in dict.fromkeys((r["transport"], r["edge"]) for r in rows):
        pts = sorted((rate_gbps(r["nic"]) * 1000, r["cpu_s_per_mb"]) for r in rows
                     if (r["transport"], r["edge"]) == key)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o" if key[0] == "gloo" else "s",
                linestyle="-" if key[0] == "gloo" else "--", label=" ".join(key))
    ax.set_xlabel("NIC rate (Mbit/s)")
    ax.set_ylabel("CPU seconds per MB moved (both hosts)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "cpu_per_mb.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
