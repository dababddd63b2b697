"""RL weight sync at model scale: time, GB/s into the busiest receiver and measured peak
memory, per method, the way verl and vLLM report a sync.

    sudo python benchmarks/weight_sync_scale.py [--nic 400mbit] [--nic none] [--layers 32]
        [--width 512] [--vocab 48000] [--repeat 3] [--budget-mb 256]
        [--methods alpa_comm,alpa_comm_fresh,jax_device_put,gather_broadcast]
        [--out benchmarks/results/emulated/weight_sync_scale] [--json] [--local]

Six ``jax.distributed`` processes, one per emulated host (network namespaces, ``tc``-shaped
NICs; ``--nic none``: unshaped; ``--local``: loopback, no root), 2 CPU devices each. The
trainer (hosts 0-1) holds an LLM-shaped model FSDP-style (every array sharded along dim 0
over its 4 devices): a Qwen2-like decoder of ``--layers`` layers (per layer two norms,
q/k/v/o projections with q/k/v biases, gated MLP: 12 arrays) plus embedding, final norm and
LM head; by default 557 MiB in 387 arrays. It pushes the weights to 2 inference replicas
(hosts 2-3 and 4-5), each tensor-parallel over its 4 devices (Megatron layout: q/k/v and
gate/up split by column, o/down by row, embedding by vocabulary row, LM head by column,
biases split, norms whole), so every inference process needs about half the model.

Methods, each in a launch of its own (so each process's memory is its own), each run
timed from a common barrier to the slowest process's end:

* ``alpa_comm``: ``reshard_tree(params, out=old_weights, max_inflight_bytes=budget)``:
  received into the previous weights' memory;
* ``alpa_comm_atomic``: the same with ``atomic=True``: each leaf through staging memory,
  committed whole (groups of leaves in turn, staging within half the budget);
* ``alpa_comm_fresh``: the same call without ``out``: new arrays beside the old weights
  (what receiving into the old weights avoids);
* ``jax_device_put``: JAX's own cross-host ``jax.device_put`` of the tree onto each replica
  in the layout JAX accepts (the same FSDP shard shapes on the replica's 4 devices: JAX
  refuses the tensor-parallel layout, a change of shard shapes), one call per replica;
  the tensor-parallel layout would still need a reshard inside each replica, not counted:
  a floor for any JAX-native path;
* ``gather_broadcast``: every array gathered whole on process 0, then one chunk-pipelined
  broadcast of the whole model to every inference process, each cutting out its shards
  (the common path without a planner, at its best).

Per method: seconds per sync (median), GB/s into the busiest receiver, the bound (the
bytes the busiest inference process must receive over the rate one process-to-process
copy reaches in the same launch, measured as the slope between two copy sizes), the
peak resident memory above the weights in each process (``VmHWM`` reset before each run
through ``/proc/self/clear_refs``, minus the resident size before it; a sampling thread
where the reset is not allowed), the bucket size, and whether every received shard
equalled NumPy's reference (the sources alternate between two versions of the weights, so
stale bytes would show). Writes results.md (table + command), results.json and
results.png under ``--out``; the network is removed at the end, also on failure.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

WORLD, DEVICES, TRAIN, REPLICAS = 6, 2, (0, 1), ((2, 3), (4, 5))
METHODS = ("alpa_comm", "alpa_comm_atomic", "alpa_comm_fresh", "jax_device_put", "gather_broadcast")
LATENCY_S = 1e-3
"""What one message costs here beyond its bytes (Python, the transport and the tc queue on
two shared cores), as ``alpa_comm_bench.sync_processes`` tells the planner."""
COLUMNS = ("method", "model_bytes", "leaves", "replicas", "nic", "seconds", "gbps_busiest_receiver",
           "bound_seconds", "peak_extra_bytes", "bucket_bytes", "verified")


# ------------------------------------------------------------------ the model
def model_arrays(layers: int, width: int, vocab: int) -> list[tuple[str, tuple, str]]:
    """(name, shape, tensor-parallel split) of every array: ``col`` (dim 1), ``row`` (dim
    0) or ``rep`` (whole on every device); the leaf-size mix of a Qwen2-style checkpoint."""
    kv, ffn = width // 4, 3 * width
    out = [("embed", (vocab, width), "row")]
    for i in range(layers):
        p = f"layers.{i:02d}."
        out += [(p + "input_norm", (width,), "rep"),
                (p + "q_proj", (width, width), "col"), (p + "q_bias", (width,), "row"),
                (p + "k_proj", (width, kv), "col"), (p + "k_bias", (kv,), "row"),
                (p + "v_proj", (width, kv), "col"), (p + "v_bias", (kv,), "row"),
                (p + "o_proj", (width, width), "row"),
                (p + "post_norm", (width,), "rep"),
                (p + "gate_proj", (width, ffn), "col"), (p + "up_proj", (width, ffn), "col"),
                (p + "down_proj", (ffn, width), "row")]
    return out + [("final_norm", (width,), "rep"), ("lm_head", (width, vocab), "col")]


def values(leaf: int, version: int, shape: tuple, index: tuple) -> np.ndarray:
    """Array ``leaf``'s values in ``version`` of the weights over ``index`` (slices), made
    from the global element numbers (no whole array is ever built): exact in float32 and
    different between versions and leaves."""
    ranges = [np.arange(*sl.indices(n), dtype=np.int64) for sl, n in zip(index, shape)]
    flat = ranges[0]
    for r, n in zip(ranges[1:], shape[1:]):
        flat = flat[..., None] * n + r
    mixed = (flat * 2654435761 + leaf * 40503 + version * 9973) % (1 << 22)
    return (mixed.astype(np.float32) - (1 << 21)) / 1024.0


def receiver_bytes(arrays, tp: int = 4, per_process: int = DEVICES) -> int:
    """Bytes one inference process must receive: the union of its devices' shards."""
    share = per_process / tp
    return int(sum(np.prod(s) * 4 * (1 if split == "rep" else share) for _, s, split in arrays))


# ------------------------------------------------------------------ memory
class PeakMemory:
    """Peak resident memory of this process over a block above ``baseline`` (the resident
    size once the weights were made, before any sync: what pools and caches keep between
    syncs counts too): ``VmHWM`` reset through ``/proc/self/clear_refs`` (Linux) before
    the block, else a thread sampling ``VmRSS``."""

    def __init__(self, baseline: int):
        self.before = baseline

    def __enter__(self):
        gc.collect()
        self.reset_ok = _reset_hwm()
        self._stop, self._seen = threading.Event(), self.before
        if not self.reset_ok:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self._seen = max(self._seen, _status("VmRSS"))

    def __exit__(self, *exc):
        self._stop.set()
        self.peak = _status("VmHWM") if self.reset_ok else max(self._seen, _status("VmRSS"))
        self.extra = max(0, self.peak - self.before)


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ one process
def _worker(config_path: str) -> int:
    from alpa_comm.jax.launch import worker_init

    cfg = json.loads(Path(config_path).read_text())
    rank, world, _ = worker_init()
    import jax
    from jax._src import distributed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import ProcessGroup, reshard_tree
    from alpa_comm_bench.probes import copy_times

    method, arrays = cfg["method"], model_arrays(cfg["layers"], cfg["width"], cfg["vocab"])
    names = [n for n, _, _ in arrays]
    client = distributed.global_state.client
    step = [0]

    def barrier():
        step[0] += 1
        client.wait_at_barrier(f"wss/{step[0]}", 900_000)

    def say(msg):
        if rank == 0:
            print(f"progress: {method}: {msg}", file=sys.stderr, flush=True)

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    of = {p: [d for d in devices if d.process_index == p] for p in range(world)}
    train = NamedSharding(Mesh(np.array(of[0] + of[1]), ("fsdp",)), P("fsdp"))
    infer_mesh = Mesh(np.array([of[a] + of[b] for a, b in REPLICAS]), ("replica", "tp"))
    split = {"col": P(None, "tp"), "row": P("tp"), "rep": P()}
    targets = {n: NamedSharding(infer_mesh, split[s]) for n, _, s in arrays}
    infer = rank not in TRAIN

    def version(v):  # the trainer's weights, version v (every process makes the global arrays)
        return {n: jax.make_array_from_callback(shape, train, lambda idx, i=i, s=shape: values(i, v, s, idx),
                                                dtype=np.float32) for i, (n, shape, _) in enumerate(arrays)}

    versions = [version(0), version(1)]
    old = {n: jax.make_array_from_callback(shape, targets[n], lambda idx, s=shape: np.full(
        tuple(len(range(*sl.indices(k))) for sl, k in zip(idx, s)), -1.0, np.float32), dtype=np.float32)
        for n, shape, _ in arrays}
    jax.block_until_ready((versions, old))
    group = ProcessGroup.from_jax(nic_gbps=cfg["nic_gbps"], latency_s=LATENCY_S)
    report = {"rank": rank, "runs": [], "wrong": 0, "checked": 0, "copies": {}}
    gc.collect()
    baseline = _status("VmRSS")  # the weights (two versions on the trainer, the old ones on inference)
    report["baseline"] = baseline
    replica_meshes = [Mesh(np.array(of[a] + of[b]), ("fsdp",)) for a, b in REPLICAS]
    root = NamedSharding(Mesh(np.array(of[0][:1]), ("x",)), P())
    fanout = NamedSharding(Mesh(np.array([of[p][0] for pair in REPLICAS for p in pair]), ("x",)), P())
    budget = cfg["budget"]
    current = old
    for run in range(cfg["repeat"] + 1):
        src = versions[run % 2]
        barrier()
        with PeakMemory(baseline) as mem:
            t0 = time.perf_counter()
            got = None
            if method in ("alpa_comm", "alpa_comm_atomic"):
                got = reshard_tree(src, None, out=current, group=group, max_inflight_bytes=budget,
                                   atomic=method == "alpa_comm_atomic")
                current = got
            elif method == "alpa_comm_fresh":
                got = reshard_tree(src, targets, group=group, max_inflight_bytes=budget)
            elif method == "jax_device_put":
                got = [jax.device_put(src, {n: NamedSharding(m, P("fsdp")) for n in names}) for m in replica_meshes]
            else:  # gather on process 0, broadcast whole arrays, cut out the shards
                full = None
                if rank in TRAIN:
                    full = reshard_tree(src, {n: root for n in names}, group=group, strategy="send_recv",
                                        bucket_bytes=None, max_inflight_bytes=budget)
                if rank == 0 or infer:
                    spread = reshard_tree(full if rank == 0 else {n: _placeholder(shape, root)
                                                                   for n, shape, _ in arrays},
                                          {n: fanout for n in names}, group=group, strategy="broadcast",
                                          max_inflight_bytes=budget)
                    if infer:
                        whole = {n: np.asarray(spread[n].addressable_shards[0].data) for n in names}
                        got = {n: jax.make_array_from_callback(shape, targets[n], lambda idx, b=whole[n]: b[idx],
                                                               dtype=np.float32) for n, shape, _ in arrays}
                        del whole
                    del spread
                del full
            if got is not None:
                jax.block_until_ready(got)
            seconds = time.perf_counter() - t0
        report["runs"].append({"seconds": seconds, "extra": mem.extra, "hwm_reset": mem.reset_ok})
        if run == cfg["repeat"] and got is not None and infer:  # the last run's bytes against NumPy
            trees = got if isinstance(got, list) else [got]
            for tree in trees:
                for i, n in enumerate(names):
                    for s in tree[n].addressable_shards:
                        report["checked"] += 1
                        want = values(i, run % 2, arrays[i][1], s.index)
                        report["wrong"] += not np.array_equal(np.asarray(s.data), want)
        if method not in ("alpa_comm", "alpa_comm_atomic"):
            del got
        say(f"run {run + 1}/{cfg['repeat'] + 1}: {seconds:.2f} s")

    if cfg.get("calibrate"):  # after the runs: its buffers would count as theirs
        report["copies"] = copy_times(rank, of, group, barrier, (0, 2), cfg["probe_bytes"], cfg["repeat"])
        say("calibrated")
    print("RESULT " + json.dumps(report), flush=True)
    barrier()
    jax.distributed.shutdown()
    return 0


def _placeholder(shape, root):
    """What a process holding none of a gathered array passes for it (it only receives)."""
    import jax

    return jax.make_array_from_single_device_arrays(shape, root, [], dtype=np.float32)


# ------------------------------------------------------------------ the driver
def run_method(method: str, args, nic: str | None, calibrate: bool, say) -> list[dict]:
    from alpa_comm.jax.launch import config_file, launch, reports_of
    from alpa_comm.runtime.emulated import netns
    from alpa_comm.runtime.emulated.launch import teardown_emulated

    nic_gbps = planned_gbps(args, nic)
    model_mb = sum(np.prod(s) * 4 for _, s, _ in model_arrays(args.layers, args.width, args.vocab)) / 2**20
    cfg = {"method": method, "layers": args.layers, "width": args.width, "vocab": args.vocab,
           "repeat": args.repeat, "budget": int(args.budget_mb * 2**20), "nic_gbps": nic_gbps,
           "calibrate": calibrate, "probe_bytes": int(min(256, max(16, model_mb / 4)) * 2**20)}
    network = None if args.local else netns.EmulatedNetwork(WORLD, nic).up()
    try:
        per_run = model_mb * 8 / 1024 / min(nic_gbps, 2.0)  # seconds a run may take at worst
        with config_file(cfg) as path:
            outs = launch(WORLD, DEVICES, [sys.executable, str(Path(__file__).resolve()), "--worker", path],
                          network=network, timeout=120 + 6 * (args.repeat + 1) * per_run, fail_fast=True,
                          progress=say, cross_host_transfers=method == "jax_device_put")
    finally:
        if network is not None:
            teardown_emulated(network)
    return reports_of(outs, f"{method}: ")


def planned_gbps(args, nic: str | None) -> float:
    """The NIC rate the planner is told: the emulated rate, or 10 Gbit/s unshaped."""
    from alpa_comm.runtime.emulated import netns

    return netns.rate_gbps(nic) if nic and not args.local else 10.0


def summarize(method: str, reports: list[dict], args, nic: str | None, rate: float) -> dict:
    arrays = model_arrays(args.layers, args.width, args.vocab)
    model_bytes = int(sum(np.prod(s) * 4 for _, s, _ in arrays))
    into = receiver_bytes(arrays)
    runs = [max(r["runs"][i]["seconds"] for r in reports) for i in range(1, args.repeat + 1)]
    seconds = statistics.median(runs)
    extra = {r["rank"]: max(x["extra"] for x in r["runs"][1:]) for r in reports}
    from alpa_comm.resharding.coalesce import auto_bucket_bytes, bucket_within
    from alpa_comm.topology import ClusterSpec

    told = ClusterSpec(num_hosts=WORLD, devices_per_host=DEVICES, nic_send_gbps=planned_gbps(args, nic),
                       latency_s=LATENCY_S)  # what the planner was told
    bucket = bucket_within(auto_bucket_bytes(told), int(args.budget_mb * 2**20))
    wrong = sum(r["wrong"] for r in reports)
    checked = sum(r["checked"] for r in reports)
    return {"method": method, "model_bytes": model_bytes, "leaves": len(arrays), "replicas": len(REPLICAS),
            "nic": "loopback" if args.local else (nic or "unshaped"), "seconds": seconds,
            "gbps_busiest_receiver": into / seconds / 1e9, "bound_seconds": into / rate,
            "peak_extra_bytes": max(extra.values()), "bucket_bytes": bucket if method.startswith("alpa") else None,
            "verified": checked > 0 and wrong == 0,
            "runs": runs, "x_bound": seconds * rate / into, "peak_extra_by_rank": extra,
            "busiest_receiver_bytes": into, "measured_copy_gbps": rate * 8 / 1e9, "budget_bytes": int(args.budget_mb * 2**20),
            "shards_checked": checked, "shards_wrong": wrong,
            "hwm_reset": all(x["hwm_reset"] for r in reports for x in r["runs"])}


def _mib(n) -> str:
    return f"{n / 2**20:.0f} MiB" if n is not None else "-"


def table(rows: list[dict]) -> str:
    from alpa_comm.report.tables import table as fmt

    return fmt(["nic", "method", "seconds", "x bound", "GB/s busiest receiver", "peak extra (worst process)",
                "bucket", "verified"],
               [[r["nic"], r["method"], f"{r['seconds']:.2f}", f"{r['x_bound']:.2f}", f"{r['gbps_busiest_receiver']:.3f}",
                 _mib(r["peak_extra_bytes"]), _mib(r["bucket_bytes"]), "yes" if r["verified"] else "NO"]
                for r in rows])


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nics = list(dict.fromkeys(r["nic"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs = [c + (i - (len(methods) - 1) / 2) * width for c in range(len(nics))]
        by = {r["nic"]: r for r in rows if r["method"] == m}
        axes[0].bar(xs, [by[n]["x_bound"] if n in by else 0 for n in nics], width, label=m)
        axes[1].bar(xs, [by[n]["peak_extra_bytes"] / 2**20 if n in by else 0 for n in nics], width, label=m)
    axes[0].axhline(1.0, color="black", linestyle="dashed", linewidth=0.8)
    axes[0].set_ylabel("seconds / bound (busiest receiver)")
    axes[1].set_ylabel("peak MiB above the weights (worst process)")
    for ax in axes:
        ax.set_xticks(range(len(nics)))
        ax.set_xticklabels(nics)
        ax.legend(fontsize=7)
    model = rows[0]
    fig.suptitle(f"weight sync: {model['model_bytes'] / 2**20:.0f} MiB, {model['leaves']} arrays, FSDP 2x2 -> "
                 f"{model['replicas']} TP replicas", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="RL weight sync at model scale: seconds, GB/s into the busiest "
                                            "receiver and measured peak memory per method (6 JAX processes)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--nic", action="append", help="NIC rate of every emulated host, e.g. 400mbit, or 'none' "
                                                  "(unshaped); repeatable (default: 400mbit and none)")
    p.add_argument("--local", action="store_true", help="run on loopback instead (no root; no NIC shaping)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--vocab", type=int, default=48000)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per method (after one warm-up)")
    p.add_argument("--budget-mb", type=float, default=256, help="max_inflight_bytes of the planned sync, MiB")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default="benchmarks/results/emulated/weight_sync_scale",
                   help="where results.* go, relative to the working directory")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    if args.worker:
        from alpa_comm.jax.launch import run_worker

        return run_worker(_worker, args.worker)
    from alpa_comm_bench.probes import copy_rate

    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    if args.layers < 1 or args.width % 8 or args.vocab % 8:
        p.error(f"--layers must be >= 1 and --width/--vocab multiples of 8, got {args.layers}/{args.width}/"
                f"{args.vocab}")
    nics = [None] if args.local else [None if n == "none" else n for n in (args.nic or ["400mbit", "none"])]
    arrays = model_arrays(args.layers, args.width, args.vocab)
    print(f"model: {sum(np.prod(s) * 4 for _, s, _ in arrays) / 2**20:.0f} MiB in {len(arrays)} arrays; "
          f"{len(nics)} network(s) x {len(methods)} methods x {args.repeat + 1} runs", file=sys.stderr, flush=True)
    rows = []
    t_start = time.monotonic()
    for nic in nics:
        rate = None
        for k, method in enumerate(methods):
            label = "loopback" if args.local else (nic or "unshaped")

            def say(msg, label=label):
                print(f"[{time.monotonic() - t_start:6.0f} s] {label}: {msg}", file=sys.stderr, flush=True)

            reports = run_method(method, args, nic, calibrate=k == 0, say=say)
            if rate is None:
                rate, _ = copy_rate(reports, args.repeat)
                say(f"one process sends another at {rate * 8 / 1e9:.3f} Gbit/s")
            rows.append(summarize(method, reports, args, nic, rate))
            r = rows[-1]
            say(f"{method}: {r['seconds']:.2f} s ({r['x_bound']:.2f}x bound), peak extra {_mib(r['peak_extra_bytes'])}"
                f", verified {r['verified']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "sudo python benchmarks/weight_sync_scale.py " + " ".join(a for a in (argv or sys.argv[1:]))
    (out / "results.json").write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=1))
    (out / "results.md").write_text(f"`{command.strip()}`\n\n{table(rows)}\n")
    chart(rows, out / "results.png")
    print(table(rows))
    if args.json:
        print(json.dumps([{k: r[k] for k in COLUMNS} for r in rows]))
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
