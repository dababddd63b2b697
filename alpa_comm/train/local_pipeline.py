"""Execute a pipeline schedule for real, with JAX, in one process.

Every stage is a ``StageRunner`` (the same one the distributed runtime runs in
each host worker); here an in-process mailbox replaces cross-mesh resharding.
It proves a schedule computes exactly the single-device loss and gradients, and
it is the fast reference the distributed runtime is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax

from ..models.base import PipelineModel
from ..pipeline.ir import Schedule, ScheduleError
from ..pipeline.validate import reject_virtual
from .programs import stage_programs
from .stage_runner import StageRunner, consumers_of


@dataclass
class PipelineRun:
    loss: float
    grads: list
    microbatch_losses: list[float] = field(default_factory=list)
    peak_live_activations: list[int] = field(default_factory=list)  # microbatches with a live VJP, per stage
    peak_live_bytes: list[int] = field(default_factory=list)


class InProcessMailbox:
    """Arrays handed between stages of one process; a RECV finds them or reports not yet."""

    def __init__(self):
        self.boxes: dict[tuple, dict] = {}

    def send(self, direction, src, dst, mb, arrays):
        self.boxes[(direction, src, dst, mb)] = arrays

    def recv(self, direction, src, dst, mb, block):
        got = self.boxes.pop((direction, src, dst, mb), None)
        if got is None and block:
            raise ScheduleError(f"stage {dst}: RECV_{direction}{mb}@{src} has nothing to receive")
        return got


def run_schedule(model: PipelineModel, schedule: Schedule, microbatches: list[dict]) -> PipelineRun:
    """Run one training step's forward and backward under ``schedule``: every stage's
    ``StageRunner`` in one loop, round-robin, each going as far as its RECVs allow."""
    S, M = model.num_stages, len(microbatches)
    reject_virtual(schedule)
    if schedule.num_stages != S:
        raise ScheduleError(f"the schedule has {schedule.num_stages} stages, the model {S}")
    if schedule.num_microbatches != M:
        raise ScheduleError(f"the schedule has {schedule.num_microbatches} microbatches, {M} were given")
    mailbox = InProcessMailbox()
    runners = [StageRunner(i, S, stage_programs(model, i), model.consumes[i], consumers_of(model.consumes, i), mailbox)
               for i in range(S)]
    for i, r in enumerate(runners):
        r.begin(model.params[i], microbatches)
    pc = [0] * S
    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for i in range(S):
            acts = schedule.stages[i]
            while pc[i] < len(acts) and runners[i].run(acts[pc[i]], schedule.peer(i, acts[pc[i]]), block=False):
                pc[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [f"stage {i} at {schedule.stages[i][pc[i]]}" for i in range(S) if pc[i] < len(schedule.stages[i])]
            raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    records = [r.finish() for r in runners]
    losses = [records[-1].losses[m] for m in range(M)]
    return PipelineRun(sum(losses) / M, [r.grads for r in runners], losses, [r.peak_live for r in records],
                       [r.peak_live_bytes for r in records])


def reference_step(model: PipelineModel, microbatches: list[dict]):
    """Loss (mean over microbatches) and gradients on one device, no pipeline."""
    def loss_fn(params):
        return sum(model.reference_loss(params, b) for b in microbatches) / len(microbatches)

    return jax.value_and_grad(loss_fn)(model.params)
