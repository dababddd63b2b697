"""Pipeline-ready models in pure JAX: a model is a list of stage functions
``stage(params, inputs, batch) -> outputs`` (dicts of arrays) plus, per stage,
which inputs come from which earlier stage. Importing needs jax."""
from .base import PipelineModel
from .gpt import gpt
from .utransformer import utransformer

__all__ = ["PipelineModel", "gpt", "utransformer"]
