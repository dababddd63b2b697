"""The concurrent executor: transfers overlap, within the count and the buffer budget it
is given, deadlock-free at any limit on random plans, bit-exact, and a failure surfaces
at once naming the host; the buffers it recycles are reused only once nothing else
holds them."""
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import STRATEGIES, ClusterSpec, DeviceMesh, plan_resharding
from alpa_comm.errors import InvalidOptionError
from alpa_comm.placement import Resharding
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.runtime.backend import CommunicationError, ThreadBackend
from alpa_comm.runtime.executor import HostExecutor, destination_buffers, slab_regions
from alpa_comm.runtime.host_memory import HOST_ALIGNMENT, BufferPool, aligned_empty
from alpa_comm.runtime.local import execute_in_threads, execute_tree_in_threads, tree_layouts

from exactness import expect_exact
from strategies_hyp import resharding_cases
from test_tree import CLUSTER as TREE_CLUSTER, small_leaves, transformer

DATA_STRATEGIES = [s for s in STRATEGIES if carries_data(s)]


class SlowWire(ThreadBackend):
    """A ThreadBackend whose messages take tens of milliseconds to arrive, so transfers that
    run at once overlap visibly; counts the messages in flight."""

    DELAY_S = 0.02  # well above a busy machine's scheduling delay: the overlap is unmistakable
    lock = threading.Lock()
    pending = peak = 0

    def isend(self, buf, peer, tag):
        cls = type(self)
        with cls.lock:
            cls.pending += 1
            cls.peak = max(cls.peak, cls.pending)
        handle = super().isend(buf, peer, tag)
        inner = handle._wait
        arrives = time.monotonic() + self.DELAY_S

        def wait(timeout):
            time.sleep(max(0.0, arrives - time.monotonic()))
            inner(timeout)
            with cls.lock:
                cls.pending -= 1
        handle._wait = wait
        return handle


def peak_overlap(timings) -> int:
    events = sorted([(t.start, 1) for t in timings] + [(t.end, -1) for t in timings], key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_transfers_overlap_up_to_the_limits_and_one_means_plan_order():
    cluster = ClusterSpec(num_hosts=2, devices_per_host=4)
    plan = plan_resharding((64, 32), "float32", "1x4@0", "S1R", "1x4@1", "RS1", cluster=cluster,
                           strategy="send_recv", bucket_bytes=None)  # every piece its own message
    assert len(plan.host_operations[0]) > 4
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    # every transfer here leaves host 0 through its one NIC: the per-NIC window bounds them too
    for limit, window, expect in ((1, 32, 1), (3, 32, 3), (32, 32, None), (32, 2, 2), (32, 1, 1)):
        seen = {}
        out = execute_in_threads(plan, x, timeout=10, max_concurrent=limit, max_per_resource=window,
                                 backend_class=SlowWire, on_timings=lambda h, ts: seen.setdefault(h, ts))
        expect_exact(plan, x, out)
        peak = peak_overlap(seen[0])
        assert peak == expect if expect else peak > 3, (limit, window, peak)


def test_the_buffer_budget_bounds_the_buckets_in_flight():
    plan = plan_resharding_tree(transformer(2), cluster=TREE_CLUSTER, bucket_bytes=4096)
    packed = [t for t in plan.transfers if t.parts]
    assert len(packed) > 4
    budget = 2 * max(t.nbytes for t in packed)
    seen = {}
    arrays = [np.random.default_rng(i).standard_normal(leaf.shape).astype(np.float32)
              for i, leaf in enumerate(plan.leaves)]
    out = execute_tree_in_threads(plan, arrays, timeout=10, backend_class=SlowWire, max_inflight_bytes=budget,
                                  max_per_resource=64, on_timings=lambda h, ts: seen.setdefault(h, ts))
    for leaf, a, got in zip(tree_layouts(plan), arrays, out):
        for d, box in leaf.dst_boxes.items():
            assert np.array_equal(got[d], a[tuple(slice(lo, hi) for lo, hi in box)])
    size = {t.id: t.nbytes for t in packed}
    for h, timings in seen.items():
        for t in timings:  # at every transfer's start, what else holds a bucket is within the budget
            held = sum(size.get(o.transfer, 0) for o in timings if o.start <= t.start < o.end)
            assert held <= budget + size.get(t.transfer, 0), (h, t.transfer, held, budget)


def test_the_buffer_budget_bounds_strided_receives_in_flight():
    """A column block of a row-major destination shard cannot be received in place: it
    lands in scratch memory first, which counts against the budget like a packed bucket
    (else a receiver of a column-split layout held all of them at once)."""
    cluster = ClusterSpec(num_hosts=2, devices_per_host=4)
    plan = plan_resharding((64, 32), "float32", "1x4@0", "RS1", "1x4@1", "S1R", cluster=cluster,
                           strategy="send_recv", bucket_bytes=None)  # every block its own message, strided there
    size = {t.id: t.nbytes for t in plan.transfers}
    budget = 2 * max(size.values())
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    seen = {}
    out = execute_in_threads(plan, x, timeout=10, backend_class=SlowWire, max_inflight_bytes=budget,
                             max_per_resource=64, on_timings=lambda h, ts: seen.setdefault(h, ts))
    expect_exact(plan, x, out)
    timings = seen[1]
    assert peak_overlap(timings) > 1  # the receives do overlap, up to the budget
    for t in timings:
        held = sum(size[o.transfer] for o in timings if o.start <= t.start < o.end)
        assert held <= budget + size[t.transfer], (t.transfer, held, budget)


@settings(max_examples=40, deadline=None)
@given(resharding_cases(), st.sampled_from(DATA_STRATEGIES), st.integers(1, 4), st.sampled_from([1, 64, 1 << 20]),
       st.integers(1, 3))
def test_random_plans_are_bit_exact_at_any_limit(case, strategy, limit, budget, window):
    """Deadlock freedom comes from admission in plan order, not from a large limit: any
    count and any budget (even below one transfer's buffer) completes, bit-exact."""
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec,
                           cluster=ClusterSpec(num_hosts=hosts, devices_per_host=dph), strategy=strategy,
                           loadbalance="greedy")
    x = (np.arange(np.prod(shape)) % 251).astype(np.float32).reshape(shape)
    expect_exact(plan, x, execute_in_threads(plan, x, timeout=20, max_concurrent=limit, max_inflight_bytes=budget,
                                             max_per_resource=window))


def test_a_failure_surfaces_at_once_naming_the_host():
    cluster = ClusterSpec(num_hosts=3, devices_per_host=2)
    plan = plan_resharding((64, 8), "float32", "1x2@0", "S1R", "2x2@1,2", "RR", cluster=cluster)
    t0 = time.monotonic()
    with pytest.raises(CommunicationError, match="host 0"):
        execute_in_threads(plan, np.zeros((64, 8), np.float32), timeout=3, kill_host=0)
    assert time.monotonic() - t0 < 10


def test_a_failure_while_packing_ends_the_transfer_instead_of_hanging(monkeypatch):
    """A bucket whose packing fails on the packing thread (here: reading a part raises)
    ends its chunked send with that error at once; nothing waits for bytes that will not
    be packed."""
    plan = plan_resharding_tree(small_leaves(), cluster=TREE_CLUSTER, bucket_bytes=8 << 20)
    assert any(t.parts and t.chunks > 1 for t in plan.transfers)
    original = HostExecutor.slice_bytes

    def broken(self, device, index, leaf=None):
        if threading.current_thread().name.startswith("alpa-comm-pack"):
            raise RuntimeError("cannot read a part")
        return original(self, device, index, leaf)
    monkeypatch.setattr(HostExecutor, "slice_bytes", broken)
    arrays = [np.zeros(leaf.shape, leaf.dtype) for leaf in plan.leaves]
    t0 = time.monotonic()
    with pytest.raises(Exception, match="cannot read a part"):
        execute_tree_in_threads(plan, arrays, timeout=20)
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_bad_limits_are_refused_by_name(bad):
    from alpa_comm.runtime.executor import ExecutorOptions

    for limit in ("max_concurrent", "max_inflight_bytes", "max_per_resource"):
        with pytest.raises(InvalidOptionError, match=limit):
            HostExecutor(0, [], [], [], None, lambda d: 0, options=ExecutorOptions(**{limit: bad}))


def test_a_bucket_lands_in_place_in_a_destination_slab():
    """Destination buffers cut from one slab in the order the buckets carry them: every
    bucket of a same-layout tree (leaves of many sizes, packed largest first) is received
    where its parts belong (nothing to unpack)."""
    cluster = ClusterSpec(num_hosts=2, devices_per_host=2)
    moves = [Resharding.between((256 + 64 * i,), "float32", DeviceMesh.parse("1x2@0", 2), "S1",
                                DeviceMesh.parse("1x2@1", 2), "S1") for i in range(20)]
    plan = plan_resharding_tree(moves, cluster=cluster, bucket_bytes=1 << 14)
    layouts = tree_layouts(plan)
    host_of = cluster.host_of
    regions = slab_regions(layouts, lambda d: host_of(d) == 1, plan.transfers)
    dst, in_place = destination_buffers(layouts, regions, lambda n: aligned_empty((n,), np.uint8))
    ex = HostExecutor(1, layouts, [{} for _ in layouts], dst, ThreadBackend(1, _Hub()), host_of)
    buckets = [t for t in plan.transfers if t.parts and all(host_of(r) == 1 for p in t.parts for r in p.receivers)]
    assert buckets
    found = {t.id: ex.bucket_target(t) for t in buckets}
    assert all(v is not None for v in found.values())
    # worked out once from the slab's arithmetic: the same views the search finds
    assert set(in_place) == set(found)
    for tid, v in in_place.items():
        assert v.__array_interface__["data"] == found[tid].__array_interface__["data"] and v.nbytes == found[tid].nbytes
    arrays = [np.arange(leaf.shape[0], dtype=np.float32) + i for i, leaf in enumerate(plan.leaves)]
    out = execute_tree_in_threads(plan, arrays, timeout=10)
    for a, got in zip(arrays, out):
        assert np.array_equal(np.concatenate([got[2], got[3]]), a)
    for leaf in dst:
        for buf in leaf.values():
            assert buf.__array_interface__["data"][0] % HOST_ALIGNMENT == 0


class _Hub:
    world = 2


def test_the_pool_reuses_only_what_nothing_holds():
    pool = BufferPool(1 << 20)
    a = pool.empty((100,), np.float32)
    pa = a.__array_interface__["data"][0]
    b = pool.empty((100,), np.float32)
    assert b.__array_interface__["data"][0] != pa  # a is still held
    view = a[10:20]
    del a
    c = pool.empty((100,), np.float32)
    assert c.__array_interface__["data"][0] != pa  # a view of it is still held
    del view, c
    d = pool.empty((25, 4), np.float32)  # the same bytes, another shape
    assert d.__array_interface__["data"][0] == pa and pool.reused == 1
    assert d.__array_interface__["data"][0] % HOST_ALIGNMENT == 0
    del b, d
    pool.max_free_bytes = 500
    pool.trim()
    assert pool.free_bytes() <= 500
    with pytest.raises(ValueError, match="max_free_bytes"):
        BufferPool(-1)


def test_the_pool_lets_the_buffers_handed_out_longest_ago_go_first():
    """A larger tree after a smaller one, each call's results held until the next call has
    begun: the larger tree's spare buffer stays and is received into again; the smaller
    tree's, handed out before, go (letting the largest go first kept those instead, and
    every other call of the larger tree took fresh pages)."""
    pool = BufferPool(1000)
    smalls = [pool.empty((300,), np.uint8) for _ in range(2)]
    del smalls
    first = pool.empty((600,), np.uint8)
    pool.trim()
    second = pool.empty((600,), np.uint8)  # the first call's results still held
    del first
    pool.trim()
    assert pool.free_bytes() <= 1000
    before = pool.reused
    third = pool.empty((600,), np.uint8)  # the second's still held: the first call's buffer again
    assert pool.reused == before + 1
    del second, third


def test_jax_adopts_the_aligned_buffers_without_a_copy():
    jax = pytest.importorskip("jax")
    buf = aligned_empty((1024,), np.float32)
    buf[:] = 3
    y = jax.device_put(buf, jax.devices()[0])
    assert y.unsafe_buffer_pointer() == buf.__array_interface__["data"][0]


class FourStreams(SlowWire):
    """SlowWire as a backend of four streams a pair (as the TCP and gloo ones can be)."""

    streams = 4
    pending = peak = 0


def test_each_stream_gets_a_window_and_a_striped_transfer_takes_all_of_them():
    """By default a NIC keeps two transfers in flight per stream of the backend; one whose
    messages are striped over every stream counts as that many."""
    from alpa_comm.runtime.backend import STRIPE_MIN_BYTES

    cluster = ClusterSpec(num_hosts=2, devices_per_host=4)
    for shape, expect in (((64, 32), 8), ((4096, 4096), 2)):  # pieces of 512 B / 4 MiB, one chunk each
        plan = plan_resharding(shape, "float32", "1x4@0", "S1R", "1x4@1", "RS1", cluster=cluster,
                               strategy="send_recv", bucket_bytes=None)
        big = plan.transfers[0].nbytes >= STRIPE_MIN_BYTES
        assert big == (expect == 2) and len(plan.host_operations[0]) > 8
        x = (np.arange(np.prod(shape)) % 251).astype(np.float32).reshape(shape)
        seen = {}
        out = execute_in_threads(plan, x, timeout=20, backend_class=FourStreams,
                                 on_timings=lambda h, ts: seen.setdefault(h, ts))
        expect_exact(plan, x, out)
        assert peak_overlap(seen[0]) <= expect, (shape, peak_overlap(seen[0]))
        assert peak_overlap(seen[0]) >= 2


def test_every_backend_declares_its_capabilities_and_names_a_transport():
    """The transport interface: every backend (threads, TCP, gloo, NCCL, the NCCL model's
    ungrouped stand-in) is a concrete ``Backend`` whose abilities are declared attributes
    and whose name is a ``Transport``, equal to the string users write."""
    import inspect

    from alpa_comm.runtime.backend import (Backend, GlooBackend, GlooSubgroupBackend, NcclBackend,
                                           NcclSubgroupBackend, Transport)
    from alpa_comm.runtime.tcp import TcpBackend
    from alpa_comm.testing.ungrouped_nccl import ungrouped

    classes = [ThreadBackend, TcpBackend, GlooBackend, GlooSubgroupBackend, NcclBackend, NcclSubgroupBackend,
               ungrouped(NcclSubgroupBackend)]
    for cls in classes:
        assert issubclass(cls, Backend) and not inspect.isabstract(cls), cls
        assert isinstance(cls.name, Transport), cls
        for ability in ("concurrent", "issue_ordered", "vectored", "rendezvous", "fresh_after_failure"):
            assert isinstance(getattr(cls, ability), bool), (cls, ability)
        assert cls.streams == 1 or isinstance(cls.streams, int)
    assert inspect.isabstract(Backend)
    assert TcpBackend.name == "tcp" and Transport("gloo") is Transport.GLOO and f"{Transport.NCCL}" == "nccl"
    assert TcpBackend.rendezvous and TcpBackend.vectored and NcclBackend.issue_ordered and not NcclBackend.concurrent


def test_options_as_one_object():
    """``HostExecutor`` takes its options as one ``ExecutorOptions`` (by name; none: every
    default), and nothing else: no option arguments beside it, no other object."""
    from alpa_comm.errors import InvalidTypeError
    from alpa_comm.runtime.executor import ExecutorOptions

    backend = ThreadBackend(0, _Hub())
    given = ExecutorOptions(7.0, 1e9, tag_base=3, max_concurrent=4)
    assert given == ExecutorOptions(timeout=7.0, min_rate=1e9, tag_base=3, max_concurrent=4)
    ex = HostExecutor(0, [], [], [], backend, lambda d: 0, options=given)
    assert ex.options is given and ex.timeout == 7.0 and ex.max_concurrent == 4
    default = HostExecutor(0, [], [], [], backend, lambda d: 0)
    assert default.options == ExecutorOptions() and default.max_inflight_bytes == ExecutorOptions().max_inflight_bytes
    with pytest.raises(TypeError):
        HostExecutor(0, [], [], [], backend, lambda d: 0, 7.0)
    with pytest.raises(TypeError):
        HostExecutor(0, [], [], [], backend, lambda d: 0, max_concurrent=4)
    with pytest.raises(InvalidTypeError, match="max_concurrent"):
        HostExecutor(0, [], [], [], backend, lambda d: 0, options={"max_concurrent": 4})


def test_the_dispatcher_and_the_packer_never_wait_on_a_timer(monkeypatch):
    """Every wait of the dispatcher and of packing ahead is on a condition that the awaited
    event notifies (a transfer ended, a failure, a run of parts packed), never a poll."""
    from types import SimpleNamespace

    from alpa_comm.runtime import dispatch, packing

    timeouts = []

    class Recording(threading.Condition):
        def wait(self, timeout=None):
            timeouts.append(timeout)
            return super().wait(timeout)

    for module in (dispatch, packing):
        monkeypatch.setattr(module, "threading", SimpleNamespace(Condition=Recording))
    plan = plan_resharding_tree(small_leaves(), cluster=TREE_CLUSTER, bucket_bytes=8 << 20)
    arrays = [np.random.default_rng(i).random(leaf.shape).astype(leaf.dtype) for i, leaf in enumerate(plan.leaves)]
    out = execute_tree_in_threads(plan, arrays, timeout=20, backend_class=SlowWire, max_concurrent=2)
    assert timeouts and all(t is None for t in timeouts), timeouts
    assert out[0] and all(len(leaf) for leaf in out)


def test_shutdown_now_cancels_what_has_not_started():
    """Python 3.8's ``shutdown(cancel_futures=True)``: the futures not yet started are
    cancelled, the running one ends on its own."""
    from concurrent.futures import ThreadPoolExecutor

    from alpa_comm.runtime.pools import shutdown_now

    pool, started, release = ThreadPoolExecutor(max_workers=1), threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or release.wait(10))
    assert started.wait(10)
    queued = [pool.submit(time.sleep, 0) for _ in range(3)]
    shutdown_now(pool, [running, *queued])
    assert all(f.cancelled() for f in queued) and not running.cancelled()
    release.set()
    assert running.result(timeout=10) is True


# ------------------------------------------------ hand-made plans on hosts as threads
def _host_of(d: int) -> int:
    return d // 2  # devices 0, 1 on host 0; 2, 3 on host 1


def _quarters_layout():
    """16 float32 elements, a quarter a source device; device 0 receives the third
    quarter, devices 2 and 3 the first and second."""
    from alpa_comm.runtime.layouts import Layout

    src = {d: ((4 * d, 4 * d + 4),) for d in range(4)}
    dst = {0: ((8, 12),), 2: ((0, 4),), 3: ((4, 8),)}
    return Layout(np.dtype(np.float32), src, dst, dst)


def _send(tid, sender, receiver, lo, deps=(), kind="send_recv"):
    from alpa_comm.resharding.plan import Transfer

    return Transfer(tid, tid, kind, sender, (receiver,), ((lo, lo + 4),), 16, 1, 0.0, 0.0, deps)


def _run_hand_made(transfers, within_s=10.0, after=None, **options):
    """Run ``transfers`` (every host's, in plan order) with hosts 0 and 1 as threads; the
    hosts' errors by host, and their destination buffers. A host still running after
    ``within_s`` fails the test (it hung) instead of hanging it. ``after(host, executor)``
    runs on the host's thread once its run ended (its kept pools are that thread's)."""
    from alpa_comm.runtime.backend import ThreadHub
    from alpa_comm.runtime.executor import ExecutorOptions

    host_of = _host_of
    lay = _quarters_layout()
    x = np.arange(16, dtype=np.float32)
    hub, errors = ThreadHub(2), {}
    dst = lay.empty_destinations(lambda d: True, zeros=True)

    def work(h):
        mine = lambda d: host_of(d) == h  # noqa: E731
        src = lay.source_shards(x, mine)
        ex = HostExecutor(h, lay, src, {d: b for d, b in dst.items() if mine(d)}, ThreadBackend(h, hub),
                          host_of, options=ExecutorOptions(**options))
        try:
            ex.run(transfers)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[h] = e
            hub.dead.add(h)
        if after is not None:
            after(h, ex)

    threads = [threading.Thread(target=work, args=(h,), daemon=True) for h in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(within_s)
    hung = [h for h, t in zip((0, 1), threads) if t.is_alive()]
    assert not hung, f"hosts {hung} still running after {within_s} s"
    return errors, dst, x


def test_a_full_window_collects_what_a_threaded_transfer_waits_for():
    """Host 0 receives ``d`` (posted, not yet collected), then sends ``a``, which reads
    what ``d`` delivered (``deps``), so ``a`` runs on a transfer thread waiting for ``d``
    to end; then ``b`` needs room in the NIC window ``a`` holds. Waiting for ``a`` there
    would wait for ``d``, which only the dispatching thread can collect: it collects
    ``d`` first, and everything ends, bit-exact."""
    d, a, b = _send(0, 2, 0, 8), _send(1, 0, 2, 0, deps=(0,)), _send(2, 1, 3, 4)
    errors, dst, x = _run_hand_made([d, a, b], timeout=2.0, max_per_resource=1)
    assert not errors, errors
    assert np.array_equal(dst[0], x[8:12]) and np.array_equal(dst[2], x[0:4]) and np.array_equal(dst[3], x[4:8])


def test_unknown_kinds_on_the_dispatching_thread_fail_naming_the_host():
    """Two transfers of a kind no kind has the name of: admission asks nothing of the
    kind, and the run fails the documented way (``CommunicationError`` naming the host
    and the kind)."""
    errors, _, _ = _run_hand_made([_send(0, 0, 2, 0, kind="teleport"), _send(1, 1, 3, 4, kind="teleport")],
                                  timeout=2.0)
    assert set(errors) == {0, 1}
    for h, e in errors.items():
        assert isinstance(e, CommunicationError) and f"host {h}: unknown transfer kind 'teleport'" in str(e), e


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_on_the_dispatching_thread_wakes_the_transfer_threads(monkeypatch, error):
    """Host 0 receives ``d`` (posted, uncollected), runs ``a`` (which reads what ``d``
    delivers) on a transfer thread, then fails admitting ``x`` on its dispatching thread.
    The failure is the run's: it is raised, ``a``'s thread stops waiting for ``d`` and
    ends, and the next run on that thread gets fresh transfer threads."""
    from alpa_comm.runtime import dispatch
    from alpa_comm.runtime.pools import transfer_threads

    original = HostExecutor.buffer_bytes
    used = {}

    def breaks_at_x(self, t, packs):
        if self.host == 0 and t.id == 2:
            raise error("cannot size x")
        return original(self, t, packs)

    def recorded(limit):
        used[threading.current_thread().name] = pool = transfer_threads(limit)
        return pool

    monkeypatch.setattr(HostExecutor, "buffer_bytes", breaks_at_x)
    monkeypatch.setattr(dispatch, "transfer_threads", recorded)
    checks = {}

    def after(h, ex):
        if h == 0:
            old = used[threading.current_thread().name]
            checks["fresh"] = transfer_threads(2) is not old
            ending = threading.Thread(target=old.shutdown, daemon=True)  # waits for its threads
            ending.start()
            ending.join(5)
            checks["ended"] = not ending.is_alive()

    d, a, x = _send(0, 2, 0, 8), _send(1, 0, 2, 0, deps=(0,)), _send(2, 1, 3, 4)
    errors, _, _ = _run_hand_made([d, a, x], after=after, timeout=2.0, max_concurrent=2)
    assert isinstance(errors.get(0), error) and "cannot size x" in str(errors[0]), errors
    assert checks == {"fresh": True, "ended": True}


def test_the_executors_read_and_write_primitives_take_the_leaf_always():
    """A default leaf would read leaf 0 for a caller that forgot it; kinds go through
    their ``TransferContext``, whose default is the transfer's own leaf."""
    import inspect

    from alpa_comm.runtime.context import TransferContext

    for name in ("slice_bytes", "read_destination", "write", "flat_target"):
        leaf = inspect.signature(getattr(HostExecutor, name)).parameters["leaf"]
        assert leaf.default is inspect.Parameter.empty, name
    layout = _quarters_layout()
    ex = HostExecutor(0, [layout, layout], [{0: np.zeros(4, np.float32)}, {0: np.arange(4, dtype=np.float32)}],
                      [{}, {}], ThreadBackend(0, _Hub()), _host_of)
    ctx = TransferContext(ex, _send(0, 0, 2, 0)._replace(leaf=1), None, 0, 1.0)
    assert np.array_equal(ctx.slice_bytes(0, ((0, 4),)).view(np.float32), np.arange(4))


def test_a_transfer_a_host_only_receives_holds_its_receive_window_without_waiting():
    """A chained broadcast's last host only receives: it waits for no window
    (``resource_keys`` is empty) but takes its room on its receiving NIC (``held_keys``),
    so a later transfer it forwards waits behind it; a host that sends or forwards holds
    nothing extra."""
    from alpa_comm.runtime.executor import ExecutorOptions
    from alpa_comm.resharding.resources import nic_receive, nic_send

    class Stub:
        rendezvous, streams, vectored = False, 1, False

    cluster = ClusterSpec(num_hosts=3, devices_per_host=1)
    plan = plan_resharding((1 << 22,), "float32", "1x1@0", "R", "2x1@1-2", "R", cluster=cluster,
                           strategy="broadcast")
    host_of = cluster.host_of
    seen_held = 0
    for h in range(3):
        ex = HostExecutor(h, [None], [{}], [{}], Stub(), host_of, options=ExecutorOptions(latency_s=20e-6))
        for t in plan.transfers:
            hosts = {host_of(t.sender)} | {host_of(r) for r in t.receivers}
            if h not in hosts:
                continue
            waits, held = ex.resource_keys(t), ex.held_keys(t)
            if waits:
                assert nic_send(h) in waits and held == ()
            else:
                assert held == (nic_receive(h),) and host_of(t.sender) != h
                seen_held += 1
    assert seen_held, "no host only received"
