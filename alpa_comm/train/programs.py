"""Each stage's compiled forward/backward programs, built once per model.

Kept in the trainer rather than on ``PipelineModel`` so that models (the layer
below) never import the runtime that executes them.
"""
from __future__ import annotations

from ..models.base import PipelineModel
from .stage_runner import StagePrograms


def stage_programs(model: PipelineModel, stage: int) -> StagePrograms:
    """Stage ``stage``'s programs for ``model`` (cached on the model object)."""
    cache = model.__dict__.setdefault("_programs", {})
    if stage not in cache:
        cache[stage] = StagePrograms(model.stages[stage])
    return cache[stage]
