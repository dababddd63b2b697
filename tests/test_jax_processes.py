"""``alpa_comm.jax`` in a real multi-process JAX program: one ``jax.distributed`` process
per host (here: local processes, CPU devices, gloo between them), global ``jax.Array``s
on named meshes moved with ``reshard``/``reshard_tree`` and every addressable shard of
the result compared with NumPy, bit for bit."""
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st

import jax_processes

pytest.importorskip("jax")
pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(600)

WORLD, DEVICES = 3, 2
AXES = [("data", "model"), ("x", "y"), ("fsdp", "tp")]


@st.composite
def sides(draw, rank):
    """A mesh over some of the processes (host-major, or transposed) and a spec for it."""
    hosts = sorted(draw(st.sets(st.integers(0, WORLD - 1), min_size=1, max_size=WORLD)))
    ids = [[h * DEVICES + d for d in range(DEVICES)] for h in hosts]
    if draw(st.booleans()):
        ids = [list(r) for r in zip(*ids)]  # devices major: mesh dim 0 spans a host's devices
    dims = [[] for _ in range(rank)]
    for m in draw(st.permutations([0, 1])):
        where = draw(st.integers(-1, rank - 1))
        if where >= 0:
            dims[where].append(m)
    spec = "".join("R" if not d else "S" + "".join(map(str, d)) for d in dims)
    return {"ids": ids, "axes": list(draw(st.sampled_from(AXES))), "spec": spec}


def _parts(side):
    sizes = (len(side["ids"]), len(side["ids"][0]))
    out, spec, i = [], side["spec"], 0
    while i < len(spec):
        if spec[i] == "R":
            out.append(1)
            i += 1
        else:
            j = i + 1
            n = 1
            while j < len(spec) and spec[j].isdigit():
                n *= sizes[int(spec[j])]
                j += 1
            out.append(n)
            i = j
    return out


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    src, dst = draw(sides(rank)), draw(sides(rank))
    shape = []
    for a, b in zip(_parts(src), _parts(dst)):
        lcm = a * b // __import__("math").gcd(a, b)
        shape.append(lcm * draw(st.integers(1, 3)))
    return {"shape": shape, "dtype": draw(st.sampled_from(["float32", "int32", "float64", "int8"])),
            "src": src, "dst": dst, "buffers": draw(st.sampled_from(["host", "device"])), "into": draw(st.booleans())}


def _check(results, cases_):
    for rank, (out, err) in enumerate(results):
        assert out is not None, f"rank {rank} failed:\n{err}"
        for case, r in zip(cases_, out):
            if r.get("skipped"):
                continue
            assert "error" not in r and not r["wrong"], (rank, case, r)


@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate],  # no shrinking: a launch each
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(cases(), min_size=6, max_size=6))
def test_random_meshes_and_partition_specs_are_bit_exact(batch):
    """Random meshes over 1-3 of 3 processes (host-major or device-major, named axes),
    random PartitionSpecs, shapes and dtypes: one multi-process launch per batch."""
    _check(jax_processes.run(WORLD, DEVICES, batch), batch)


@st.composite
def trees(draw):
    """2-6 random leaves (each its own meshes and specs) moved in one ``reshard_tree``,
    with buckets small enough that leaves share them and large leaves span several
    transfers: every leaf is placed as soon as its last writer on a process ends
    (``ProgressivePlacer``). On CPU devices the result aliases the received buffer, so
    bytes written after an early placement would still show; bfloat16 on the wire makes
    placement a cast (a copy), where a leaf placed too early shows as wrong bytes."""
    leaves = [{k: v for k, v in c.items() if k not in ("buffers", "into")}
              for c in draw(st.lists(cases(), min_size=2, max_size=6))]
    wire = draw(st.sampled_from([None, "bfloat16"]))
    return {"tree": leaves, "bucket": draw(st.sampled_from([64, 256, 4096, "auto"])), "wire": wire, "out_dtype": None,
            "into": wire is None and draw(st.booleans())}


GATHERED = [  # every destination shard gathers pieces from two senders: two writers a leaf
    {"tree": [{"shape": [8, 4], "dtype": "float32", "src": {"ids": [[0, 1], [2, 3]], "axes": ["a", "b"], "spec": "S01R"},
               "dst": {"ids": [[4, 5]], "axes": ["a", "b"], "spec": "RR"}},
              {"shape": [64], "dtype": "float32", "src": {"ids": [[0, 2], [1, 3]], "axes": ["a", "b"], "spec": "S01"},
               "dst": {"ids": [[4, 5]], "axes": ["a", "b"], "spec": "S1"}}],
     "bucket": None, "wire": "bfloat16", "out_dtype": None}]
INTO = [{**GATHERED[0], "wire": None, "into": True}]  # the same, received into the previous arrays


@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(trees(), min_size=4, max_size=4))
@example(GATHERED * 2 + INTO * 2)
def test_random_trees_are_bit_exact_whatever_the_buckets(batch):
    _check(jax_processes.run(WORLD, DEVICES, batch), batch)


def test_examples_tree_and_overlapping_meshes():
    """FSDP-like training layout to a tensor-parallel layout, the same layout on the same
    devices, a move within one process, destinations as (mesh, "RS1") (one array and a
    tree), bfloat16 on the wire (received as float32, and kept as bfloat16; an int32 leaf
    travels as it is), a pytree of three arrays in one coalesced plan, and shards handed
    over by DLPack (buffers="device")."""
    train = {"ids": [[0, 1], [2, 3]], "axes": ["fsdp", "tp"], "spec": "S01R"}
    infer = {"ids": [[4, 5]], "axes": ["dp", "tp"], "spec": "RS1"}
    same = {"ids": [[0, 1], [2, 3]], "axes": ["a", "b"], "spec": "S01R"}
    one = {"ids": [[0, 1]], "axes": ["a", "b"], "spec": "S1R"}
    batch = [
        {"shape": [8, 6], "dtype": "float32", "src": train, "dst": infer},
        {"shape": [8, 6], "dtype": "float32", "src": train, "dst": same},
        {"shape": [4, 2], "dtype": "int32", "src": one, "dst": {**one, "spec": "RS1"}},
        {"shape": [8, 6], "dtype": "float32", "src": train, "dst": infer, "notation": True},
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": train, "dst": infer},
                  {"shape": [4], "dtype": "float32", "src": {**train, "spec": "S0"}, "dst": {**infer, "spec": "R"}}],
         "notation": True},
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": train, "dst": infer},
                  {"shape": [8, 2], "dtype": "int32", "src": train, "dst": infer}],
         "wire": "bfloat16", "out_dtype": None},
        {"shape": [8, 6], "dtype": "float32", "src": train, "dst": infer, "wire": "bfloat16",
         "out_dtype": "bfloat16"},
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": train, "dst": infer},
                  {"shape": [4], "dtype": "float32", "src": {**train, "spec": "S0"}, "dst": {**infer, "spec": "R"}},
                  {"shape": [6, 6], "dtype": "int32", "src": {**train, "spec": "RR"}, "dst": {**infer, "spec": "S1R"}}]},
        # shards handed over by DLPack: a tree, bfloat16 on the wire (as uint16 bytes), kept bfloat16
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": train, "dst": infer},
                  {"shape": [6, 6], "dtype": "int32", "src": {**train, "spec": "RR"}, "dst": {**infer, "spec": "S1R"}}],
         "buffers": "device"},
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": train, "dst": infer},
                  {"shape": [8, 2], "dtype": "int32", "src": train, "dst": infer}],
         "wire": "bfloat16", "out_dtype": None, "buffers": "device"},
        {"shape": [8, 6], "dtype": "float32", "src": train, "dst": infer, "wire": "bfloat16",
         "out_dtype": "bfloat16", "buffers": "device"},
    ]
    _check(jax_processes.run(WORLD, DEVICES, batch), batch)


def test_backend_nccl_on_the_nccl_model_is_bit_exact(monkeypatch):
    """``alpa_comm.jax`` with ``backend="nccl"`` as a user runs it: three ``jax.distributed``
    processes of one device each, device buffers handed over by DLPack, the real
    ``NcclSubgroupBackend`` and the concurrent executor, with the NCCL model served from
    this process (``nccl_model_remote``) standing in for CuPy and NCCL in every process:
    every kind, layout changes, 2 -> 1 and 1 -> 2 processes, overlapping meshes, a tree with
    bfloat16 on the wire; every shard bit-exact."""
    from alpa_comm.testing.nccl_model_remote import serve

    two = {"ids": [[0], [1]], "axes": ["fsdp", "tp"], "spec": "S0R"}
    three = {"ids": [[0], [1], [2]], "axes": ["x", "y"], "spec": "S0R"}
    one = {"ids": [[2]], "axes": ["dp", "tp"], "spec": "RR"}
    pair = {"ids": [[1], [2]], "axes": ["dp", "tp"], "spec": "RR"}
    batch = [{"shape": [12, 6], "dtype": "float32", "src": two, "dst": one, "strategy": s, "backend": "nccl"}
             for s in ("broadcast", "send_recv", "rotated_chains", "double_tree")]
    batch += [
        {"shape": [12, 6], "dtype": "float32", "src": {**one, "spec": "RS1"}, "dst": pair, "backend": "nccl"},
        {"shape": [12, 6], "dtype": "int32", "src": three, "dst": {**three, "spec": "RS0"}, "backend": "nccl"},
        {"shape": [12, 6], "dtype": "float32", "src": three, "dst": {**three, "spec": "RR"},
         "strategy": "rotated_chains", "backend": "nccl"},
        {"tree": [{"shape": [16, 4], "dtype": "float32", "src": two, "dst": pair},
                  {"shape": [6, 6], "dtype": "int32", "src": {**two, "spec": "RR"}, "dst": {**pair, "spec": "S0R"}},
                  {"shape": [4], "dtype": "float32", "src": {**two, "spec": "S0"}, "dst": {**pair, "spec": "R"}}],
         "wire": "bfloat16", "out_dtype": None, "backend": "nccl"},
    ]
    with serve() as server:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        results = jax_processes.run(3, 1, batch)
        moved = server.model.operations  # NCCL operations the model ran for the processes
    _check(results, batch)
    assert sum(r["shards"] for out, _ in results for r in out if not r.get("skipped")) >= 15
    print(f"{moved} NCCL operations on the model")
    assert moved >= len(batch)


@pytest.mark.parametrize("hosts,dead,atomic", [((0, 1, 2), 2, False), ((1, 2), 1, True)])
def test_a_process_killed_mid_transfer_is_named_within_60_s(hosts, dead, atomic):
    """The group is up (one resharding done); then one process exits instead of taking
    part in the next: every surviving process of the resharding gets a CommunicationError
    naming it within 60 s (group timeout 10 s), also when the dead one hosted the
    subgroup's store (the lowest member, host 1 of hosts 1 and 2); the previous arrays it
    was receiving into in place (``out=``) are deleted, not left half-written; received
    into with ``atomic=True``, they keep their previous values and stay usable. Not tested:
    killing process 0, which runs JAX's coordination service: JAX then ends every process."""
    ids = [[2 * h, 2 * h + 1] for h in hosts]
    src = {"ids": ids, "axes": ["x", "y"], "spec": "S0R"}
    dst = {"ids": ids, "axes": ["x", "y"], "spec": "RS0"}
    case = {"shape": [6, 6], "dtype": "float32", "src": src, "dst": dst, "timeout": 10}
    results = jax_processes.run(WORLD, DEVICES, [case, {**case, "kill": dead, "into": True, "atomic": atomic}],
                                timeout=120)
    assert results[dead][0] is None  # the killed rank printed nothing
    for rank in set(hosts) - {dead}:
        out, err = results[rank]
        assert out is not None, err
        assert not out[0].get("error") and not out[0]["wrong"], out[0]
        r = out[1]
        assert "error" in r and f"host {dead}" in r["error"] and r["seconds"] < 60, r
        if atomic:
            assert r["deleted"] is False and set(r["states"]) == {"old"} and r["updated"] == [], r
        else:
            assert r["deleted"] is True, r


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sender_killed_mid_sync_leaves_each_out_leaf_old_or_new_as_reported(seed):
    """A tree received into previous arrays (``out=``, ``atomic=True``) while its sender
    exits at a seeded moment of the call (before its first byte, part of the way, or
    after): the receiver gets an answer within 60 s, every leaf holds either all its new
    values or all its previous ones, the arrays stay usable, and ``PartialUpdateError``
    names exactly the leaves that hold the new values. The destination shards each gather two source
    shards' halves (two writers a leaf), in small buckets (many transfers)."""
    import random

    rng = random.Random(seed)
    leaf = {"shape": [256, 256], "dtype": "float32", "src": {"ids": [[2, 3]], "axes": ["x", "y"], "spec": "S1R"},
            "dst": {"ids": [[4, 5]], "axes": ["x", "y"], "spec": "RS1"}}
    warm = {**leaf, "shape": [8, 8]}
    case = {"tree": [leaf] * 96, "bucket": 64 << 10, "into": True, "atomic": True, "timeout": 10,
            "kill_after": {"rank": 1, "seconds": rng.uniform(0.0, 0.15)}}
    results = jax_processes.run(WORLD, DEVICES, [warm, case], timeout=150)
    out, err = results[2]
    assert out is not None, err
    assert not out[0].get("error") and not out[0]["wrong"], out[0]
    r = out[1]
    if "error" not in r:  # the sender was done before it exited
        assert not r["wrong"], r
        return
    assert "host 1" in r["error"] and r["seconds"] < 60, r
    assert r["deleted"] is False and "mixed" not in r["states"], r
    paths = [f"/{i}" for i in range(96)]
    assert r["updated"] == [p for p, s in zip(paths, r["states"]) if s == "new"], r
    assert r["unchanged"] == [p for p, s in zip(paths, r["states"]) if s == "old"], r


def test_the_weight_sync_processes_bench_verifies_every_method(tmp_path):
    """``alpa-comm bench --suite weight-sync --mode processes`` on loopback (its regime is the
    emulated cluster; here only that it runs, verifies every shard and writes its files)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "bench", "--suite", "weight-sync", "--mode",
                           "processes", "--cluster", "local", "--size-mb", "1", "--repeat", "1", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    from alpa_comm_bench.shapes import SYNC_LAYOUTS
    from alpa_comm_bench.sync_processes import METHODS
    assert {(r["case"], r["method"]) for r in rows} == {(c, m) for c in SYNC_LAYOUTS for m in METHODS}
    assert all(r["verified"] and r["lower_bound_seconds"] > 0 for r in rows)
    half = {r["case"]: r["nbytes"] for r in rows if r["method"] == "planned_bf16"}
    assert all(2 * half[r["case"]] == r["nbytes"] for r in rows if r["method"] == "planned")
    assert "progress" not in done.stderr and "planned done" in done.stderr  # rank 0's progress, passed on
    assert (tmp_path / "weight_sync_processes.png").exists()


def test_the_data_plane_bench_verifies_every_method_and_lists_jax_refusals(tmp_path):
    """``alpa-comm bench --mode processes --suite data-plane`` on loopback at a small size:
    every case of both suites, all five methods (ours over tcp and over gloo, JAX's, both
    transports' raw rates), every shard verified; JAX's own
    device_put probed on every layout-change case (each process's outcome recorded)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "bench", "--mode", "processes", "--suite",
                           "data-plane", "--cluster", "local", "--size-mb", "0.25", "--repeat", "1", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["results"]
    assert {r["method"] for r in rows} == {"alpa_comm", "alpa_comm_gloo", "jax_device_put", "raw", "raw_gloo"}
    assert {r["suite"] for r in rows} == {"same-layout-processes", "layout-change-processes"}
    assert all(r["verified"] for r in rows if not r["method"].startswith("raw"))
    assert len({r["case"] for r in rows}) == 9
    refusals = data["cluster"]["jax_refusals"]
    assert len(refusals) == 4 and all(len(r["processes"]) == 3 for r in refusals)
    assert all(p["outcome"] for r in refusals for p in r["processes"])
    assert "JAX's own device_put" in done.stdout and "a cached call within 5 ms" in done.stdout
    assert (tmp_path / "same_layout_processes.png").exists() and (tmp_path / "layout_change_processes.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["--suite", "n-to-m"], "not --suite n-to-m"),
    (["--suite", "weight-sync", "--streams", "2"], "--streams does nothing with --suite weight-sync"),
    (["--suite", "weight-sync", "--cluster", "ray://h:1"], "emulated or local"),
    (["--suite", "weight-sync", "--hosts", "3"], "--hosts does nothing with --mode processes"),
])
def test_the_processes_bench_refuses_what_it_cannot_do(argv, message):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "bench", "--mode", "processes", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


FIRST_CALL = r'''
import json, sys, time
from alpa_comm.jax.launch import worker_init
rank, world, _ = worker_init()
import numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from alpa_comm.jax import reshard
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
src = NamedSharding(Mesh(np.array(devices[:2]), ("x",)), P("x"))
dst = NamedSharding(Mesh(np.array(devices[2:4]), ("x",)), P("x"))
x = jax.make_array_from_callback((256,), src, lambda idx: np.arange(256, dtype=np.float32)[idx], dtype=np.float32)
t0 = time.monotonic()
y = reshard(x, dst)
seconds = time.monotonic() - t0
ok = all(np.array_equal(np.asarray(s.data), np.arange(256, dtype=np.float32)[s.index]) for s in y.addressable_shards)
print("RESULT " + json.dumps({"ok": ok, "torch": "torch" in sys.modules, "seconds": seconds}), flush=True)
'''


def test_the_first_call_over_tcp_meets_through_jaxs_own_store_without_torch():
    """The default transport's subgroup meets through JAX's key-value store: the first
    call imports nothing of torch (its import alone takes 1-2.5 s here)."""
    import json
    import sys

    from alpa_comm.jax.launch import launch

    outs = launch(2, 2, [sys.executable, "-c", FIRST_CALL], timeout=120)
    got = [json.loads(o.lines("RESULT ")[0]) for o in outs if o.lines("RESULT ")]
    assert len(got) == 2, [o.stderr[-2000:] for o in outs]
    assert all(g["ok"] for g in got) and not any(g["torch"] for g in got), got


WITHOUT_TORCH = '''
import sys
sys.modules["torch"] = None  # as if torch were not installed
from alpa_comm.errors import MissingExtraError
from alpa_comm.jax import ProcessGroup
try:
    ProcessGroup(0, 1, address="127.0.0.1:1", backend="gloo")
except MissingExtraError as e:
    print(e.name, "|", e)
'''


def test_a_gloo_group_without_torch_names_the_extra_in_one_line():
    """``backend="gloo"`` meets through torch's store: without torch the group says which
    extra installs it, and nothing else is printed (the background import stays quiet)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.strip().partition(" | ")
    assert name == "torch" and "install the extra 'runtime'" in message, done.stdout
    assert done.stderr == "", done.stderr


def test_a_tree_received_leaf_by_leaf_keeps_its_staging_within_half_the_budget():
    """``atomic=True`` with a small ``max_inflight_bytes``: the tree runs as groups of leaves
    in turn (``resharding.staging``), so the staging alive at once on the receiver stays
    within half the budget (each leaf here 256 KiB on the receiver, the budget 2 MiB), and
    every shard is exact. In one plan the order keeps many leaves open at once."""
    leaf = {"shape": [256, 256], "dtype": "float32", "src": {"ids": [[2, 3]], "axes": ["x", "y"], "spec": "S1R"},
            "dst": {"ids": [[4, 5]], "axes": ["x", "y"], "spec": "RS1"}}
    case = {"tree": [leaf] * 48, "bucket": 64 << 10, "into": True, "atomic": True, "budget": 2 << 20}
    results = jax_processes.run(WORLD, DEVICES, [case, case], timeout=150)
    out, err = results[2]
    assert out is not None, err
    for r in out:
        assert not r.get("error") and not r["wrong"], r
        assert 0 < r["staging_peak"] <= 1 << 20, r
