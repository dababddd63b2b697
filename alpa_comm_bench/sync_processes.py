"""``alpa-comm bench --suite weight-sync --mode processes``: weight sync between the user's
own JAX processes, our planned sync against what RL systems do without it.

Six ``jax.distributed`` processes, one per emulated host, 2 CPU devices each (the
launcher: ``alpa_comm.jax.launch``). A training group (hosts 0-1, mesh (data=2, fsdp=2),
every weight sharded FSDP-style along dim 0 over its 4 devices) pushes a transformer's
weights (``shapes.transformer_weights``) to inference replicas on hosts 2-5, in two
layouts (``shapes.SYNC_LAYOUTS``):

* ``tp-in-host``: 4 replicas, each tensor-parallel over one host's 2 devices (mesh
  (replica=4, tp=2)): every inference host needs the whole model;
* ``tp-across-hosts``: 2 replicas, each tensor-parallel over 2 hosts x 2 devices (mesh
  (replica=2, tp=4)): every inference host needs half of it.

Methods, each run by every process that takes part, timed from a common barrier to the
last process's end (the run's time is the slowest process's):

* ``planned``: one ``reshard_tree`` call (one jointly balanced plan, made once and cached,
  small leaves packed, chunk-pipelined broadcasts);
* ``planned_bf16``: the same with ``wire_dtype="bfloat16"`` (half the bytes; receivers
  get float32 values rounded to bfloat16);
* ``per_leaf``: one ``reshard`` call per weight (each planned once and cached);
* ``gather_broadcast``: the common baseline: every weight gathered whole on process 0,
  then ``torch.distributed``'s gloo broadcast of each whole weight to every inference
  process (gloo's algorithm: a binomial tree, the whole buffer each round), each of which
  cuts out its own shards;
* ``gather_pipelined``: the same gather, then one chunk-pipelined broadcast of every
  whole weight to the inference hosts (what NCCL's ring broadcast does on GPUs: the
  baseline at its best).

The lower bound of a layout is the bytes the busiest inference host must receive divided
by the NIC rate (measured in the same run between two processes: ``probes.copy_times``).
Every received shard is compared with the NumPy reference (bit-exact; ``planned_bf16``
against the values rounded to bfloat16).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .probes import copy_rate, copy_times
from .result import Result, VerificationError
from .shapes import SYNC_LAYOUTS, transformer_weights

WORLD, DEVICES, TRAIN, INFER = 6, 2, (0, 1), (2, 3, 4, 5)
METHODS = ("planned", "planned_bf16", "per_leaf", "gather_broadcast", "gather_pipelined")
BASELINES = ("gather_broadcast", "gather_pipelined")
LATENCY_S = 1e-3
"""What one message costs here beyond its bytes (Python, gloo and the tc queue on two shared
cores): the planner's chunk and bucket sizes follow from it."""


def host_bytes_in(weights: dict[str, np.ndarray], replica: int, tp: int) -> dict[int, int]:
    """Bytes each inference host must receive (the union of its devices' shards): matrices
    split by column over ``tp`` devices, vectors whole on every device."""
    hosts_per_replica = tp // DEVICES
    out = {h: 0 for h in INFER[: replica * hosts_per_replica]}
    for w in weights.values():
        share = w.nbytes // hosts_per_replica if w.ndim == 2 else w.nbytes
        for h in out:
            out[h] += share
    return out


# ------------------------------------------------------------------ one process
def _worker(config_path: str) -> int:
    from alpa_comm.jax.launch import worker_init

    rank, world, _ = worker_init()
    import jax
    from jax._src import distributed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import ProcessGroup, reshard, reshard_tree
    from alpa_comm.runtime.executor import numpy_dtype

    cfg = json.loads(Path(config_path).read_text())
    client = distributed.global_state.client
    weights = transformer_weights(cfg["size_mb"])
    names = list(weights)
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    of = {p: [d for d in devices if d.process_index == p] for p in range(world)}
    train = Mesh(np.array(of[0] + of[1]).reshape(2, 2), ("data", "fsdp"))
    in_train = rank in TRAIN
    params = {k: jax.make_array_from_callback(w.shape, NamedSharding(train, P(("data", "fsdp"))),
                                              lambda idx, w=w: w[idx], dtype=w.dtype)
              for k, w in weights.items()}
    bf16 = {k: w.astype(numpy_dtype("bfloat16")).astype(np.float32) for k, w in weights.items()}
    barrier_n = [0]

    def barrier():
        barrier_n[0] += 1
        client.wait_at_barrier(f"alpa_comm_bench/sync_processes/{barrier_n[0]}", 600_000)

    def check(got: dict, want: dict) -> int:
        return sum(not np.array_equal(np.asarray(s.data), want[k][s.index])
                   for k, y in got.items() for s in y.addressable_shards)

    report = {"rank": rank, "layouts": {}}
    # the planner is told the NIC it runs on, and what a message costs beyond its bytes here
    group = ProcessGroup.from_jax(nic_gbps=cfg["nic_gbps"], latency_s=cfg["latency_s"])
    # gloo's own broadcast is the gather_broadcast baseline's second half (torch's broadcast)
    gloo = ProcessGroup.from_jax(backend="gloo", nic_gbps=cfg["nic_gbps"], latency_s=cfg["latency_s"])
    report["copies"] = copy_times(rank, of, group, barrier, (0, 1), _elements(cfg["size_mb"]) * 4, cfg["repeat"])

    for layout, (replica, tp) in SYNC_LAYOUTS.items():
        infer_ids = [d for p in INFER for d in of[p]]
        infer = Mesh(np.array(infer_ids).reshape(replica, tp), ("replica", "tp"))
        hosts = {d.process_index for d in infer.devices.flat}
        targets = {k: NamedSharding(infer, P(None, "tp") if w.ndim == 2 else P()) for k, w in weights.items()}
        mine = in_train or rank in hosts
        firsts = [of[p][0] for p in sorted(hosts)]
        root = NamedSharding(Mesh(np.array(of[0][:1]), ("x",)), P())
        fanout = NamedSharding(Mesh(np.array(firsts), ("x",)), P())
        rows = {}
        for method in METHODS:
            seconds, wrong = [], 0
            for i in range(cfg["repeat"] + 1):
                barrier()
                t0 = time.perf_counter()
                got = None
                if mine and method == "planned":
                    got = reshard_tree(params, targets, group=group)
                elif mine and method == "planned_bf16":
                    got = reshard_tree(params, targets, group=group, wire_dtype="bfloat16", dtype="float32")
                elif mine and method == "per_leaf":
                    got = {k: reshard(params[k], targets[k], group=group) for k in names}
                elif mine and method in BASELINES:
                    full = None
                    if in_train:  # 1. every weight whole on process 0
                        full = reshard_tree(params, {k: root for k in names}, group=group, strategy="send_recv",
                                            bucket_bytes=None)
                    if rank == 0 or rank in hosts:  # 2. whole weights to every inference process
                        if method == "gather_broadcast":
                            backend = gloo.backend({0} | hosts)
                            bufs = {}
                            for k in names:
                                buf = (np.array(full[k].addressable_shards[0].data) if rank == 0
                                       else np.empty(weights[k].shape, np.float32))
                                backend.collective_broadcast(buf, 0, timeout=cfg["timeout"])
                                bufs[k] = buf
                        else:
                            spread = reshard_tree(
                                full if rank == 0 else {k: _placeholder(weights[k], root) for k in names},
                                {k: fanout for k in names}, group=group, strategy="broadcast")
                            bufs = ({k: np.asarray(spread[k].addressable_shards[0].data) for k in names}
                                    if rank in hosts else {})
                        if rank in hosts:  # 3. each cuts out its own shards
                            got = {k: jax.make_array_from_callback(weights[k].shape, targets[k],
                                                                   lambda idx, b=bufs[k]: b[idx], dtype=np.float32)
                                   for k in names}
                    if got is not None:
                        jax.block_until_ready(got)
                seconds.append(time.perf_counter() - t0)
                if got is not None and rank in hosts:
                    wrong += check(got, bf16 if method == "planned_bf16" else weights)
            rows[method] = {"seconds": seconds[1:], "wrong": wrong, "checked": rank in hosts}
            if rank == 0:
                print(f"progress: {layout}: {method} done ({cfg['repeat'] + 1} runs)", file=sys.stderr, flush=True)
        report["layouts"][layout] = rows
    print("RESULT " + json.dumps(report), flush=True)
    jax.distributed.shutdown()
    return 0


def _elements(size_mb: float) -> int:
    return int(size_mb * 2**18)  # float32 elements in size_mb MiB


def _placeholder(w: np.ndarray, root):
    """What a process that holds none of a gathered weight passes for it: an array of the
    right shape and sharding with no shards of its own (it only receives)."""
    import jax

    return jax.make_array_from_single_device_arrays(w.shape, root, [], dtype=w.dtype)


# ------------------------------------------------------------------ the driver
def run(nic: str | None, size_mb: float, repeat: int, timeout: float = 60.0, emulated: bool = True,
        progress=None) -> tuple[list, dict]:
    """Launch the six processes (on the emulated cluster, or on loopback), collect their
    reports, and return (``Result`` rows, a description of the run)."""
    from alpa_comm.jax.launch import config_file, launch, python_command, reports_of
    from alpa_comm.runtime.emulated import netns
    from alpa_comm.runtime.emulated.launch import teardown_emulated

    say = progress or (lambda msg: None)
    cfg = {"size_mb": size_mb, "repeat": repeat, "timeout": timeout, "latency_s": LATENCY_S,
           "nic_gbps": netns.rate_gbps(nic) if emulated and nic else 10.0}
    network = netns.EmulatedNetwork(WORLD, nic).up() if emulated else None
    try:
        say(f"{WORLD} JAX processes ({'emulated hosts, NIC ' + str(nic) if emulated else 'loopback'}), "
            f"{size_mb:g} MiB of weights, {len(SYNC_LAYOUTS)} layouts x {len(METHODS)} methods x {repeat + 1} runs")
        t0 = time.monotonic()
        with config_file(cfg) as path:
            outs = launch(WORLD, DEVICES, python_command(__name__, "--worker", path), network=network,
                          timeout=max(300.0, 40 * (repeat + 1) * size_mb / 8), fail_fast=True, progress=say)
        say(f"processes done in {time.monotonic() - t0:.0f} s")
    finally:
        if network is not None:
            teardown_emulated(network)
    reports = reports_of(outs)
    rate, fixed = copy_rate(reports, repeat)
    weights = transformer_weights(size_mb)
    nbytes = sum(w.nbytes for w in weights.values())
    results = []
    for layout, (replica, tp) in SYNC_LAYOUTS.items():
        into = host_bytes_in(weights, replica, tp)
        for method in METHODS:
            bound = max(into.values()) / rate / (2 if method == "planned_bf16" else 1)
            runs = [max(r["layouts"][layout][method]["seconds"][i] for r in reports) for i in range(repeat)]
            wrong = sum(r["layouts"][layout][method]["wrong"] for r in reports)
            if wrong:
                raise VerificationError(f"weight-sync (processes) {layout}, {method}: {wrong} shards wrong")
            results.append(Result("weight-sync-processes", layout, method,
                                  "broadcast" if method != "gather_broadcast" else "send_recv", "auto", runs,
                                  statistics.median(runs), bound, float("nan"),
                                  nbytes // (2 if method == "planned_bf16" else 1), True,
                                  {"busiest_host_in_bytes": max(into.values()), "leaves": len(weights)}))
    desc = {"kind": "emulated" if emulated else "local", "processes": WORLD, "devices_per_process": DEVICES,
            "nic": nic, "measured_copy_gbps": rate * 8 / 1e9, "fixed_seconds_per_call": fixed,
            "planner_latency_s": LATENCY_S, "size_mb": size_mb, "repeat": repeat,
            "description": f"{WORLD} JAX processes x {DEVICES} CPU devices"
                           + (f", NIC {nic}" if emulated else ", loopback")}
    return results, desc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one process of the weight-sync processes benchmark "
                                            "(run by 'alpa-comm bench --suite weight-sync --mode processes')")
    p.add_argument("--worker", required=True, help="the benchmark's JSON configuration")
    args = p.parse_args(argv)
    from alpa_comm.jax.launch import run_worker

    return run_worker(_worker, args.worker)


if __name__ == "__main__":
    sys.exit(main())
