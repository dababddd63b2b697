"""``StageSetup``: everything a pipeline worker needs to build its stage replica.

The driver plans once and ships one of these to every host; it is plain data
(no JAX objects), so it travels through Ray as it is and a worker's set-up
reads named, typed fields instead of a dictionary's keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..pipeline.ir import Schedule
from ..resharding.host_job import HostJob
from ..resharding.strategies import carries_data


@dataclass(frozen=True)
class StageSetup:
    stage: int
    replica: int                 # which of the stage's ``dp`` data-parallel hosts this is
    dp: int
    num_stages: int
    model: str                   # a ``models.build_model`` name
    model_kwargs: dict
    schedule: Schedule
    jobs: dict[str, list[HostJob]]   # edge name -> this host's job per key
    edge_index: dict[str, int]       # edge name -> small integer, the same on every host (tags)
    edge_keys: dict[str, list[str]]  # edge name -> the arrays it carries
    timeout: float
    strategy: str
    optimizer: str
    lr: float
    input_shapes: dict[str, tuple] = field(default_factory=dict)  # per consumed key, this replica's share
    batch_shape: tuple = ()

    @property
    def moves_data(self) -> bool:
        """False for ``signal``: edges then deliver zeros and the stages compute on them."""
        return carries_data(self.strategy)
