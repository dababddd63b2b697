"""``StageSetup``: everything a pipeline worker needs to build its stage replica.

The driver plans once and ships one of these to every host; it is plain data
(no JAX objects), so it travels through Ray as it is and a worker's set-up
reads named, typed fields instead of a dictionary's keys. With virtual stages a
stage's mesh runs several model stages (``model_stages``); ``jobs`` and the edges
then join model stages.
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
    # per model stage of this mesh, per consumed key: this replica's share
    input_shapes: dict[int, dict[str, tuple]] = field(default_factory=dict)
    batch_shape: tuple = ()
    transport: str = "gloo"      # what the mailbox moves transfers over (``runtime.worker.TRANSPORTS``)

    @property
    def model_stages(self) -> list[int]:
        """The model stages this stage's mesh runs, by chunk: one without virtual stages
        (the stage itself), several with them (``Schedule.virtual_stage``)."""
        return [self.schedule.virtual_stage(self.stage, c) for c in range(self.schedule.num_chunks)]

    @property
    def num_model_stages(self) -> int:
        """How many stages the model is built with: one per chunk of every stage."""
        return self.schedule.num_virtual_stages

    @property
    def moves_data(self) -> bool:
        """False for ``signal``: edges then deliver zeros and the stages compute on them."""
        return carries_data(self.strategy)
