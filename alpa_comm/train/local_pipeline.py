"""Execute a pipeline schedule for real, with JAX, in one process.

Every action of the schedule IR runs as it would on a stage's mesh: ``F``
computes the stage and keeps its VJP; ``B`` applies it (``BI`` only the
input-gradient half, ``BW`` the weight-gradient half, from the same VJP);
``SEND``/``RECV`` hand named arrays between stages and block until data
arrived. Gradients accumulate over microbatches (the loss is the mean over
microbatches). The distributed runtime will run the same loop per stage with
cross-mesh resharding in place of the in-process handoff; this executor is the
reference it is tested against, and it proves a schedule computes exactly the
single-device loss and gradients.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from ..models.base import PipelineModel
from ..pipeline.ir import Action, Schedule, ScheduleError


def with_skips(schedule: Schedule, model: PipelineModel) -> Schedule:
    """Add SEND/RECV actions (with explicit peers) for the model's non-adjacent edges."""
    stages = [list(s) for s in schedule.stages]
    for src, dst in model.skips:
        for i, peer, kinds in ((src, dst, ("SEND_F", "RECV_B")), (dst, src, ("RECV_F", "SEND_B"))):
            out = []
            for a in stages[i]:
                if a.kind == "F":
                    if kinds[0] == "RECV_F":
                        out.append(Action("RECV_F", a.mb, peer))
                    out.append(a)
                    if kinds[0] == "SEND_F":
                        out.append(Action("SEND_F", a.mb, peer))
                elif a.kind in ("B", "BI"):
                    if kinds[1] == "RECV_B":
                        out.append(Action("RECV_B", a.mb, peer))
                    out.append(a)
                    if kinds[1] == "SEND_B":
                        out.append(Action("SEND_B", a.mb, peer))
                else:
                    out.append(a)
            stages[i] = out
    return Schedule(tuple(tuple(s) for s in stages), schedule.name + (" +skips" if model.skips else ""))


@dataclass
class PipelineRun:
    loss: float
    grads: list
    microbatch_losses: list[float] = field(default_factory=list)
    peak_live_activations: list[int] = field(default_factory=list)  # microbatches with a live VJP, per stage


def _add(a, b):
    return b if a is None else jax.tree_util.tree_map(jnp.add, a, b)


def run_schedule(model: PipelineModel, schedule: Schedule, microbatches: list[dict]) -> PipelineRun:
    """Run one training step's forward and backward under ``schedule``."""
    S, M = model.num_stages, len(microbatches)
    if schedule.num_stages != S:
        raise ScheduleError(f"the schedule has {schedule.num_stages} stages, the model {S}")
    if schedule.num_microbatches != M:
        raise ScheduleError(f"the schedule has {schedule.num_microbatches} microbatches, {M} were given")
    consumers: dict[int, dict[int, list[str]]] = {i: {} for i in range(S)}  # producer -> consumer -> keys
    for j, c in enumerate(model.consumes):
        for key, i in c.items():
            consumers[i].setdefault(j, []).append(key)
    vjps, cts, gx_of, outputs = {}, {}, {}, {}
    inbox_f: dict[tuple[int, int], dict] = {}
    inbox_b: dict[tuple[int, int], dict] = {}
    sent: set[tuple] = set()
    grads = [None] * S
    losses = [0.0] * M
    live = [0] * S
    peak = [0] * S
    pc = [0] * S

    def forward(i, m):
        inputs = inbox_f.get((i, m), {})
        missing = set(model.consumes[i]) - set(inputs)
        if missing:
            raise ScheduleError(f"stage {i}: F{m} runs without inputs {sorted(missing)} (a RECV_F is missing)")
        batch = microbatches[m]
        stage = model.jitted(i)
        out, vjp = jax.vjp(lambda p, x: stage(p, x, batch), model.params[i], inputs)
        vjps[(i, m)], outputs[(i, m)] = vjp, out
        live[i] += 1
        peak[i] = max(peak[i], live[i])
        if i == S - 1:
            losses[m] = float(out["loss"])

    def cotangent(i, m):
        out = outputs[(i, m)]
        if i == S - 1:
            return {"loss": jnp.asarray(1.0 / M, out["loss"].dtype)}
        got = inbox_b.get((i, m), {})
        missing = set(out) - set(got)
        if missing:
            raise ScheduleError(f"stage {i}: backward of microbatch {m} runs without gradients for {sorted(missing)}")
        return {k: got[k] for k in out}

    def step(i, a: Action) -> bool:
        m = a.mb
        if a.kind == "F":
            forward(i, m)
        elif a.kind in ("B", "BI"):
            ct = cotangent(i, m)
            gp, gx = vjps[(i, m)](ct)
            gx_of[(i, m)] = gx
            if a.kind == "B":
                grads[i] = _add(grads[i], gp)
                del vjps[(i, m)]
                live[i] -= 1
            else:
                cts[(i, m)] = ct
        elif a.kind == "BW":
            gp, _ = vjps.pop((i, m))(cts.pop((i, m)))
            grads[i] = _add(grads[i], gp)
            live[i] -= 1
        elif a.kind == "SEND_F":
            j = schedule.peer(i, a)
            inbox_f.setdefault((j, m), {}).update({k: outputs[(i, m)][k] for k in consumers[i].get(j, [])})
            sent.add(("F", i, j, m))
        elif a.kind == "SEND_B":
            p = schedule.peer(i, a)
            box = inbox_b.setdefault((p, m), {})
            for k, src in model.consumes[i].items():
                if src == p:
                    box[k] = box[k] + gx_of[(i, m)][k] if k in box else gx_of[(i, m)][k]
            sent.add(("B", i, p, m))
        elif a.kind == "RECV_F":
            return ("F", schedule.peer(i, a), i, m) in sent
        elif a.kind == "RECV_B":
            return ("B", schedule.peer(i, a), i, m) in sent
        return True

    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for i in range(S):
            while pc[i] < len(schedule.stages[i]) and step(i, schedule.stages[i][pc[i]]):
                pc[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [f"stage {i} at {schedule.stages[i][pc[i]]}" for i in range(S) if pc[i] < len(schedule.stages[i])]
            raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    return PipelineRun(sum(losses) / M, grads, losses, peak)


def reference_step(model: PipelineModel, microbatches: list[dict]):
    """Loss (mean over microbatches) and gradients on one device, no pipeline."""
    def loss_fn(params):
        return sum(model.reference_loss(params, b) for b in microbatches) / len(microbatches)

    return jax.value_and_grad(loss_fn)(model.params)
