"""Run a multi-process JAX program here: N local processes, each ``jax.distributed``
process ``i`` of N with ``devices`` CPU devices, running ``WORKER`` on JSON cases. Each
process prints one JSON result line; ``run`` returns them by rank.

A case: ``{"shape", "dtype", "src": {"ids", "axes", "spec"}, "dst": {...}}`` with device
ids in alpa_comm's numbering (process * devices + position); optional ``"tree"`` (a
list of cases moved by one ``reshard_tree``), ``"kill"`` (a rank that exits instead of
taking part), ``"kill_after": {"rank", "seconds"}`` (a rank that exits that long after
its call began, mid-transfer or not), ``"wire"``/``"out_dtype"`` (``wire_dtype``/``dtype`` of the call),
``"bucket"`` (a tree's ``bucket_bytes``), ``"strategy"`` (the transfer kind),
``"buffers": "device"`` (a group that hands shards over by DLPack), ``"into": true``
(received into previous arrays of the destination sharding, ``out=``: the results must be
those very objects; with ``"atomic": true`` leaf by leaf, ``atomic=True``), ``"backend": "nccl"``
(device buffers over ``NcclSubgroupBackend``: the test serves the NCCL model,
``alpa_comm.testing.nccl_model_remote``, and every process is its client)."""
from __future__ import annotations

import json
import os
import sys
import tempfile

WORKER = r'''
import json, os, sys, time
import numpy as np
from alpa_comm.jax.launch import worker_init
from alpa_comm.testing.nccl_model_remote import connect_from_env
nccl_model = connect_from_env()  # a test serves the NCCL model: its CuPy stands in (backend "nccl")
rank, world, devices = worker_init(x64=True)  # float64/int64 cases stay 64-bit
import jax
from jax.sharding import Mesh, NamedSharding
from alpa_comm import ShardingSpec
from alpa_comm.jax import JaxHosts, reshard, reshard_tree
from alpa_comm.runtime.backend import CommunicationError
hosts = JaxHosts(jax.devices())
cases = json.loads(open(sys.argv[1]).read())

def sharding(side, ndim):
    ids = np.array(side["ids"])
    mesh = Mesh(np.vectorize(hosts.device, otypes=[object])(ids), tuple(side["axes"]))
    return NamedSharding(mesh, ShardingSpec.parse(side["spec"]).to_jax(side["axes"]))

def reference(case, seed):
    n = int(np.prod(case["shape"]))
    return ((np.arange(n) * 7 + seed) % 65521).astype(case["dtype"]).reshape(case["shape"])

STAGING = {"now": 0, "peak": 0}


def _track_staging():
    """Count the staging bytes alive on this process (``into.Staging``: made on a leaf's
    first transfer, let go at its commit), to check the bound of groups run in turn."""
    import threading

    from alpa_comm.jax import into
    if getattr(into.Staging, "_tracked", False):
        return
    lock, get, release, counted = threading.Lock(), into.Staging.__getitem__, into.Staging.release, set()

    def getitem(self, device):
        buf = get(self, device)
        with lock:
            bufs = self._bufs
            if bufs is not None and id(bufs) not in counted:
                counted.add(id(bufs))
                STAGING["now"] += sum(b.nbytes for b in bufs.values())
                STAGING["peak"] = max(STAGING["peak"], STAGING["now"])
        return buf

    def let_go(self):
        with lock:
            bufs = self._bufs
            if bufs is not None and id(bufs) in counted:
                counted.discard(id(bufs))
                STAGING["now"] -= sum(b.nbytes for b in bufs.values())
        release(self)

    into.Staging.__getitem__, into.Staging.release, into.Staging._tracked = getitem, let_go, True


def mine(side):
    return any(i // devices == rank for i in np.ravel(side["ids"]))

out, groups = [], {}
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
    if case.get("kill_after", {}).get("rank") == rank:
        import threading
        threading.Timer(case["kill_after"]["seconds"], os._exit, (3,)).start()
    t0 = time.monotonic()
    olds = None
    try:
        extra = {"timeout": case.get("timeout"), "wire_dtype": case.get("wire"), "dtype": case.get("out_dtype")}
        if "bucket" in case:
            extra["bucket_bytes"] = case["bucket"]
        if "budget" in case:
            extra["max_inflight_bytes"] = case["budget"]
        if "strategy" in case:
            extra["strategy"] = case["strategy"]
        if case.get("backend") == "nccl":  # device buffers over NcclSubgroupBackend, on the served model
            if "nccl" not in groups:
                from alpa_comm.jax import ProcessGroup
                groups["nccl"] = ProcessGroup.from_jax(backend="nccl", name="nccl")
            extra["group"] = groups["nccl"]
        elif case.get("buffers") == "device":  # shards handed over by DLPack, not read as NumPy
            if "device" not in groups:
                from alpa_comm.jax import ProcessGroup
                groups["device"] = ProcessGroup.from_jax(buffers="device")
            extra["group"] = groups["device"]
        if case.get("into"):  # the previous weights: another value, same sharding; received into
            olds = [jax.make_array_from_callback(tuple(p["shape"]), d, lambda idx, r=r: (r[idx] + 1).astype(r.dtype),
                                                 dtype=r.dtype) for p, d, r in zip(parts, dsts, refs)]
            extra["out"] = olds if "tree" in case else olds[0]
            if case.get("atomic"):
                extra["atomic"] = True
                _track_staging()
        if "tree" in case:
            ys = reshard_tree(xs, given, **extra)
        else:
            ys = [reshard(xs[0], given[0], **extra)]
        if olds is not None and any(y is not o for y, o in zip(ys, olds)):
            raise AssertionError("out= returned other arrays than it was given")
    except CommunicationError as e:
        rec = {"error": str(e), "seconds": time.monotonic() - t0,
               "deleted": None if olds is None else all(o.is_deleted() for o in olds)}
        if olds is not None and not any(o.is_deleted() for o in olds):
            def state(y, r):  # every shard new, every shard old, or a mix
                shards = y.addressable_shards
                got = [np.array_equal(np.asarray(s.data), r[s.index]) for s in shards]
                was = [np.array_equal(np.asarray(s.data), (r[s.index] + 1).astype(r.dtype)) for s in shards]
                return "new" if all(got) else "old" if all(was) else "mixed"
            rec["states"] = [state(y, r) for y, r in zip(olds, refs)]
            rec["updated"], rec["unchanged"] = getattr(e, "updated", None), getattr(e, "unchanged", None)
        out.append(rec)
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
    out.append({"wrong": wrong, "shards": shards, "seconds": time.monotonic() - t0,
                "staging_peak": STAGING["peak"]})
print("RESULT " + json.dumps(out), flush=True)
killed = {c["kill"] for c in cases if "kill" in c} | {c["kill_after"]["rank"] for c in cases if "kill_after" in c}
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


def run(world: int, devices: int, cases: list[dict], timeout: float = 240,
        network=None) -> list[tuple[list[dict] | None, str]]:
    """Every rank's (results or None for a rank that died, the end of its stderr); the test
    decides what that means. ``network``: an ``EmulatedNetwork`` that is up: rank i runs
    as emulated host i (in its namespace, over its shaped NIC); else all on loopback."""
    from alpa_comm.jax.launch import launch

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    os.chmod(f.name, 0o644)
    try:
        outs = launch(world, devices, [sys.executable, "-c", WORKER, f.name], network=network, timeout=timeout)
    finally:
        os.unlink(f.name)
    return [(json.loads(o.lines("RESULT ")[0]) if o.lines("RESULT ") else None, o.stderr[-3000:]) for o in outs]
