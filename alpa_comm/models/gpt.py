"""GPT: decoder-only transformer with learned positions and causal attention, cut
into pipeline stages (embedding on the first, head and loss on the last)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import PipelineModel, block, cross_entropy, init_block, layer_norm, split_layers


def gpt(num_stages: int, layers: int = 4, d: int = 32, heads: int = 4, vocab: int = 256, seq: int = 16,
        seed: int = 0) -> PipelineModel:
    if d % heads:
        raise ValueError(f"model width {d} is not divisible by {heads} heads")
    key = jax.random.PRNGKey(seed)
    keys = jax.random.split(key, layers + 2)
    blocks = [init_block(keys[i], d) for i in range(layers)]
    groups = split_layers(layers, num_stages)
    params, stages, consumes = [], [], []
    for s, rng in enumerate(groups):
        p = {"blocks": [blocks[i] for i in rng]}
        if s == 0:
            p["tok"] = jax.random.normal(keys[-2], (vocab, d)) * 0.02
            p["pos"] = jax.random.normal(keys[-1], (seq, d)) * 0.02
        if s == num_stages - 1:
            p["ln_f"] = {"scale": jnp.ones(d), "bias": jnp.zeros(d)}
            p["head"] = jnp.zeros((d, vocab))
        params.append(p)
        consumes.append({} if s == 0 else {"h": s - 1})
        stages.append(_stage(s == 0, s == num_stages - 1, heads))
    return PipelineModel("gpt", stages, params, consumes)


def _stage(first: bool, last: bool, heads: int):
    def stage(p, inputs, batch):
        if first:
            tokens = batch["tokens"]
            x = p["tok"][tokens] + p["pos"][: tokens.shape[1]]
        else:
            x = inputs["h"]
        for bp in p["blocks"]:
            x = block(bp, x, heads)
        if last:
            logits = layer_norm(p["ln_f"], x) @ p["head"]
            return {"loss": cross_entropy(logits, batch["targets"])}
        return {"h": x}
    return stage
