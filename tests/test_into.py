"""``reshard_tree(..., out=old)``: the results are received into the previous arrays'
memory and returned as those very objects; an ``out`` that cannot take them in place is
refused by name before anything moves. One JAX process of 4 CPU devices (a subprocess:
the device count is set before JAX starts)."""
import subprocess
import sys

import pytest

pytest.importorskip("jax")

SCRIPT = r'''
import os
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_num_cpu_devices", 4)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from alpa_comm.errors import InvalidOptionError
from alpa_comm.jax import ProcessGroup, reshard, reshard_tree
from alpa_comm.runtime.worker import free_port

group = ProcessGroup(0, 1, address=f"127.0.0.1:{free_port('127.0.0.1')}")
d = jax.devices()
src = NamedSharding(Mesh(np.array(d[:2]), ("a",)), P("a"))
dst = NamedSharding(Mesh(np.array(d[2:]), ("b",)), P(None, "b"))
rep = NamedSharding(Mesh(np.array(d[2:]), ("b",)), P())
w = {"x": np.arange(64, dtype=np.float32).reshape(8, 8), "y": np.arange(16, dtype=np.float32).reshape(4, 4) * 3,
     "z": np.arange(8, dtype=np.int32)}
xs = {k: jax.device_put(v, src) for k, v in w.items()}
shardings = {"x": dst, "y": dst, "z": rep}

def old(k, sharding=None, dtype=None):
    v = w[k]
    return jax.device_put(np.full(v.shape, -1, dtype or v.dtype), sharding or shardings[k])

for step in range(6):  # the same previous arrays, received into again and again (a weight sync)
    atomic = step >= 3  # in place, then leaf by leaf through staging memory
    olds = {k: old(k) for k in w} if step in (0, 3) else got
    fresh = group.pool.fresh
    got = reshard_tree(xs, shardings if step % 3 else None, out=olds, group=group, max_inflight_bytes=256,
                       atomic=atomic)
    assert all(got[k] is olds[k] for k in w), "other arrays returned"
    for k in w:
        assert np.array_equal(np.asarray(got[k]), w[k]), (k, np.asarray(got[k]))
        assert all(np.array_equal(np.asarray(s.data), w[k][s.index]) for s in got[k].addressable_shards)
    if not atomic:
        assert group.pool.fresh == fresh, "a destination slab was made"
    elif step > 3:
        assert group.pool.fresh == fresh, "the staging memory was not recycled"
    xs = {k: jax.device_put(v + step + 1, src) for k, v in w.items()}
    w = {k: v + step + 1 for k, v in w.items()}
one = reshard(xs["x"], None, out=old("x"), group=group)
assert np.array_equal(np.asarray(one), w["x"])
print("EXACT")

def refused(tree=None, **kw):
    try:
        reshard_tree(tree or xs, kw.pop("dst", shardings), group=group, **kw)
    except InvalidOptionError as e:
        print("REFUSED", e)
    else:
        print("ACCEPTED", kw)

gone = old("y")
gone.delete()
refused(out={**{k: old(k) for k in w}, "x": old("y")})
refused(out={**{k: old(k) for k in w}, "x": old("x", dtype=np.int32)})
refused(out={**{k: old(k) for k in w}, "x": old("x", sharding=rep)})
refused(out={**{k: old(k) for k in w}, "y": gone})
same = old("x")
refused({"a": xs["x"], "b": xs["x"]}, out={"a": same, "b": same}, dst={"a": dst, "b": dst})
refused({"x": same}, out={"x": same}, dst={"x": dst})  # the array being sent is no place to receive
refused(out={k: old(k) for k in w}, wire_dtype="bfloat16")
refused(out={"x": old("x")})
refused(out={k: old(k) for k in w}, max_inflight_bytes=0)
refused(atomic=True)
refused(out={k: old(k) for k in w}, atomic="yes")
'''


def test_received_into_the_previous_arrays_and_refused_by_name():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert "EXACT" in lines
    refusals = [ln for ln in lines if ln.startswith(("REFUSED", "ACCEPTED"))]
    assert not [ln for ln in refusals if ln.startswith("ACCEPTED")], refusals
    expected = ["out leaf /x is float32[4, 4]; the result is float32[8, 8]",
                "out leaf /x is int32[8, 8]; the result is float32[8, 8]",
                "out leaf /x has sharding",
                "out leaf /y is deleted",
                "out leaf /b and out leaf /a share memory",
                "the source leaf /x and out leaf /x share memory",
                "out leaf /x: it travels as bfloat16 and the result is float32",
                "out's leaves ['/x'] do not match",
                "max_inflight_bytes must be a positive integer, got 0",
                "atomic=True is about receiving into out=",
                "atomic must be True or False, got 'yes'"]
    assert len(refusals) == len(expected), refusals
    for got, want in zip(refusals, expected):
        assert want in got, (got, want)
