"""GPT: decoder-only transformer with learned positions and causal attention, cut
into pipeline stages (embedding on the first, head and loss on the last)."""
from __future__ import annotations

from ..errors import InvalidOptionError
from .base import PipelineModel, block, embed, head_loss, stage_params


def gpt(num_stages: int, layers: int = 4, d: int = 32, heads: int = 4, vocab: int = 256, seq: int = 16,
        seed: int = 0) -> PipelineModel:
    if d % heads:
        raise InvalidOptionError(f"model width {d} is not divisible by {heads} heads")
    groups, params = stage_params(layers, num_stages, d, vocab, seq, seed)
    stages, consumes = [], []
    for s, rng in enumerate(groups):
        consumes.append({} if s == 0 else {"h": s - 1})
        stages.append(_stage(s == 0, s == num_stages - 1, heads))
    return PipelineModel("gpt", stages, params, consumes)


def _stage(first: bool, last: bool, heads: int):
    def stage(p, inputs, batch):
        x = embed(p, batch) if first else inputs["h"]
        for bp in p["blocks"]:
            x = block(bp, x, heads)
        if last:
            return head_loss(p, x, batch)
        return {"h": x}
    return stage
