"""``double_tree``: one slice to many hosts down two pipelined binary trees; every host
sends about one copy, the fill is log2(A) steps; bit-exact on threads, near the
bandwidth bound in simulation where a chain is 1.7-3.4x off."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.placement import Resharding
from alpa_comm.resharding.kinds import transfer_kind
from alpa_comm.resharding.kinds.double_tree import chunk_bounds, depth, halves, tree_edges
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.resharding.verify import verify_plan
from alpa_comm.sim import simulate

from exactness import run_exact, run_tree


def _hosts(first, count):
    return ",".join(str(h) for h in range(first, first + count))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300))
def test_each_host_is_inner_in_at_most_one_tree_and_reached_by_both(a):
    hosts = list(range(100, 100 + a))
    inner = []
    for tree in (0, 1):
        edges = tree_edges(7, hosts, tree)
        children = [c for _, c in edges]
        assert sorted(children) == hosts  # every host gets this tree's half exactly once
        parents = {p for p, _ in edges} - {7}
        assert all(sum(1 for p, _ in edges if p == h) <= 2 for h in parents)  # binary
        inner.append(parents)
        # hops from the sender to each host
        level = {7: 0}
        for p, c in edges:  # heap order: a parent precedes its children
            level[c] = level[p] + 1
        assert max(level.values()) == depth(a)
    assert not inner[0] & inner[1]


@given(st.integers(0, 10_000), st.integers(1, 300))
def test_chunks_cover_each_half_without_empty_ones(n, k):
    for lo, hi in halves(n):
        b = chunk_bounds(lo, hi, k)
        assert b[0] == lo and b[-1] == hi
        if hi > lo:
            assert np.all(np.diff(b) > 0)


@pytest.mark.parametrize("dst_hosts,dph,chunks", [(1, 2, None), (2, 1, 3), (3, 2, None), (6, 2, 4), (9, 1, 7)])
def test_one_host_to_many_is_bit_exact(dst_hosts, dph, chunks):
    cluster = ClusterSpec(num_hosts=1 + dst_hosts, devices_per_host=dph, nic_send_gbps=10)
    shape = (12, 10)
    plan = plan_resharding(shape, "float32", f"1x{dph}@0", "RR", f"{dst_hosts}x{dph}@{_hosts(1, dst_hosts)}",
                           "RS1" if dph > 1 else "RR", cluster=cluster, strategy="double_tree", chunks=chunks)
    verify_plan(plan)
    assert {t.kind for t in plan.transfers} == {"double_tree"}
    x = np.random.default_rng(dst_hosts).standard_normal(shape).astype(np.float32)
    run_exact(plan, x)


def test_a_packed_tree_plan_is_bit_exact():
    cluster = ClusterSpec(num_hosts=6, devices_per_host=2, nic_send_gbps=10)
    tree = {"w": Resharding.between((8, 12), "float32", "1x2@0", "RS1", "5x2@1,2,3,4,5", "RS1"),
            "b": [Resharding.between((8,), "float32", "1x2@0", "S0", "5x2@1,2,3,4,5", "R")]}
    plan = plan_resharding_tree(tree, cluster=cluster, strategy="double_tree", bucket_bytes=1 << 20)
    verify_plan(plan)
    assert any(t.kind == "double_tree" and t.parts for t in plan.transfers)
    run_tree(plan, seed=2)


@pytest.mark.parametrize("hosts", [3, 7, 16, 100])
def test_planner_and_simulator_agree_with_the_closed_form(hosts):
    cluster = ClusterSpec(num_hosts=hosts + 1, devices_per_host=1, nic_send_gbps=10, latency_s=0.0,
                          intra_host_gbps=float("inf"))
    n = 1 << 22
    plan = plan_resharding((n,), "float32", "1x1@0", "R", f"{hosts}x1@{_hosts(1, hosts)}", "R", cluster=cluster,
                           strategy="double_tree", chunks=64)
    t = 4 * n / cluster.send_rate(0)
    expected = transfer_kind("double_tree").closed_form(t, hosts, 1, chunks=64)
    assert plan.predicted_seconds == pytest.approx(expected, rel=1e-9)
    assert simulate(plan).makespan == pytest.approx(expected, rel=0.02)


def test_one_to_all_at_scale_is_near_the_bound_and_auto_takes_the_tree():
    """One host to 255 hosts (the scale matrix's one-to-all): a chain is 1.7x the bound."""
    cluster = ClusterSpec(num_hosts=256, devices_per_host=8, nic_send_gbps=100)
    args = ((4096, 1024, 64), "float32", "1x8@0", "S0RR", f"255x8@{_hosts(1, 255)}", "RRR")
    tree = plan_resharding(*args, cluster=cluster, strategy="double_tree", cache=False)
    chain = plan_resharding(*args, cluster=cluster, strategy="broadcast", cache=False)
    assert simulate(tree).makespan <= 1.15 * tree.lower_bound_seconds
    assert simulate(chain).makespan >= 1.5 * chain.lower_bound_seconds
    auto = plan_resharding(*args, cluster=cluster, strategy="auto", cache=False)
    assert auto.strategy == "double_tree" and auto.strategy_asked == "auto"


def test_each_tree_forwards_without_waiting_for_the_other():
    """A host forwards a tree's chunk the moment it lands, whatever the other tree does.
    Waiting for the other tree's chunk first (the old loop) chained every host to both
    trees' depths: on 16 emulated hosts the pipeline then stepped at several hops a chunk
    (4.5 s where 1.5 s were due). Here the sender holds back tree 1 until tree 0's root
    (host 1, a leaf of tree 1) has passed all of tree 0 on to host 2: a coupled host 1
    would wait for tree 1's first chunk and never get there."""
    import threading

    from alpa_comm.runtime.backend import Handle, ThreadBackend
    from alpa_comm.runtime.local import execute_in_threads

    chunks = 4
    forwarded = threading.Event()
    sent_on = []  # host 1's sends to host 2

    class HoldTree1(ThreadBackend):
        def isend(self, buf, peer, tag):
            if self.rank == 1 and peer == 2:
                sent_on.append(tag)
                if len(sent_on) == chunks:
                    forwarded.set()
            if self.rank == 0 and peer == 4:  # tree 1's root: released once host 1 forwarded tree 0
                inner = []
                th = threading.Thread(target=lambda: forwarded.wait(10) and inner.append(
                    ThreadBackend.isend(self, buf, peer, tag)), daemon=True)
                th.start()

                def wait(timeout):
                    th.join(timeout)
                    if not inner:
                        raise TimeoutError("tree 1 was held back: host 1 never forwarded tree 0")
                    inner[0].wait(timeout)
                return Handle(wait, "held")
            return super().isend(buf, peer, tag)

    cluster = ClusterSpec(num_hosts=5, devices_per_host=1, nic_send_gbps=10)
    assert tree_edges(0, [1, 2, 3, 4], 0)[:2] == [(0, 1), (1, 2)] and tree_edges(0, [1, 2, 3, 4], 1)[0] == (0, 4)
    plan = plan_resharding((64, 8), "float32", "1x1@0", "RR", "4x1@1,2,3,4", "RR", cluster=cluster,
                           strategy="double_tree", chunks=chunks)
    x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    out = execute_in_threads(plan, x, timeout=15, backend_class=HoldTree1)
    assert all(np.array_equal(b, x) for b in out.values())
    assert len(sent_on) == chunks


@pytest.mark.parametrize("chunks,alone", [(64, True), (1, False)])
def test_a_pipelined_tree_runs_alone_on_its_nics_a_store_and_forward_one_shares(chunks, alone):
    """Two pipelined trees over the same hosts could only split their NICs, and coupled
    they step at the slower one's pace (``admission.ALONE_BUSY``): each takes a whole
    window, in the executor and the simulator alike; a one-chunk tree keeps one level
    busy at a time and shares."""
    from alpa_comm.resharding.admission import MAX_PER_RESOURCE, window_units

    cluster = ClusterSpec(num_hosts=10, devices_per_host=1, nic_send_gbps=1, latency_s=1e-6)
    plan = plan_resharding((1 << 16, 64), "float32", "2x1@0,1", "S0R", "8x1@2,3,4,5,6,7,8,9", "RR",
                           cluster=cluster, strategy="double_tree", chunks=chunks)
    a, b = plan.transfers
    units = window_units(a, 1, MAX_PER_RESOURCE, cluster.host_of, cluster.slowest_nic_rate, cluster.latency_s)
    assert units == (MAX_PER_RESOURCE if alone else 1)
    spans = {e.transfer: (e.start, e.end) for e in simulate(plan).timeline}
    overlap = min(spans[a.id][1], spans[b.id][1]) - max(spans[a.id][0], spans[b.id][0])
    assert (overlap <= 1e-12) == alone
