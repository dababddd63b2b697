"""Where a reshard_tree call's time goes beyond its bytes: per-phase wall time of each
process's calls, for trees of small leaves (the fixed costs per call and per leaf).

Two ``jax.distributed`` processes x 2 CPU devices on loopback, as in
``benchmarks/user_script.py``: a tree of N float32 leaves of K KiB in ``P("x")`` on
process 0's devices moved onto process 1's, interleaved with one batched
``jax.device_put``. Each phase of ``alpa_comm.jax.reshard`` is wrapped with a timer in
the process (tree flattening, the cached prepare, destinations, the executor's run,
the placer's results, unflattening); "other" is the call's time outside them.

    python benchmarks/fixed_costs.py --points 10x16,100x16,1000x16 --repeat 30 [--out DIR]

Prints a table (microseconds per call, by phase and process, and per leaf from the
smallest to the largest tree); ``--out`` also writes results.json and table.md.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = (("reshard", "tree_flatten", "flatten"), ("reshard", "_prepare", "prepare (cached)"),
          ("buffers.HostBuffers", "destinations", "destinations"), ("buffers.HostBuffers", "placer", "placer set-up"),
          ("executor.HostExecutor", "__init__", "executor set-up"), ("executor.HostExecutor", "run", "executor run"),
          ("buffers.ProgressivePlacer", "results", "placer results"), ("reshard", "tree_unflatten", "unflatten"))


def child(rank: int, coordinator: str, transfer: str, points: list, repeat: int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cross_host_transfer_socket_address", transfer)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2, process_id=rank)
    import numpy as np
    from jax._src import distributed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import alpa_comm.jax.buffers  # noqa: F401
    import alpa_comm.runtime.executor  # noqa: F401
    from alpa_comm.jax import reshard_tree

    mods = {"reshard": sys.modules["alpa_comm.jax.reshard"], "buffers": sys.modules["alpa_comm.jax.buffers"],
            "executor": sys.modules["alpa_comm.runtime.executor"]}
    acc: dict[str, float] = {}

    def wrap(owner, name, label):
        f = getattr(owner, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[label] = acc.get(label, 0.0) + time.perf_counter() - t0
        setattr(owner, name, timed)

    for where, name, label in PHASES:
        mod, _, cls = where.partition(".")
        wrap(getattr(mods[mod], cls) if cls else mods[mod], name, label)
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    src = NamedSharding(Mesh(np.array(devices[:2]), ("x",)), P("x"))
    dst = NamedSharding(Mesh(np.array(devices[2:]), ("x",)), P("x"))
    rows = []
    for i, (n, kib) in enumerate(points):
        size = int(kib * 256)
        vals = [np.random.default_rng(j).standard_normal(size, dtype=np.float32) for j in range(n)]
        tree = {f"l{j:05d}": jax.make_array_from_callback((size,), src, lambda idx, v=v: v[idx], dtype=np.float32)
                for j, v in enumerate(vals)}
        targets = {k: dst for k in tree}
        times = {"jax": [], "alpa_comm": []}
        for r in range(repeat + 2):
            for m in ("jax", "alpa_comm"):
                distributed.global_state.client.wait_at_barrier(f"fixed/{i}/{r}/{m}", 120_000)
                if r == 2 and m == "alpa_comm":
                    acc.clear()
                t0 = time.perf_counter()
                got = jax.device_put(tree, targets) if m == "jax" else reshard_tree(tree, targets)
                jax.block_until_ready(got)
                if r >= 2:
                    times[m].append(time.perf_counter() - t0)
                del got
        rows.append({"leaves": n, "leaf_kib": kib, "median_us": {m: statistics.median(v) * 1e6 for m, v in times.items()},
                     "mean_us": {m: statistics.fmean(v) * 1e6 for m, v in times.items()},
                     "phases_us": {k: v / repeat * 1e6 for k, v in acc.items()}})
        if rank == 0:
            print(f"progress: point {i + 1}/{len(points)}: {n} x {kib:g} KiB", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"rank": rank, "rows": rows}), flush=True)
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(reports: list[dict]) -> str:
    labels = [label for _, _, label in PHASES]
    head = "| tree | process | " + " | ".join(labels) + " | other | call (mean) | JAX (mean) |"
    lines = [head, "|---|---|" + "---:|" * (len(labels) + 3)]
    for rep in sorted(reports, key=lambda r: r["rank"]):
        for row in rep["rows"]:
            ph = row["phases_us"]
            inside = sum(ph.get(k, 0.0) for k in labels)  # disjoint: none calls another
            other = row["mean_us"]["alpa_comm"] - inside
            name = "sender" if rep["rank"] == 0 else "receiver"
            lines.append(f"| {row['leaves']:,} x {row['leaf_kib']:g} KiB | {name} | "
                         + " | ".join(f"{ph.get(k, 0.0):,.0f}" for k in labels)
                         + f" | {other:,.0f} | {row['mean_us']['alpa_comm']:,.0f} | {row['mean_us']['jax']:,.0f} |")
    return "\n".join(lines)


def per_leaf(reports: list[dict]) -> str:
    """The slope between the smallest and largest tree of the same leaf size, per method,
    on the receiver (the process whose call ends last)."""
    rows = next(r for r in reports if r["rank"] == 1)["rows"]
    out = []
    for kib in sorted({r["leaf_kib"] for r in rows}):
        sel = sorted((r for r in rows if r["leaf_kib"] == kib), key=lambda r: r["leaves"])
        if len(sel) < 2:
            continue
        a, b = sel[0], sel[-1]
        for m in ("alpa_comm", "jax"):
            slope = (b["mean_us"][m] - a["mean_us"][m]) / (b["leaves"] - a["leaves"])
            out.append(f"{m}: {slope:.1f} us per further {kib:g} KiB leaf, {a['mean_us'][m] - slope * a['leaves']:,.0f} "
                       f"us per call ({a['leaves']} -> {b['leaves']} leaves)")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="10x16,100x16,1000x16",
                   help="trees as LEAVESxKIB, comma-separated (default 10x16,100x16,1000x16)")
    p.add_argument("--repeat", type=int, default=30, help="timed calls per tree after two warm-ups (default 30)")
    p.add_argument("--out", help="write results.json and table.md here")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the processes are killed")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    points = [(int(n), float(k)) for n, k in (x.split("x") for x in args.points.split(","))]
    if args.child:
        child(int(args.child[0]), args.child[1], args.child[2], points, args.repeat)
        return 0
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, __file__, "--points", args.points, "--repeat", str(args.repeat),
                               "--child", str(r), coordinator, f"127.0.0.1:{free_port()}"],
                              env=env, stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [pr.communicate(timeout=args.timeout)[0] for pr in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
    if any(pr.returncode for pr in procs):
        print(f"exit codes by process: {[pr.returncode for pr in procs]}", file=sys.stderr)
        return 1
    reports = [json.loads(line[len("RESULT "):]) for out in outs for line in out.splitlines()
               if line.startswith("RESULT ")]
    text = table(reports) + "\n\n" + per_leaf(reports)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python", "benchmarks/fixed_costs.py"] + (argv if argv is not None else sys.argv[1:]))
        (out / "results.json").write_text(json.dumps({"command": command, "reports": reports}, indent=1) + "\n")
        (out / "table.md").write_text(f"Command: `{command}`\n\nMicroseconds per call (mean over the timed calls); "
                                      f"'other' is the call outside the timed phases.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
