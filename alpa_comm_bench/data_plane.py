"""``alpa-comm bench --mode processes --suite same-layout | layout-change``: the data plane
in the user's own JAX processes, beside JAX's own cross-host ``device_put`` and the
transport's raw rate, in one run.

Three ``jax.distributed`` processes of 2 CPU devices each (``alpa_comm.jax.launch``;
every process has its own ``jax_cross_host_transfer_socket_address``, as JAX needs). The
source is always process 0's two devices, ``P("x")``. Cases:

* ``same-layout``: process 1's two devices in the same layout, at half, one and two
  times ``--size-mb``; a tree of 200 leaves moved in one call (256 KiB each at the
  default 128 MiB); a 1 KiB array (what a
  cached call costs when the bytes cost nothing).
* ``layout-change``: ``P(None, "x")`` on process 1 (a layout change), ``P()`` on process 1
  (sharded to replicated), process 1's first device only (a change of device count), and
  one device on each of processes 1 and 2 (one sender, two receiver processes).

Methods, interleaved within every repeat (each from a common barrier to the slowest
process's end):

* ``alpa_comm``: ``reshard`` / ``reshard_tree`` (the planner, the concurrent executor,
  alpa_comm's own TCP transport: the group's default), and ``alpa_comm_gloo``: the same
  over gloo;
* ``jax_device_put``: JAX's own path where it takes the case (same shard shapes:
  ``jax.device_put`` onto the other process's mesh, a tree as one batched call), else
  JAX's best working alternative: ``device_put`` in the source layout onto the
  destination's devices then a jitted reshard inside the destination mesh (layout,
  replicated; a local ``device_put`` for the change of device count, which ``jit``
  refuses), or one ``device_put`` per shard between single-device arrays (two receiver
  processes);
* ``raw`` and ``raw_gloo``: each transport alone, ``isend``/``irecv`` over the same
  group's backend (same streams) of the bytes each receiving process needs from each
  sender as one message, into buffers made before the clock starts; the faster of the
  two is the data plane's limit (``x lower bound``).

Every received shard is compared with the NumPy reference, bit for bit. ``probe_jax``
tries JAX's own ``device_put`` on the layout-change cases once, each in processes of
its own with a deadline, and records what every process saw (JAX's error, or that it
did not return).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from alpa_comm.errors import InvalidOptionError

from .result import Result, VerificationError

WORLD, DEVICES = 3, 2
SUITES = ("same-layout", "layout-change")
METHODS = ("alpa_comm", "alpa_comm_gloo", "jax_device_put", "raw", "raw_gloo")
TRANSPORTS = {"alpa_comm": "tcp", "alpa_comm_gloo": "gloo", "raw": "tcp", "raw_gloo": "gloo"}
"""The transport each of our methods runs on: ``alpa_comm`` and ``raw`` on the group's
default (alpa_comm's own TCP transport), their ``_gloo`` twins on gloo."""
TREE_LEAVES = 200
PROBE_DEADLINE_S = 20.0


def cases(suite: str, size_mb: float) -> list[dict]:
    """The cases of ``suite`` with arrays of about ``size_mb`` MiB (float32)."""
    n = _elements(size_mb)
    cols = 256
    rows = max(DEVICES * 2, n // cols // 4 * 4)
    if suite == "same-layout":
        out = [{"name": f"P(x) {_mib(mb)} MiB", "leaves": [[_elements(mb)]], "dst": "p1", "spec": ["x"],
                "jax": "direct"} for mb in (size_mb / 2, size_mb, size_mb * 2)]
        leaf = max(256, int(size_mb * 512) // 2 * 2)  # 256 KiB leaves at the default 128 MiB
        out.append({"name": f"tree {TREE_LEAVES} x {_kib(leaf * 4)} KiB", "leaves": [[leaf]] * TREE_LEAVES,
                    "dst": "p1", "spec": ["x"], "jax": "direct"})
        out.append({"name": "P(x) 1 KiB", "leaves": [[256]], "dst": "p1", "spec": ["x"], "jax": "direct"})
        return out
    if suite == "layout-change":
        shape = [rows, cols]
        return [
            {"name": "P(x) -> P(None, x)", "leaves": [shape], "dst": "p1", "spec": [None, "x"], "jax": "two_step"},
            {"name": "P(x) -> P() (replicated)", "leaves": [shape], "dst": "p1", "spec": [], "jax": "two_step"},
            {"name": "2 -> 1 devices", "leaves": [shape], "dst": "p1-one", "spec": ["x"], "jax": "two_step"},
            {"name": "1 -> 2 receiver processes", "leaves": [shape], "dst": "p1p2", "spec": ["x"],
             "jax": "per_shard"},
        ]
    raise InvalidOptionError(f"unknown data-plane suite {suite!r}; choose one of {', '.join(SUITES)}")


def _elements(size_mb: float) -> int:
    return max(DEVICES, int(size_mb * 2**18) // DEVICES * DEVICES)


def _mib(mb: float) -> str:
    return f"{mb:g}"


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:g}"


def receiving_processes(dst: str) -> tuple[int, ...]:
    return {"p1": (1,), "p1-one": (1,), "p1p2": (1, 2)}[dst]


def needed_bytes(case: dict) -> dict[int, int]:
    """Bytes each receiving process needs from process 0 (the union of its devices' boxes):
    the whole array, except with two receiver processes, which need half each."""
    total = sum(int(np.prod(s)) * 4 for s in case["leaves"])
    procs = receiving_processes(case["dst"])
    return {p: total // len(procs) for p in procs}


# ------------------------------------------------------------------ one process
def _worker(config_path: str) -> int:
    from alpa_comm.jax.launch import worker_init

    rank, world, _ = worker_init()
    import jax
    from jax._src import distributed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import ProcessGroup, reshard_tree

    cfg = json.loads(Path(config_path).read_text())
    client = distributed.global_state.client
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    of = {p: [d for d in devices if d.process_index == p] for p in range(world)}
    src_mesh = Mesh(np.array(of[0]), ("x",))
    meshes = {"p1": Mesh(np.array(of[1]), ("x",)), "p1-one": Mesh(np.array(of[1][:1]), ("x",)),
              "p1p2": Mesh(np.array([of[1][0], of[2][0]]), ("x",))}
    groups = {t: ProcessGroup.from_jax(backend=t, nic_gbps=cfg["nic_gbps"], streams=cfg["streams"],
                                       timeout=cfg["timeout"], latency_s=cfg["latency_s"])
              for t in dict.fromkeys(TRANSPORTS.values())}
    barrier_n = [0]

    def barrier():
        barrier_n[0] += 1
        client.wait_at_barrier(f"alpa_comm_bench/data_plane/{barrier_n[0]}", 600_000)

    report = {"rank": rank, "cases": {}, "streams": groups["tcp"].streams}
    for suite in cfg["suites"]:
        for case in cases(suite, cfg["size_mb"]):
            refs = [np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + i for i, s in enumerate(case["leaves"])]
            xs = [jax.make_array_from_callback(r.shape, NamedSharding(src_mesh, P("x")), lambda idx, r=r: r[idx],
                                               dtype=np.float32) for r in refs]
            dst = NamedSharding(meshes[case["dst"]], P(*case["spec"]))
            recv = receiving_processes(case["dst"])
            mine = rank == 0 or rank in recv
            raws = {m: _raw_plan(case, rank, groups[TRANSPORTS[m]]) for m in ("raw", "raw_gloo")} if mine else {}
            rows = {m: {"seconds": [], "wrong": 0} for m in METHODS}
            for i in range(cfg["repeat"] + 1):
                for method in METHODS:
                    barrier()
                    t0 = time.perf_counter()
                    got = None
                    if method.startswith("alpa_comm") and mine:
                        got = reshard_tree(xs, [dst] * len(xs), group=groups[TRANSPORTS[method]])
                    elif method == "jax_device_put":
                        got = _jax_method(case, xs, dst, rank, of, meshes)
                    elif method.startswith("raw") and mine:
                        raws[method]()
                    if got is not None:
                        jax.block_until_ready(got)
                    seconds = time.perf_counter() - t0
                    if i:  # the first round is the warm-up (planning, group join, JAX's compiles)
                        rows[method]["seconds"].append(seconds)
                    if got is not None and rank in recv:
                        rows[method]["wrong"] += sum(not np.array_equal(np.asarray(s.data), r[s.index])
                                                     for y, r in zip(got, refs) for s in y.addressable_shards)
                    del got
            report["cases"][f"{suite}/{case['name']}"] = rows
            if rank == 0:
                print(f"progress: {suite}: {case['name']} done ({cfg['repeat'] + 1} rounds x {len(METHODS)} methods)",
                      file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(report), flush=True)
    jax.distributed.shutdown()
    return 0


def _raw_plan(case: dict, rank: int, group):
    """The ``raw`` method of one process: the bytes each receiver needs as one message
    from process 0 (striped over the group's streams by the backend), buffers ready."""
    need = needed_bytes(case)
    backend = group.backend({0, *need})
    if rank == 0:
        bufs = {p: np.ones(n, np.uint8) for p, n in need.items()}
    else:
        bufs = {0: np.empty(need[rank], np.uint8)}
    timeout = group.timeout

    def run():
        handles = [backend.isend(b, p, 1) if rank == 0 else backend.irecv(b, p, 1) for p, b in bufs.items()]
        for h in handles:
            h.wait(timeout)
    return run


def _jax_method(case: dict, xs: list, dst, rank: int, of: dict, meshes: dict):
    """JAX's own transfer of ``xs`` onto ``dst`` (every process calls): direct where JAX
    takes the case, else its best working alternative. Returns what this process holds."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if case["jax"] == "direct":
        return jax.device_put(xs, [dst] * len(xs))
    if case["jax"] == "two_step":  # same layout onto the destination's devices, then reshard inside them
        there = NamedSharding(meshes["p1"], P("x"))
        moved = jax.device_put(xs, [there] * len(xs))
        if rank != 1:
            return None
        if set(dst.mesh.devices.flat) != set(there.mesh.devices.flat):  # jit keeps the device set
            return [jax.device_put(y, dst) for y in moved]
        return [jax.jit(lambda a: a, out_shardings=dst)(y) for y in moved]
    # per_shard: shard i of process 0's device i -> the i-th destination device, one call each
    out = []
    targets = list(dst.mesh.devices.flat)
    for x in xs:
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start)
        rows = x.shape[0] // len(targets)
        pieces = []
        for i, tgt in enumerate(targets):
            one = NamedSharding(Mesh(np.array([of[0][i]]), ("x",)), P())
            part = jax.make_array_from_single_device_arrays((rows, *x.shape[1:]), one,
                                                            [shards[i].data] if rank == 0 else [], dtype=x.dtype)
            pieces.append(jax.device_put(part, NamedSharding(Mesh(np.array([tgt]), ("x",)), P())))
        local = [p.addressable_shards[0].data for p in pieces if p.addressable_shards]
        out.append(jax.make_array_from_single_device_arrays(x.shape, dst, local, dtype=x.dtype))
    return out if rank in (1, 2) else None


# ------------------------------------------------------------------ probing JAX
def _probe_worker(config_path: str) -> int:
    """Try JAX's own ``device_put`` on one case and say what happened here."""
    from alpa_comm.jax.launch import worker_init

    rank, world, _ = worker_init()
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    cfg = json.loads(Path(config_path).read_text())
    case = cfg["case"]
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    of = {p: [d for d in devices if d.process_index == p] for p in range(world)}
    meshes = {"p1": [of[1][0], of[1][1]], "p1-one": [of[1][0]], "p1p2": [of[1][0], of[2][0]]}
    ref = np.arange(int(np.prod(case["leaves"][0])), dtype=np.float32).reshape(case["leaves"][0])
    x = jax.make_array_from_callback(ref.shape, NamedSharding(Mesh(np.array(of[0]), ("x",)), P("x")),
                                     lambda idx: ref[idx], dtype=np.float32)
    dst = NamedSharding(Mesh(np.array(meshes[case["dst"]]), ("x",)), P(*case["spec"]))
    print("PROBE started", flush=True)
    try:
        y = jax.device_put(x, dst)
        jax.block_until_ready(y)
        ok = all(np.array_equal(np.asarray(s.data), ref[s.index]) for s in y.addressable_shards)
        print("PROBE " + json.dumps({"rank": rank, "outcome": "returned", "correct": ok}), flush=True)
    except Exception as e:  # noqa: BLE001 - JAX's own error is the result
        print("PROBE " + json.dumps({"rank": rank, "outcome": "raised",
                                     "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}), flush=True)
    import os
    os._exit(0)  # never wait in JAX's shutdown barrier for a process that is stuck


def probe_jax(size_mb: float, network=None, progress=None) -> list[dict]:
    """What JAX's own ``device_put`` does on every layout-change case: one launch each,
    ended after ``PROBE_DEADLINE_S``; per process: its error, a result, or no return."""
    from alpa_comm.jax.launch import config_file, launch, python_command

    say = progress or (lambda msg: None)
    out = []
    for case in cases("layout-change", min(size_mb, 1.0)):
        with config_file({"case": case}) as path:
            outs = launch(WORLD, DEVICES, python_command(__name__, "--probe", path), network=network,
                          timeout=PROBE_DEADLINE_S, cross_host_transfers=True)
        seen = {}
        for o in outs:
            lines = o.lines("PROBE ")
            got = [json.loads(ln) for ln in lines if ln.startswith("{")]
            if got:
                seen[o.rank] = got[0]
            elif o.returncode == -9:
                seen[o.rank] = {"rank": o.rank, "outcome": f"did not return within {PROBE_DEADLINE_S:g} s (killed)"}
            else:
                last = (o.stderr.strip().splitlines() or [""])[-1][:200]
                seen[o.rank] = {"rank": o.rank, "outcome": f"did not return; ended (exit code {o.returncode}) once "
                                                           f"the other processes had left: {last}"}
        out.append({"case": case["name"], "processes": [seen[r] for r in sorted(seen)]})
        say(f"probed JAX's device_put on {case['name']}: "
            + "; ".join(f"process {p['rank']}: {p['outcome']}" for p in out[-1]["processes"]))
    return out


# ------------------------------------------------------------------ the driver
def run(suites, nic: str | None, size_mb: float, repeat: int, timeout: float = 60.0, emulated: bool = False,
        streams: int | str = "auto", stream_gbps: float | None = None, probe: bool = True,
        progress=None) -> tuple[list, dict]:
    """Launch the processes (loopback, or the emulated cluster with ``nic``), collect their
    reports; returns (``Result`` rows, a description of the run with JAX's refusals
    under ``jax_refusals``)."""
    from alpa_comm.jax.group import DEFAULT_STREAM_GBPS, streams_for
    from alpa_comm.jax.launch import config_file, launch, python_command, reports_of
    from alpa_comm.runtime.emulated import netns
    from alpa_comm.runtime.emulated.launch import teardown_emulated
    from alpa_comm.runtime.launch import EMULATED_LATENCY_S

    say = progress or (lambda msg: None)
    nic_gbps = netns.rate_gbps(nic) if emulated and nic else LOOPBACK_GBPS
    n_streams = streams_for(streams, nic_gbps, stream_gbps or DEFAULT_STREAM_GBPS)
    cfg = {"suites": list(suites), "size_mb": size_mb, "repeat": repeat, "timeout": timeout, "nic_gbps": nic_gbps,
           "streams": n_streams, "latency_s": EMULATED_LATENCY_S if emulated else LOOPBACK_LATENCY_S}
    network = netns.EmulatedNetwork(WORLD, nic).up() if emulated else None
    try:
        where = f"emulated hosts, NIC {nic}" if emulated else "loopback, no tc"
        say(f"{WORLD} JAX processes x {DEVICES} CPU devices ({where}), {n_streams} TCP stream(s) a pair (tcp and gloo alike); suites "
            f"{', '.join(suites)}; {len(METHODS)} methods interleaved, {repeat} timed rounds after a warm-up")
        t0 = time.monotonic()
        with config_file(cfg) as path:
            outs = launch(WORLD, DEVICES, python_command(__name__, "--worker", path), network=network,
                          timeout=max(300.0, 30 * (repeat + 1) * max(size_mb, 1) / 16), fail_fast=True,
                          progress=say, cross_host_transfers=True)
        say(f"processes done in {time.monotonic() - t0:.0f} s")
        refusals = probe_jax(size_mb, network, say) if probe and "layout-change" in suites else []
    finally:
        if network is not None:
            teardown_emulated(network)
    reports = reports_of(outs)
    results = []
    for suite in suites:
        for case in cases(suite, size_mb):
            key = f"{suite}/{case['name']}"
            nbytes = sum(int(np.prod(s)) * 4 for s in case["leaves"])
            timed = {m: [max(r["cases"][key][m]["seconds"][i] for r in reports) for i in range(repeat)]
                     for m in METHODS}
            raw = min(statistics.median(timed["raw"]), statistics.median(timed["raw_gloo"]))
            for method in METHODS:
                wrong = sum(r["cases"][key][method]["wrong"] for r in reports)
                if wrong:
                    raise VerificationError(f"{suite} (processes) {case['name']}, {method}: {wrong} shards wrong")
                how = {"alpa_comm": "reshard_tree (tcp)", "alpa_comm_gloo": "reshard_tree (gloo)",
                       "raw": "tcp isend/irecv", "raw_gloo": "gloo isend/irecv",
                       "jax_device_put": {"direct": "device_put", "two_step": "device_put + reshard inside",
                                          "per_shard": "device_put per shard"}[case["jax"]]}[method]
                results.append(Result(f"{suite}-processes", case["name"], method, "broadcast", "-", timed[method],
                                      statistics.median(timed[method]), raw, float("nan"), nbytes,
                                      not method.startswith("raw") or None,
                                      {"how": how, "leaves": len(case["leaves"]), "receiving_processes":
                                       list(receiving_processes(case["dst"])), "raw_is_the_bound": True}))
    desc = {"kind": "emulated" if emulated else "local", "processes": WORLD, "devices_per_process": DEVICES,
            "nic": nic, "streams": n_streams, "size_mb": size_mb, "repeat": repeat, "jax_refusals": refusals,
            "description": f"{WORLD} JAX processes x {DEVICES} CPU devices, "
                           + (f"NIC {nic}" if emulated else "loopback (no tc)") + f", {n_streams} stream(s)"}
    return results, desc


LOOPBACK_LATENCY_S = 50e-6
"""What the planner is told one message costs on loopback: the group's default, so the
suite plans as a user's script on the default group does (``benchmarks/user_script.py``)."""
LOOPBACK_GBPS = 40.0
"""What the planner and ``streams="auto"`` are told a loopback link carries: two gloo
streams moved 36-42 Gbit/s between two processes here, one 27-31."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one process of the data-plane processes benchmark "
                                            "(run by 'alpa-comm bench --mode processes --suite same-layout')")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--worker", help="the benchmark's JSON configuration")
    g.add_argument("--probe", help="a probe's JSON configuration (one case of JAX's own device_put)")
    args = p.parse_args(argv)
    from alpa_comm.jax.launch import run_worker

    return run_worker(_worker, args.worker) if args.worker else run_worker(_probe_worker, args.probe)


if __name__ == "__main__":
    sys.exit(main())
