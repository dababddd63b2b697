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
    # the balancer predicts each NIC's sequence one transfer at a time: played that way the
    # simulator agrees to the last digit; the executor's windows only overlap fills
    strict = simulate(bad_plan, window=1, max_concurrent=1)
    assert strict.makespan == pytest.approx(bad_plan.predicted_seconds, rel=1e-6)
    assert bad.makespan <= strict.makespan * (1 + 1e-9)


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


def _gather_plan(senders: int, nbytes_each: int):
    """One host takes a slice from each of ``senders`` hosts (send_recv, one message each)."""
    cluster = ClusterSpec(num_hosts=senders + 1, devices_per_host=1, nic_send_gbps=100, latency_s=20e-6)
    plan = plan_resharding((senders * nbytes_each // 4,), "float32", f"{senders}x1@0-{senders - 1}", "S0",
                           f"1x1@{senders}", "R", cluster=cluster, strategy="send_recv", cache=False)
    assert len(plan.transfers) == senders
    return plan, cluster


@pytest.mark.parametrize("senders", [8, 32, 64, 100])
def test_small_messages_overlap_up_to_the_hosts_concurrency(senders):
    """Latency-bound messages are admitted outside the NIC windows, at most MAX_CONCURRENT
    per host (``resharding.admission``, as the executor runs them): a host taking a message
    from each of 100 hosts pays four latencies, not 100; one at a time it pays 100."""
    from alpa_comm.resharding.admission import MAX_CONCURRENT
    plan, cluster = _gather_plan(senders, 1024)
    waves = math.ceil(senders / MAX_CONCURRENT)
    overlapped = simulate(plan).makespan
    wire = senders * 1024 / cluster.recv_rate(senders)  # every byte through the one receiving NIC
    assert waves * cluster.latency_s + wire / waves <= overlapped <= (waves * cluster.latency_s + wire) * 1.001
    strict = simulate(plan, window=1, max_concurrent=1).makespan
    assert strict >= senders * cluster.latency_s
    assert overlapped >= plan.latency_bound_seconds * (1 - 1e-9)


def test_long_transfers_keep_the_plans_order_two_at_a_time_on_a_nic():
    """Transfers that hold a NIC for long start in the plan's order there, at most
    MAX_PER_RESOURCE at once: the third of three 64 MiB sends from one host starts when
    the first ends, and the three share the NIC, so the makespan is the bytes' time."""
    cluster = ClusterSpec(num_hosts=4, devices_per_host=1, nic_send_gbps=10, latency_s=20e-6)
    plan = plan_resharding((3 << 24,), "float32", "1x1@0", "R", "3x1@1-3", "S0", cluster=cluster,
                           strategy="send_recv", cache=False)
    run = simulate(plan)
    starts = sorted(e.start for e in run.timeline)
    ends = sorted(e.end for e in run.timeline)
    assert starts[0] == starts[1] == 0.0 and starts[2] == pytest.approx(ends[0])
    assert run.makespan == pytest.approx(cluster.latency_s * 2 + (3 << 26) / cluster.send_rate(0), rel=0.01)


def _admitted_vs_simulated(plan):
    from alpa_comm.resharding.admission import admitted_seconds
    return admitted_seconds(plan.transfers, plan.cluster), simulate(plan).makespan


@pytest.mark.parametrize("senders", [8, 33, 100])
def test_admitted_estimate_overlaps_small_messages_as_admission_does(senders):
    """``admission.admitted_seconds`` (what ``auto`` ranks kinds by) charges a host's
    latency-bound messages one latency per ``MAX_CONCURRENT`` of them, as the simulator
    plays them, where the one-at-a-time prediction charges one latency each."""
    from alpa_comm.resharding.admission import MAX_CONCURRENT
    plan, cluster = _gather_plan(senders, 1024)
    admitted, played = _admitted_vs_simulated(plan)
    assert admitted == pytest.approx(played, rel=0.02)
    waves = math.ceil(senders / MAX_CONCURRENT)
    assert waves * cluster.latency_s < admitted < (waves + 1) * cluster.latency_s < plan.predicted_seconds


def test_admitted_estimate_runs_long_transfers_two_at_a_time():
    """Three 64 MiB sends from one host: two start together, the third when one ends; the
    bytes share the NIC, and the third's latency is not hidden."""
    cluster = ClusterSpec(num_hosts=4, devices_per_host=1, nic_send_gbps=10, latency_s=20e-6)
    plan = plan_resharding((3 << 24,), "float32", "1x1@0", "R", "3x1@1-3", "S0", cluster=cluster,
                           strategy="send_recv", cache=False)
    admitted, played = _admitted_vs_simulated(plan)
    assert admitted == pytest.approx(played, rel=0.01)
    assert admitted == pytest.approx(2 * cluster.latency_s + (3 << 26) / cluster.send_rate(0), rel=0.01)


def test_admitted_estimate_holds_a_window_through_every_phase():
    """A scatter then ring all-gather (``global_allgather``) keeps its place in the sending
    NIC's window through its ring phase, two transfers at a time that share their
    bottleneck: the sending NIC idles through every ring, which the estimate counts."""
    cluster = ClusterSpec(num_hosts=4, devices_per_host=8, nic_send_gbps=100, latency_s=20e-6)
    plan = plan_resharding((64, 256, 4096), "float32", "1x8@0", "S1RR", "2x8@2-3", "RS1R", cluster=cluster,
                           strategy="global_allgather", cache=False)
    admitted, played = _admitted_vs_simulated(plan)
    sent, _ = plan.network_bytes()
    assert admitted == pytest.approx(played, rel=0.02)
    assert played > 1.3 * sent[0] / cluster.send_rate(0)  # more than the sender's own bytes


def test_auto_ranks_kinds_as_the_executor_admits_them():
    """64 hosts' 512 slices of 32 KiB to 8 hosts, each slice to every device of one host:
    one at a time send/recv looks faster (each message pays a latency either way, and a
    chain adds its fill), but send/recv crosses each NIC once per device, 8x the bytes,
    while admission overlaps the chains' latencies 32 at a time. ``auto`` ranks by the
    admitted time and takes the chain."""
    cluster = ClusterSpec(num_hosts=72, devices_per_host=8, nic_send_gbps=100, latency_s=20e-6)
    args = ((4096, 1024), "float32", "64x8@0-63", "S10R", "8x8@64-71", "S0R")
    each = {s: plan_resharding(*args, cluster=cluster, strategy=s, cache=False) for s in ("send_recv", "broadcast")}
    assert each["send_recv"].predicted_seconds < each["broadcast"].predicted_seconds
    played = {s: simulate(p).makespan for s, p in each.items()}
    assert played["broadcast"] * 3 < played["send_recv"]
    auto = plan_resharding(*args, cluster=cluster, strategy="auto", cache=False)
    assert auto.strategy == "broadcast" and auto.admitted_seconds == pytest.approx(played["broadcast"], rel=0.1)


def _progressive_filling(flows, capacity):
    """The textbook form the simulator's water-filling must agree with: raise every
    unfrozen flow together, freeze at each saturated link or cap, repeat."""
    rem = {}
    count = {}
    for f in flows:
        for link in f.links:
            rem[link] = capacity[link]
            count[link] = count.get(link, 0) + 1
    rate = {f.id: 0.0 for f in flows}
    unfrozen = list(flows)
    while unfrozen:
        delta = min((rem[l] / c for l, c in count.items() if c > 0), default=math.inf)
        delta = min(delta, min(f.cap - rate[f.id] for f in unfrozen))
        if math.isinf(delta):
            for f in unfrozen:
                rate[f.id] = math.inf
            break
        for f in unfrozen:
            rate[f.id] += delta
            for link in f.links:
                rem[link] -= delta
        keep = []
        for f in unfrozen:
            if f.cap - rate[f.id] <= 1e-12 * max(1.0, f.cap if not math.isinf(f.cap) else 1.0) or any(
                    not math.isinf(capacity[link]) and rem[link] <= 1e-12 * capacity[link] for link in f.links):
                for link in f.links:
                    count[link] -= 1
            else:
                keep.append(f)
        if len(keep) == len(unfrozen):
            break
        unfrozen = keep
    return rate


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sets(st.integers(0, 7), min_size=1, max_size=4),
                          st.sampled_from([math.inf, 1.0, 3.0, 50.0])), min_size=1, max_size=30),
       st.lists(st.sampled_from([1.0, 2.0, 5.0, 10.0, math.inf]), min_size=8, max_size=8))
def test_water_filling_agrees_with_progressive_filling(specs, caps):
    from alpa_comm.sim.network import Flow
    if all(math.isinf(c) for c in caps):
        caps[0] = 4.0
    flows = [Flow(i, tuple(sorted(links)), 1.0, cap, lambda now: None) for i, (links, cap) in enumerate(specs)]
    capacity = dict(enumerate(caps))
    fast, slow = max_min_rates(flows, capacity), _progressive_filling(flows, capacity)
    for f in flows:
        assert fast[f.id] == pytest.approx(slow[f.id], rel=1e-9, abs=1e-12)


def test_sim_vs_measured_replays_a_committed_bench_run(tmp_path):
    """benchmarks/sim_vs_measured.py re-plans every planned method of a measured run and
    simulates it both ways; a file that is not there is named."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    script = root / "benchmarks" / "sim_vs_measured.py"
    run = root / "benchmarks" / "results" / "emulated" / "sim_admission" / "results.json"
    done = subprocess.run([sys.executable, str(script), str(run), "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "sim_vs_measured.md").read_text()
    assert "admission: mean |error|" in text and "one at a time: mean |error|" in text
    assert text.count("| balance |") == 40
    missing = subprocess.run([sys.executable, str(script), str(tmp_path / "nope.json")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode != 0 and "nope.json" in missing.stderr
