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
