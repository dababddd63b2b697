"""One pipeline stage executing its actions of the schedule IR for one training step.

The same runner serves the one-process pipeline (``local_pipeline``: every stage
in one loop, arrays handed over in memory) and the distributed one (one runner
per host worker, arrays moved by cross-mesh resharding). Only the ``Mailbox``
differs, so the two cannot disagree on what an action means:

* ``F m`` computes the stage and keeps its VJP (the residuals stay live);
* ``B m`` applies the VJP: weight gradients accumulate, input gradients wait for
  their ``SEND_B``; ``BI m`` computes only the input half, ``BW m`` later only the
  weight half of the same backward (``split_vjp``: both halves are pytrees, so
  jitted functions take them);
* ``SEND_*`` hands arrays to the mailbox (asynchronous); ``RECV_*`` takes them,
  blocking or, in poll mode, reporting that they have not arrived.

The loss is the mean over microbatches (the last stage seeds every backward
with ``1/M``), so accumulated gradients equal the single-device gradients.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .._extras import require
from ..pipeline.ir import Action, ActionKind, ScheduleError
from .backward_split import split_vjp

jax = require("jax")  # optional: a missing jax names its extra
jnp = require("jax.numpy")


class Mailbox(Protocol):
    def send(self, direction: str, src: int, dst: int, mb: int, arrays: dict) -> None: ...

    def recv(self, direction: str, src: int, dst: int, mb: int, block: bool) -> dict | None: ...


@dataclass
class StagePrograms:
    """A stage's compiled programs. ``constrain_out`` pins activations and input
    gradients to the layout the edges expect (identity in one process).

    ``forward`` returns the outputs and the backward state: the two halves of the
    stage's backward, split from its jaxpr by ``split_vjp`` (any stage function, no
    knowledge of its layers). ``backward_input`` returns the input gradients and the
    weight-gradient state (the weight half and the residuals it reads) and frees the
    rest of the forward's residuals; ``backward_weight`` finishes the parameter
    gradients from that state. ``backward`` is both at once. BI + BW cost what B costs.
    """

    stage_fn: Callable
    constrain_out: Callable = staticmethod(lambda tree: tree)

    def __post_init__(self):
        fn, pin = self.stage_fn, self.constrain_out

        def forward(params, inputs, batch):
            out, bi, bw = split_vjp(lambda p, x: pin(fn(p, x, batch)), params, inputs)
            return out, (bi, bw)

        def backward_input(bi, ct):
            (gx,), residuals = bi(ct)
            return pin(gx), residuals

        def backward_weight(bw, residuals):
            return bw(residuals)

        self.forward = jax.jit(forward)
        # The state is a Python pair (input half, weight half): BI takes only the input
        # half with the forward's residuals, BW only what BI handed it.
        self._bi = jax.jit(backward_input)
        self._bw = jax.jit(backward_weight)
        self.accumulate = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))

    def backward(self, state, ct):
        """The whole backward: the two halves one after the other. Not one fused program:
        on a stage sharded over its host's devices XLA partitions the fused backward
        worse than the halves (measured, U-Transformer stage over 2 CPU devices: 67-78 ms
        fused against 57 ms as two programs), and the halves are compiled anyway."""
        bi, bw = state
        gx, residuals = self._bi(bi, ct)
        return self._bw(bw, residuals), gx

    def backward_input(self, state, ct):
        """Input gradients and the weight-gradient state (the forward's residuals are released)."""
        bi, bw = state
        gx, residuals = self._bi(bi, ct)
        return gx, (bw, residuals)

    def backward_weight(self, wstate):
        bw, residuals = wstate
        return self._bw(bw, residuals)


def residual_bytes(state, params) -> int:
    """Bytes of activation state kept alive (each buffer once; parameter-shaped
    leaves, i.e. weights and partial weight gradients, left out), on this host."""
    param_shapes = {(tuple(p.shape), str(p.dtype)) for p in jax.tree_util.tree_leaves(params)}
    seen, total = set(), 0
    for x in jax.tree_util.tree_leaves(state):
        if not hasattr(x, "addressable_shards") or (tuple(x.shape), str(x.dtype)) in param_shapes:
            continue
        for s in x.addressable_shards:
            ptr = s.data.unsafe_buffer_pointer()
            if ptr not in seen:
                seen.add(ptr)
                total += int(s.data.nbytes)
    return total


@dataclass
class StepRecord:
    """What one stage did in one step: losses (last stage), events (kind, mb, start,
    end in seconds since the epoch), peak live VJPs and their activation bytes."""

    losses: dict[int, float] = field(default_factory=dict)
    events: list[tuple[str, int, float, float]] = field(default_factory=list)
    peak_live: int = 0
    peak_live_bytes: int = 0
    state_bytes: dict[str, int] = field(default_factory=dict)  # one microbatch's live bytes after F / after BI


class StageRunner:
    def __init__(self, stage: int, num_stages: int, programs: StagePrograms, consumes: dict[str, int],
                 consumers: dict[int, list[str]], mailbox: Mailbox, sync: bool = False):
        """``consumes``: input key -> producing stage; ``consumers``: consuming stage ->
        the output keys it takes. ``sync`` waits for every compute to finish (true
        per-action timings for the trace). Stages here are model stages: with virtual
        stages a runner serves one chunk, and the peers ``run`` is given (and the mailbox
        is keyed by) are model stages too (``Schedule.peer_virtual_stage``)."""
        self.stage, self.num_stages, self.p = stage, num_stages, programs
        self.consumes, self.consumers, self.mailbox, self.sync = consumes, consumers, mailbox, sync
        self.state_bytes: dict[str, int] = {}  # one microbatch's live bytes after F / after BI (shapes are fixed)

    def begin(self, params, microbatches: list[dict]) -> None:
        self.params, self.microbatches = params, microbatches
        self.M = len(microbatches)
        self.vjps, self.wstates, self.gx, self.outputs = {}, {}, {}, {}
        self.inbox_f: dict[int, dict] = {}
        self.inbox_b: dict[int, dict] = {}
        self.grads = None
        self.record = StepRecord()
        self._live_bytes: dict[int, int] = {}

    # ------------------------------------------------------------------ actions
    def run(self, a: Action, peer: int, block: bool = True) -> bool:
        """Run one action; False only in poll mode when a RECV's data is not there yet."""
        m = a.mb
        t0 = time.time()
        if a.kind is ActionKind.F:
            self._forward(m)
        elif a.kind in (ActionKind.B, ActionKind.BI):
            ct = self._cotangent(m)
            if a.kind is ActionKind.B:
                gp, gx = self.p.backward(self.vjps.pop(m), ct)
                self._accumulate(gp)
                self._free(m)
            else:
                gx, wstate = self.p.backward_input(self.vjps.pop(m), ct)
                self.wstates[m] = wstate
                self._wait(wstate)
                self._track(m, wstate, "BI")
            self.gx[m] = gx
            self._wait(gx)
        elif a.kind is ActionKind.BW:
            if m not in self.wstates:
                raise ScheduleError(f"stage {self.stage}: BW{m} before BI{m}")
            self._accumulate(self.p.backward_weight(self.wstates.pop(m)))
            self._wait(self.grads)
            self._free(m)
        elif a.kind is ActionKind.SEND_F:
            self.mailbox.send("F", self.stage, peer, m, self.outputs_for(m, peer))
        elif a.kind is ActionKind.SEND_B:
            if m not in self.gx:
                raise ScheduleError(f"stage {self.stage}: SEND_B{m} before the backward of microbatch {m}")
            self.mailbox.send("B", self.stage, peer, m, self.input_grads_for(m, peer))
        elif a.kind.is_recv:
            got = self.mailbox.recv(a.kind[-1], peer, self.stage, m, block)
            if got is None:
                return False
            self.take(a.kind[-1], m, got)
        else:
            raise ScheduleError(f"stage {self.stage}: unknown action {a}")
        t1 = time.time()
        if a.kind.startswith("RECV"):
            unpack = min(getattr(self.mailbox, "unpack_s", 0.0), t1 - t0)
            self.record.events.append((str(a.kind), m, t0, t1 - unpack))
            if unpack:
                self.record.events.append(("UNPACK", m, t1 - unpack, t1))
        elif a.is_compute:
            self.record.events.append((str(a.kind), m, t0, t1))
        return True

    # ------------------------------------------------- what a transfer carries
    # A SEND hands these to the mailbox and a RECV passes what arrives to ``take``; a
    # runner holding two neighbouring model stages of one mesh (a V's turn, a skip
    # inside a stage) calls them directly: a local hand-off, no transfer.
    def outputs_for(self, m: int, consumer: int) -> dict:
        """Microbatch ``m``'s outputs that model stage ``consumer`` takes (after ``F m``)."""
        return {k: self.outputs[m][k] for k in self.consumers.get(consumer, [])}

    def input_grads_for(self, m: int, producer: int) -> dict:
        """Microbatch ``m``'s input gradients for what ``producer`` sent (after its backward)."""
        return {k: self.gx[m][k] for k, src in self.consumes.items() if src == producer}

    def take(self, direction: str, m: int, arrays: dict) -> None:
        """Arrays that arrived for microbatch ``m``: inputs ("F") or output gradients ("B",
        summed where several consumers send gradients for one output)."""
        if direction == "F":
            self.inbox_f.setdefault(m, {}).update(arrays)
        else:
            box = self.inbox_b.setdefault(m, {})
            for k, v in arrays.items():
                box[k] = box[k] + v if k in box else v

    @property
    def live(self) -> tuple[int, int]:
        """(microbatches, bytes) whose activation state this stage keeps alive now."""
        return len(self._live_bytes), sum(self._live_bytes.values())

    def _wait(self, tree) -> None:
        if self.sync:
            jax.block_until_ready(tree)

    def _forward(self, m: int) -> None:
        inputs = self.inbox_f.pop(m, {})
        missing = set(self.consumes) - set(inputs)
        if missing:
            raise ScheduleError(f"stage {self.stage}: F{m} runs without inputs {sorted(missing)} "
                                "(a RECV_F is missing)")
        out, state = self.p.forward(self.params, inputs, self.microbatches[m])
        self.outputs[m], self.vjps[m] = out, state
        self._wait(out)
        self._track(m, state, "F")
        if self.stage == self.num_stages - 1:
            self.record.losses[m] = out["loss"]

    def _track(self, m: int, state, phase: str) -> None:
        """Microbatch ``m`` now keeps ``state`` alive (its activations until its BW). The
        bytes depend only on shapes, so they are counted once per phase and reused."""
        if phase not in self.state_bytes:
            self.state_bytes[phase] = residual_bytes(state, self.params)
        self._live_bytes[m] = self.state_bytes[phase]
        self.record.peak_live = max(self.record.peak_live, len(self._live_bytes))
        self.record.peak_live_bytes = max(self.record.peak_live_bytes, sum(self._live_bytes.values()))

    def _free(self, m: int) -> None:
        self._live_bytes.pop(m, None)
        self.outputs.pop(m, None)

    def _cotangent(self, m: int) -> dict:
        out = self.outputs[m]
        if self.stage == self.num_stages - 1:
            return {"loss": jnp.asarray(1.0 / self.M, out["loss"].dtype)}
        got = self.inbox_b.pop(m, {})
        missing = set(out) - set(got)
        if missing:
            raise ScheduleError(f"stage {self.stage}: backward of microbatch {m} runs without gradients for "
                                f"{sorted(missing)} (a RECV_B is missing)")
        return {k: got[k] for k in out}

    def _accumulate(self, gp) -> None:
        self.grads = gp if self.grads is None else self.p.accumulate(self.grads, gp)

    def finish(self) -> StepRecord:
        """End of the step: every VJP must have been consumed."""
        if self.vjps or self.wstates:
            raise ScheduleError(f"stage {self.stage}: microbatches {sorted(set(self.vjps) | set(self.wstates))} "
                                "were never (fully) back-propagated")
        self.record.losses = {m: float(v) for m, v in self.record.losses.items()}
        self.record.state_bytes = dict(self.state_bytes)
        return self.record


def consumers_of(consumes: list[dict[str, int]], stage: int) -> dict[int, list[str]]:
    """For ``stage``: consuming stage -> the output keys it takes."""
    out: dict[int, list[str]] = {}
    for j, c in enumerate(consumes):
        for key, i in sorted(c.items()):
            if i == stage:
                out.setdefault(j, []).append(key)
    return out
