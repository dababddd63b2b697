"""The planner's cost model reproduces the paper's closed forms on the 1-to-m suite."""
import math

import pytest

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.resharding.cost_model import auto_chunks, chain_time
from alpa_comm.resharding.kinds import transfer_kind
from alpa_comm.sim import simulate
from alpa_comm.suites import one_to_m

IDEAL = dict(num_hosts=5, devices_per_host=4, nic_send_gbps=10.0, intra_host_gbps=math.inf, latency_s=0.0)


@pytest.mark.parametrize("case", one_to_m(64 << 20), ids=lambda c: c.name)
@pytest.mark.parametrize("strategy", ["send_recv", "local_allgather", "global_allgather", "broadcast"])
def test_one_to_m_matches_closed_form(case, strategy):
    cluster = ClusterSpec(**IDEAL)
    k = 16
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=cluster, strategy=strategy, chunks=k)
    hosts, devices = map(int, case.name.split("x"))
    t = (64 << 20) / cluster.send_rate(0)
    assert plan.predicted_seconds == pytest.approx(transfer_kind(strategy).closed_form(t, hosts, devices, k), rel=1e-9)
    assert plan.lower_bound_seconds == pytest.approx(t)


def test_closed_forms_are_the_papers():
    t = 1.0
    assert transfer_kind("send_recv").closed_form(t, 3, 4) == 12
    assert transfer_kind("local_allgather").closed_form(t, 3, 4) == 3
    assert transfer_kind("broadcast").closed_form(t, 3, 4, chunks=100) == pytest.approx(1.02)
    assert transfer_kind("global_allgather").closed_form(t, 3, 4) == pytest.approx(2 - 1 / 12)


def test_chain_time_tradeoff_and_auto_chunks():
    rate = 1e9 / 8 * 10
    hops = [rate] * 4
    n = 64 << 20
    t = n / rate
    assert chain_time(n, hops, 1, 0.0) == pytest.approx(4 * t)
    assert chain_time(n, hops, 1000, 0.0) == pytest.approx(t * (1 + 3 / 1000))
    lat = 20e-6
    k = auto_chunks(n, hops, lat)
    best = min(range(1, 257), key=lambda kk: chain_time(n, hops, kk, lat))
    assert chain_time(n, hops, k, lat) <= chain_time(n, hops, best, lat) * 1.01
    assert auto_chunks(n, [rate], lat) == 1  # one hop: nothing to pipeline


@pytest.mark.parametrize("receivers,fan,rounds", [(1, 1, 1), (2, 1, 2), (3, 1, 2), (7, 1, 3), (8, 1, 4), (255, 1, 8),
                                                  (1, 32, 1), (32, 32, 1), (33, 32, 2), (1088, 32, 2), (1089, 32, 3)])
def test_latency_rounds_of_one_host_to_many(receivers, fan, rounds):
    """The hosts holding a slice grow at most (fan + 1)-fold per round of messages, a host
    having ``fan`` messages in flight at once (one: they double)."""
    from alpa_comm.resharding.planner import latency_rounds
    from alpa_comm.resharding.unit_tasks import UnitTask
    cluster = ClusterSpec(num_hosts=receivers + 1, devices_per_host=1)
    task = UnitTask(0, ((0, 8),), (0,), tuple(range(1, receivers + 1)), 32)
    assert latency_rounds([task], cluster, fan=fan) == rounds


@pytest.mark.parametrize("senders,fan,rounds", [(15, 1, 4), (15, 32, 1), (32, 32, 1), (33, 32, 2)])
def test_latency_rounds_of_gathering_from_many_hosts(senders, fan, rounds):
    """A host that needs slices only k separate hosts hold hears from them in
    log_(fan+1)(k+1) rounds."""
    from alpa_comm.resharding.planner import latency_rounds
    from alpa_comm.resharding.unit_tasks import UnitTask
    cluster = ClusterSpec(num_hosts=senders + 1, devices_per_host=1)
    tasks = [UnitTask(i, ((i, i + 1),), (i,), (senders,), 4) for i in range(senders)]
    assert latency_rounds(tasks, cluster, fan=fan) == rounds
    # the same slices, each also held by host 0: one source set covers them all
    shared = [UnitTask(i, ((i, i + 1),), (0, i), (senders,), 4) for i in range(1, senders)]
    assert latency_rounds(shared, cluster, fan=fan) == 1


def test_small_transfers_are_judged_against_the_latency_aware_bound():
    cluster = ClusterSpec(num_hosts=256, devices_per_host=1, nic_send_gbps=10)
    dst = "255x1@" + ",".join(map(str, range(1, 256)))
    plan = plan_resharding((64,), "float32", "1x1@0", "R", dst, "R", cluster=cluster, strategy="double_tree")
    # a holder reaches at most 32 more hosts a round (admission.MAX_CONCURRENT): 256 in two
    assert plan.latency_bound_seconds == pytest.approx(2 * cluster.latency_s)
    # two binary trees: two messages a step, 2 x 8 latencies against the bound's 2 rounds
    played = simulate(plan).makespan
    assert played / plan.lower_bound_seconds > 10 and 7.9 < played / plan.latency_bound_seconds < 8.1
    assert "latency-aware" in plan.explain()
    again = type(plan).from_json(plan.to_json())
    assert again.latency_bound_seconds == plan.latency_bound_seconds
