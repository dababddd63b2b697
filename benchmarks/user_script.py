"""A user's own script: two ``jax.distributed`` processes started by hand, one tree moved
between them by ``alpa_comm.jax.reshard_tree`` and by JAX's batched ``jax.device_put``.

    python benchmarks/user_script.py [--leaves 200] [--leaf-kib 256] [--ndim 1] [--repeat 5]
    python benchmarks/user_script.py --sweep [--out benchmarks/results/user_script]
    python benchmarks/user_script.py --points 10x1024x1,100x256x2

Nothing of alpa_comm's benchmark harness is used: the script starts its processes with
``subprocess`` (``jax.distributed.initialize``, 2 CPU devices each, every process its own
``jax_cross_host_transfer_socket_address`` as JAX's cross-host ``device_put`` needs), makes
its leaves with ``jax.make_array_from_callback`` from random data, holds them on process
0's two devices in ``P("x")`` and moves them onto process 1's two devices in the same
layout (the case JAX's own ``device_put`` takes across processes). Every repeat runs the
methods one after another from a common barrier (the ``jax.distributed`` client's
``wait_at_barrier``: ``multihost_utils.sync_global_devices`` needs CPU collectives),
each timed on each process to ``jax.block_until_ready``; the order turns by one method
each repeat, so each method runs as often right after each other one (in a fixed order,
one method's call timed right after JAX's and the same call timed after it again
differed by up to 9 % at 10 x 256 KiB); the time of a repeat is the slower process's; a
point is the median of its repeats after one warm-up of each method:

* ``jax``: ``jax.device_put(tree, shardings)``, one batched call;
* ``alpa_comm``: ``reshard_tree(tree, shardings)`` on the default group;
* ``raw``: the bytes of the tree as one message over alpa_comm's TCP transport
  (``isend``/``irecv`` into a buffer made beforehand): what the wire itself takes.

Process 1 compares every received shard with the NumPy values it was made from, bit for
bit. ``--sweep`` runs leaf sizes 16 KiB to 16 MiB, 10 to 10,000 leaves and 1-D/2-D/3-D
leaves (the tree at most ``--max-total-mib``) in the same two processes and writes a
table, ``results.json`` and a PNG of time per leaf against leaf size.
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

METHODS = ("jax", "alpa_comm", "raw")
SWEEP_KIB = (16, 64, 256, 1024, 4096, 16384)
SWEEP_LEAVES = (10, 100, 1000, 10000)
SWEEP_NDIMS = (1, 2, 3)


def leaf_shape(leaf_bytes: int, ndim: int) -> tuple[int, ...]:
    """A float32 leaf of ``leaf_bytes`` in ``ndim`` dimensions, dim 0 even (2 devices)."""
    n = max(2, leaf_bytes // 4)
    if ndim == 1:
        return (n // 2 * 2,)
    last = 64 if ndim == 2 else 16
    if ndim == 2:
        return (max(2, n // last // 2 * 2), last)
    return (max(2, n // (last * last) // 2 * 2), last, last)


def points(args) -> list[dict]:
    if args.points:
        out = []
        for item in args.points.split(","):
            try:
                n, kib, ndim = item.split("x")
                out.append({"leaves": int(n), "leaf_kib": float(kib), "ndim": int(ndim)})
            except ValueError:
                raise SystemExit(f"--points: {item!r} is not LEAVESxKIBxNDIM (e.g. 10x1024x1)") from None
        return out
    if not args.sweep:
        return [{"leaves": args.leaves, "leaf_kib": args.leaf_kib, "ndim": args.ndim}]
    out = []
    for ndim in SWEEP_NDIMS:
        for kib in SWEEP_KIB:
            for n in SWEEP_LEAVES:
                if n * kib <= args.max_total_mib * 1024 and (ndim == 1 or n in (100, 1000) or kib == 256):
                    out.append({"leaves": n, "leaf_kib": kib, "ndim": ndim})
    return out


# ------------------------------------------------------------------ one process
def run_process(rank: int, coordinator: str, transfer_address: str, config: dict) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cross_host_transfer_socket_address", transfer_address)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2, process_id=rank)
    import numpy as np
    from jax._src import distributed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import ProcessGroup, default_group, reshard_tree

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    src = NamedSharding(Mesh(np.array(devices[:2]), ("x",)), P("x"))
    dst = NamedSharding(Mesh(np.array(devices[2:]), ("x",)), P("x"))
    group = ProcessGroup.from_jax(**config["group"]) if config.get("group") else default_group()
    backend = group.backend({0, 1})
    rng = np.random.default_rng(0)
    rows = []
    for i, point in enumerate(config["points"]):
        shape = leaf_shape(int(point["leaf_kib"] * 1024), point["ndim"])
        values = [rng.standard_normal(shape, dtype=np.float32) for _ in range(point["leaves"])]
        tree = {f"layer{j:05d}": jax.make_array_from_callback(shape, src, lambda idx, v=v: v[idx], dtype=np.float32)
                for j, v in enumerate(values)}
        targets = {k: dst for k in tree}
        nbytes = sum(v.nbytes for v in values)
        wire = np.empty(nbytes, np.uint8) if rank == 1 else np.ones(nbytes, np.uint8)

        def raw():
            h = backend.isend(wire, 1, 7) if rank == 0 else backend.irecv(wire, 0, 7)
            h.wait(60.0)

        run = {"jax": lambda: jax.device_put(tree, targets), "alpa_comm": lambda: reshard_tree(tree, targets),
               "raw": raw}
        if config.get("group"):
            run["alpa_comm"] = lambda: reshard_tree(tree, targets, group=group)
        if config.get("profile"):  # cProfile of this process's reshard_tree calls (the calling thread)
            import cProfile

            prof, plain = cProfile.Profile(), run["alpa_comm"]
            run["alpa_comm"] = lambda: prof.runcall(plain)
        seconds = {m: [] for m in METHODS}
        for r in range(config["repeat"] + 1):
            for m in METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]:
                distributed.global_state.client.wait_at_barrier(f"user-script/{i}/{r}/{m}", 600_000)
                t0 = time.perf_counter()
                got = run[m]()
                if got is not None:
                    jax.block_until_ready(got)
                if r:
                    seconds[m].append(time.perf_counter() - t0)
                if got is not None and rank == 1:
                    for k, v in zip(tree, values):
                        for s in got[k].addressable_shards:
                            if not np.array_equal(np.asarray(s.data), v[s.index]):
                                raise SystemExit(f"{m}: leaf {k} wrong on {s.device}")
                del got
        if config.get("profile"):
            prof.dump_stats(f"{config['profile']}/rank{rank}-point{i}.prof")
        rows.append({**point, "shape": list(shape), "bytes": nbytes, "seconds": seconds})
        del tree, values
        if rank == 0:
            print(f"progress: point {i + 1}/{len(config['points'])}: {point['leaves']} x {point['leaf_kib']} KiB "
                  f"{point['ndim']}-D", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"rank": rank, "rows": rows}), flush=True)
    jax.distributed.shutdown()


# ------------------------------------------------------------------ the driver
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: dict, timeout: float) -> list[dict]:
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cfg = json.dumps(config)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--coordinator", coordinator,
                               "--transfer-address", f"127.0.0.1:{free_port()}", "--config", cfg],
                              env=env, stdout=subprocess.PIPE, text=True) for r in range(2)]
    deadline = time.monotonic() + timeout
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise SystemExit(f"exit codes by process: {[p.returncode for p in procs]}")
    return [json.loads(line[len("RESULT "):]) for out in outs for line in out.splitlines() if line.startswith("RESULT ")]


def summarize(reports: list[dict]) -> list[dict]:
    """Per point: the slower process's time per repeat, the median per method."""
    out = []
    for i, row in enumerate(reports[0]["rows"]):
        per = {m: [max(r["rows"][i]["seconds"][m][k] for r in reports) for k in range(len(row["seconds"][m]))]
               for m in METHODS}
        med = {m: statistics.median(v) for m, v in per.items()}
        out.append({k: row[k] for k in ("leaves", "leaf_kib", "ndim", "shape", "bytes")} | {
            "seconds": per, "median_s": med, "speed_vs_jax": med["jax"] / med["alpa_comm"]})
    return out


def table(rows: list[dict]) -> str:
    lines = ["| tree | JAX device_put | reshard_tree | raw transport | alpa_comm speed vs JAX |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        m = r["median_s"]
        lines.append(f"| {r['leaves']:,} x {r['leaf_kib']:g} KiB, {r['ndim']}-D | {m['jax'] * 1e3:.1f} ms | "
                     f"{m['alpa_comm'] * 1e3:.1f} ms | {m['raw'] * 1e3:.1f} ms | {r['speed_vs_jax']:.2f}x |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["leaves"] for r in rows if r["ndim"] == 1})
    fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.6), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], counts):
        sel = sorted((r for r in rows if r["ndim"] == 1 and r["leaves"] == n), key=lambda r: r["leaf_kib"])
        for m, style in (("jax", "s--"), ("alpa_comm", "o-"), ("raw", "^:")):
            ax.loglog([r["leaf_kib"] for r in sel], [r["median_s"][m] / n * 1e6 for r in sel], style, label=m)
        ax.set_title(f"{n:,} leaves (1-D)")
        ax.set_xlabel("leaf size (KiB)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per leaf (us)")
    axes[0][0].legend()
    fig.suptitle("two processes x 2 CPU devices, loopback, same layout: time per leaf")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leaves", type=int, default=200, help="leaves in the tree (default 200)")
    p.add_argument("--leaf-kib", type=float, default=256, help="KiB per leaf, float32 (default 256)")
    p.add_argument("--ndim", type=int, default=1, choices=(1, 2, 3), help="dimensions of each leaf (default 1)")
    p.add_argument("--repeat", type=int, default=5, help="timed repeats after one warm-up (default 5)")
    p.add_argument("--sweep", action="store_true", help="run the whole sweep (sizes x counts x dimensions)")
    p.add_argument("--points", help="trees as LEAVESxKIBxNDIM, comma-separated (e.g. 10x1024x1,100x256x2), "
                                    "instead of one tree or the sweep")
    p.add_argument("--max-total-mib", type=float, default=640, help="sweep: largest tree in MiB (default 640)")
    p.add_argument("--out", help="write table.md, results.json and sweep.png here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the processes are killed")
    p.add_argument("--group", help="ProcessGroup.from_jax keywords as JSON (default: the default group)")
    p.add_argument("--profile", help="write a cProfile of each process's reshard_tree calls into this folder")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--transfer-address", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        run_process(args.rank, args.coordinator, args.transfer_address, json.loads(args.config))
        return 0
    pts = points(args)
    print(f"2 JAX processes x 2 CPU devices, loopback; {len(pts)} point(s), {args.repeat} repeats after a warm-up, "
          f"methods interleaved, their order turning each repeat: {', '.join(METHODS)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    config = {"points": pts, "repeat": args.repeat, "profile": args.profile and str(Path(args.profile).resolve()),
              "group": json.loads(args.group) if args.group else None}
    rows = summarize(launch(config, args.timeout))
    text = table(rows)
    print(text)
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/user_script.py " + " ".join(argv if argv is not None else sys.argv[1:])
        (out / "results.json").write_text(json.dumps({"command": command, "date": time.strftime("%Y-%m-%d"),
                                                      "repeat": args.repeat, "rows": rows}, indent=1) + "\n")
        (out / "table.md").write_text(f"Command: `{command}`\n\n{text}\n")
        if args.sweep:
            plot(rows, out / "sweep.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
