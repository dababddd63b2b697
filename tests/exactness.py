"""Bit-exact checks of plans run by the thread executor: every destination device's
buffer equals its box of the NumPy reference."""
import numpy as np

from alpa_comm.runtime.executor import view
from alpa_comm.runtime.local import execute_in_threads, execute_tree_in_threads, tree_layouts


def expect_exact(plan, x, out):
    """``out`` (device -> buffer) holds each destination device's box of ``x``."""
    full = tuple((0, n) for n in x.shape)
    for d, box in tree_layouts(plan)[0].dst_boxes.items():
        assert np.array_equal(out[d], view(x, full, box)), f"device {d} got wrong data ({plan.strategy})"


def run_exact(plan, x, timeout: float = 20):
    """Run a one-array plan on ``x`` in threads and check every destination device."""
    out = execute_in_threads(plan, x, timeout=timeout)
    expect_exact(plan, x, out)
    return out


def run_tree(plan, seed: int = 0, **options):
    """Run a tree plan on random leaves in threads and check every leaf on every device
    (``options``: ``execute_tree_in_threads``'s, e.g. another ``backend_class``)."""
    rng = np.random.default_rng(seed)
    arrays = [(rng.integers(0, 100, leaf.shape)).astype(leaf.dtype) for leaf in plan.leaves]
    out = execute_tree_in_threads(plan, arrays, timeout=20, **options)
    for leaf, lay, a, got in zip(plan.leaves, tree_layouts(plan), arrays, out):
        full = tuple((0, n) for n in a.shape)
        for d, box in lay.dst_boxes.items():
            assert np.array_equal(got[d], view(a, full, box)), f"{leaf.path} device {d}"
