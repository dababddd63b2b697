"""The progressive placer hands a transfer's completed leaves to its placing thread while
others are still on their way in, and adopts the last ones on the caller's thread (a
hand-off then only adds a thread's wake-up before the results)."""
from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

from alpa_comm.jax.buffers import ProgressivePlacer


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_only_leaves_completed_before_the_last_writer_go_to_the_placing_thread(data):
    n = data.draw(st.integers(1, 6))
    writers = {t: data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
               for t in range(data.draw(st.integers(1, 5)))}
    order = data.draw(st.permutations(list(writers)))
    placer = ProgressivePlacer(None, [((4,), "float32")] * n, None, [None] * n, None, None, writers)
    handed = []
    placer._pool = SimpleNamespace(submit=lambda fn, batch: handed.append(list(batch)) or SimpleNamespace())
    written = {i for w in writers.values() for i in w}
    for k, t in enumerate(order):
        before = len(handed)
        placer.done(SimpleNamespace(id=t))
        if k == len(order) - 1:
            assert len(handed) == before  # the last completions stay for results()
    last_done = {i for i in written
                 if max(k for k, t in enumerate(order) if i in writers[t]) == len(order) - 1}
    assert sorted(i for b in handed for i in b) == sorted(written - last_done)
    assert placer.left == 0
