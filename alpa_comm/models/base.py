"""The pipeline model contract and the transformer pieces both models share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .._extras import require
from ..errors import InvalidOptionError

jax = require("jax")  # optional: a missing jax names its extra
jnp = require("jax.numpy")


@dataclass
class PipelineModel:
    """``stages[i](params[i], inputs, batch) -> outputs``.

    ``inputs`` holds the arrays named in ``consumes[i]`` (key -> producing stage);
    ``batch`` is the microbatch (``tokens``, ``targets``). The last stage returns
    ``{"loss": scalar}``. ``skips`` lists (producer, consumer) pairs that are not
    adjacent (U-Transformer skip connections).
    """

    name: str
    stages: list[Callable]
    params: list
    consumes: list[dict[str, int]]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def jitted(self, i: int):
        """Stage ``i`` compiled once (shapes are fixed per run)."""
        cache = self.__dict__.setdefault("_jit", {})
        if i not in cache:
            cache[i] = jax.jit(self.stages[i])
        return cache[i]

    @property
    def skips(self) -> list[tuple[int, int]]:
        return sorted({(src, dst) for dst, c in enumerate(self.consumes) for src in c.values() if src != dst - 1})

    def reference_loss(self, params, batch) -> jax.Array:
        """The whole model on one device: the stages composed in order."""
        outputs: dict[int, dict] = {}
        for i, stage in enumerate(self.stages):
            inputs = {k: outputs[src][k] for k, src in self.consumes[i].items()}
            outputs[i] = self.jitted(i)(params[i], inputs, batch)
        return outputs[len(self.stages) - 1]["loss"]


def layer_norm(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def init_block(key, d: int) -> dict:
    k = jax.random.split(key, 4)
    s = 0.02
    return {"ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)}, "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "qkv": jax.random.normal(k[0], (d, 3 * d)) * s, "out": jax.random.normal(k[1], (d, d)) * s,
            "mlp1": jax.random.normal(k[2], (d, 4 * d)) * s, "mlp2": jax.random.normal(k[3], (4 * d, d)) * s}


def block(p, x, heads: int):
    """Pre-LN transformer block with causal self-attention."""
    b, t, d = x.shape
    h = layer_norm(p["ln1"], x)
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for a in (q, k, v))
    att = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(d // heads)
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e9)
    att = jax.nn.softmax(att, axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + y @ p["out"]
    return x + jax.nn.gelu(layer_norm(p["ln2"], x) @ p["mlp1"]) @ p["mlp2"]


def cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    if num_layers < num_stages:
        raise InvalidOptionError(f"{num_layers} layers cannot fill {num_stages} stages")
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def embed_params(key, vocab: int, seq: int, d: int) -> dict:
    k1, k2 = jax.random.split(key)
    return {"tok": jax.random.normal(k1, (vocab, d)) * 0.02, "pos": jax.random.normal(k2, (seq, d)) * 0.02}


def head_params(d: int, vocab: int) -> dict:
    return {"ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)}, "head": jnp.zeros((d, vocab))}


def embed(p, batch):
    tokens = batch["tokens"]
    return p["tok"][tokens] + p["pos"][: tokens.shape[1]]


def head_loss(p, x, batch) -> dict:
    return {"loss": cross_entropy(layer_norm(p["ln_f"], x) @ p["head"], batch["targets"])}


def stage_params(num_layers: int, num_stages: int, d: int, vocab: int, seq: int, seed: int):
    """The layer groups of each stage and its parameters: its blocks, plus the embedding
    on the first stage and the head on the last."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_layers + 1)
    blocks = [init_block(keys[i], d) for i in range(num_layers)]
    groups = split_layers(num_layers, num_stages)
    params = []
    for s, rng in enumerate(groups):
        p = {"blocks": [blocks[i] for i in rng]}
        if s == 0:
            p.update(embed_params(keys[-1], vocab, seq, d))
        if s == num_stages - 1:
            p.update(head_params(d, vocab))
        params.append(p)
    return groups, params
