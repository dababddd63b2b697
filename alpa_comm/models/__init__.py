"""Pipeline-ready models in pure JAX: a model is a list of stage functions
``stage(params, inputs, batch) -> outputs`` (dicts of arrays) plus, per stage,
which inputs come from which earlier stage. Importing needs jax."""
from ..errors import InvalidOptionError
from .base import PipelineModel
from .gpt import gpt
from .utransformer import utransformer

MODELS = ("gpt", "utransformer")


def build_model(name: str, num_stages: int, layers: int = 4, d: int = 32, heads: int = 4, seq: int = 16,
                vocab: int = 256, seed: int = 0) -> PipelineModel:
    """A model by name; ``layers`` counts all transformer layers (a U-Transformer's 2L).
    Host workers rebuild the same model from these arguments (same seed, same weights).

    ``name`` may also be ``"package.module:function"``, a model of your own: the function
    is called as ``function(num_stages, layers=, d=, heads=, seq=, vocab=, seed=)`` and
    returns a ``PipelineModel`` whose stages take the batch ``{"tokens", "targets"}``
    (int32, ``(rows, seq)``) and whose last stage returns ``{"loss": scalar}``. Each
    worker imports the module, so it must be importable there (installed, or on
    ``PYTHONPATH``). Its backward is split by ``alpa_comm.train.split_vjp``, so every
    schedule, ZB-H1 and delayed weight gradients included, trains it."""
    if name == "gpt":
        return gpt(num_stages, layers=layers, d=d, heads=heads, vocab=vocab, seq=seq, seed=seed)
    if name == "utransformer":
        if layers % 2:
            raise InvalidOptionError(f"a U-Transformer has an even number of layers (2L), got {layers}")
        return utransformer(num_stages, half_layers=layers // 2, d=d, heads=heads, vocab=vocab, seq=seq, seed=seed)
    if ":" in name:
        return _user_model(name, num_stages, dict(layers=layers, d=d, heads=heads, seq=seq, vocab=vocab, seed=seed))
    raise InvalidOptionError(f"unknown model {name!r}; choose one of {', '.join(MODELS)} or 'package.module:function'")


def _user_model(name: str, num_stages: int, kwargs: dict) -> PipelineModel:
    import importlib  # noqa: PLC0415

    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidOptionError(f"model {name!r}: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InvalidOptionError(f"model {name!r}: {module_name!r} has no function {attr!r}")
    model = fn(num_stages, **kwargs)
    if not isinstance(model, PipelineModel):
        raise InvalidOptionError(f"model {name!r} returned {type(model).__name__}, not a PipelineModel")
    if model.num_stages != num_stages or len(model.params) != num_stages or len(model.consumes) != num_stages:
        raise InvalidOptionError(f"model {name!r} was asked for {num_stages} stages and has {model.num_stages} "
                                 f"(params for {len(model.params)}, consumes for {len(model.consumes)})")
    return model


__all__ = ["MODELS", "PipelineModel", "build_model", "gpt", "utransformer"]
