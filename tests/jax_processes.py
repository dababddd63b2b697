"""Run a multi-process JAX program here: N local processes, each ``jax.distributed``
process ``i`` of N with ``devices`` CPU devices, running ``WORKER`` on JSON cases. Each
process prints one JSON result line; ``run`` returns them by rank.

A case: ``{"shape", "dtype", "src": {"ids", "axes", "spec"}, "dst": {...}}`` with device
ids in alpa_comm's numbering (process * devices + position); optional ``"tree"`` (a
list of cases moved by one ``reshard_tree``) and ``"kill"`` (a rank that exits at the
start of the transfer)."""
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
    if case.get("kill") == rank:
        time.sleep(0.5)
        os._exit(3)
    t0 = time.monotonic()
    try:
        if "tree" in case:
            ys = reshard_tree(xs, dsts, timeout=case.get("timeout"))
        else:
            ys = [reshard(xs[0], dsts[0], timeout=case.get("timeout"))]
    except CommunicationError as e:
        out.append({"error": str(e), "seconds": time.monotonic() - t0})
        continue
    wrong, shards = [], 0
    for y, r, d in zip(ys, refs, dsts):
        if y.sharding != d or tuple(y.shape) != tuple(r.shape):
            wrong.append("sharding or shape")
        for s in y.addressable_shards:
            shards += 1
            if not np.array_equal(np.asarray(s.data), r[s.index]):
                wrong.append(str(s.device))
    out.append({"wrong": wrong, "shards": shards, "seconds": time.monotonic() - t0})
print("RESULT " + json.dumps(out), flush=True)
if any("kill" in c for c in cases):
    # jax.distributed's shutdown barrier would wait for the killed process: leave without
    # it, process 0 (JAX's coordinator, whose exit ends the others) last
    time.sleep(3 if rank == 0 else 0)
    os._exit(0)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, devices: int, cases: list[dict], timeout: float = 240) -> list[list[dict] | None]:
    """Every rank's results (None for a rank that died); the test decides what that means."""
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "GLOO_SOCKET_IFNAME": "lo"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(world), str(devices), address, f.name],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in range(world)]
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
