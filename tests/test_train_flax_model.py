"""A model the project did not write (flax layers: embedding, convolution, layer norms,
a dense layer applied twice) trains through every split-backward schedule with exactly
the single-device loss and gradients: the backward split comes from its jaxpr."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402
from flax import linen as nn  # noqa: E402

from alpa_comm.models import PipelineModel  # noqa: E402
from alpa_comm.pipeline import generate, validate  # noqa: E402
from alpa_comm.train.local_pipeline import reference_step, run_schedule  # noqa: E402

VOCAB, SEQ, D, M = 11, 6, 8, 4


class Encoder(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D)(tokens)
        x = nn.Conv(D, (3,))(x)
        return nn.gelu(nn.LayerNorm()(x))


class Shared(nn.Module):
    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(D)  # one module called twice: tied weights
        return nn.LayerNorm()(x + dense(nn.tanh(dense(x))))


class Head(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(VOCAB)(nn.LayerNorm(use_bias=False)(x))


def flax_pipeline() -> PipelineModel:
    enc, mid, head = Encoder(), Shared(), Head()
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    h = jnp.zeros((2, SEQ, D))
    params = [enc.init(keys[0], jnp.zeros((2, SEQ), jnp.int32)), mid.init(keys[1], h), head.init(keys[2], h)]

    def first(p, inputs, batch):
        return {"h": enc.apply(p, batch["tokens"])}

    def middle(p, inputs, batch):
        return {"h": mid.apply(p, inputs["h"])}

    def last(p, inputs, batch):
        logp = jax.nn.log_softmax(head.apply(p, inputs["h"]), axis=-1)
        return {"loss": -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()}

    return PipelineModel("flax", [first, middle, last], params, [{}, {"h": 0}, {"h": 1}])


def _microbatches():
    rng = np.random.default_rng(3)
    return [{"tokens": jnp.asarray(rng.integers(0, VOCAB, (2, SEQ)), jnp.int32),
             "targets": jnp.asarray(rng.integers(0, VOCAB, (2, SEQ)), jnp.int32)} for _ in range(M)]


@pytest.mark.parametrize("kind,split,delay", [("1f1b", False, None), ("1f1b", True, None),
                                              ("eager-1f1b", True, 1), ("zb-h1", True, None)])
def test_a_flax_model_trains_through_split_backward_schedules(kind, split, delay):
    model, mbs = flax_pipeline(), _microbatches()
    ref_loss, ref_grads = reference_step(model, mbs)
    schedule = generate(kind, model.num_stages, M, split_backward=split, delay_wgrad=delay)
    validate(schedule)
    run = run_schedule(model, schedule, mbs)
    assert run.loss == pytest.approx(float(ref_loss), rel=1e-5)
    for got, want in zip(run.grads, ref_grads):
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_alpa_comm_train_takes_a_model_of_your_own():
    """``--model package.module:function``: the example flax model trains under ZB-H1 and
    delayed eager-1F1B from the command line; a bad name is one line and exit code 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    for schedule in (["--schedule", "zb-h1"], ["--schedule", "eager-1f1b", "--delay-wgrad", "1"]):
        done = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "train", "--model",
                               "examples.flax_pipeline:flax_model", "--cluster", "inprocess", "--stages", "3",
                               "--layers", "3", "--steps", "4", *schedule], capture_output=True, text=True,
                              timeout=300, env=env, cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
        first, last = (float(x) for x in done.stdout.split("loss ")[1].split(" over")[0].split(" -> "))
        assert last < first, done.stdout
    bad = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "train", "--model", "moon", "--cluster", "inprocess"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "must be gpt, utransformer or package.module:function, got 'moon'" in bad.stderr


def test_a_model_of_your_own_is_checked_when_built(tmp_path, monkeypatch):
    from alpa_comm.models import build_model

    (tmp_path / "my_models.py").write_text(
        "from examples.flax_pipeline import flax_model\n"
        "def not_a_model(num_stages, **kw):\n    return 42\n"
        "def two_stages(num_stages, **kw):\n    return flax_model(2, **kw)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        build_model("no_such_module:f", 2)
    with pytest.raises(ValueError, match="'my_models' has no function 'missing'"):
        build_model("my_models:missing", 2)
    with pytest.raises(ValueError, match="returned int, not a PipelineModel"):
        build_model("my_models:not_a_model", 2)
    with pytest.raises(ValueError, match="was asked for 3 stages and has 2"):
        build_model("my_models:two_stages", 3)
    assert build_model("my_models:two_stages", 2, layers=2).num_stages == 2
