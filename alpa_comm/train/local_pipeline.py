"""Execute a pipeline schedule for real, with JAX, in one process.

Every model stage is a ``StageRunner`` (the same one the distributed runtime runs in
each host worker); here an in-process mailbox replaces cross-mesh resharding.
It proves a schedule computes exactly the single-device loss and gradients, and
it is the fast reference the distributed runtime is tested against.

Schedules over virtual stages (``interleaved-1f1b``, ``zb-v``, ``dualpipev``) run too:
the model is built with one model stage per chunk (``build_model(name, S * C)``), and
each stage's actions go to the runner of their chunk's model stage
(``Schedule.virtual_stage``). Transfers are keyed by the model stages they join, so
two between the same stages for one microbatch never meet. Model stages on one stage
(a V's turn, a skip that stays inside a stage) hand over locally, with no action in
the schedule: a consumer's ``F m`` takes the outputs of its producers on its stage
(their ``F m`` must have run), a producer's backward of ``m`` takes the input
gradients of its consumers on its stage (their backward of ``m`` must have run).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._extras import require
from ..models.base import PipelineModel
from ..pipeline.edges import local_producers, model_stage_meshes
from ..pipeline.ir import Action, ActionKind, Schedule, ScheduleError
from .programs import stage_programs
from .stage_runner import StageRunner, consumers_of

jax = require("jax")  # optional: a missing jax names its extra


@dataclass
class PipelineRun:
    """One step's loss and gradients (one entry per model stage). Peak memory is per
    stage (mesh), over all of its chunks: ``peak_live_activations`` counts the
    (microbatch, chunk) pairs whose activation state (forward residuals, then the
    weight-gradient state after ``BI``) is alive at once, so one chunk's microbatch is
    one; without virtual stages that is microbatches with a live VJP. It is
    ``C * memory(schedule, wgrad_fraction=1)`` in the memory model's whole-stage units.
    ``peak_live_bytes`` is the same peak in bytes."""

    loss: float
    grads: list
    microbatch_losses: list[float] = field(default_factory=list)
    peak_live_activations: list[int] = field(default_factory=list)  # chunk-microbatches, per stage
    peak_live_bytes: list[int] = field(default_factory=list)


class InProcessMailbox:
    """Arrays handed between model stages of one process, keyed by (direction, source
    model stage, destination model stage, microbatch); a RECV finds them or reports not yet."""

    def __init__(self):
        self.boxes: dict[tuple, dict] = {}

    def send(self, direction, src, dst, mb, arrays):
        self.boxes[(direction, src, dst, mb)] = arrays

    def recv(self, direction, src, dst, mb, block):
        got = self.boxes.pop((direction, src, dst, mb), None)
        if got is None and block:
            raise ScheduleError(f"stage {dst}: RECV_{direction}{mb}@{src} has nothing to receive")
        return got


def check_sizes(model: PipelineModel, schedule: Schedule) -> None:
    """The model has one model stage per chunk of the schedule, or the two numbers are named."""
    V = model.num_stages
    if schedule.virtual:
        if schedule.num_virtual_stages != V:
            raise ScheduleError(f"the schedule has {schedule.num_stages} stages x {schedule.num_chunks} chunks = "
                                f"{schedule.num_virtual_stages} model stages, the model {V}: build the model "
                                f"with {schedule.num_virtual_stages} stages")
    elif schedule.num_stages != V:
        raise ScheduleError(f"the schedule has {schedule.num_stages} stages, the model {V}")


class LocalHandoffs:
    """The hand-overs between model stages on one stage, which no action of the schedule
    names: the in-process runner and the distributed worker (one runner per chunk of its
    mesh) both call ``before`` ahead of every compute action, so the two cannot disagree."""

    def __init__(self, consumes: list[dict[str, int]], schedule: Schedule):
        self.schedule = schedule
        self.producers = local_producers(consumes, model_stage_meshes(schedule))
        V = len(consumes)
        self.consumers = {u: [v for v in range(V) if u in self.producers[v]] for u in range(V)}

    def before(self, stage: int, a: Action, runners) -> None:
        """Before compute action ``a`` of ``stage``: a consumer's ``F m`` takes the outputs of
        its producers on this stage, a producer's backward of ``m`` the input gradients of
        its consumers here. ``runners`` maps model stage -> ``StageRunner`` (those of this
        stage at least). Raises ``ScheduleError`` where the other side has not run yet."""
        schedule = self.schedule
        v = schedule.virtual_stage(stage, a.chunk)
        r = runners[v]
        if a.kind is ActionKind.F:
            for u in self.producers[v]:
                if a.mb not in runners[u].outputs:
                    raise ScheduleError(f"stage {stage}: {a} (model stage {v}) runs before "
                                        f"F{a.mb}{_chunk(schedule, u)} (model stage {u}), whose outputs it takes "
                                        "on this stage")
                r.take("F", a.mb, runners[u].outputs_for(a.mb, v))
        elif a.kind in (ActionKind.B, ActionKind.BI):
            for w in self.consumers[v]:
                if a.mb not in runners[w].gx:
                    raise ScheduleError(f"stage {stage}: {a} (model stage {v}) runs before the backward of microbatch "
                                        f"{a.mb} of model stage {w} (chunk {schedule.place(w)[1]}), whose input "
                                        "gradients it takes on this stage")
                r.take("B", a.mb, runners[w].input_grads_for(a.mb, v))


def run_schedule(model: PipelineModel, schedule: Schedule, microbatches: list[dict]) -> PipelineRun:
    """Run one training step's forward and backward under ``schedule``: every model
    stage's ``StageRunner`` in one loop, stage by stage round-robin, each stage going as
    far as its RECVs allow."""
    V, M = model.num_stages, len(microbatches)
    check_sizes(model, schedule)
    S = schedule.num_stages
    if schedule.num_microbatches != M:
        raise ScheduleError(f"the schedule has {schedule.num_microbatches} microbatches, {M} were given")
    mailbox = InProcessMailbox()
    runners = [StageRunner(v, V, stage_programs(model, v), model.consumes[v], consumers_of(model.consumes, v),
                           mailbox) for v in range(V)]
    for v, r in enumerate(runners):
        r.begin(model.params[v], microbatches)
    handoffs = LocalHandoffs(model.consumes, schedule)
    on_stage = [[schedule.virtual_stage(i, c) for c in range(schedule.num_chunks)] for i in range(S)]
    peak = [[0, 0] for _ in range(S)]

    def step(i: int, a: Action) -> bool:
        v = schedule.virtual_stage(i, a.chunk)
        r = runners[v]
        if a.kind.is_comm:
            return r.run(a, schedule.peer_virtual_stage(i, a), block=False)
        handoffs.before(i, a, runners)
        r.run(a, -1)
        live = [runners[u].live for u in on_stage[i]]
        peak[i][0] = max(peak[i][0], sum(n for n, _ in live))
        peak[i][1] = max(peak[i][1], sum(b for _, b in live))
        return True

    pc = [0] * S
    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for i in range(S):
            acts = schedule.stages[i]
            while pc[i] < len(acts) and step(i, acts[pc[i]]):
                pc[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [f"stage {i} at {schedule.stages[i][pc[i]]}" for i in range(S) if pc[i] < len(schedule.stages[i])]
            raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    records = [r.finish() for r in runners]
    losses = [records[-1].losses[m] for m in range(M)]
    return PipelineRun(sum(losses) / M, [r.grads for r in runners], losses, [p[0] for p in peak],
                       [p[1] for p in peak])


def _chunk(schedule: Schedule, v: int) -> str:
    c = schedule.place(v)[1]
    return f".{c}" if c else ""


def reference_step(model: PipelineModel, microbatches: list[dict]):
    """Loss (mean over microbatches) and gradients on one device, no pipeline."""
    def loss_fn(params):
        return sum(model.reference_loss(params, b) for b in microbatches) / len(microbatches)

    return jax.value_and_grad(loss_fn)(model.params)
