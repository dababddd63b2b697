"""The distributed pipeline trainer's pure parts: edge planning between stage meshes,
the bucketed all-reduce, tag ranges, and the measurement helpers."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.topology import ClusterSpec
from alpa_comm.pipeline import Costs, generate, simulate_schedule
from alpa_comm.resharding.strategies import STRATEGIES, carries_data
from alpa_comm.resharding.verify import verify_plan
from alpa_comm.runtime.allreduce import allreduce_mean, buckets
from alpa_comm.runtime.backend import CommunicationError, ThreadBackend, ThreadHub
from alpa_comm.pipeline.edges import Edge, edge_plans, model_edges, stage_mesh
from alpa_comm.report.trace import chrome_trace
from alpa_comm.train.measure import costs_from, iteration_seconds, stage_times
from alpa_comm.train.transport import tag_slot

from ranks import run_ranks

UT4 = [{}, {"h": 0}, {"h": 1, "skip1": 1}, {"h": 2, "skip0": 0}]  # utransformer(4, half_layers=2).consumes


# ------------------------------------------------------------------ pure parts
def test_edges_of_a_u_transformer_include_the_skip_and_its_gradient():
    edges = model_edges(UT4)
    assert Edge("F", 0, 3, ("skip0",)) in edges and Edge("B", 3, 0, ("skip0",)) in edges
    assert Edge("F", 1, 2, ("h", "skip1")) in edges
    assert len(edges) == 8


def test_an_edge_backwards_is_refused_with_the_stage_named():
    with pytest.raises(ValueError, match="stage 1 consumes 'x' from stage 2"):
        model_edges([{}, {"x": 2}, {}])


@settings(max_examples=25, deadline=None)
@given(dp=st.integers(1, 2), k=st.sampled_from([1, 2, 4]),
       strategy=st.sampled_from(STRATEGIES), rows_per=st.integers(1, 3))
def test_every_edge_plan_delivers_its_layout(dp, k, strategy, rows_per):
    edges = model_edges(UT4)
    rows = dp * k * rows_per
    shapes = {(s, key): (rows, 8, 16) for s in range(4) for key in ("h", "skip0", "skip1")}
    spec = ClusterSpec(num_hosts=4 * dp, devices_per_host=k)
    plans = edge_plans(edges, shapes, "float32", dp, k, spec, strategy)
    for e, per_key in plans.items():
        assert len(per_key) == len(e.keys)
        for p in per_key:
            assert p.src_mesh == stage_mesh(e.src, dp, k) and p.dst_mesh == stage_mesh(e.dst, dp, k)
            if carries_data(strategy):
                verify_plan(p)


def test_rows_that_do_not_divide_over_the_stage_devices_are_refused():
    with pytest.raises(ValueError, match="not divisible by 2 data-parallel hosts x 2 devices"):
        edge_plans(model_edges(UT4), {(s, k): (6, 4, 4) for s in range(4) for k in ("h", "skip0", "skip1")},
                   "float32", 2, 2, ClusterSpec(num_hosts=8, devices_per_host=2), "broadcast")


def test_too_many_concurrent_transfers_is_a_clear_error():
    assert tag_slot(0, 0, 3, 4) == 3
    with pytest.raises(CommunicationError, match="too many concurrent transfers"):
        tag_slot(10_000, 0, 0, 64)


def _run_ranks(n, fn):
    hub = ThreadHub(n)
    return run_ranks(n, lambda r: fn(ThreadBackend(r, hub), r))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 4), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
       bucket=st.sampled_from([8, 64, 1 << 20]), seed=st.integers(0, 99))
def test_bucketed_allreduce_is_the_mean_over_hosts(n, sizes, bucket, seed):
    rng = np.random.default_rng(seed)
    data = [[rng.standard_normal(s).astype(np.float32) for s in sizes] for _ in range(n)]
    out = _run_ranks(n, lambda b, r: allreduce_mean(b, data[r], list(range(n)), 0, bucket_bytes=bucket, timeout=10))
    for i in range(len(sizes)):
        want = np.mean([data[r][i] for r in range(n)], axis=0)
        for r in range(n):
            np.testing.assert_allclose(out[r][i], want, rtol=1e-6, atol=1e-6)


def test_buckets_keep_order_and_never_exceed_the_size_unless_one_array_does():
    assert buckets([2, 2, 2, 10, 1], 4, 16) == [[0, 1], [2], [3], [4]]


def test_measured_records_become_costs_a_trace_and_an_iteration_time():
    rec0 = {"host": 0, "stage": 0, "events": [("F", 0, 0.0, 1.0), ("B", 0, 3.0, 5.0), ("UPDATE", -1, 5.0, 9.0)],
            "transfers": [("F:0->1", 0, 1.0, 1.5)]}
    rec1 = {"host": 1, "stage": 1, "events": [("RECV_F", 0, 0.0, 1.5), ("F", 0, 1.5, 2.0), ("B", 0, 2.0, 2.5)],
            "transfers": [("B:1->0", 0, 2.5, 3.0)]}
    steps = [[rec0, rec1]]
    assert iteration_seconds([rec0, rec1]) == 5.0
    times = stage_times(steps, 2, busy=False)
    assert times["F"] == [1.0, 0.5] and times["B"] == [2.0, 0.5]
    costs = costs_from(times, {"F:0->1": 0.5, "B:1->0": 0.25}, 2)
    r = simulate_schedule(generate("1f1b", 2, 1), costs)
    assert r.iteration_time == pytest.approx(1.0 + 0.5 + 0.5 + 0.5 + 0.25 + 2.0)
    trace = chrome_trace(steps)
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"F0", "B0", "RECV_F0", "F:0->1 mb0", "UPDATE"} <= names


def test_simulator_takes_a_separate_backward_transfer_time():
    s = generate("1f1b", 2, 1)
    assert (simulate_schedule(s, Costs(1.0, 2.0, 0.5, t_comm_b=0.0)).iteration_time
            == pytest.approx(simulate_schedule(s, Costs(1.0, 2.0, 0.5)).iteration_time - 0.5))


def test_busy_factor_charges_work_between_actions_but_not_waits():
    from alpa_comm.train.measure import busy_factor
    rec = {"events": [("RECV_F", 0, 0.0, 2.0), ("UNPACK", 0, 2.0, 2.5), ("F", 0, 2.5, 3.5), ("B", 0, 4.0, 5.0),
                      ("UPDATE", -1, 5.0, 9.0)]}
    assert busy_factor(rec) == pytest.approx((5.0 - 2.0) / 2.0)  # 1 s of runtime work beside 2 s of compute
    assert busy_factor({"events": [("F", 0, 0.0, 1.0)]}) == 1.0


# ------------------------------------------------------------------ the simulator as a predictor
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "eager-1f1b", "zb-h1"]), st.integers(2, 5), st.integers(1, 6),
       st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_signal_ignores_the_nic_model_and_constant_action_times_change_nothing(kind, S, M, f, b):
    s = generate(kind, S, M, split_backward=kind != "gpipe" and kind != "1f1b")
    costs = Costs(f, b, 0.7)
    assert (simulate_schedule(s, costs, signal=True, shared_nic=True).iteration_time
            == pytest.approx(simulate_schedule(s, costs, signal=True).iteration_time))
    c = costs.resolve(S)
    same = simulate_schedule(s, costs, shared_nic=True, action_time=lambda i, k, mb, chunk: c[k][i])
    assert same.iteration_time == pytest.approx(simulate_schedule(s, costs, shared_nic=True).iteration_time)


def _records(durations_f, durations_b, S=2):
    """One step's records of a 2-stage GPipe run, each stage with these F and B durations."""
    per_host = []
    for s in range(S):
        t, ev = 0.0, []
        for kind, ds in (("F", durations_f), ("B", durations_b)):
            for mb, d in enumerate(ds):
                ev.append((kind, mb, t, t + d))
                t += d
        per_host.append({"host": s, "stage": s, "events": ev})
    return [per_host]


def test_the_prediction_of_a_run_without_spread_is_the_simulation():
    from alpa_comm.train.measure import predict
    s = generate("gpipe", 2, 3)
    recs = _records([1.0] * 3, [2.0] * 3)
    edges = {"F:0->1": 0.25, "B:1->0": 0.25}
    expect = simulate_schedule(s, costs_from(stage_times(recs, 2), edges, 2), shared_nic=True).iteration_time
    assert predict(s, recs, edges) == pytest.approx(expect)


def test_spread_along_dependency_chains_costs_time_the_median_simulation_misses():
    """Iteration time is a max over chains of sums, convex in the durations: equal
    medians and means, but the spread of each action makes the expected maximum larger."""
    from alpa_comm.train.measure import predict
    s = generate("1f1b", 2, 4)
    recs = _records([0.5, 1.5, 0.5, 1.5], [1.0, 3.0, 1.0, 3.0])
    flat = _records([1.0] * 4, [2.0] * 4)
    edges = {"F:0->1": 0.1, "B:1->0": 0.1}
    assert predict(s, recs, edges, draws=200) > predict(s, flat, edges) * 1.02


def test_a_step_slowed_as_a_whole_stays_in_its_step():
    """The machine slowing every host for one step is noise correlated in time: predicted
    step by step, the median prediction is the typical step's; pooled, the slow step's
    actions land in every simulated step and the prediction leaves the median step."""
    from alpa_comm.train.measure import predict, predict_by_step
    s = generate("1f1b", 2, 4)
    edges = {"F:0->1": 0.1, "B:1->0": 0.1}
    step = _records([1.0] * 4, [2.0] * 4)[0]
    slow = _records([2.0] * 4, [4.0] * 4)[0]
    typical = predict(s, [step], edges)
    assert predict_by_step(s, [step, slow, step], edges) == pytest.approx(typical)
    assert predict(s, [step, slow, step], edges) > typical * 1.2
    with pytest.raises(ValueError, match="no steps"):
        predict_by_step(s, [], edges)


def test_transfer_overlap_is_the_share_of_sending_time_spent_computing():
    from alpa_comm.train.measure import transfer_overlap
    rec = {"events": [("F", 0, 0.0, 1.0), ("RECV_B", 0, 1.0, 2.0), ("B", 0, 2.0, 4.0)],
           "transfers": [("F:0->1", 0, 0.5, 1.5), ("F:0->1", 1, 3.0, 3.5)]}
    assert transfer_overlap(rec) == pytest.approx((0.5 + 0.5) / 1.5)
    assert transfer_overlap({"events": [], "transfers": []}) == 1.0


def test_comm_cpu_counts_only_the_threads_that_move_data():
    from alpa_comm.train.measure import comm_cpu_seconds
    rec = {"cpu_by_thread": {"gloo_tcp_loop": 0.25, "mailbox": 0.125, "transfer": 0.0625, "tcp-recv-1.0": 0.5,
                             "tf_XLAEigen": 3.0, "ray::PipelineWo": 1.0, "client.poll0": 0.01}}
    assert comm_cpu_seconds(rec) == 0.25 + 0.125 + 0.0625 + 0.5
    assert comm_cpu_seconds({"events": []}) == 0.0  # a record from before threads were counted


def test_a_prediction_refuses_records_of_another_schedule():
    from alpa_comm.train.measure import predict
    recs = _records([1.0] * 3, [2.0] * 3)  # F and B only
    with pytest.raises(ValueError, match="BI"):
        predict(generate("eager-1f1b", 2, 3, split_backward=True), recs, {"F:0->1": 0.1, "B:1->0": 0.1})
    with pytest.raises(ValueError, match="draws"):
        predict(generate("gpipe", 2, 3), recs, {}, draws=0)
