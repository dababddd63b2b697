"""The flow-level simulator: closed forms, fair sharing, exposed idle time, the lower bound."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec, DeviceMesh, STRATEGIES, plan_resharding
from alpa_comm.resharding.kinds import transfer_kind
from alpa_comm.resharding.resources import nic_receive as rx, nic_send as tx
from alpa_comm.sim import FluidNetwork, max_min_rates, simulate
from alpa_comm.report.charts import gantt_png
from alpa_comm.report.trace import chrome_trace, write_chrome_trace
from alpa_comm.suites import n_to_m, one_to_m

from strategies_hyp import resharding_cases

PAPER = ClusterSpec(num_hosts=5, devices_per_host=4, nic_send_gbps=10.0, intra_host_gbps=1200.0, latency_s=20e-6)


@pytest.mark.parametrize("case", one_to_m(256 << 20), ids=lambda c: c.name)
@pytest.mark.parametrize("strategy", ["send_recv", "local_allgather", "broadcast"])
def test_simulator_reproduces_closed_forms_within_2_percent(case, strategy):
    k = 64
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=PAPER, strategy=strategy, chunks=k)
    hosts, devices = map(int, case.name.split("x"))
    t = (256 << 20) / PAPER.send_rate(0)
    expected = transfer_kind(strategy).closed_form(t, hosts, devices, k)
    assert simulate(plan).makespan == pytest.approx(expected, rel=0.02)


def test_two_flows_on_one_nic_take_twice_as_long():
    cap = {tx(0): 100.0, rx(1): 1000.0, rx(2): 1000.0}
    times = {}
    for n_flows in (1, 2):
        net = FluidNetwork(cap)
        ends = []
        for dst in (1, 2)[:n_flows]:
            net.add_flow((tx(0), rx(dst)), 1000.0, ends.append)
        net.run()
        times[n_flows] = max(ends)
    assert times[1] == pytest.approx(10.0)
    assert times[2] == pytest.approx(2 * times[1])


def test_max_min_fairness_gives_leftover_to_unconstrained_flows():
    class F:
        def __init__(self, i, links):
            self.id, self.links, self.cap = i, links, math.inf
    # flows a, b share link 0 (cap 10); flow b also crosses link 1 (cap 2); a gets the rest
    rates = max_min_rates([F(0, (0,)), F(1, (0, 1))], {0: 10.0, 1: 2.0})
    assert rates[1] == pytest.approx(2.0) and rates[0] == pytest.approx(8.0)


def test_a_bad_order_shows_idle_hosts():
    case = n_to_m(16)[3]  # RS01R -> S01RR: every source host sends to every destination host
    run = {}
    for mode in ("size", "greedy"):
        plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                               cluster=PAPER, strategy="broadcast", loadbalance=mode)
        run[mode] = (plan, simulate(plan))
    bad_plan, bad = run["size"]
    good_plan, good = run["greedy"]
    # LPT keeps task order: each receiving host queues behind the other, hosts sit idle
    assert bad.makespan > 1.5 * good.makespan
    assert min(bad.host_busy_fraction.values()) < 0.7
    assert min(good.host_busy_fraction.values()) > 0.95
    assert bad.makespan == pytest.approx(bad_plan.predicted_seconds, rel=1e-6)


def test_sharing_a_nic_when_a_plan_overlaps_transfers():
    # Simulating a plan on a slower cluster than it was planned for stretches every transfer.
    plan = plan_resharding((1 << 20,), "float32", "1x1@0", "R", "1x4@1", "R", cluster=PAPER, strategy="send_recv")
    slow = ClusterSpec(num_hosts=5, devices_per_host=4, nic_send_gbps=5.0, latency_s=20e-6)
    assert simulate(plan, slow).makespan == pytest.approx(2 * simulate(plan).makespan, rel=0.01)


@settings(max_examples=60, deadline=None)
@given(resharding_cases(), st.sampled_from(STRATEGIES), st.sampled_from(["naive", "greedy", "size"]))
def test_simulated_makespan_never_beats_the_lower_bound(case, strategy, mode):
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=dph, nic_send_gbps=[10 + 3 * h for h in range(hosts)])
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec, cluster=cluster, strategy=strategy,
                           loadbalance=mode)
    res = simulate(plan)
    assert res.makespan >= plan.latency_bound_seconds * (1 - 1e-9)  # >= the bandwidth bound too
    assert len(res.timeline) == len(plan.transfers)


def test_exports(tmp_path):
    case = n_to_m(16)[2]
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=PAPER, loadbalance="naive")
    res = simulate(plan)
    trace = chrome_trace(res)
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    path = write_chrome_trace(res, tmp_path / "t.json")
    assert json.loads(path.read_text())["traceEvents"]
    png = gantt_png(res, tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
