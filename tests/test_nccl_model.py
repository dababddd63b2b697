"""The GPU path proven without a GPU: the NCCL model's rules, today's deadlock caught, and
the real NCCL backend bit-exact on it for every transfer kind, trees and the all-reduce."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from torch.distributed import HashStore

from alpa_comm import STRATEGIES, ClusterSpec, DeviceMesh, plan_resharding
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.placement import Resharding
from alpa_comm.suites import n_to_m, one_to_m
from alpa_comm.testing import nccl_model as M

from exactness import expect_exact
from nccl_ranks import run_plan_on_model
from ranks import rank_errors
from strategies_hyp import resharding_cases

DATA_STRATEGIES = [s for s in STRATEGIES if carries_data(s)]
CLUSTER = ClusterSpec(num_hosts=5, devices_per_host=4)


def _on_model(n, body, **model):
    """(errors by rank, the model) of ``body(rank, comm, stream, cupy, nccl)`` on the
    model: ``n`` ranks of one communicator, each a thread with a stream of its own."""
    with M.install(**model) as m:
        import cupy
        from cupy.cuda import nccl

        uid = nccl.get_unique_id()

        def rank(r):
            body(r, nccl.NcclCommunicator(n, uid, r), cupy.cuda.Stream(non_blocking=True), cupy, nccl)
        return rank_errors(n, rank), m


# ------------------------------------------------------------------ the model's rules
def test_a_ring_of_ungrouped_sends_deadlocks_and_is_named():
    """Rule 2: every rank sends, then receives, on one stream: each send waits for a
    receive queued behind its peer's send."""
    def rank(r, comm, s, cupy, nccl):
        out, into = cupy.ones(4, np.float32), cupy.zeros(4, np.float32)
        comm.send(out.data.ptr, 4, nccl.NCCL_FLOAT32, (r + 1) % 3, s.ptr)
        comm.recv(into.data.ptr, 4, nccl.NCCL_FLOAT32, (r - 1) % 3, s.ptr)
        s.synchronize()
    errors, model = _on_model(3, rank)
    assert all(isinstance(e, M.NcclDeadlock) for e in errors), errors
    report = str(errors[0])
    for r in range(3):
        assert f"rank {r} of communicator c0" in report
    assert "send of 16 B" in report and "queued behind" in report and "test_nccl_model.py" in report
    assert model.operations == 0


def test_the_same_ring_in_one_group_completes():
    """Rule 3: a send and a receive in one group progress together."""
    got = {}

    def rank(r, comm, s, cupy, nccl):
        out, into = cupy.full(4, r, np.float32), cupy.zeros(4, np.float32)
        nccl.groupStart()
        comm.send(out.data.ptr, 4, nccl.NCCL_FLOAT32, (r + 1) % 3, s.ptr)
        comm.recv(into.data.ptr, 4, nccl.NCCL_FLOAT32, (r - 1) % 3, s.ptr)
        nccl.groupEnd()
        s.synchronize()
        got[r] = into.get()
    assert _on_model(3, rank)[0] == [None] * 3
    for r in range(3):
        assert np.array_equal(got[r], np.full(4, (r - 1) % 3, np.float32))


def test_the_backend_and_the_model_agree_on_the_group_limit():
    from alpa_comm.runtime.backend import NcclBackend

    assert NcclBackend.MAX_GROUP_OPS == M.MAX_GROUP_OPS == 2048


@pytest.mark.parametrize("limit", [M.MAX_GROUP_OPS, None])
def test_a_group_holds_at_most_2048_operations(limit):
    """Rule 3's limit (NCCL 2.9-2.11 API docs): 2,049 sends in one group fail on the model;
    ``max_group_ops=None`` lifts it."""
    def rank(r, comm, s, cupy, nccl):
        bufs = cupy.zeros(2049, np.uint8)
        nccl.groupStart()
        for i in range(2049):
            fn = comm.send if r == 0 else comm.recv
            fn(bufs[i:i + 1].data.ptr, 1, nccl.NCCL_UINT8, 1 - r, s.ptr)
        nccl.groupEnd()
        s.synchronize()
    errors = _on_model(2, rank, max_group_ops=limit)[0]
    if limit is None:
        assert errors == [None, None]
    else:
        assert all(isinstance(e, M.NcclMismatch) and "2049 operations" in str(e) for e in errors), errors


def test_point_to_point_matches_in_issue_order_and_checks_sizes():
    """Rule 2: the first send meets the first receive, whatever the program meant."""
    def rank(r, comm, s, cupy, nccl):
        a, b = cupy.zeros(8, np.uint8), cupy.zeros(16, np.uint8)
        nccl.groupStart()
        if r == 0:
            comm.send(a.data.ptr, 8, nccl.NCCL_UINT8, 1, s.ptr)
            comm.send(b.data.ptr, 16, nccl.NCCL_UINT8, 1, s.ptr)
        else:  # receives posted in the other order
            comm.recv(b.data.ptr, 16, nccl.NCCL_UINT8, 0, s.ptr)
            comm.recv(a.data.ptr, 8, nccl.NCCL_UINT8, 0, s.ptr)
        nccl.groupEnd()
        s.synchronize()
    errors, _ = _on_model(2, rank)
    assert any(isinstance(e, M.NcclMismatch) and "8 B sent, 16 B expected" in str(e) for e in errors), errors


def test_collectives_must_match_acrossrank_errors():
    """Rule 4: the k-th collective of every rank is the same call."""
    def rank(r, comm, s, cupy, nccl):
        x = cupy.ones(4 + 4 * r, np.float32)
        comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
        s.synchronize()
    errors, _ = _on_model(2, rank)
    assert any(isinstance(e, M.NcclMismatch) and "differs between ranks" in str(e) for e in errors), errors


def test_all_reduce_sums_overrank_errors():
    got = {}

    def rank(r, comm, s, cupy, nccl):
        x = cupy.arange(5, dtype=np.float32) * (r + 1)
        comm.allReduce(x.data.ptr, x.data.ptr, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
        s.synchronize()
        got[r] = x.get()
    assert _on_model(3, rank)[0] == [None] * 3
    assert all(np.array_equal(got[r], np.arange(5, dtype=np.float32) * 6) for r in range(3))


@pytest.mark.parametrize("concurrent", [False, True])
def test_two_streams_promise_no_concurrency(concurrent):
    """Rule 6: a send on one stream and a receive on another of the same device only
    progress together if the GPU co-schedules them, which NCCL does not promise."""
    def rank(r, comm, s1, cupy, nccl):
        s2 = cupy.cuda.Stream()
        out, into = cupy.ones(4, np.uint8), cupy.zeros(4, np.uint8)
        comm.send(out.data.ptr, 4, nccl.NCCL_UINT8, 1 - r, s1.ptr)
        comm.recv(into.data.ptr, 4, nccl.NCCL_UINT8, 1 - r, s2.ptr)
        s1.synchronize()
        s2.synchronize()
    errors, _ = _on_model(2, rank, concurrent_streams=concurrent)
    if concurrent:
        assert errors == [None, None]
    else:
        assert all(isinstance(e, M.NcclDeadlock) for e in errors), errors


def test_a_rank_that_never_joins_is_reported_not_hung():
    """Rule 5: creating a communicator waits for every rank."""
    with M.install(stall_s=0.05):
        from cupy.cuda import nccl

        uid = nccl.get_unique_id()
        errors = rank_errors(2, lambda r: nccl.NcclCommunicator(3, uid, r))
    assert all(isinstance(e, M.NcclDeadlock) and "creating communicator" in str(e) for e in errors), errors


# ----------------------------------------------------------- today's backend, caught
def ungrouped_backend():
    """The NCCL backend as it was (``alpa_comm.testing.ungrouped_nccl``), among some hosts."""
    from alpa_comm.runtime.backend import NcclSubgroupBackend
    from alpa_comm.testing.ungrouped_nccl import ungrouped

    return ungrouped(NcclSubgroupBackend)


def test_the_ungrouped_backend_deadlocks_on_the_ring_all_reduce():
    with M.install():
        Ungrouped = ungrouped_backend()
        store = HashStore()
        import cupy

        def rank(r):
            b = Ungrouped(r, [0, 1, 2], store, 0, 20)
            b.allreduce_sum(cupy.ones(12, np.float32), [0, 1, 2], 0, timeout=20)
        errors = rank_errors(3, rank)
    assert all(isinstance(e, M.NcclDeadlock) for e in errors), errors
    assert "exchange" in str(errors[0]) and "ring_allreduce_sum" in str(errors[0])


def test_the_ungrouped_backend_deadlocks_on_a_replicated_reshard():
    """The first replicated reshard with a ring (rotated chains' all-gather)."""
    plan = plan_resharding((64, 64), "float32", "1x4@0", "RS1", "3x4@1-3", "RR",
                           cluster=CLUSTER, strategy="rotated_chains")
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    with M.install():
        with pytest.raises(M.NcclDeadlock, match="ring_allgather"):
            run_plan_on_model(plan, [x], backend=ungrouped_backend(), timeout=20)


def _forwards_before_last_receive(model, middle_rank):
    """Whether the middle host of a chain finished forwarding chunk 1 before its last
    chunk had arrived (a pipelined chain), from the model's completion log."""
    log = [(k, seq) for k, _, rank, _, seq in model.completed if rank == middle_rank]
    first_send = log.index(("send", 0))
    last_recv = max(i for i, (k, _) in enumerate(log) if k == "recv")
    return first_send < last_recv


@pytest.mark.parametrize("grouped", [True, False])
def test_a_chain_stays_pipelined(grouped):
    """A chain's middle host forwards chunk c while it takes chunk c+1; the ungrouped
    backend made it store-and-forward (its receives were all queued ahead)."""
    plan = plan_resharding((256, 64), "float32", "1x1@0", "RR", "2x1@1,2", "RR", cluster=ClusterSpec(3, 1),
                           strategy="broadcast", chunks=8)
    assert plan.transfers[0].chunks == 8
    x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    with M.install() as model:
        out = run_plan_on_model(plan, [x], backend=None if grouped else ungrouped_backend())[0]
        expect_exact(plan, x, out)
        middle = plan.cluster.host_of(plan.transfers[0].receivers[0])  # NCCL rank = host (hosts 0-2)
        assert _forwards_before_last_receive(model, middle) is grouped


# ------------------------------------------- the concurrent executor on NCCL
def launch_recording_backend(groups: dict):
    """The NCCL backend, recording each launched group's (kind, peer) list per host."""
    from alpa_comm.runtime.backend import NcclSubgroupBackend

    class Recording(NcclSubgroupBackend):
        def _launch_through(self, awaited):
            with self._lock:
                launched = awaited[3] is not None
                if not launched:
                    cut = next(i for i, op in enumerate(self._pending) if op is awaited)
                    ops = [(op[0], op[2]) for i, op in enumerate(self._pending) if op[0] == "send" or i <= cut]
                super()._launch_through(awaited)
                if not launched:
                    groups.setdefault(self.rank, []).append(ops)
    return Recording


def test_the_executor_keeps_several_transfers_in_one_nccl_group():
    """One host sends a different slice to each of four hosts: on NCCL the concurrent
    executor posts the transfers and launches their sends together (a group progresses as
    one), where one transfer at a time would launch four groups of one send."""
    plan = plan_resharding((512, 64), "float32", "1x1@0", "RR", "4x1@1,2,3,4", "S0R", cluster=ClusterSpec(5, 1),
                           strategy="send_recv")
    assert len(plan.transfers) == 4
    x = np.arange(512 * 64, dtype=np.float32).reshape(512, 64)
    groups: dict = {}
    with M.install():
        expect_exact(plan, x, run_plan_on_model(plan, [x], backend=launch_recording_backend(groups))[0])
    sends = [op for g in groups[0] for op in g]
    assert sends == [("send", h) for h in (1, 2, 3, 4)], groups[0]  # the plan's order
    assert len(groups[0]) < 4 and max(map(len, groups[0])) >= 2, groups[0]  # (NIC windows may split them)
    assert all(groups[h] == [[("recv", 0)]] for h in range(1, 5)), groups


def test_the_executor_keeps_nccl_groups_within_their_limit():
    """One host sends eight slices of 300 chunks each (2,400 sends, past a group's 2,048):
    the executor ends its groups between whole transfers, every group within the limit the
    model enforces, and every byte arrives."""
    n, chunks = 8, 300
    plan = plan_resharding((n * chunks, 1), "float32", "1x1@0", "RR", f"{n}x1@" + ",".join(map(str, range(1, n + 1))),
                           "S0R", cluster=ClusterSpec(n + 1, 1), strategy="broadcast", chunks=chunks,
                           bucket_bytes=None)
    assert sum(t.chunks for t in plan.transfers) > M.MAX_GROUP_OPS
    x = np.arange(n * chunks, dtype=np.float32).reshape(n * chunks, 1)
    groups: dict = {}
    with M.install():
        expect_exact(plan, x, run_plan_on_model(plan, [x], backend=launch_recording_backend(groups))[0])
    assert sum(map(len, groups[0])) == n * chunks
    assert max(map(len, groups[0])) <= M.MAX_GROUP_OPS and len(groups[0]) > 1, [len(g) for g in groups[0]]


def test_a_failure_on_nccl_surfaces_instead_of_hanging():
    """A receive fails on host 1 while a transfer that reads what it delivers (Alpa's
    follow-up all-gather, ``deps``) waits its turn: the error comes out, no thread hangs."""
    from alpa_comm.runtime.backend import CommunicationError, Handle, NcclSubgroupBackend

    plan = plan_resharding((64, 8), "float32", "1x2@0", "RR", "2x2@1,2", "S0R", cluster=ClusterSpec(3, 2),
                           strategy="alpa")
    assert any(t.deps for t in plan.transfers)

    class FailingOnHost1(NcclSubgroupBackend):
        def irecv(self, buf, peer, tag):
            handle = super().irecv(buf, peer, tag)
            if self.rank != 1:
                return handle

            def wait(timeout):
                raise CommunicationError(f"host 1: injected failure receiving from host {peer}")
            return Handle(wait, handle.what)
    x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    with M.install(), pytest.raises(CommunicationError) as caught:
        run_plan_on_model(plan, [x], backend=FailingOnHost1, timeout=5)
    assert "did not finish in time" not in str(caught.value), caught.value


def test_on_nccl_the_executor_issues_each_pair_in_plan_order():
    """Two transfers between the same two hosts (same byte count, so a swap would match
    and deliver the wrong slice silently): the concurrent executor on NCCL must issue
    them in one order at both ends."""
    plan = plan_resharding((256, 64), "float32", "1x2@0", "S0R", "1x2@1", "S1R", cluster=ClusterSpec(2, 2),
                           strategy="send_recv", bucket_bytes=None)  # four messages, not one coalesced
    pair = [t for t in plan.transfers if plan.cluster.host_of(t.sender) == 0]
    assert len(pair) >= 2 and len({t.nbytes for t in pair}) == 1
    x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    for _ in range(3):
        with M.install():
            expect_exact(plan, x, run_plan_on_model(plan, [x])[0])


# ----------------------------------------------------- the fixed backend, bit-exact
@pytest.mark.parametrize("case", n_to_m(2) + one_to_m(1 << 16), ids=lambda c: f"{c.suite}-{c.name}")
@pytest.mark.parametrize("strategy", DATA_STRATEGIES)
def test_every_kind_on_the_suites_is_bit_exact_on_the_model(case, strategy):
    x = np.random.default_rng(1).standard_normal(case.shape).astype(np.float32)
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER, strategy=strategy)
    with M.install():
        expect_exact(plan, x, run_plan_on_model(plan, [x])[0])


@settings(max_examples=25, deadline=None)
@given(resharding_cases(overlap=True), st.sampled_from(DATA_STRATEGIES), st.sampled_from([None, 1, 3]))
def test_random_plans_are_bit_exact_on_the_model(case, strategy, chunks):
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=dph)
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec, cluster=cluster, strategy=strategy,
                           chunks=chunks, loadbalance="greedy")
    x = (np.arange(np.prod(shape)) % 251).astype(np.float32).reshape(shape)
    with M.install():
        expect_exact(plan, x, run_plan_on_model(plan, [x])[0])


@settings(max_examples=25, deadline=None)
@given(resharding_cases(overlap=True), st.sampled_from(DATA_STRATEGIES), st.integers(1, 6),
       st.sampled_from([1, 4096, 1 << 20]), st.integers(1, 3), st.sampled_from([None, 2, 7]))
def test_random_plans_on_the_model_at_any_executor_limit(case, strategy, limit, budget, window, chunks):
    """The concurrent executor on NCCL: any number of transfers in flight, any buffer
    budget and NIC window, chunked or not: bit-exact, never a deadlock or a swapped match."""
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec,
                           cluster=ClusterSpec(num_hosts=hosts, devices_per_host=dph), strategy=strategy,
                           chunks=chunks, loadbalance="greedy", bucket_bytes=None)
    x = (np.arange(np.prod(shape)) % 251).astype(np.float32).reshape(shape)
    with M.install():
        expect_exact(plan, x, run_plan_on_model(plan, [x], max_concurrent=limit, max_inflight_bytes=budget,
                                                max_per_resource=window)[0])


@pytest.mark.parametrize("strategy", ["broadcast", "double_tree", "send_recv", "auto"])
def test_a_coalesced_tree_is_bit_exact_on_the_model(strategy):
    cluster = ClusterSpec(num_hosts=4, devices_per_host=2)
    shapes = [(64, 32), (8,), (128, 16), (4, 5), (256,)]
    tree = {f"w{i}": Resharding.between(s, "float32", "2x2@0,1", "S0" + "R" * (len(s) - 1), "2x2@2,3", "R" * len(s))
            for i, s in enumerate(shapes)}
    plan = plan_resharding_tree(tree, cluster=cluster, strategy=strategy, bucket_bytes=1 << 14)
    assert any(t.parts for t in plan.transfers)
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 100, leaf.shape).astype(np.float32) for leaf in plan.leaves]
    with M.install():
        out = run_plan_on_model(plan, arrays)
    from alpa_comm.runtime.executor import view
    from alpa_comm.runtime.local import tree_layouts

    for lay, a, got in zip(tree_layouts(plan), arrays, out):
        full = tuple((0, n) for n in a.shape)
        for d, box in lay.dst_boxes.items():
            assert np.array_equal(got[d], view(a, full, box))


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 5), st.integers(1, 300), st.sampled_from([np.float32, np.float64, np.int32]))
def test_the_ring_all_reduce_is_exact_on_the_model(n, size, dtype):
    from alpa_comm.runtime.backend import NcclSubgroupBackend

    rng = np.random.default_rng(size)
    parts = [rng.integers(-50, 50, size).astype(dtype) for _ in range(n)]
    got = {}
    with M.install():
        import cupy

        store = HashStore()

        def rank(r):
            b = NcclSubgroupBackend(r, list(range(n)), store, 0, 20)
            x = cupy.asarray(parts[r].copy())
            b.allreduce_sum(x, list(range(n)), 0, timeout=20)
            b.barrier(20)
            got[r] = np.asarray(x).view(np.ndarray).copy()
        assert rank_errors(n, rank) == [None] * n
    want = sum(parts)
    assert all(np.array_equal(got[r], want) for r in range(n))


def test_a_wait_past_its_timeout_names_the_peer():
    """A peer that never sends: the wait aborts the communicator and names the host."""
    from alpa_comm.runtime.backend import CommunicationError, NcclSubgroupBackend

    with M.install(stall_s=60):
        import cupy

        store = HashStore()
        errors = {}

        def rank(r):
            b = NcclSubgroupBackend(r, [0, 1], store, 0, 5)
            if r == 1:
                try:
                    b.irecv(cupy.zeros(4, np.uint8), 0, 0).wait(0.3)
                except CommunicationError as e:
                    errors[r] = e
        rank_errors(2, rank)
    assert "host 1: receiving from host 0 timed out" in str(errors[1])


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 4), st.lists(st.integers(1, 40), min_size=1, max_size=5), st.sampled_from([8, 64, 1 << 20]))
def test_the_data_parallel_all_reduce_is_the_mean_on_the_model(n, sizes, bucket):
    """``allreduce_mean`` (the trainer's gradient all-reduce, in flat buckets) over the NCCL
    backend on device arrays: the mean over hosts, and the buckets stay in device memory."""
    from alpa_comm.runtime.allreduce import allreduce_mean
    from alpa_comm.runtime.backend import NcclSubgroupBackend

    rng = np.random.default_rng(len(sizes))
    data = [[rng.integers(-8, 8, s).astype(np.float32) for s in sizes] for _ in range(n)]
    got = {}
    with M.install():
        store = HashStore()

        def rank(r):
            b = NcclSubgroupBackend(r, list(range(n)), store, 0, 20)
            out = allreduce_mean(b, [M.device_array(a) for a in data[r]], list(range(n)), 0, bucket_bytes=bucket,
                                 timeout=20)
            assert all(isinstance(a, M.ModelArray) for a in out)
            got[r] = [a.get() for a in out]
        assert rank_errors(n, rank) == [None] * n
    for i in range(len(sizes)):
        want = np.mean([data[r][i] for r in range(n)], axis=0)
        for r in range(n):
            np.testing.assert_allclose(got[r][i], want, rtol=1e-6)


def test_the_gpu_check_passes_on_the_model(capsys):
    """``benchmarks/gpu_check.py --model``: the N-GPU part of the prepared GPU check (every
    kind, device buffers, the ring all-reduce) runs here on the model."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--model", "--devices", "3", "--size-mb", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "24/24 plans bit-exact (on the model)" in out and "OK   ring all-reduce over 3 ranks" in out
