"""Device-resident data: the executor keeps every buffer in the memory of the array module
it is given (CuPy on GPUs), never staging through host NumPy. Shown without a GPU by a
stand-in: arrays that refuse every NumPy function (as CuPy arrays do), and a module that
makes them (as CuPy does); every kind and a packed tree plan still arrive bit-exact, and
every destination buffer is still device memory."""
from types import SimpleNamespace

import numpy as np
import pytest

from alpa_comm import STRATEGIES, ClusterSpec, plan_resharding
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.runtime.executor import array_module
from alpa_comm.runtime.local import execute_in_threads, execute_tree_in_threads
from alpa_comm.suites import n_to_m, one_to_m

from exactness import expect_exact


class DeviceArray(np.ndarray):
    """An array in 'device memory': slicing, views, reshapes and assignment work (CuPy
    has them); any NumPy function applied to it is a host round trip and fails."""

    def __array_function__(self, func, types, args, kwargs):
        raise AssertionError(f"numpy.{func.__name__} was called on device memory")


def _dev(a):
    return np.asarray(a).view(DeviceArray)


def _host(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


devnp = SimpleNamespace(  # what the executor may use of CuPy
    empty=lambda shape, dtype=np.float64: _dev(np.empty(shape, dtype)),
    zeros=lambda shape, dtype=np.float64: _dev(np.zeros(shape, dtype)),
    asarray=_dev,
    concatenate=lambda pieces: _dev(np.concatenate([_host(p) for p in pieces])),
    ascontiguousarray=lambda a: _dev(np.ascontiguousarray(_host(a))),
)
CLUSTER = ClusterSpec(num_hosts=5, devices_per_host=4)


@pytest.mark.parametrize("case", n_to_m(2)[:4] + one_to_m(1 << 14)[:3], ids=lambda c: f"{c.suite}-{c.name}")
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if carries_data(s)])
def test_every_kind_keeps_data_in_device_memory(case, strategy):
    x = np.random.default_rng(2).standard_normal(case.shape).astype(np.float32)
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER, strategy=strategy, chunks=3)
    out = execute_tree_in_threads(plan, [x], timeout=20, xp=devnp)[0]
    assert all(isinstance(b, DeviceArray) for b in out.values())
    expect_exact(plan, x, {d: _host(b) for d, b in out.items()})


def test_a_packed_tree_keeps_data_in_device_memory():
    from alpa_comm.placement import Resharding

    moves = [Resharding.between(shape, "float32", "2x4@0,1", src, "1x4@2", dst)
             for shape, src, dst in [((64, 32), "S01R", "RS1"), ((32,), "S01", "R"), ((8, 8), "S0R", "RR")] * 4]
    plan = plan_resharding_tree(moves, cluster=CLUSTER, bucket_bytes="auto")
    assert any(t.parts for t in plan.transfers)
    arrays = [np.arange(np.prod(m.shape), dtype=np.float32).reshape(m.shape) * (i + 1) for i, m in enumerate(moves)]
    outs = execute_tree_in_threads(plan, arrays, timeout=20, xp=devnp)
    for leaf, a, out in zip(plan.leaves, arrays, outs):
        assert all(isinstance(b, DeviceArray) for b in out.values())
        full = tuple((0, n) for n in a.shape)
        from alpa_comm.runtime.executor import view
        for d, box in leaf.resharding.dst.device_boxes(leaf.shape).items():
            assert np.array_equal(_host(out[d]), view(a, full, box))


def test_the_module_is_found_from_the_buffers_without_importing_cupy():
    import sys

    assert array_module([{0: np.zeros(2)}], [{}]) is np
    assert "cupy" not in sys.modules
    assert execute_in_threads  # the host path stays NumPy
