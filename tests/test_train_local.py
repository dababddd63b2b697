"""Every schedule computes exactly the single-device loss and gradients (GPT and
U-Transformer, skip connections across stages included)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from alpa_comm.models import gpt, utransformer  # noqa: E402
from alpa_comm.pipeline import ScheduleError, generate, validate  # noqa: E402
from alpa_comm.pipeline.edges import with_skips  # noqa: E402
from alpa_comm.train.local_pipeline import reference_step, run_schedule  # noqa: E402
from alpa_comm.train.programs import stage_programs  # noqa: E402

M = 4


def microbatches(vocab=256, seq=16, b=2, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(M):
        t = rng.integers(0, vocab, (b, seq + 1))
        out.append({"tokens": jnp.asarray(t[:, :-1], jnp.int32), "targets": jnp.asarray(t[:, 1:], jnp.int32)})
    return out


VARIANTS = [(k, split, delay) for k in ("gpipe", "1f1b", "eager-1f1b")
            for split, delay in ((False, None), (True, None), (True, 1))] + [("zb-h1", True, None)]


@pytest.mark.parametrize("model_fn,S,variants", [
    (lambda S: gpt(S, layers=4), 2, [("eager-1f1b", True, 1), ("zb-h1", True, None)]),  # two stages: the split forms
    (lambda S: gpt(S, layers=4), 4, VARIANTS),
    (lambda S: utransformer(S, half_layers=2), 4, VARIANTS),
    (lambda S: utransformer(S, half_layers=3), 3, VARIANTS)],
    ids=["gpt-2", "gpt-4", "utransformer-4", "utransformer-3"])
def test_every_schedule_matches_the_single_device_step(model_fn, S, variants):
    model = model_fn(S)
    mbs = microbatches()
    ref_loss, ref_grads = reference_step(model, mbs)
    for kind, split, delay in variants:
        sched = with_skips(generate(kind, S, M, split_backward=split, delay_wgrad=delay), model.skips)
        validate(sched)
        run = run_schedule(model, sched, mbs)
        assert run.loss == pytest.approx(float(ref_loss), rel=1e-5), (kind, split, delay)
        for g, r in zip(run.grads, ref_grads):
            for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(r)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_live_activations_follow_the_memory_model():
    model = gpt(4, layers=4)
    from alpa_comm.pipeline import memory
    for kind in ("1f1b", "eager-1f1b"):
        sched = generate(kind, 4, M)
        run = run_schedule(model, sched, microbatches())
        assert run.peak_live_activations == [int(m.peak_activations) for m in memory(sched)]


def test_a_schedule_missing_the_skip_edges_is_rejected():
    model = utransformer(4, half_layers=2)
    with pytest.raises(ScheduleError, match="without inputs \\['skip0'\\]"):
        run_schedule(model, generate("1f1b", 4, M), microbatches())


def test_train_cli_runs_and_writes(tmp_path, capsys):
    from alpa_comm.cli import main
    assert main(["train", "--model", "gpt", "--stages", "2", "--layers", "2", "--width", "32", "--seq", "16",
                 "--steps", "3", "--microbatches", "2", "--cluster", "inprocess", "--out", str(tmp_path)]) == 0
    assert "loss" in capsys.readouterr().out
    assert (tmp_path / "loss.png").exists() and (tmp_path / "loss.json").exists()
    assert main(["train", "--cluster", "inprocess", "--dp", "2", "--steps", "1"]) == 2
    assert "--dp 1" in capsys.readouterr().err
    assert main(["train", "--cluster", "inprocess", "--steps", "0"]) == 2
    assert "argument --steps: must be >= 1, got '0'" in capsys.readouterr().err
    assert main(["train", "--cluster", "moon", "--steps", "1"]) == 2
    assert "unknown cluster 'moon'" in capsys.readouterr().err
    assert main(["train", "--cluster", "inprocess", "--transport", "tcp", "--steps", "1"]) == 2
    assert "--transport tcp needs host workers" in capsys.readouterr().err
    assert main(["train", "--cluster", "local", "--transport", "pigeon", "--steps", "1"]) == 2
    assert "argument --transport: invalid choice: 'pigeon'" in capsys.readouterr().err


def test_a_bad_transport_is_named_before_any_process_starts():
    from alpa_comm.errors import InvalidOptionError
    from alpa_comm.runtime.backend import CommunicationError
    from alpa_comm.runtime.worker import HostWorker
    from alpa_comm.train.trainer import TrainConfig
    with pytest.raises(InvalidOptionError, match="--transport must be one of gloo, tcp, got 'udp'"):
        TrainConfig(cluster="local", transport="udp")
    worker = HostWorker(0, 2, 1)  # plain Python: no Ray, not connected
    with pytest.raises(ValueError, match="unknown transport 'udp'; choose one of gloo, tcp"):
        worker.join_transport("udp")
    with pytest.raises(CommunicationError, match="host 0: not connected"):
        worker.join_transport("tcp")
    with pytest.raises(CommunicationError, match="host 0: transport 'tcp' not joined"):
        worker.transport("tcp")


def test_train_cli_schedule_auto_prints_its_ranking(capsys):
    from alpa_comm.cli import main
    assert main(["train", "--model", "utransformer", "--stages", "2", "--layers", "2", "--width", "16", "--seq", "8",
                 "--steps", "2", "--microbatches", "4", "--cluster", "inprocess", "--schedule", "auto"]) == 0
    captured = capsys.readouterr()
    assert "--schedule auto" in captured.err and "picked " in captured.err and "loss" in captured.out
    assert main(["train", "--cluster", "inprocess", "--schedule", "1f1b", "--memory-cap", "2", "--steps", "1"]) == 2
    assert "--memory-cap applies to --schedule auto, not '1f1b'" in capsys.readouterr().err
    assert main(["train", "--cluster", "inprocess", "--schedule", "auto", "--delay-wgrad", "1", "--steps", "1"]) == 2
    assert "leave out --split-backward and --delay-wgrad" in capsys.readouterr().err
    assert main(["train", "--cluster", "local", "--schedule", "1f1b", "--trial-margin", "0.1", "--steps", "1"]) == 2
    assert "--trial-margin applies to --schedule auto, not '1f1b'" in capsys.readouterr().err
    assert main(["train", "--cluster", "inprocess", "--schedule", "auto", "--trial-margin", "0.1", "--steps", "1"]) == 2
    assert "--trial-margin needs host workers" in capsys.readouterr().err
    assert main(["train", "--cluster", "local", "--schedule", "auto", "--trial-margin", "-1", "--steps", "1"]) == 2
    assert "argument --trial-margin: must be >= 0, got '-1'" in capsys.readouterr().err


def test_split_backward_does_no_extra_work():
    """BI + BW cost what B costs (in XLA's flop count): the weight half reuses the
    input half's output gradients instead of recomputing them."""
    from alpa_comm.models import build_model

    m = build_model("utransformer", 2, layers=4, d=32, seq=8)
    P = stage_programs(m, 1)
    batch = {"tokens": jnp.zeros((2, 8), jnp.int32), "targets": jnp.zeros((2, 8), jnp.int32)}
    inputs = {k: jnp.ones((2, 8, 32)) * 0.1 for k in m.consumes[1]}
    out, state = P.forward(m.params[1], inputs, batch)
    ct = {"loss": jnp.asarray(1.0)}
    _, (bw, residuals) = P.backward_input(state, ct)

    def flops(f, *a):
        c = f.lower(*a).compile().cost_analysis()
        return (c[0] if isinstance(c, list) else c)["flops"]
    fused = jax.jit(lambda st, c: st[1](st[0](c)[1]))  # the whole backward as one program, for its flops
    b = flops(fused, state, ct)
    assert flops(P._bi, state[0], ct) + flops(P._bw, bw, residuals) == pytest.approx(b, rel=0.05)
    assert flops(P._bw, bw, residuals) > 0.25 * b  # the weight matmuls really moved to BW


def test_the_trial_measures_again_in_rounds_only_what_the_noise_cannot_separate(monkeypatch):
    """``trial_finalists``: a calibrated finalist starts from its calibration steps, the
    others get a trial round; then only the finalists within the noise of the fastest run
    again, at most ``TRIAL_ROUNDS`` rounds in all, and each reports the median of all its
    steps and where they came from."""
    from types import SimpleNamespace

    from alpa_comm.pipeline import auto_schedule
    from alpa_comm.train import distributed, trainer

    times = {"a": iter([10.1, 10.0] * 5), "b": iter([10.05, 10.15] * 5), "c": iter([12.0, 12.1] * 5)}
    built = []

    class FakePipeline:
        def __init__(self, cluster, model, stages, schedule, **kw):
            self.label = schedule.to_text()
            built.append(self.label)

        def step(self, batch):
            return SimpleNamespace(seconds=next(times[self.label]))

    monkeypatch.setattr(distributed, "DistributedPipeline", FakePipeline)

    def cand(label, predicted):
        return SimpleNamespace(candidate=SimpleNamespace(label=label), schedule=SimpleNamespace(to_text=lambda: label),
                               predicted_s=predicted, fits=True, peak_activations=4)

    ranked = [cand("a", 10.0), cand("b", 10.1), cand("c", 10.2), cand("d", 20.0)]  # d: beyond the margin
    cfg = trainer.TrainConfig(schedule="auto", cluster="local", steps=1)
    runs = [{"schedule": "a", "seconds": [10.2, 10.0, 10.1]}]
    got = trainer.trial_finalists(cfg, None, ranked, iter(range(100)), runs, margin=0.5)
    rounds = auto_schedule.TRIAL_ROUNDS
    # b and c: a first round each (one warm-up + TRIAL_STEPS); a and b, within the noise, again each round
    assert built == ["b", "c"] + ["a", "b"] * (rounds - 1)
    assert set(got) == {"a", "b", "c"}
    assert got["a"][1] == f"calibration + trial x{rounds - 1}" and got["b"][1] == f"trial x{rounds}"
    assert got["c"] == (pytest.approx(12.05), "trial")
