"""A small pipeline program in the shape Alpa 0.2.3 builds it, for the harness: Alpa's own
``JaxPipelineComputation`` stages over stand-in jaxpr equations, a NumPy interpreter for
them, and Alpa's own ``PipelineInstEmitter`` driven over a schedule.

Only for a harness process (``loader.load_package`` done first): the harness's ``jax``
is a stand-in, so the equations here are NamedTuples with jax 0.3.22's ``JaxprEqn``
fields (``invars, outvars, primitive, params, effects, source_info``) and the
variables are ``alpa_objects.Var``. The layout is Alpa's (``computation.py``): a stage
is [start marker, ``named_call`` over the merged layers (each layer a ``named_call``
of its own), end marker]; backward stages read the forward's activations, the weights
and gradient-accumulator invars and end with ``acc_out = acc_in + dW``, as
``compute_grad_to_accumulate_grad`` writes it.

Each of S meshes holds two dense ``tanh`` layers; the last mesh's output is its own
loss gradient (a loss of ``|x|^2 / 2``).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np

from .alpa_objects import Var


class Primitive:
    def __init__(self, name: str, multiple_results: bool = False):
        self.name, self.multiple_results = name, multiple_results

    def __repr__(self):
        return self.name


class Eqn(NamedTuple):
    invars: list
    outvars: list
    primitive: Primitive
    params: dict
    effects: Any = frozenset()
    source_info: Any = None


class Jaxpr:
    def __init__(self, invars, outvars, eqns):
        self.constvars, self.invars, self.outvars, self.eqns = [], list(invars), list(outvars), list(eqns)


MARKER = Primitive("pipeline_marker", multiple_results=True)
CALL = Primitive("named_call", multiple_results=True)
OPS = {
    "tanh": np.tanh,
    "one_minus_sq": lambda x: np.float32(1) - x * x,
    "mul": np.multiply,
    "add": np.add,
    "matmul": lambda a, b: a @ b,
    "matmul_nt": lambda a, b: a @ b.T,
    "matmul_tn": lambda a, b: a.T @ b,
}
PRIMS = {name: Primitive(name) for name in OPS}


class _Names:
    def __init__(self):
        self.n = 0

    def var(self, stem: str, shape) -> Var:
        self.n += 1
        return Var(f"{stem}#{self.n}", shape)


def _marker(invars, outvars, name, kind):
    return Eqn(list(invars), list(outvars), MARKER, {"name": name, "mark_type": kind})


def _op(name, ins, out):
    return Eqn(list(ins), [out], PRIMS[name], {})


def _call(invars, body_eqns, body_in, body_out, outvars, name):
    return Eqn(list(invars), list(outvars), CALL, {"name": name, "call_jaxpr": Jaxpr(body_in, body_out, body_eqns)})


def _layer_call(names, outer_in, build, out_shapes, name):
    """``build(inner invars) -> (eqns, inner outvars)`` wrapped as a ``named_call``."""
    inner_in = [names.var(f"{v.name.split('#')[0]}_in", v.aval.shape) for v in outer_in]
    eqns, inner_out = build(inner_in)
    outer_out = [names.var(f"{name}_out", s) for s in out_shapes]
    return _call(outer_in, eqns, inner_in, inner_out, outer_out, name), outer_out


def _stage(computation_cls, names, name, invars, build, out_shapes):
    """Alpa's merged-stage layout: start marker, a named_call over the layers, end marker."""
    sym_in = [names.var(v.name.split("#")[0] + "_s", v.aval.shape) for v in invars]
    body_eqns, body_out = build(list(invars))  # the call's jaxpr reuses the stage's invars, as Alpa's does
    sym_out = [names.var(f"{name}_so", s) for s in out_shapes]
    outvars = [names.var(f"{name}_o", s) for s in out_shapes]
    eqns = [_marker(invars, sym_in, name, "start"),
            _call(sym_in, body_eqns, invars, body_out, sym_out, name + "_merged"),
            _marker(sym_out, outvars, name, "end")]
    return computation_cls(name=name, invars=list(invars), outvars=outvars, eqns=eqns, consts_dir={})


def pipeline(num_meshes: int, width: int = 4, rows: int = 3):
    """``{"stages", "stage_to_mesh", "global_invars", "is_batch", "accumulators" (in ->
    out), "weights" (per mesh), "input_gradient" (mesh -> the backward outvar the
    previous mesh reads)}``: forward stage i on mesh i, backward 2S-1-i."""
    from alpa.pipeline_parallel.computation import JaxPipelineComputation

    S, names = num_meshes, _Names()
    x0 = names.var("x0", (rows, width))
    weights = [[names.var(f"W{i}{l}", (width, width)) for l in range(2)] for i in range(S)]
    acc_in = [[names.var(f"acc{i}{l}", (width, width)) for l in range(2)] for i in range(S)]
    forward, acts, x = [], [], x0
    for i in range(S):
        def build_fwd(ins, i=i):
            xi, w0, w1 = ins
            eqns, outs = [], []
            h = xi
            for w, stem in ((w0, "a"), (w1, "x")):
                def layer(inner, stem=stem):
                    z, y = names.var("z", (rows, width)), names.var(stem, (rows, width))
                    return [_op("matmul", inner, z), _op("tanh", [z], y)], [y]
                call, (h,) = _layer_call(names, [h, w], layer, [(rows, width)], f"fwd{i}{stem}")
                eqns.append(call)
                outs.append(h)
            return eqns, outs
        stage = _stage(JaxPipelineComputation, names, str(i), [x, *weights[i]], build_fwd,
                       [(rows, width), (rows, width)])
        forward.append(stage)
        acts.append((x, stage.outvars[0], stage.outvars[1]))  # (input, after layer 0, output)
        x = stage.outvars[1]
    backward, acc_out, grads_in = [None] * S, {}, {}
    g = x  # the last mesh: d(|x|^2 / 2)/dx = x
    for i in reversed(range(S)):
        xi, ai, yi = acts[i]
        invars = [g, xi, ai, yi, *weights[i], *acc_in[i]]

        def build_bwd(ins, i=i):
            g_, x_, a_, y_, w0, w1, c0, c1 = ins
            eqns = []

            def layer(inner):
                gy, h_in, h_out, w, c = inner
                d, dz = names.var("d", h_out.aval.shape), names.var("dz", h_out.aval.shape)
                gx, dw, acc = (names.var("gx", h_in.aval.shape), names.var("dW", w.aval.shape),
                               names.var("accout", w.aval.shape))
                return ([_op("one_minus_sq", [h_out], d), _op("mul", [gy, d], dz), _op("matmul_nt", [dz, w], gx),
                         _op("matmul_tn", [h_in, dz], dw), _op("add", [c, dw], acc)], [gx, acc])
            call1, (ga, acc1) = _layer_call(names, [g_, a_, y_, w1, c1], layer,
                                            [a_.aval.shape, w1.aval.shape], f"bwd{i}1")
            call0, (gx, acc0) = _layer_call(names, [ga, x_, a_, w0, c0], layer,
                                            [x_.aval.shape, w0.aval.shape], f"bwd{i}0")
            eqns += [call1, call0]
            return eqns, ([gx] if i > 0 else []) + [acc0, acc1]
        shapes = ([(rows, width)] if i > 0 else []) + [(width, width)] * 2
        stage = _stage(JaxPipelineComputation, names, str(2 * S - 1 - i), invars, build_bwd, shapes)
        backward[S - 1 - i] = stage
        outs = list(stage.outvars)
        if i > 0:
            grads_in[i] = outs.pop(0)
            g = grads_in[i]
        acc_out.update(zip(acc_in[i], outs))
    global_invars = [x0] + [w for ws in weights for w in ws]  # accumulators are not global invars in Alpa
    return {"stages": forward + backward, "stage_to_mesh": list(range(S)) + list(reversed(range(S))),
            "global_invars": global_invars, "is_batch": [True] + [False] * (len(global_invars) - 1),
            "accumulators": acc_out, "weights": weights, "input_gradient": grads_in, "new_var": names.var}


def trivial_stages(num_meshes: int):
    """2S stages that are only their markers (nothing to split): for tests of the
    dispatch, where stage contents do not matter."""
    from alpa.pipeline_parallel.computation import JaxPipelineComputation

    return [JaxPipelineComputation(name=str(k), invars=[], outvars=[],
                                   eqns=[_marker([], [], str(k), "start"), _marker([], [], str(k), "end")],
                                   consts_dir={}) for k in range(2 * num_meshes)]


# ------------------------------------------------------------------ evaluation
def evaluate(eqns, env: dict) -> None:
    """Run stand-in equations on NumPy values (``env``: Var -> array, updated)."""
    def read(a):
        return env[a]

    for e in eqns:
        if e.primitive is MARKER:
            for i, o in zip(e.invars, e.outvars):
                env[o] = read(i)
        elif e.primitive is CALL:
            body = e.params["call_jaxpr"]
            inner = {v: read(a) for v, a in zip(body.invars, e.invars)}
            evaluate(body.eqns, inner)
            for o, r in zip(e.outvars, body.outvars):
                env[o] = inner[r]
        else:
            env[e.outvars[0]] = OPS[e.primitive.name](*[read(a) for a in e.invars]).astype(np.float32)


def run_stage(stage, values: dict) -> dict:
    """A stage's outvars from its invars' values."""
    env = {v: values[v] for v in stage.invars}
    evaluate(stage.eqns, env)
    return {v: env[v] for v in stage.outvars}


# ------------------------------------------------------------------ emitter
class _Task:
    """What Alpa's emitter reads of a compiled send/recv resharding task."""

    is_local_allgather_task = False

    def __init__(self, src_mesh, dst_mesh, uuid):
        self.send_worker_task_ids = {w: uuid for w in src_mesh.workers}
        self.recv_worker_task_ids = {w: uuid for w in dst_mesh.workers}


class _XlaStage:
    """What Alpa's emitter reads of an ``XlaShardedPipelineComputation`` (no HLO here)."""

    def __init__(self, stage, num_devices):
        from jax.interpreters.pxla import NoSharding, Replicated, ShardingSpec

        self.name, self.invars, self.outvars = stage.name, stage.invars, stage.outvars
        self.donated_invars = [False] * len(stage.invars)
        self.input_sharding_specs = [ShardingSpec([NoSharding()] * len(v.aval.shape), [Replicated(num_devices)])
                                     for v in stage.invars]

    def get_hlo_text(self):
        return ""


def emit(stages, schedule, meshes, global_invars, is_batch, accumulators, num_batch):
    """Alpa's ``PipelineInstEmitter`` walking ``schedule``'s clocks (``_compile_exec_one_tick``,
    ``_compile_exec_one_mesh``, ``_compile_get_vars_from_mesh``, ``_compile_alloc``,
    ``_compile_resharding_task``: Alpa's own, send/recv mode). Stand-ins for what needs
    XLA: stages without HLO, resharding tasks that only carry their worker ids.
    Returns per mesh the instruction list of its first worker as readable strings."""
    from alpa.global_env import global_config
    from alpa.pipeline_parallel.runtime_emitter import PipelineInstEmitter, PipelineInstType
    from alpa.util import DisjointDict

    global_config.resharding_mode = "send_recv"
    xla = [_XlaStage(s, meshes[0].num_devices) for s in stages]
    emitter = PipelineInstEmitter(stages=xla, global_invars=global_invars, grad_dummy_invars=dict(accumulators),
                                  global_outvars=[], concat_vars_mapping={}, mesh_group=meshes, schedule=schedule,
                                  is_batch=is_batch, num_batch=num_batch, default_auto_sharding_option=None,
                                  manual_stage_option=None, flop_count=0, allreduce_groups=[])
    producer_mesh = {}
    for k, s in enumerate(stages):
        (mesh,) = schedule.stage_placement(k)
        for v in s.outvars:
            producer_mesh[v] = mesh
    uuid = iter(range(10 ** 6, 2 * 10 ** 6))
    for k, s in enumerate(stages):
        (dst,) = schedule.stage_placement(k)
        for v in s.invars:
            src = producer_mesh.get(v)
            if src is not None and src != dst and v not in emitter._resharding_tasks[src][dst]:
                emitter._resharding_tasks[src][dst][v] = _Task(meshes[src], meshes[dst], next(uuid))
    # inputs where Alpa's input split puts them: weights once on the mesh that reads them,
    # the batch per microbatch; each accumulator's zero buffer for the first microbatch
    # (``_compile_grad_buffer_allocations``), later ones chain to the previous output
    for k, s in enumerate(stages):
        (mesh,) = schedule.stage_placement(k)
        for v in s.invars:
            if v in accumulators:
                emitter.env.set_var_mesh_uuid(v, schedule.first_backward_batch_index, mesh, next(uuid))
            elif v in global_invars:
                batches = range(num_batch) if is_batch[global_invars.index(v)] else [0]
                for b in batches:
                    if not emitter.env.var_at(v, b, mesh):
                        emitter.env.set_var_mesh_uuid(v, b, mesh, next(uuid))
    instruction_lists, configs = defaultdict(list), defaultdict(list)
    donation = [DisjointDict() for _ in meshes]
    executable_uuids = list(range(len(stages)))
    for clock in schedule.schedules:
        emitter._compile_exec_one_tick(clock, donation, instruction_lists, executable_uuids, configs)

    where = {}
    for (var, batch), placed in emitter.env.env.items():
        for mesh, u in placed.items():
            where[(mesh, int(u))] = (var.name, batch)
    out = []
    for mesh_idx, mesh in enumerate(meshes):
        lines = []
        for inst in instruction_lists[mesh.workers[0]]:
            if inst.opcode == PipelineInstType.RUN and inst.info.startswith("stage"):
                stage = int(inst.info.split()[1])
                batch = where[(mesh_idx, int(inst.output_uuids[0]))][1] if len(inst.output_uuids) else None
                sync = not inst.opaques["kwargs"]["skip_grad_sync"]
                lines.append(f"RUN {stages[stage].name} mb{batch}" + (" sync" if sync else ""))
            elif inst.opcode == PipelineInstType.SEND:
                var, batch = where[(mesh_idx, int(inst.input_uuids[0]))]
                lines.append(f"SEND {var} mb{batch}")
            elif inst.opcode == PipelineInstType.RECV:
                lines.append("RECV")
        out.append(lines)
    return out
