"""Backward weight delaying inside Alpa 0.2.3: each backward pipeline stage Alpa builds
is split into an input-gradient computation and a weight-gradient computation.

Why: Alpa runs one backward computation per stage; the input gradient the previous
mesh waits for leaves only when the whole backward, weight gradients included, is done.
Split, the input-gradient part (BI) runs first, its output goes out, and the
weight-gradient part (BW) runs later, at the place the delay rule gives it in the
schedule (``alpa_translate.schedule_to_clocks``), behind other work.

The split is the same dependency analysis as ``alpa_comm.train.split_vjp``, on Alpa's
objects (by duck typing; nothing here imports Alpa or JAX):

* a stage is a ``JaxPipelineComputation``: ``eqns`` = [start marker, body..., end
  marker], the start marker mapping the stage's invars to internal names, the end
  marker internal values to its outvars. Alpa wraps a merged stage's layers in nested
  ``named_call`` equations; they are inlined first (each call's jaxpr is its own scope).
* the outvars another pipeline stage reads (the input gradients) belong to BI; the
  others (the gradient accumulators) to BW. BI is every equation the BI outvars
  depend on; BW is what the BW outvars depend on, minus BI. Every equation runs once.
* what BW reads that BI computed becomes extra BI outvars ("residuals", fresh
  variables), read by BW's start marker; what BW reads of the stage's own invars it
  takes directly. BW's internal names are fresh, because Alpa concatenates a mesh's
  stages into one program before sharding them.
* markers are Alpa's own marker equations with new operands (``_replace``), BW's named
  after the stage (``<name>_weight``: Alpa matches compiled pieces by name).

A stage none of whose outvars another stage reads (the first mesh's backward: its
inputs are the data) or one with no weight outvars is left whole.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from ..errors import AlpaCommError

MARKER = "pipeline_marker"
"""Alpa's ``pipeline_p`` primitive name."""
CALLS = ("named_call", "xla_call", "core_call")
"""Call primitives whose ``call_jaxpr`` is inlined (Alpa merges layers with ``named_call``)."""
WEIGHT_SUFFIX = "_weight"


class WeightDelayError(AlpaCommError, ValueError):
    """A stage is not in the shape Alpa 0.2.3 builds (markers, scopes)."""


def _is_literal(atom) -> bool:
    return hasattr(atom, "val")  # jax.core.Literal; Var and DropVar have no ``val``


def _is_drop(atom) -> bool:
    return type(atom).__name__ == "DropVar"


def _is_var(atom) -> bool:
    return not _is_literal(atom) and not _is_drop(atom)


def inline_calls(eqns: Sequence) -> list:
    """``eqns`` with every call equation (``CALLS``) replaced by its body, recursively:
    the body's invars become the call's operands, the call's outvars the body's
    results. Each call jaxpr is a scope of its own, so substitutions do not leak."""
    out: list = []
    defined: set[int] = set()

    def walk(eqns, subst: dict) -> None:
        def resolve(a):
            return a if not _is_var(a) else subst.get(a, a)

        for e in eqns:
            ins = [resolve(a) for a in e.invars]
            body = e.params.get("call_jaxpr") if e.primitive.name in CALLS else None
            if body is not None:
                if list(getattr(body, "constvars", ())):
                    raise WeightDelayError(f"{e.primitive.name} body has constvars; Alpa passes constants as operands")
                inner = dict(zip(body.invars, ins))
                walk(body.eqns, inner)
                for o, r in zip(e.outvars, body.outvars):
                    if _is_var(o):
                        subst[o] = inner.get(r, r) if _is_var(r) else r
                continue
            for o in e.outvars:
                if _is_var(o):
                    if id(o) in defined:
                        raise WeightDelayError(f"variable {o} is defined twice once calls are inlined")
                    defined.add(id(o))
            out.append(e._replace(invars=ins))

    walk(eqns, {})
    return out


def _needed(body: Sequence, roots, producer: dict) -> set[int]:
    need, stack = set(), [r for r in roots if _is_var(r)]
    while stack:
        i = producer.get(stack.pop())
        if i is None or i in need:
            continue
        need.add(i)
        stack.extend(a for a in body[i].invars if _is_var(a))
    return need


def _ordered(items) -> list:
    return list(dict.fromkeys(items))


def split_backward(stage, *, consumed, new_var: Callable[[Any], Any]):
    """``(bi, bw)``: ``stage`` (a backward ``JaxPipelineComputation``) as its
    input-gradient and weight-gradient computations, or None where it stays whole.

    ``consumed``: the variables other pipeline stages read; ``new_var(aval)``: a fresh
    variable (``jax.core.gensym`` in Alpa's process)."""
    eqns = inline_calls(stage.eqns)
    if len(eqns) < 2 or any(e.primitive.name != MARKER for e in (eqns[0], eqns[-1])):
        raise WeightDelayError(f"stage {stage.name!r} does not start and end with pipeline markers")
    start, body, end = eqns[0], eqns[1:-1], eqns[-1]
    outer_of = dict(zip(start.outvars, start.invars))  # internal name -> the stage's invar
    pairs = list(zip(end.invars, end.outvars))
    bi_pairs = [(i, o) for i, o in pairs if o in consumed]
    bw_pairs = [(i, o) for i, o in pairs if o not in consumed]
    if not bi_pairs or not bw_pairs:
        return None

    producer = {o: k for k, e in enumerate(body) for o in e.outvars if _is_var(o)}
    bi = _needed(body, [i for i, _ in bi_pairs], producer) | {k for k, e in enumerate(body) if e.effects}
    bw = _needed(body, [i for i, _ in bw_pairs], producer) - bi
    bi_eqns = [body[k] for k in sorted(bi)]
    bw_eqns = [body[k] for k in sorted(bw)]
    bw_defined = {o for e in bw_eqns for o in e.outvars if _is_var(o)}
    bw_reads = _ordered(a for a in [x for e in bw_eqns for x in e.invars] + [i for i, _ in bw_pairs]
                        if _is_var(a) and a not in bw_defined)
    bi_defined = {o for e in bi_eqns for o in e.outvars if _is_var(o)}
    residuals = [v for v in bw_reads if v in bi_defined]
    bw_from_invars = [v for v in bw_reads if v in outer_of]
    bi_from_invars = _ordered(a for a in [x for e in bi_eqns for x in e.invars] + [i for i, _ in bi_pairs]
                              if _is_var(a) and a in outer_of)

    handed = [new_var(v.aval) for v in residuals]  # BI's extra outvars = BW's extra invars
    bi_start = start._replace(invars=[outer_of[v] for v in bi_from_invars], outvars=bi_from_invars)
    bi_end = end._replace(invars=[i for i, _ in bi_pairs] + residuals, outvars=[o for _, o in bi_pairs] + handed)
    bi_stage = dataclasses.replace(stage, invars=list(bi_start.invars), outvars=list(bi_end.outvars),
                                   eqns=[bi_start, *bi_eqns, bi_end])

    name = stage.name + WEIGHT_SUFFIX
    fresh = {v: new_var(v.aval) for v in bw_from_invars + residuals}

    def rename(a):
        return fresh.get(a, a) if _is_var(a) else a

    bw_start = start._replace(invars=[outer_of[v] for v in bw_from_invars] + handed,
                              outvars=[fresh[v] for v in bw_from_invars + residuals],
                              params={**start.params, "name": name})
    bw_end = end._replace(invars=[rename(i) for i, _ in bw_pairs], outvars=[o for _, o in bw_pairs],
                          params={**end.params, "name": name})
    bw_body = [e._replace(invars=[rename(a) for a in e.invars]) for e in bw_eqns]
    bw_stage = dataclasses.replace(stage, name=name, invars=list(bw_start.invars), outvars=list(bw_end.outvars),
                                   eqns=[bw_start, *bw_body, bw_end])
    return bi_stage, bw_stage


def split_backward_stages(stages: Sequence, stage_to_mesh: Sequence[int], *, new_var) -> tuple[list, list, dict]:
    """Alpa's pipeline stages (forward stage of mesh i at i, backward at 2S-1-i) with
    each splittable backward replaced by its input-gradient part and its weight-gradient
    part appended (mesh order, indices 2S, 2S+1, ...). Returns the stages, the extended
    ``stage_to_mesh`` and ``{mesh: weight stage index}`` for the schedule."""
    S = len(stages) // 2
    if len(stages) != 2 * S or list(stage_to_mesh) != list(range(S)) + list(reversed(range(S))):
        raise WeightDelayError(f"expected {2 * S} stages placed forward 0..S-1 then backward S-1..0, "
                               f"got stage_to_mesh {list(stage_to_mesh)}")
    consumed = {v for s in stages for v in s.invars}
    out, to_mesh, weight_stages = list(stages), list(stage_to_mesh), {}
    for mesh in range(S):
        k = 2 * S - 1 - mesh
        halves = split_backward(stages[k], consumed=consumed, new_var=new_var)
        if halves is None:
            continue
        out[k] = halves[0]
        weight_stages[mesh] = len(out)
        out.append(halves[1])
        to_mesh.append(mesh)
    return out, to_mesh, weight_stages
