"""Planning the distributed trainer's edges over virtual stages (pure: no JAX, no cluster).

Model stage ``v`` runs on mesh ``schedule.place(v)[0]``: edges whose two model stages
sit on different meshes get a resharding plan between those meshes, edges inside one
mesh are local hand-offs, and every transfer is named by the model stages it joins, so
two between the same meshes for one microbatch never meet (``tests/test_train_emulated.py``
runs them)."""
import pytest

from alpa_comm.pipeline import ScheduleError, generate, validate
from alpa_comm.pipeline.edges import (Edge, check_transfers, edge_hosts, edge_plans, local_producers, model_edges,
                                      model_stage_meshes, schedule_edges, split_edges, stage_mesh, transfer_edge,
                                      with_skips)
from alpa_comm.topology import ClusterSpec
from alpa_comm.train.transport import ordered_transfers

GPT4 = [{}, {"h": 0}, {"h": 1}, {"h": 2}]  # gpt(4).consumes
UT4 = [{}, {"h": 0}, {"h": 1, "skip1": 1}, {"h": 2, "skip0": 0}]  # utransformer(4, half_layers=2).consumes
UT4_SKIPS = [(0, 3)]  # UT4's non-adjacent edge (PipelineModel.skips)


def names(edges):
    return sorted(e.name for e in edges)


def test_model_stages_sit_on_the_meshes_their_placement_names():
    assert model_stage_meshes(generate("zb-v", 2, 4)) == [0, 1, 1, 0]
    assert model_stage_meshes(generate("interleaved-1f1b", 2, 4, chunks=2)) == [0, 1, 0, 1]
    assert model_stage_meshes(generate("1f1b", 3, 4)) == [0, 1, 2]  # one chunk: each its own mesh


def test_edges_inside_a_mesh_are_local_hand_offs_and_get_no_plan():
    v = model_stage_meshes(generate("zb-v", 2, 4))
    planned, local = split_edges(model_edges(UT4), v)
    # the V's turn (1 -> 2, with the skip riding it) and the skip 0 -> 3 stay on a mesh
    assert names(local) == ["B:2->1", "B:3->0", "F:0->3", "F:1->2"]
    assert names(planned) == ["B:1->0", "B:3->2", "F:0->1", "F:2->3"]
    assert local_producers(UT4, v) == {0: [], 1: [], 2: [1], 3: [0]}
    loop = model_stage_meshes(generate("interleaved-1f1b", 2, 4, chunks=2))
    planned, local = split_edges(model_edges(UT4), loop)
    assert local == [] and "F:0->3" in names(planned)  # the skip crosses mesh 0 -> 1 beside F:0->1
    assert local_producers(GPT4, [0, 1, 2, 3]) == {v: [] for v in range(4)}  # one chunk: nothing local


def test_plans_join_the_meshes_of_their_model_stages_and_a_local_edge_is_refused():
    mesh_of, dp, k = [0, 1, 0, 1], 2, 2
    edges = split_edges(model_edges(GPT4), mesh_of)[0]
    shapes = {(s, "h"): (dp * k, 8, 16) for s in range(4)}
    plans = edge_plans(edges, shapes, "float32", dp, k, ClusterSpec(num_hosts=4, devices_per_host=k), "broadcast",
                       mesh_of=mesh_of)
    back = Edge("B", 2, 1, ("h",))  # model stage 2 (mesh 0) sends model stage 1 (mesh 1) its gradient
    (p,) = plans[back]
    assert p.src_mesh == stage_mesh(0, dp, k) and p.dst_mesh == stage_mesh(1, dp, k)
    assert edge_hosts(back, dp, mesh_of) == {0, 1, 2, 3} and edge_hosts(Edge("F", 0, 1, ("h",)), 1) == {0, 1}
    with pytest.raises(ValueError, match="edge F:1->2 joins two model stages on stage 1: a local hand-off"):
        edge_plans([Edge("F", 1, 2, ("h",))], shapes, "float32", dp, k, ClusterSpec(num_hosts=4, devices_per_host=k),
                   "broadcast", mesh_of=[0, 1, 1, 0])


def test_transfers_are_named_by_the_model_stages_they_join():
    s = with_skips(generate("interleaved-1f1b", 2, 4, chunks=2), UT4_SKIPS)
    validate(s)
    # stage 0 sends microbatch 0 to stage 1 twice: to model stage 1 (adjacent) and to 3 (the skip)
    sends = [transfer_edge(s.transfer_key(0, a)) for a in s.stages[0] if a.kind == "SEND_F" and a.mb == 0]
    assert sorted(sends) == ["F:0->1", "F:0->3", "F:2->3"]
    assert schedule_edges(s) == set(names(split_edges(model_edges(UT4), model_stage_meshes(s))[0]))
    assert transfer_edge(("B", 0, 1, 0, None)) == "B:1->0"  # one chunk: the stages are the model stages
    assert transfer_edge(("B", 0, 1, 0, 2)) == "B:3->2"     # boundary 2: gradients back from model stage 3


def test_a_virtual_schedule_without_the_models_skips_is_named_before_any_host_starts():
    s = generate("interleaved-1f1b", 2, 4, chunks=2)
    planned = split_edges(model_edges(UT4), model_stage_meshes(s))[0]
    with pytest.raises(ScheduleError, match=r"moves nothing over the model's edge\(s\) \['B:3->0', 'F:0->3'\]"):
        check_transfers(s, planned)
    check_transfers(with_skips(s, UT4_SKIPS), planned)
    with pytest.raises(ScheduleError, match=r"moves data over \['B:3->0', 'F:0->3'\], which the model has no edge"):
        check_transfers(with_skips(s, UT4_SKIPS), split_edges(model_edges(GPT4), model_stage_meshes(s))[0])


@pytest.mark.parametrize("kind", ["interleaved-1f1b", "zb-v", "dualpipev"])
def test_the_agreed_transfer_order_covers_virtual_stages(kind):
    """NCCL's mailbox (``OrderedMailbox``) runs each host's transfers in one order; over
    virtual stages each is keyed by its model-stage edge, every transfer once per side."""
    s = with_skips(generate(kind, 2, 4, chunks=2) if kind == "interleaved-1f1b" else generate(kind, 2, 4), UT4_SKIPS)
    edges = schedule_edges(s)
    per_stage = [ordered_transfers(s, i, edges) for i in range(2)]
    for order in per_stage:
        assert len(order) == len(set(order))
    sends = sorted((n, mb) for order in per_stage for n, mb, role in order if role == "send")
    recvs = sorted((n, mb) for order in per_stage for n, mb, role in order if role == "recv")
    assert sends == recvs and len(sends) == len(edges) * 4
    # the two stages meet their shared transfers in the same order
    shared = [[(n, mb) for n, mb, _ in order] for order in per_stage]
    assert shared[0] == shared[1]


# ------------------------------------------------------------------ --schedule auto over virtual stages
def _ranking(model, model_for, predict=None):
    import io

    from alpa_comm.pipeline import Costs
    from alpa_comm.train.trainer import TrainConfig, choose_schedule

    log = io.StringIO()
    cfg = TrainConfig(model="utransformer", stages=2, microbatches=4, schedule="auto")
    pick = choose_schedule(cfg, model, Costs(1.0, 2.0, 0.5), predict, log, model_for=model_for)
    return pick, log.getvalue()


def test_schedule_auto_ranks_virtual_stages_where_the_model_can_be_cut_per_chunk():
    from types import SimpleNamespace

    model = SimpleNamespace(num_stages=2, skips=[])  # 2 model stages: UT with its skip on the adjacent edge
    asked = []

    def model_for(n):
        asked.append(n)
        return SimpleNamespace(num_stages=n, skips=UT4_SKIPS)

    def loop_first(s):  # a predictor that favours the interleaved loop (skip 0 -> 3 crosses stages there)
        return 1.0 if s.name.startswith("interleaved") else 2.0

    pick, log = _ranking(model, model_for, loop_first)
    assert all(k in log for k in ("zb-v", "dualpipev", "interleaved-1f1b x2 chunks", "1f1b"))
    assert asked == [4]  # one model cut into 4 stages serves every 2-chunk candidate
    assert pick.schedule.virtual and "SEND_F0@1.1" in pick.schedule.to_text()  # with the 4-stage model's skip
    validate(pick.schedule)

    def too_few_layers(n):
        raise ValueError(f"2 layers cannot fill {n} stages")

    _, log = _ranking(model, too_few_layers)
    assert "zb-v" not in log and "dualpipev" not in log and "1f1b" in log
    _, log = _ranking(model, None)  # the in-process trainer: one-chunk families only
    assert "zb-v" not in log and "interleaved" not in log


def test_a_prediction_over_virtual_stages_charges_each_chunk_its_share():
    """Calibration measures one-chunk runs; a chunk of a 2-chunk schedule costs half a draw,
    as the simulator charges half a stage's cost (constant durations: the two agree)."""
    from alpa_comm.pipeline import simulate_schedule
    from alpa_comm.train.measure import costs_from, predict, stage_times

    recs = [[{"host": s, "stage": s, "events": [(k, 0, 0.0, d) for k, d in (("F", 1.0), ("B", 2.0), ("BI", 1.2),
                                                                                ("BW", 1.0))]} for s in range(2)]]
    edges = {"F:0->1": 0.25, "B:1->0": 0.25}
    for s in (generate("zb-v", 2, 4), generate("interleaved-1f1b", 2, 4, chunks=2)):
        costs = costs_from(stage_times(recs, 2), edges, 2)
        want = simulate_schedule(s, costs, shared_nic=True).iteration_time
        assert predict(s, recs, edges) == pytest.approx(want)


def _v_records(durations: dict, S: int = 2) -> list:
    """One step of a V-placed run over 2S model stages: host s runs model stages s and
    2S-1-s, each event labelled with its model stage, one microbatch."""
    per_host = []
    for s in range(S):
        ev, t = [], 0.0
        for v in (s, 2 * S - 1 - s):
            for kind in ("F", "BI", "BW"):
                d = durations[(v, kind)]
                ev.append((kind, 0, t, t + d, v))
                t += d
        per_host.append({"host": s, "stage": s, "events": ev, "transfers": []})
    return [per_host]


DUR = {(v, k): 1.0 + v + {"F": 0.0, "BI": 0.5, "BW": 0.25}[k] for v in range(4) for k in ("F", "BI", "BW")}


def test_a_prediction_from_a_run_over_the_same_model_cut_draws_each_model_stage_its_own():
    """Records of a V run (events labelled by model stage) predict that V schedule with
    each model stage's own durations, and another V schedule over the same cut too:
    DualPipeV's whole backwards are drawn as a BI plus a BW of the same model stage."""
    from alpa_comm.pipeline import simulate_schedule
    from alpa_comm.train.measure import costs_from, predict, stage_times

    recs = _v_records(DUR)
    edges = {"F:0->1": 0.3, "B:1->0": 0.2, "F:2->3": 0.4, "B:3->2": 0.1}  # 1 -> 2 is inside mesh 1
    for s in (generate("zb-v", 2, 4), generate("dualpipev", 2, 4)):
        costs = costs_from(stage_times(recs, 2), edges, 2, model_stage_meshes(s))

        def own(i, kind, mb, chunk, s=s):
            v = s.virtual_stage(i, chunk)
            return DUR[(v, "BI")] + DUR[(v, "BW")] if kind == "B" else DUR[(v, kind)]
        want = simulate_schedule(s, costs, shared_nic=True, action_time=own).iteration_time
        assert predict(s, recs, edges) == pytest.approx(want)


def test_stage_times_sum_a_stage_s_model_stages_and_edges_read_by_the_mesh_that_sends():
    from alpa_comm.train.measure import costs_from, stage_times

    times = stage_times(_v_records(DUR), 2, busy=False)
    assert times["F"] == pytest.approx([DUR[(0, "F")] + DUR[(3, "F")], DUR[(1, "F")] + DUR[(2, "F")]])
    costs = costs_from(times, {"F:2->3": 0.4, "B:3->2": 0.1}, 2, model_stage_meshes(generate("zb-v", 2, 4)))
    assert costs.t_comm == [0.0, 0.4]   # model stage 2 sits on mesh 1 in a V
    assert costs.t_comm_b == [0.1, 0.0]  # model stage 3 on mesh 0


def test_records_over_another_model_cut_are_refused_with_the_counts_named():
    from alpa_comm.train.measure import predict

    recs = [[{"host": 0, "stage": 0, "events": [("F", 0, 0.0, 1.0, 0), ("F", 0, 1.0, 2.0, 2)]},
             {"host": 1, "stage": 1, "events": [("F", 0, 0.0, 1.0, 1)]}]]
    with pytest.raises(ValueError, match="3 model stages; schedule 'zb-v' has 4"):
        predict(generate("zb-v", 2, 4), recs, {})


def test_a_measured_trace_names_the_model_stage_of_a_chunk():
    from alpa_comm.report.trace import chrome_trace

    trace = chrome_trace(_v_records(DUR))
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"F0", "F0 (model stage 3)", "BI0 (model stage 2)"} <= names and "F0 (model stage 0)" not in names


def test_the_link_bound_is_the_busiest_nic_s_bytes_over_its_rate_times_the_microbatches():
    """One host sends a 1 MB array to two others: its NIC pushes 1 MB per microbatch once
    (broadcast: the second receiver is fed by the first) or twice (send/recv); each
    receiver's NIC takes 1 MB in. At 8 Gbit/s (1e9 B/s) and 5 microbatches: 5 ms or 10 ms."""
    from alpa_comm.pipeline.edges import link_seconds
    from alpa_comm.resharding import plan_resharding
    from alpa_comm.topology import ClusterSpec

    spec = ClusterSpec(num_hosts=3, devices_per_host=1, nic_send_gbps=8.0)
    bcast = plan_resharding((250_000,), "float32", "1x1@0", "R", "2x1@1,2", "R", cluster=spec, strategy="broadcast")
    sendrecv = plan_resharding((250_000,), "float32", "1x1@0", "R", "2x1@1,2", "R", cluster=spec, strategy="send_recv")
    assert link_seconds([bcast], spec, 5) == pytest.approx(5e-3)
    assert link_seconds([sendrecv], spec, 5) == pytest.approx(10e-3)
    assert link_seconds([], spec, 5) == 0.0


def test_a_v_keeps_the_u_transformer_s_skips_off_the_links():
    """Planned offline (``plan_pipeline``): over the same 4-stage cut into 8 model stages,
    the loop placement sends every skip over a NIC, the V none, so its busiest NIC moves
    fewer bytes; GPT (no skips) moves the same in both."""
    from alpa_comm.models import build_model
    from alpa_comm.pipeline.edges import with_skips
    from alpa_comm.topology import ClusterSpec
    from alpa_comm.train.distributed import plan_pipeline

    kw = {"layers": 8, "d": 16, "heads": 2, "seq": 8}
    spec = ClusterSpec(num_hosts=4, devices_per_host=2, nic_send_gbps=1.0)

    def link(model, kind, chunks=None):
        s = generate(kind, 4, 8, chunks=chunks)
        s = with_skips(s, build_model(model, s.num_virtual_stages, **kw).skips)
        return plan_pipeline(model, kw, s, 4, 1, spec, "broadcast").link_seconds()
    assert link("utransformer", "zb-v") < link("utransformer", "interleaved-1f1b", 2)
    assert link("gpt", "zb-v") == pytest.approx(link("gpt", "interleaved-1f1b", 2))
