"""The planner's cost model reproduces the paper's closed forms on the 1-to-m suite."""
import math

import pytest

from alpa_comm import ClusterSpec, plan_resharding
from alpa_comm.resharding.cost_model import auto_chunks, chain_time
from alpa_comm.resharding.kinds import transfer_kind
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
