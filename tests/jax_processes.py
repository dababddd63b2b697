"""Run a multi-process JAX program here: N local processes, each ``jax.distributed``
process ``i`` of N with ``devices`` CPU devices, running ``WORKER`` on JSON cases. Each
process prints one JSON result line; ``run`` returns them by rank.

A case: ``{"shape", "dtype", "src": {"ids", "axes", "spec"}, "dst": {...}}`` with device
ids in alpa_comm's numbering (process * devices + position); optional ``"tree"`` (a
list of cases moved by one ``reshard_tree``), ``"kill"`` (a rank that exits instead of
taking part), ``"wire"``/``"out_dtype"`` (``wire_dtype``/``dtype`` of the call)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r'''
import json, os, sys, time
import numpy as np
rank, world, devices = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
import jax
jax.config.update("jax_num_cpu_devices", devices)
jax.config.update("jax_enable_x64", True)  # float64/int64 cases stay 64-bit
jax.distributed.initialize(coordinator_address=sys.argv[4], num_processes=world, process_id=rank)
from jax.sharding import Mesh, NamedSharding
from alpa_comm import ShardingSpec
from alpa_comm.jax import JaxHosts, reshard, reshard_tree
from alpa_comm.runtime.backend import CommunicationError
hosts = JaxHosts(jax.devices())
cases = json.loads(open(sys.argv[5]).read())

def sharding(side, ndim):
    ids = np.array(side["ids"])
    mesh = Mesh(np.vectorize(hosts.device, otypes=[object])(ids), tuple(side["axes"]))
    return NamedSharding(mesh, ShardingSpec.parse(side["spec"]).to_jax(side["axes"]))

def reference(case, seed):
    n = int(np.prod(case["shape"]))
    return ((np.arange(n) * 7 + seed) % 65521).astype(case["dtype"]).reshape(case["shape"])

def mine(side):
    return any(i // devices == rank for i in np.ravel(side["ids"]))

out = []
for c, case in enumerate(cases):
    parts = case.get("tree") or [case]
    if not any(mine(p["src"]) or mine(p["dst"]) for p in parts):
        out.append({"skipped": True})
        continue
    refs = [reference(p, c * 100 + i) for i, p in enumerate(parts)]
    xs = [jax.make_array_from_callback(tuple(p["shape"]), sharding(p["src"], len(p["shape"])),
                                       lambda idx, r=r: r[idx], dtype=r.dtype) for p, r in zip(parts, refs)]
    dsts = [sharding(p["dst"], len(p["shape"])) for p in parts]
    # "notation": the destinations given as (mesh, "S01R") in alpa_comm's notation
    given = [(d.mesh, p["dst"]["spec"]) for d, p in zip(dsts, parts)] if case.get("notation") else dsts
    if case.get("kill") == rank:
        time.sleep(0.5)
        os._exit(3)
    t0 = time.monotonic()
    try:
        extra = {"timeout": case.get("timeout"), "wire_dtype": case.get("wire"), "dtype": case.get("out_dtype")}
        if "tree" in case:
            ys = reshard_tree(xs, given, **extra)
        else:
            ys = [reshard(xs[0], given[0], **extra)]
    except CommunicationError as e:
        out.append({"error": str(e), "seconds": time.monotonic() - t0})
        continue
    if case.get("wire"):  # what the receivers should get: rounded to the wire type, then cast
        from alpa_comm.runtime.executor import numpy_dtype
        refs = [r.astype(numpy_dtype(case["wire"])).astype(numpy_dtype(case.get("out_dtype") or r.dtype.name))
                if np.issubdtype(r.dtype, np.floating) else r for r in refs]
    wrong, shards = [], 0
    for y, r, d in zip(ys, refs, dsts):
        if y.sharding != d or tuple(y.shape) != tuple(r.shape) or np.dtype(y.dtype) != r.dtype:
            wrong.append(f"sharding, shape or dtype ({y.dtype} for {r.dtype})")
        for s in y.addressable_shards:
            shards += 1
            if not np.array_equal(np.asarray(s.data), r[s.index]):
                wrong.append(str(s.device))
    out.append({"wrong": wrong, "shards": shards, "seconds": time.monotonic() - t0})
print("RESULT " + json.dumps(out), flush=True)
killed = {c["kill"] for c in cases if "kill" in c}
if killed:
    # jax.distributed's shutdown barrier would wait for the killed process: leave without
    # it, process 0 (JAX's coordinator, whose exit ends the others) after every survivor
    from jax._src import distributed
    client = distributed.global_state.client
    client.key_value_set(f"tests/done/{rank}", "1")
    if rank == 0:
        for r in set(range(world)) - killed:
            client.blocking_key_value_get(f"tests/done/{r}", 120_000)
    os._exit(0)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, devices: int, cases: list[dict], timeout: float = 240,
        network=None) -> list[list[dict] | None]:
    """Every rank's results (None for a rank that died); the test decides what that means.
    ``network``: an ``EmulatedNetwork`` that is up: rank i runs as emulated host i (in its
    namespace, over its shaped NIC); else all ranks on loopback."""
    from alpa_comm.runtime.emulated import netns

    coordinator = netns.host_ip(0) if network else "127.0.0.1"
    address = f"{coordinator}:{free_port() if not network else 7000 + os.getpid() % 1000}"
    base_env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    os.chmod(f.name, 0o644)
    procs = []
    for r in range(world):
        env = dict(base_env, GLOO_SOCKET_IFNAME=netns.host_ifname(r) if network else "lo")
        if network:
            env["ALPA_COMM_GROUP_ADDR"] = netns.host_ip(r)
        prefix = network.exec_prefix(r) if network else []
        procs.append(subprocess.Popen(prefix + [sys.executable, "-c", WORKER, str(r), str(world), str(devices),
                                                address, f.name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
        if network:
            network.track(procs[-1].pid)
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
            outs.append((json.loads(line[7:]) if line else None, err[-3000:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        os.unlink(f.name)
    return outs
