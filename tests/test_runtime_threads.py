"""The executor moves bit-exact data for every strategy (hosts as threads, no Ray)."""
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import STRATEGIES, ClusterSpec, DeviceMesh, plan_resharding
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.resharding.verify import verify_plan
from alpa_comm.runtime.backend import CommunicationError
from alpa_comm.runtime.local import execute_in_threads
from alpa_comm.suites import n_to_m, one_to_m

from exactness import expect_exact

from strategies_hyp import resharding_cases

DATA_STRATEGIES = [s for s in STRATEGIES if carries_data(s)]  # every kind the registry offers
CLUSTER = ClusterSpec(num_hosts=5, devices_per_host=4)


@pytest.mark.parametrize("case", n_to_m(2) + one_to_m(1 << 16), ids=lambda c: f"{c.suite}-{c.name}")
@pytest.mark.parametrize("strategy", DATA_STRATEGIES)
def test_reference_suites_bit_exact(case, strategy):
    x = np.random.default_rng(1).standard_normal(case.shape).astype(np.float32)
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER, strategy=strategy)
    expect_exact(plan, x, execute_in_threads(plan, x, timeout=20))


@settings(max_examples=60, deadline=None)
@given(resharding_cases(), st.sampled_from(DATA_STRATEGIES), st.sampled_from([None, 1, 3]),
       st.sampled_from(["float32", "int8", "float64"]))
def test_random_cases_bit_exact(case, strategy, chunks, dtype):
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=dph)
    plan = plan_resharding(shape, dtype, src_t, sspec, dst_t, dspec, cluster=cluster, strategy=strategy,
                           chunks=chunks, loadbalance="greedy")
    x = (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)
    expect_exact(plan, x, execute_in_threads(plan, x, timeout=20))


@settings(max_examples=60, deadline=None)
@given(resharding_cases(overlap=True), st.sampled_from(DATA_STRATEGIES))
def test_colocated_and_identical_meshes_bit_exact(case, strategy):
    """Source and destination on shared devices (training and inference colocated, or a
    layout change within one mesh): what a device already holds is copied locally, only
    the rest moves, and every byte lands right."""
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=dph)
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec, cluster=cluster, strategy=strategy,
                           loadbalance="greedy")
    verify_plan(plan)
    x = (np.arange(np.prod(shape)) % 251).astype(np.float32).reshape(shape)
    expect_exact(plan, x, execute_in_threads(plan, x, timeout=20))
    for t in plan.transfers:  # a host holding the slice never takes it in through its NIC
        if t.kind != "local_copy" and not t.parts and t.sender is not None:
            holders = {cluster.host_of(d) for d in plan.unit_tasks[t.task].src_devices}
            assert not {cluster.host_of(r) for r in t.receivers} & holders


def test_a_layout_change_within_one_mesh_moves_only_what_must_cross():
    cluster = ClusterSpec(num_hosts=2, devices_per_host=4)
    same = plan_resharding((16, 8), "float32", "2x4@0,1", "S0R", "2x4@0,1", "S0R", cluster=cluster)
    assert {t.kind for t in same.transfers} == {"local_copy"} and same.lower_bound_seconds == 0
    change = plan_resharding((16, 8), "float32", "2x4@0,1", "S0R", "2x4@0,1", "RS1", cluster=cluster)
    _, received = change.network_bytes()
    assert received == {0: 16 * 8 * 4 // 2, 1: 16 * 8 * 4 // 2}  # each host takes in only the half it lacks
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    expect_exact(change, x, execute_in_threads(change, x, timeout=20))


def test_signal_runs_without_data():
    case = n_to_m(2)[0]
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER, strategy="signal")
    execute_in_threads(plan, np.zeros(case.shape, np.float32), timeout=10)


def test_a_dead_host_raises_naming_it_quickly():
    case = one_to_m(1 << 16)[-1]  # 1 -> 4 hosts x 2 devices
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER, strategy="broadcast")
    t0 = time.monotonic()
    with pytest.raises(CommunicationError, match="host 2"):
        execute_in_threads(plan, np.zeros(case.shape, np.float32), timeout=30, kill_host=2)
    assert time.monotonic() - t0 < 10


def test_wrong_array_is_rejected_before_anything_moves():
    case = n_to_m(2)[0]
    plan = plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=CLUSTER)
    with pytest.raises(ValueError, match="does not match"):
        execute_in_threads(plan, np.zeros(case.shape, np.float64))


def test_a_silent_peer_times_out_naming_it():
    from alpa_comm.runtime.backend import ThreadBackend, ThreadHub
    hub = ThreadHub(2)
    buf = np.empty(8, np.uint8)
    t0 = time.monotonic()
    with pytest.raises(CommunicationError, match="host 0: receiving from host 1 timed out after 0.3 s"):
        ThreadBackend(0, hub).recv(buf, 1, tag=5, timeout=0.3)
    assert time.monotonic() - t0 < 2


def test_closing_the_mailbox_cancels_an_abandoned_steps_queued_jobs():
    """A step that failed is abandoned (its receives forgotten); closing the mailbox then
    still cancels the jobs of that step that never started, as it does a live step's."""
    import threading

    from alpa_comm.train.transport import ReshardMailbox

    box = ReshardMailbox(0, None, {"F:0->1": []}, {"F:0->1": 0}, {"F:0->1": []}, 4, 2, 5.0,
                         lambda a: a, lambda n, k, b: b)
    release, started = threading.Event(), threading.Semaphore(0)

    def busy(name, mb, srcs):  # every worker busy until released
        started.release()
        return release.wait(10)

    box._run = busy
    try:
        for mb in range(6):  # four workers: two jobs stay queued
            box.post("F", 0, 1, mb)
        assert all(started.acquire(timeout=10) for _ in range(4))
        jobs = list(box.pending.values())
        box.abandon()
        box.close()
        assert sum(f.cancelled() for f in jobs) == 2, [f._state for f in jobs]
    finally:
        release.set()
    assert all(f.cancelled() or f.result(timeout=10) for f in jobs)
