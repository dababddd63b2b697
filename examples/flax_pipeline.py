"""A model of your own, written with flax, trained through alpa_comm's pipeline schedules.

    PYTHONPATH=. alpa-comm train --model examples.flax_pipeline:flax_model --cluster inprocess \
        --stages 3 --layers 3 --schedule zb-h1 --steps 5

``flax_model`` returns a ``PipelineModel``: one stage function per pipeline stage (each a
flax module's ``apply``), the parameters of each, and which stage each input comes from.
Nothing in alpa_comm knows these layers: the backward of every stage is split into its
input- and weight-gradient halves from its jaxpr (``alpa_comm.train.split_vjp``), so
ZB-H1 and delayed weight gradients (``--delay-wgrad``) train it as they train GPT.

The first stage embeds the bytes and runs a convolution; every stage runs its share of
residual MLP blocks (a layer norm, two dense layers); the last adds a layer norm, the
head and the cross-entropy loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from alpa_comm.models import PipelineModel
from alpa_comm.models.base import split_layers


class Embed(nn.Module):
    vocab: int
    d: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d)(tokens)
        return x + nn.Conv(self.d, (3,))(x)


class Block(nn.Module):
    d: int

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * self.d)(nn.LayerNorm()(x))
        return x + nn.Dense(self.d)(nn.gelu(h))


class Head(nn.Module):
    vocab: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


class Stage(nn.Module):
    first: bool
    last: bool
    blocks: int
    d: int
    vocab: int

    @nn.compact
    def __call__(self, x, tokens):
        if self.first:
            x = Embed(self.vocab, self.d)(tokens)
        for _ in range(self.blocks):
            x = Block(self.d)(x)
        return Head(self.vocab)(x) if self.last else x


def flax_model(num_stages: int, *, layers: int = 4, d: int = 32, heads: int = 4, seq: int = 16, vocab: int = 256,
               seed: int = 0) -> PipelineModel:
    """``layers`` residual blocks over ``num_stages`` stages (``heads`` is unused: no attention)."""
    groups = split_layers(layers, num_stages)
    keys = jax.random.split(jax.random.PRNGKey(seed), num_stages)
    stages, params, consumes = [], [], []
    for s, group in enumerate(groups):
        module = Stage(first=s == 0, last=s == num_stages - 1, blocks=len(group), d=d, vocab=vocab)
        x = jnp.zeros((1, seq, d))
        params.append(module.init(keys[s], x, jnp.zeros((1, seq), jnp.int32)))
        consumes.append({} if s == 0 else {"h": s - 1})
        stages.append(_stage_fn(module, s == 0, s == num_stages - 1, d))
    return PipelineModel("flax", stages, params, consumes)


def _stage_fn(module, first: bool, last: bool, d: int):
    def stage(p, inputs, batch):
        tokens = batch["tokens"]
        x = jnp.zeros(tokens.shape + (d,)) if first else inputs["h"]
        y = module.apply(p, x, tokens)
        if not last:
            return {"h": y}
        logp = jax.nn.log_softmax(y, axis=-1)
        return {"loss": -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()}
    return stage
