"""U-Transformer: 2L transformer layers where the output of layer i is added to the
input of layer 2L-1-i (as in the paper), cut into pipeline stages. Skip
connections cross stages, so a stage may consume from any earlier stage."""
from __future__ import annotations

from .base import PipelineModel, block, embed, head_loss, stage_params


def utransformer(num_stages: int, half_layers: int = 2, d: int = 32, heads: int = 4, vocab: int = 256,
                 seq: int = 16, seed: int = 0) -> PipelineModel:
    n = 2 * half_layers
    groups, params = stage_params(n, num_stages, d, vocab, seq, seed)
    stage_of = {layer: s for s, rng in enumerate(groups) for layer in rng}
    stages, consumes = [], []
    for s, rng in enumerate(groups):
        # layer i's output feeds layer 2L-1-i's input: name it skip<i>
        need = {f"skip{n - 1 - j}": stage_of[n - 1 - j] for j in rng if j >= half_layers
                and stage_of[n - 1 - j] != s}
        consumes.append(({} if s == 0 else {"h": s - 1}) | need)
        produce = [i for i in rng if i < half_layers and stage_of[n - 1 - i] != s]
        stages.append(_stage(s == 0, s == num_stages - 1, list(rng), n, heads, produce))
    return PipelineModel("utransformer", stages, params, consumes)


def _stage(first: bool, last: bool, layers: list[int], n: int, heads: int, produce: list[int]):
    def stage(p, inputs, batch):
        x = embed(p, batch) if first else inputs["h"]
        local = {}
        out = {}
        for bp, i in zip(p["blocks"], layers):
            partner = n - 1 - i
            if i >= n // 2:  # second half: add the mirrored layer's output to the input
                x = x + (local[partner] if partner in local else inputs[f"skip{partner}"])
            x = block(bp, x, heads)
            if i < n // 2:
                local[i] = x
                if i in produce:
                    out[f"skip{i}"] = x
        if last:
            return head_loss(p, x, batch)
        out["h"] = x
        return out
    return stage
