"""Every transfer kind on many emulated hosts, bit-exact, beside the simulator's prediction.

    sudo python benchmarks/emulated_hosts.py [--hosts 16] [--devices 2] [--nic 50mbit]
                                             [--size-mb 8] [--repeat 3]
                                             [--out benchmarks/results/emulated/hosts16]

Ray nodes are too heavy for 16 hosts on this machine (a node is several processes), so each
emulated host (a network namespace with a ``tc``-shaped NIC, ``runtime.emulated``) runs one
plain Python process: a member of one ``alpa_comm.jax.ProcessGroup`` (no JAX), moving NumPy
buffers with the resharding executor over alpa_comm's own TCP transport.

In one launch the hosts first calibrate (host 1 times copies of ``--size-mb`` from host 0,
and 64 one-byte round trips for the per-message latency); host 0 then plans every case on
the calibrated cluster and hands the plans to all (the plans are the same everywhere); each
case runs ``--repeat`` times after one warm-up, each run started together after a barrier, and
every destination buffer is compared with NumPy. The driver simulates the same plans
(``sim.simulate``, the executor's admission rules) and reports, per case, the measured
median makespan (the slowest host), the simulated one and their error. Writes results.md
(table, calibration, command), results.json and results.png; the network is removed at the
end, also on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

KINDS = ("send_recv", "local_allgather", "global_allgather", "broadcast", "double_tree", "rotated_chains")


def cases(hosts: int, devices: int) -> list[tuple[str, str, str, str, str, str]]:
    """(label, strategy, source mesh, spec, destination mesh, spec) at ``hosts`` hosts: every
    kind on sharded -> replicated between two disjoint halves (what a weight sync does), a
    layout change between them, and one host to all the others."""
    half = hosts // 2
    first = f"{half}x{devices}@" + ",".join(map(str, range(half)))
    second = f"{hosts - half}x{devices}@" + ",".join(map(str, range(half, hosts)))
    rest = f"{hosts - 1}x{devices}@" + ",".join(map(str, range(1, hosts)))
    out = [(f"{k} S0R -> RR", k, first, "S0R", second, "RR") for k in KINDS]
    out += [(f"{k} S0R -> S1R", k, first, "S0R", second, "S1R") for k in ("send_recv", "broadcast")]
    out += [(f"{k} 1 -> {hosts - 1} hosts", k, f"1x{devices}@0", "RR", rest, "RR")
            for k in ("broadcast", "double_tree", "rotated_chains")]
    return out


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every core of the machine so far (``/proc/stat`` is not
    per namespace): the share busy over a run says whether the emulation, 16 processes
    and the links' packet shaping on this machine's cores, was limited by the CPU."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tcp_retransmits() -> int:
    """TCP segments this host's network namespace has retransmitted (``/proc/net/snmp``)."""
    try:
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Tcp:")]
        return int(lines[1][lines[0].index("RetransSegs")])
    except (OSError, ValueError, IndexError):
        return 0


def rows_of(size_mb: float, devices: int) -> int:
    """Rows of the (rows, 64) float32 tensor of about ``size_mb`` MiB, divisible by every split."""
    step = 64 * devices
    return max(step, int(size_mb * (1 << 20) / (64 * 4)) // step * step)


# ------------------------------------------------------------------ a host
def worker(cfg_path: str) -> int:
    """One emulated host's part (started by ``launch`` in its namespace)."""
    from alpa_comm import ClusterSpec, plan_resharding
    from alpa_comm.jax.group import ProcessGroup
    from alpa_comm.resharding.host_job import HostJob
    from alpa_comm.resharding.plan import ReshardingPlan
    from alpa_comm.runtime.executor import ExecutorOptions, HostExecutor, Layout

    cfg = json.loads(Path(cfg_path).read_text())
    rank, world = int(os.environ["ALPA_COMM_JAX_RANK"]), int(os.environ["ALPA_COMM_JAX_WORLD"])
    timeout = cfg["timeout"]
    group = ProcessGroup(rank, world, os.environ["ALPA_COMM_JAX_COORDINATOR"], backend="tcp", timeout=timeout,
                         nic_gbps=cfg["nic_gbps"])
    backend = group.backend(range(world))

    def say(text: str) -> None:
        if rank == 0:
            print(f"progress: {text}", file=sys.stderr, flush=True)

    # calibration: host 1 times copies from host 0, and one-byte round trips
    n = int(cfg["size_mb"] * (1 << 20))
    buf = np.zeros(n, np.uint8)
    times, rtts = [], []
    for i in range(cfg["repeat"] + 1):
        backend.barrier(timeout)
        t0 = time.perf_counter()
        if rank == 0:
            backend.send(buf, 1, 1, timeout)
        elif rank == 1:
            backend.recv(buf, 0, 1, timeout)
            if i:
                times.append(time.perf_counter() - t0)
    one = np.zeros(1, np.uint8)
    backend.barrier(timeout)
    for i in range(64):
        t0 = time.perf_counter()
        if rank == 0:
            backend.send(one, 1, 2, timeout)
            backend.recv(one, 1, 3, timeout)
        elif rank == 1:
            backend.recv(one, 0, 2, timeout)
            backend.send(one, 0, 3, timeout)
        rtts.append(time.perf_counter() - t0)
    if rank == 0:
        rtt = statistics.median(rtts)
        group.kv.set("bench/rtt", json.dumps(rtt))
    if rank == 1:
        group.kv.set("bench/copy", json.dumps(statistics.median(times)))
    copy_s = json.loads(group.kv.get("bench/copy", timeout))
    rtt = json.loads(group.kv.get("bench/rtt", timeout))
    calibration = {"copy_seconds": copy_s, "nic_gbps": n * 8 / copy_s / 1e9, "latency_s": rtt / 2}
    say(f"calibrated: {calibration['nic_gbps']:.3f} Gbit/s, {calibration['latency_s'] * 1e6:.0f} us a message")

    # host 0 plans every case on the calibrated cluster; every host runs the same plans
    cluster = ClusterSpec(num_hosts=world, devices_per_host=cfg["devices"], nic_send_gbps=calibration["nic_gbps"],
                          latency_s=calibration["latency_s"])
    shape = (rows_of(cfg["size_mb"], cfg["devices"]), 64)
    if rank == 0:
        for i, (_, strategy, sm, ss, dm, ds) in enumerate(cfg["cases"]):
            plan = plan_resharding(shape, "float32", sm, ss, dm, ds, cluster=cluster, strategy=strategy,
                                   chunks=cfg.get("chunks"))
            group.kv.set(f"bench/plan/{i}", plan.to_json())
    plans = [ReshardingPlan.from_json(group.kv.get(f"bench/plan/{i}", timeout)) for i in range(len(cfg["cases"]))]
    x = (np.arange(shape[0] * shape[1]) % 65_521).astype(np.float32).reshape(shape)
    out = []
    for (label, *_), plan in zip(cfg["cases"], plans):
        job = HostJob.for_host(plan, rank)
        lay = Layout.of(plan.leaves[0])
        src = lay.source_shards(x, job.is_local)
        runs, exact, timings, cpu = [], True, [], []
        retransmits = 0
        options = ExecutorOptions(timeout, job.min_rate, latency_s=job.latency_s)
        for r in range(cfg["repeat"] + 1):
            dst = lay.empty_destinations(job.is_local, zeros=True)
            backend.barrier(timeout)
            before, cpu0 = tcp_retransmits(), machine_cpu()
            t0 = time.perf_counter()
            ends = HostExecutor(rank, [lay], [src], [dst], backend, job.host_of, options=options).run(job.transfers)
            if r:
                runs.append(time.perf_counter() - t0)
                retransmits += tcp_retransmits() - before
                timings.append([(t.transfer, t.start - t0, t.end - t0) for t in ends])
            backend.barrier(timeout)  # every host has ended the run: the machine's cores over it
            cpu1 = machine_cpu()
            if r and rank == 0:
                cpu.append((cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]))
            for d, b in dst.items():
                exact &= bool(np.array_equal(b, x[tuple(slice(lo, hi) for lo, hi in lay.dst_boxes[d])]))
        say(f"{label}: {max(runs):.3f} s here, {'bit-exact' if exact else 'WRONG'}")
        out.append({"label": label, "seconds": runs, "exact": exact, "transfers": timings,
                    "retransmits": retransmits / max(1, len(runs)), "cpu_busy": cpu})
    backend.barrier(timeout)
    print("RESULT " + json.dumps({"rank": rank, "calibration": calibration, "cases": out,
                                  "plans": [p.to_json() for p in plans] if rank == 0 else None}), flush=True)
    group.close()
    return 0


# ------------------------------------------------------------------ the driver
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--hosts", type=int, default=16, help="emulated hosts (default 16)")
    p.add_argument("--devices", type=int, default=2, help="devices per host (default 2)")
    p.add_argument("--nic", default="50mbit", help="each host's NIC rate, tc notation (default 50mbit: 16 hosts' "
                   "traffic stays well within 2 cores)")
    p.add_argument("--size-mb", type=float, default=8, help="the tensor's size in MiB (default 8)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case after a warm-up (default 3)")
    p.add_argument("--timeout", type=float, default=120, help="seconds any one wait may take (default 120)")
    p.add_argument("--out", default="benchmarks/results/emulated/hosts16", help="where to write results.*")
    p.add_argument("--local", action="store_true",
                   help="every host a process on loopback, no namespaces or shaping (a check of the script, no root)")
    p.add_argument("--only", default="", help="run only the cases whose label contains this text")
    p.add_argument("--chunks", type=int, default=None,
                   help="chunks per chain or tree slice in every plan (default: the cost model's choice)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.worker:
        return worker(args.worker)
    if args.hosts < 4 or args.devices < 1 or args.repeat < 1 or args.size_mb <= 0:
        raise SystemExit(f"error: need --hosts >= 4, --devices >= 1, --repeat >= 1 and --size-mb > 0, got "
                         f"{args.hosts}, {args.devices}, {args.repeat}, {args.size_mb}")
    from alpa_comm.jax.launch import launch
    from alpa_comm.runtime.emulated import netns

    todo = [c for c in cases(args.hosts, args.devices) if args.only in c[0]]
    if not todo:
        raise SystemExit(f"error: no case label contains {args.only!r}")
    if args.chunks is not None and args.chunks < 1:
        raise SystemExit(f"error: --chunks must be >= 1, got {args.chunks}")
    cfg = {"devices": args.devices, "size_mb": args.size_mb, "repeat": args.repeat, "timeout": args.timeout,
           "nic_gbps": netns.rate_gbps(args.nic), "cases": todo, "chunks": args.chunks}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    os.chmod(f.name, 0o644)
    network = None if args.local else netns.EmulatedNetwork(args.hosts, args.nic)
    started = time.monotonic()
    qdiscs: list = []
    try:
        if network is not None:
            print(f"bringing up {args.hosts} emulated hosts at {args.nic} ...", file=sys.stderr, flush=True)
            network.up()
        outs = launch(args.hosts, 1, [sys.executable, str(Path(__file__).resolve()), "--worker", f.name],
                      network=network, timeout=args.timeout * (len(todo) + 4), fail_fast=True,
                      progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
        qdiscs = network.qdisc_stats() if network is not None else []
    finally:
        if network is not None:
            network.down()
        os.unlink(f.name)
    results = [json.loads(o.lines("RESULT ")[0]) if o.lines("RESULT ") else None for o in outs]
    failed = [o for o, r in zip(outs, results) if r is None]
    if failed:
        for o in failed[:3]:
            print(f"host {o.rank} failed (exit {o.returncode}):\n{o.stderr[-2000:]}", file=sys.stderr)
        return 1
    report(args, todo, results, time.monotonic() - started, qdiscs)
    return 0


def report(args, todo, results: list[dict], wall: float, qdiscs: list[dict] = ()) -> None:
    from alpa_comm.report.tables import table
    from alpa_comm.resharding.plan import ReshardingPlan
    from alpa_comm.sim import simulate

    calibration = results[0]["calibration"]
    plans = [ReshardingPlan.from_json(t) for t in results[0]["plans"]]
    rows, records = [], []
    for i, (label, strategy, sm, ss, dm, ds) in enumerate(todo):
        per_run = [max(r["cases"][i]["seconds"][k] for r in results) for k in range(args.repeat)]
        measured = statistics.median(per_run)
        exact = all(r["cases"][i]["exact"] for r in results)
        retransmits = sum(r["cases"][i]["retransmits"] for r in results)  # per run, all hosts
        busy = statistics.median(results[0]["cases"][i]["cpu_busy"])  # the machine's cores, host 0's view
        simulated = simulate(plans[i]).makespan
        error = simulated / measured - 1
        records.append({"case": label, "strategy": strategy, "src": f"{ss}@{sm}", "dst": f"{ds}@{dm}",
                        "transfers": len(plans[i].transfers), "measured_seconds": measured, "runs": per_run,
                        "simulated_seconds": simulated, "error": error, "exact": exact,
                        "tcp_retransmits_per_run": retransmits, "cpu_busy": busy,
                        "last_run_transfers": {r["rank"]: r["cases"][i]["transfers"][-1] for r in results}})
        rows.append([label, len(plans[i].transfers), f"{measured:.3f}", f"{min(per_run):.3f}-{max(per_run):.3f}",
                     f"{simulated:.3f}", f"{100 * error:+.1f} %", f"{100 * busy:.0f} %", f"{retransmits:.0f}",
                     "yes" if exact else "NO"])
    text = table(["case", "transfers", "measured (s)", "runs (s)", "simulated (s)", "error", "CPU busy",
                  "TCP retransmits a run", "bit-exact"], rows)
    errs = [abs(r["error"]) for r in records]
    command = " ".join([("" if args.local else "sudo ") + "python benchmarks/emulated_hosts.py", *args.argv])
    where = "local processes on loopback (unshaped)" if args.local else f"emulated hosts ({args.nic} NICs)"
    lines = [f"# Every transfer kind on {args.hosts} {where}, {args.devices} devices each, "
             f"{args.size_mb:g} MiB float32", "", f"Command: `{command}`", "",
             f"* one plain Python process per host ({'on loopback' if args.local else 'in its network namespace'}), "
             "alpa_comm's TCP transport; "
             f"{args.repeat} timed runs per case after a warm-up; measured = median over runs of the slowest host",
             f"* calibrated: one {args.size_mb:g} MiB copy host 0 -> 1 in {calibration['copy_seconds']:.3f} s = "
             f"{calibration['nic_gbps']:.3f} Gbit/s; {calibration['latency_s'] * 1e6:.0f} us a message "
             "(half a one-byte round trip)",
             f"* simulated (admission rules) against measured: mean |error| {100 * statistics.mean(errs):.1f} %, "
             f"worst {100 * max(errs):.1f} %; within 15 %: {sum(e <= 0.15 for e in errs)} of {len(errs)}",
             f"* CPU busy: the share of this machine's {os.cpu_count()} cores in use during a run (median; "
             "/proc/stat): near 100 % the emulation itself (every host's Python process, the kernel's packet "
             "shaping) sets the pace, which the simulator does not model",
             f"* bit-exact: {sum(r['exact'] for r in records)} of {len(records)}; wall time {wall:.0f} s"]
    if qdiscs:
        drops = {side: sum(q[side].get("dropped", 0) for q in qdiscs) for side in ("send", "receive")}
        lines.append(f"* packets the NIC queues dropped over the whole launch (calibration included): "
                     f"{drops['send']} on send sides, {drops['receive']} on receive sides (per host in results.json)")
    lines += ["", text]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"command": command, "hosts": args.hosts, "devices": args.devices,
                                                  "nic": args.nic, "size_mb": args.size_mb,
                                                  "calibration": calibration, "rows": records,
                                                  "qdisc_stats": list(qdiscs)}, indent=1))
    _png(records, out / "results.png", args)
    print("\n".join(lines))
    print(f"wrote {out / 'results.md'}, results.json, results.png", file=sys.stderr)


def _png(records: list[dict], path: Path, args) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(10, 4))
    xs = np.arange(len(records))
    ax.bar(xs - 0.2, [r["measured_seconds"] for r in records], 0.4, label="measured (median)")
    ax.bar(xs + 0.2, [r["simulated_seconds"] for r in records], 0.4, label="simulated")
    ax.set_xticks(xs, [r["case"] for r in records], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title(f"{args.hosts} {'local processes' if args.local else 'emulated hosts, ' + args.nic}, "
                 f"{args.size_mb:g} MiB", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
