"""The distributed pipeline trainer on the emulated cluster: every schedule and strategy
against the single-device reference step (loss and updated parameters), data
parallelism, bad requests."""
import numpy as np
import pytest

from alpa_comm.errors import InvalidOptionError
from alpa_comm.pipeline import generate
from alpa_comm.resharding.strategies import STRATEGIES, carries_data

from conftest import emulation_marks

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
jax = pytest.importorskip("jax")
pytest.importorskip("optax")

pytestmark = emulation_marks()

from alpa_comm.models import build_model  # noqa: E402
from alpa_comm.train.data import synthetic  # noqa: E402
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster  # noqa: E402
from alpa_comm.pipeline.edges import with_skips  # noqa: E402
from alpa_comm.train.local_pipeline import reference_step  # noqa: E402

KW = {"layers": 4, "d": 16, "heads": 2, "seq": 8}
LR = 0.5
# every family and every backward form (whole, split, split with a delayed weight gradient)
# once: test_train_local runs every combination against the single-device step in one process
VARIANTS = [("gpipe", False, None), ("1f1b", True, None), ("eager-1f1b", False, None), ("eager-1f1b", True, 1),
            ("zb-h1", True, None)]


@pytest.fixture(scope="module")
def cluster():
    with PipelineCluster.emulated(4, 2, nic="400mbit", timeout=30, log=None) as c:
        yield c


def _reference(model_name, num_stages, microbatches):
    model = build_model(model_name, num_stages, **KW)
    loss, grads = reference_step(model, [{k: jax.numpy.asarray(v) for k, v in mb.items()} for mb in microbatches])
    new = [jax.tree_util.tree_map(lambda p, g: np.asarray(p - LR * g), p, g) for p, g in zip(model.params, grads)]
    return float(loss), new


def _check(pipe, microbatches, ref_loss, ref_params):
    res = pipe.step(microbatches)
    assert res.loss == pytest.approx(ref_loss, rel=1e-5)
    for got, want in zip(pipe.stage_params(), ref_params):
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return res


@pytest.mark.parametrize("model_name", ["gpt", "utransformer"])
def test_every_schedule_and_strategy_matches_the_single_device_step(cluster, model_name):
    M = 4
    mbs = next(synthetic(M, 4, KW["seq"], seed=1))
    ref_loss, ref_params = _reference(model_name, 4, mbs)
    model = build_model(model_name, 4, **KW)
    # every kind the registry offers, on the U-Transformer: its skip edges carry two arrays
    # and bring two source meshes into one stage, which GPT's edges never do
    others = [s for s in STRATEGIES if s != "broadcast" and carries_data(s)] if model_name == "utransformer" else []
    runs = [(v, "broadcast") for v in VARIANTS] + [(("eager-1f1b", True, 1), s) for s in others]
    for (kind, split, delay), strategy in runs:
        sched = with_skips(generate(kind, 4, M, split_backward=split, delay_wgrad=delay), model.skips)
        pipe = DistributedPipeline(cluster, model_name, 4, sched, microbatch_size=4, model_kwargs=KW,
                                   strategy=strategy, optimizer="sgd", lr=LR)
        res = _check(pipe, mbs, ref_loss, ref_params)
        assert {r["stage"] for r in res.per_host} == {0, 1, 2, 3}
    # signal moves one byte per transfer: it runs the same schedule without the data
    sched = with_skips(generate("eager-1f1b", 4, M, split_backward=True, delay_wgrad=1), model.skips)
    pipe = DistributedPipeline(cluster, model_name, 4, sched, microbatch_size=4, model_kwargs=KW,
                               strategy="signal", optimizer="sgd", lr=LR)
    assert np.isfinite(pipe.step(mbs).loss)


def test_schedule_auto_calibrates_on_the_cluster_and_its_pick_trains_exactly(cluster, monkeypatch):
    """``--schedule auto`` on a U-Transformer (skip edges): the calibration run's measured
    durations rank every family; the pick, with its skip edges, matches the single-device step."""
    from alpa_comm.train import trainer
    from alpa_comm.train.trainer import TrainConfig, calibrate, choose_schedule

    monkeypatch.setattr(trainer, "CALIBRATION", ("eager-1f1b", 1))  # one timed step per run keeps CI short

    M = 6  # more microbatches than stages: the cap of 4 leaves out GPipe and eager-1F1B (6 and 7 deep)
    cfg = TrainConfig(model="utransformer", stages=4, layers=4, width=KW["d"], heads=KW["heads"], seq=KW["seq"],
                      microbatches=M, microbatch_size=4, schedule="auto", memory_cap=4.0, optimizer="sgd", lr=LR,
                      cluster="emulated")
    model = build_model("utransformer", 4, **KW)
    cal = calibrate(cfg, cluster, model, synthetic(M, 4, KW["seq"], seed=3), log=None)
    resolved = cal.costs.resolve(4)
    assert all(t > 0 for k in ("F", "B", "BI", "BW") for t in resolved[k])  # both calibration runs measured
    assert 0 < cal.wgrad_fraction <= 1.5
    pick = choose_schedule(cfg, model, cal.costs, cal.predict, None, cal.wgrad_fraction)
    assert pick.fits and pick.peak_activations <= 4.0
    assert pick.candidate.kind not in ("gpipe", "eager-1f1b")
    mbs = next(synthetic(M, 4, KW["seq"], seed=1))
    ref_loss, ref_params = _reference("utransformer", 4, mbs)
    pipe = DistributedPipeline(cluster, "utransformer", 4, pick.schedule, microbatch_size=4, model_kwargs=KW,
                               strategy="broadcast", optimizer="sgd", lr=LR)
    _check(pipe, mbs, ref_loss, ref_params)
    with pytest.raises(InvalidOptionError, match="no schedule fits the memory cap"):
        choose_schedule(TrainConfig(model="utransformer", stages=4, microbatches=M, schedule="auto", memory_cap=1.0),
                        model, cal.costs, cal.predict)


def test_data_parallel_stages_average_their_gradients(cluster):
    mbs = next(synthetic(3, 4, KW["seq"], seed=2))
    ref_loss, ref_params = _reference("gpt", 2, mbs)
    model = build_model("gpt", 2, **KW)
    sched = with_skips(generate("1f1b", 2, 3), model.skips)
    pipe = DistributedPipeline(cluster, "gpt", 2, sched, microbatch_size=4, model_kwargs=KW, dp=2,
                               strategy="broadcast", optimizer="sgd", lr=LR)
    res = _check(pipe, mbs, ref_loss, ref_params)
    assert sorted(r["host"] for r in res.per_host) == [0, 1, 2, 3]


def test_the_tcp_transport_trains_exactly_like_gloo(cluster):
    """alpa_comm's own TCP streams under the mailbox: a U-Transformer (skip edges, a
    delayed weight gradient) and a V schedule (two edges between one pair of meshes per
    microbatch) match the single-device step; the cluster joins the transport once."""
    mbs = next(synthetic(4, 4, KW["seq"], seed=1))
    ref_loss, ref_params = _reference("utransformer", 4, mbs)
    model = build_model("utransformer", 4, **KW)
    sched = with_skips(generate("eager-1f1b", 4, 4, split_backward=True, delay_wgrad=1), model.skips)
    pipe = DistributedPipeline(cluster, "utransformer", 4, sched, microbatch_size=4, model_kwargs=KW,
                               strategy="broadcast", optimizer="sgd", lr=LR, transport="tcp")
    res = _check(pipe, mbs, ref_loss, ref_params)
    assert "tcp" in cluster.transports and pipe.transport == "tcp"
    # the threads that move data name themselves, so a step's record counts them apart
    from alpa_comm.train.measure import comm_cpu_seconds
    names = {n for rec in res.per_host for n in rec["cpu_by_thread"]}
    assert any(n.startswith("tcp-") for n in names) and "mailbox" in names, names
    assert all(comm_cpu_seconds(rec) > 0 for rec in res.per_host)
    with pytest.MonkeyPatch.context() as mp:  # joined once: a second join asks no host
        mp.setattr(cluster, "_wait", lambda *a, **k: pytest.fail("joined the tcp transport twice"))
        cluster.join_transport("tcp")
    ref_loss, ref_params = _reference("gpt", 4, mbs)
    sched = with_skips(generate("zb-v", 2, 4), build_model("gpt", 4, **KW).skips)
    pipe = DistributedPipeline(cluster, "gpt", 2, sched, microbatch_size=4, model_kwargs=KW, strategy="broadcast",
                               optimizer="sgd", lr=LR, transport="tcp")
    _check(pipe, mbs, ref_loss, ref_params)
    assert pipe.time_edges(repeats=1).keys() == {e.name for e in pipe.edges}


def test_bad_pipeline_requests_name_the_value(cluster):
    model = build_model("gpt", 4, **KW)
    sched = with_skips(generate("1f1b", 4, 2), model.skips)
    with pytest.raises(ValueError, match="need 8 hosts"):
        DistributedPipeline(cluster, "gpt", 4, sched, microbatch_size=4, model_kwargs=KW, dp=2)
    with pytest.raises(ValueError, match="microbatch size 3"):
        DistributedPipeline(cluster, "gpt", 4, sched, microbatch_size=3, model_kwargs=KW)
    with pytest.raises(ValueError, match="unknown strategy 'carrier-pigeon'"):
        DistributedPipeline(cluster, "gpt", 4, sched, microbatch_size=4, model_kwargs=KW, strategy="carrier-pigeon")
    with pytest.raises(InvalidOptionError, match="unknown transport 'pigeon'; choose one of gloo, tcp"):
        DistributedPipeline(cluster, "gpt", 4, sched, microbatch_size=4, model_kwargs=KW, transport="pigeon")


# ------------------------------------------------------------------ virtual stages
def _reference_steps(model_name, num_model_stages, steps):
    """The single-device loss of each step and the parameters after them (SGD), by model stage."""
    model = build_model(model_name, num_model_stages, **KW)
    losses = []
    for mbs in steps:
        loss, grads = reference_step(model, [{k: jax.numpy.asarray(v) for k, v in mb.items()} for mb in mbs])
        model.params = [jax.tree_util.tree_map(lambda p, g: p - LR * g, p, g) for p, g in zip(model.params, grads)]
        losses.append(float(loss))
    return losses, [jax.tree_util.tree_map(np.asarray, p) for p in model.params]


@pytest.mark.parametrize("model_name,kind,dp,planned", [
    ("gpt", "zb-v", 1, {"F:0->1", "F:2->3"}),  # the V's turn 1 -> 2: a hand-off on stage 1, no plan
    ("utransformer", "interleaved-1f1b", 1, {"F:0->1", "F:1->2", "F:2->3", "F:0->3"}),
    ("gpt", "dualpipev", 2, {"F:0->1", "F:2->3"})])
def test_virtual_stages_train_exactly_on_the_cluster(cluster, model_name, kind, dp, planned):
    """2 stages x 2 chunks (4 model stages of one layer), two steps against the
    single-device steps: the loss of each and every model stage's parameters after both
    (the first step's head is zeros, so the second is the one whose block gradients are
    not). In a V the turn (1 -> 2) stays on stage 1 and the loss comes from stage 0; the
    U-Transformer's skip 0 -> 3 in the loop crosses stage 0 -> 1 beside the adjacent
    0 -> 1, same microbatch (two transfers the mailbox keys apart by model stage); with
    dp=2 each chunk's gradients are averaged over the stage's two hosts."""
    M, V = 4, 4
    steps = [next(synthetic(M, 4, KW["seq"], seed=s)) for s in (5, 6)]
    ref_losses, ref_params = _reference_steps(model_name, V, steps)
    skips = build_model(model_name, V, **KW).skips
    sched = with_skips(generate(kind, 2, M, chunks=2) if kind == "interleaved-1f1b" else generate(kind, 2, M), skips)
    pipe = DistributedPipeline(cluster, model_name, 2, sched, microbatch_size=4, model_kwargs=KW, dp=dp,
                               strategy="broadcast", optimizer="sgd", lr=LR)
    assert {e.name for e in pipe.edges if e.direction == "F"} == planned
    for mbs, want in zip(steps, ref_losses):
        res = pipe.step(mbs)
        assert res.loss == pytest.approx(want, rel=1e-5)
        assert {r["stage"] for r in res.per_host if r["losses"]} == {pipe.loss_stage}
    got = pipe.stage_params()
    assert len(got) == V
    for v, (g, w) in enumerate(zip(got, ref_params)):
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"model stage {v}")


def test_train_schedule_auto_can_pick_and_run_a_virtual_schedule(cluster, monkeypatch):
    """``alpa-comm train --schedule auto`` on a cluster ranks the virtual-stage schedules
    too (the model cut into 2 stages x 2 chunks), each predicted from the calibration's
    run over that cut with its own placement (loop: interleaved 1F1B, backward whole; V:
    ZB-V, split, DualPipeV's whole backwards drawn as the halves); a predictor that
    favours them makes them the finalists, the trial measures each (reusing the
    calibration's own runs of ZB-V and interleaved 1F1B, running the others), the measured
    fastest is the pick, and the run trains it: the first step's loss is the
    single-device one."""
    import contextlib

    from alpa_comm.pipeline import auto_schedule
    from alpa_comm.train import measure, trainer

    monkeypatch.setattr(trainer, "CALIBRATION", ("eager-1f1b", 1))  # one timed step per calibration run
    monkeypatch.setattr(auto_schedule, "TRIAL_ROUNDS", 1)  # one round: the rounds have tests of their own
    monkeypatch.setattr(trainer, "open_cluster", lambda cfg, log=None: contextlib.nullcontext(cluster))
    real = measure.predict
    seen = set()  # (placement, model stages, kinds) of the records each virtual schedule is predicted from

    def favour_virtual(s, records, *a, **k):
        if s.virtual:
            events = [e for per_host in records for rec in per_host for e in rec["events"] if e[0] != "UPDATE"]
            seen.add((s.placement, 1 + max(e[4] for e in events), frozenset(e[0] for e in events if e[0][0] in "FB")))
        return real(s, records, *a, **k) * (0.01 if s.virtual else 1.0)
    monkeypatch.setattr(measure, "predict", favour_virtual)
    trials = []
    real_trial = trainer.trial_finalists

    def recorded(*a, **k):
        trials.append(real_trial(*a, **k))
        return trials[-1]
    monkeypatch.setattr(trainer, "trial_finalists", recorded)
    cfg = trainer.TrainConfig(model="gpt", stages=2, layers=KW["layers"], width=KW["d"], heads=KW["heads"],
                              seq=KW["seq"], microbatches=4, microbatch_size=4, schedule="auto", optimizer="sgd",
                              lr=LR, cluster="emulated", data="synthetic", steps=2, timeout=30,
                              trial_margin=10.0)  # every virtual candidate (0.01x), no one-chunk one (1x)
    result = trainer.train(cfg, log=None)
    assert result.schedule.virtual and len(result.losses) == 2
    # from the calibration's own runs over 2 stages x 2 chunks, not halved one-chunk ones, by placement
    assert seen == {("loop", 4, frozenset({"F", "B"})), ("v", 4, frozenset({"F", "BI", "BW"}))}
    measured, = trials
    where = {label: got[1] for label, got in measured.items()}
    assert where == {"zb-v": "calibration", "interleaved-1f1b x2 chunks": "calibration", "dualpipev": "trial"}
    picked = [label for label in measured if label.split(" ")[0] == result.schedule.name.split(" ")[0]]
    assert picked and measured[picked[0]][0] <= min(v[0] for v in measured.values()) * (1 + auto_schedule.TIE)
    first = next(trainer.data_stream(cfg))
    ref_loss, _ = _reference_steps("gpt", 4, [first])
    assert result.losses[0] == pytest.approx(ref_loss[0], rel=1e-5)
