"""Pipeline-ready models in pure JAX: a model is a list of stage functions
``stage(params, inputs, batch) -> outputs`` (dicts of arrays) plus, per stage,
which inputs come from which earlier stage. Importing needs jax."""
from .base import PipelineModel
from .gpt import gpt
from .utransformer import utransformer

MODELS = ("gpt", "utransformer")


def build_model(name: str, num_stages: int, layers: int = 4, d: int = 32, heads: int = 4, seq: int = 16,
                vocab: int = 256, seed: int = 0) -> PipelineModel:
    """A model by name; ``layers`` counts all transformer layers (a U-Transformer's 2L).
    Host workers rebuild the same model from these arguments (same seed, same weights)."""
    if name == "gpt":
        return gpt(num_stages, layers=layers, d=d, heads=heads, vocab=vocab, seq=seq, seed=seed)
    if name == "utransformer":
        if layers % 2:
            raise ValueError(f"a U-Transformer has an even number of layers (2L), got {layers}")
        return utransformer(num_stages, half_layers=layers // 2, d=d, heads=heads, vocab=vocab, seq=seq, seed=seed)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


__all__ = ["MODELS", "PipelineModel", "build_model", "gpt", "utransformer"]
