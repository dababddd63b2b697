"""``split_vjp``: a backward split into its input-gradient and weight-gradient halves,
for any JAX function, found from the backward's jaxpr.

Why: a pipeline stage's input gradient is what the previous stage waits for (it
crosses meshes); its weight gradient is needed only at the optimizer step. Computing
the input half first and the weight half later (backward weight delaying, ZB-H1) lets
the cross-mesh send leave early. Taking the two halves as two separate VJPs would
redo the shared work (the output cotangent of every later operation); splitting one
backward by dependencies does not:

1. ``jax.vjp`` linearizes the function; the backward is traced once into a jaxpr whose
   inputs are the VJP's residuals and the output cotangents, and whose outputs are the
   parameter and input cotangents. Nested ``jit``/``closed_call``/``checkpoint``
   programs are inlined so that the split can go through them.
2. Dead-code elimination per output set: the equations the input cotangents depend on
   form the input part (BI); the equations the parameter cotangents depend on, minus
   those BI already computes, form the weight part (BW). Every equation runs once, in
   one of the two, so BI + BW cost what the whole backward costs.
3. The values BW reads that BI computed or received (typically each matmul's input
   and its output cotangent) are BI's residuals, handed to BW.

Refinements, measured on GPT stages (CPU, d=256: BI + BW 31-40 ms before, 26-31 ms
after, the same as the hand-written split they replace; the first stage sharded over 2
devices 62-93 ms before the third, 53-62 after):

* every equation a weight-gradient product waits for runs in BI, even where no input
  cotangent needs it (a first stage, whose input is the batch): BW then holds only the
  last products and what follows them, reading row-major operands handed over by BI
  (in one program XLA on CPU stored a product's operand transposed through the
  elementwise pass that makes it, 36 of a 62 ms backward);

* weight-gradient work that is not a product (a layer norm's scale and bias gradients,
  a bias's sum over rows) runs in BI where that shrinks the residuals (a vector handed
  over instead of two activations kept alive); every weight-gradient matmul and
  convolution stays in BW;
* ``transpose(dot_general(dy, x))``, JAX's form of ``x^T dy``, is computed as
  ``dot_general(x, dy)``: XLA on CPU runs the transpose as a pass of its own.

What stays whole: a control-flow primitive (``scan``, ``while``, ``cond``) is one
equation; its body is not split, so a ``lax.scan`` over layers puts all of its
weight gradients in BI. Equations with side effects run in BI, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._extras import require
from ..errors import InvalidArgumentError

jax = require("jax")  # optional: a missing jax names its extra
jcore = require("jax.extend.core")
Partial = jax.tree_util.Partial

# Call-like primitives whose body is inlined, so the split sees through them. The body's
# parameter name differs by primitive.
_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "checkpoint": "jaxpr", "remat": "jaxpr"}


@dataclass(frozen=True)
class _Const:
    """A literal or constant operand (not a value computed by the program)."""
    value: Any


@dataclass(frozen=True)
class _Eqn:
    primitive: Any
    params: dict
    ins: tuple        # int (a value's id) or _Const
    outs: tuple       # int, or None for an output nobody reads (DropVar)
    effectful: bool


@dataclass(frozen=True)
class _Program:
    """A flat backward: inputs ``0..num_inputs-1`` (residual leaves, jaxpr constants,
    output cotangents), equations in order, outputs as ids or constants, and the bytes
    of every value (by id)."""
    num_inputs: int
    eqns: tuple
    outputs: tuple
    nbytes: dict
    shapes: dict = field(default_factory=dict)


def _flatten(closed) -> _Program:
    """The closed jaxpr as one flat equation list, its constants turned into inputs
    (they may be tracers of an enclosing ``jit``: the caller passes them in)."""
    counter = iter(range(1 << 62))
    jaxpr = closed.jaxpr
    env: dict = {}
    nbytes: dict[int, int] = {}

    def size(v) -> int:
        aval = v.aval
        return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize if hasattr(aval, "shape") else 0

    shapes: dict[int, tuple] = {}

    def shape(v) -> tuple:
        return tuple(getattr(v.aval, "shape", ()))

    for v in list(jaxpr.constvars) + list(jaxpr.invars):
        env[v] = next(counter)
        nbytes[env[v]] = size(v)
        shapes[env[v]] = shape(v)
    num_inputs = len(env)
    eqns: list[_Eqn] = []

    def ref(atom, env):
        if isinstance(atom, jcore.Literal):
            return _Const(atom.val)
        return env[atom]

    def walk(jx, env, consts_env):
        env.update(consts_env)
        for e in jx.eqns:
            body_name = _INLINED.get(e.primitive.name)
            if body_name is not None and body_name in e.params:
                body = e.params[body_name]
                inner_jaxpr = body.jaxpr if hasattr(body, "jaxpr") else body
                inner_consts = list(getattr(body, "consts", ()))
                inner_env = {v: _Const(c) for v, c in zip(inner_jaxpr.constvars, inner_consts)}
                for v, a in zip(inner_jaxpr.invars, e.invars):
                    inner_env[v] = ref(a, env)
                walk(inner_jaxpr, inner_env, {})
                for o, inner_o in zip(e.outvars, inner_jaxpr.outvars):
                    if not isinstance(o, jcore.DropVar):
                        env[o] = ref(inner_o, inner_env)
                continue
            outs = []
            for o in e.outvars:
                if isinstance(o, jcore.DropVar):
                    outs.append(None)
                else:
                    env[o] = next(counter)
                    nbytes[env[o]] = size(o)
                    shapes[env[o]] = shape(o)
                    outs.append(env[o])
            eqns.append(_Eqn(e.primitive, dict(e.params), tuple(ref(a, env) for a in e.invars), tuple(outs),
                             bool(e.effects)))

    walk(jaxpr, env, {})
    outputs = tuple(ref(a, env) for a in jaxpr.outvars)
    return _Program(num_inputs, tuple(eqns), outputs, nbytes, shapes)


def _fold_transposed_products(program: _Program) -> _Program:
    """``transpose(dot_general(a, b))`` of a matrix as ``dot_general(b, a)``.

    JAX's transpose rule writes a weight gradient ``x^T dy`` as ``dy^T x`` followed by a
    transpose; XLA on CPU runs the transpose as a pass of its own (measured: 3.6 ms
    against 1.6 ms for a 256 x 1024 weight gradient over 512 rows). Swapping the
    operands gives the transposed product directly. Only where the product has no
    batch dimensions, a 2-d result and no other reader; the sums are the same, their
    rounding may differ in the last bit."""
    readers: dict[int, int] = {}
    for e in program.eqns:
        for r in e.ins:
            if isinstance(r, int):
                readers[r] = readers.get(r, 0) + 1
    for r in program.outputs:
        if isinstance(r, int):
            readers[r] = readers.get(r, 0) + 1
    producer = {o: i for i, e in enumerate(program.eqns) for o in e.outs if o is not None}
    eqns = list(program.eqns)
    dropped = set()
    for i, e in enumerate(eqns):
        if e.primitive.name != "transpose" or tuple(e.params.get("permutation", ())) != (1, 0):
            continue
        (src,) = e.ins
        j = producer.get(src) if isinstance(src, int) else None
        if j is None or readers.get(src) != 1 or eqns[j].primitive.name != "dot_general":
            continue
        dot = eqns[j]
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        if lb or rb:
            continue
        params = dict(dot.params, dimension_numbers=((tuple(rc), tuple(lc)), ((), ())))
        precision = params.get("precision")
        if isinstance(precision, tuple) and len(precision) == 2:
            params["precision"] = precision[::-1]
        if "out_sharding" in params and params["out_sharding"] is not None:
            continue  # a sharded result: keep JAX's own form
        eqns[i] = _Eqn(dot.primitive, params, dot.ins[::-1], e.outs, dot.effectful)
        dropped.add(j)
    if not dropped:
        return program
    return _Program(program.num_inputs, tuple(e for k, e in enumerate(eqns) if k not in dropped), program.outputs,
                    program.nbytes, program.shapes)


def _needed(program: _Program, wanted, producer: dict[int, int]) -> set[int]:
    """Indices of the equations the ids in ``wanted`` depend on."""
    need, stack = set(), [r for r in wanted if isinstance(r, int)]
    seen = set(stack)
    while stack:
        i = producer.get(stack.pop())
        if i is None or i in need:
            continue
        need.add(i)
        for r in program.eqns[i].ins:
            if isinstance(r, int) and r not in seen:
                seen.add(r)
                stack.append(r)
    return need


HEAVY = ("dot_general", "conv_general_dilated")
"""Products. Those that give a weight gradient are what BW exists to delay: they never run
in BI (the cotangent chain's own products run in BI)."""


def _residuals(program: _Program, bw: set[int], num_param_cts: int) -> tuple:
    """The values BW reads that it does not compute itself (BI's results or inputs)."""
    defined = {o for i in bw for o in program.eqns[i].outs if o is not None}
    wanted = [r for i in sorted(bw) for r in program.eqns[i].ins] + list(program.outputs[:num_param_cts])
    return tuple(sorted({r for r in wanted if isinstance(r, int) and r not in defined}))


def _feeders_of_products_to_bi(program: _Program, bi: set[int], bw: set[int], num_param_cts: int):
    """Move into BI every weight-half equation that a product (``HEAVY``) of the weight
    half waits for, so BW holds the weight-gradient products and what follows them.

    Where no input cotangent needs the cotangent chain (the first stage, whose input is
    the batch; a branch that only parameters feed), the dependency split leaves the
    whole backward in BW, and in one program XLA on CPU stores a product's operand
    transposed by changing the layout of the elementwise pass that makes it (measured,
    GPT's first stage sharded over 2 devices: that one pass 36 of the 62 ms backward).
    BI computes the chain instead and hands BW the operands of its products, as it does
    on every other stage. Nothing runs twice and nothing moves where the input
    cotangents already need the chain.

    A weight-gradient product (a product whose result has a parameter's shape, e.g. ``x^T
    dy``) never moves, even where another product reads it (factorized weights: ``W + A
    B``), and neither does anything computed from it: what moves is closed under
    dependencies, so BI never waits for BW."""
    eqns = program.eqns
    param_shapes = {program.shapes.get(r) for r in program.outputs[:num_param_cts] if isinstance(r, int)}
    param_shapes |= {s[::-1] for s in param_shapes if s is not None and len(s) == 2}  # JAX's dy^T x before its transpose

    def weight_product(i: int) -> bool:
        e = eqns[i]
        return e.primitive.name in HEAVY and any(program.shapes.get(o) in param_shapes for o in e.outs if o is not None)

    consumers: dict[int, list[int]] = {}
    for i in bw:
        for r in eqns[i].ins:
            if isinstance(r, int):
                consumers.setdefault(r, []).append(i)
    feeds: dict[int, bool] = {}
    for i in sorted(bw, reverse=True):  # the flat program is in dependency order: consumers come later
        feeds[i] = any(eqns[c].primitive.name in HEAVY or feeds[c]
                       for o in eqns[i].outs if o is not None for c in consumers.get(o, ()))
    moved = {i for i, f in feeds.items() if f and not weight_product(i)}
    made_by = {o: i for i in bw for o in eqns[i].outs if o is not None}
    for i in sorted(moved):  # producers first: one that stays keeps its readers in BW
        if any(isinstance(r, int) and r in made_by and made_by[r] not in moved for r in eqns[i].ins):
            moved.discard(i)
    return bi | moved, bw - moved


def _keep_light_work_in_bi(program: _Program, bi: set[int], bw: set[int], num_param_cts: int):
    """Move into BI the weight-gradient work that is not a product (elementwise ops,
    reductions: a layer norm's scale and bias gradients, a bias's sum over rows) where
    that shrinks what BI hands to BW: ``sum(dy * x_hat)`` handed over is a vector, ``dy``
    and ``x_hat`` are two activations kept alive until BW. Decided per connected group
    of such equations, kept only if the residual bytes drop; every weight-gradient
    product stays in BW."""
    eqns = program.eqns
    available = set(range(program.num_inputs)) | {o for i in bi for o in eqns[i].outs if o is not None}
    movable: list[int] = []
    made_by: dict[int, int] = {}
    for i in sorted(bw):
        e = eqns[i]
        if e.primitive.name in HEAVY or not all(not isinstance(r, int) or r in available for r in e.ins):
            continue
        movable.append(i)
        for o in e.outs:
            if o is not None:
                available.add(o)
                made_by[o] = i
    parent = {i: i for i in movable}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in movable:
        for r in eqns[i].ins:
            if isinstance(r, int) and r in made_by:
                parent[root(i)] = root(made_by[r])
    groups: dict[int, set[int]] = {}
    for i in movable:
        groups.setdefault(root(i), set()).add(i)

    def cost(bw_set):
        return sum(program.nbytes.get(r, 0) for r in _residuals(program, bw_set, num_param_cts))

    best = cost(bw)
    for group in sorted(groups.values(), key=min):
        trial = bw - group
        c = cost(trial)
        if c < best:
            best, bw, bi = c, trial, bi | group
    return bi, bw


def _run(eqns, env: dict) -> None:
    for e in eqns:
        vals = [r.value if isinstance(r, _Const) else env[r] for r in e.ins]
        params = e.primitive.get_bind_params(e.params)
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
            vals = list(subfuns) + vals
        out = e.primitive.bind(*vals, **params)
        for i, v in zip(e.outs, out if e.primitive.multiple_results else (out,)):
            if i is not None:
                env[i] = v


def _read(refs, env):
    return [r.value if isinstance(r, _Const) else env[r] for r in refs]


@dataclass(frozen=True, eq=False)
class _Halves:
    """The split of one backward; ``Partial``s over it travel through ``jit``."""
    program: _Program
    bi_eqns: tuple
    bw_eqns: tuple
    residual_ids: tuple
    num_param_cts: int
    ct_tree: Any
    ct_shapes: tuple
    cts_tree: Any           # (param cotangents, *input cotangents)

    def backward_input(self, *args):
        *inputs, cts = args
        leaves, tree = jax.tree_util.tree_flatten(cts)
        if tree != self.ct_tree:
            raise InvalidArgumentError(f"output cotangents have structure {tree}, the outputs have {self.ct_tree}")
        for got, want in zip(leaves, self.ct_shapes):
            if tuple(getattr(got, "shape", ())) != want.shape:
                raise InvalidArgumentError(f"an output cotangent has shape {tuple(got.shape)}, its output {want.shape}")
        env = dict(enumerate(list(inputs) + leaves))
        _run(self.bi_eqns, env)
        outs = self.program.outputs
        n = self.num_param_cts
        input_cts = _read(outs[n:], env)
        placeholder = [None] * n
        tree = jax.tree_util.tree_unflatten(self.cts_tree, placeholder + input_cts)
        return tuple(tree[1:]), tuple(env[i] for i in self.residual_ids)

    def backward_weight(self, residuals):
        if len(residuals) != len(self.residual_ids):
            raise InvalidArgumentError(f"backward_weight takes the {len(self.residual_ids)} residuals "
                                       f"backward_input returned, got {len(residuals)}")
        env = dict(zip(self.residual_ids, residuals))
        _run(self.bw_eqns, env)
        flat = _read(self.program.outputs[:self.num_param_cts], env)
        n_inputs = self.cts_tree.num_leaves - self.num_param_cts
        return jax.tree_util.tree_unflatten(self.cts_tree, flat + [None] * n_inputs)[0]


def split_vjp(fn: Callable, params, *inputs):
    """Like ``jax.vjp(fn, params, *inputs)``, with the backward in two halves.

    Returns ``(outputs, backward_input, backward_weight)``:

    * ``backward_input(output_cotangents) -> (input_cotangents, residuals)``: the
      cotangents of ``inputs`` (a tuple, one per input, as ``jax.vjp`` gives them) and
      what the weight half needs, computing only what the input cotangents depend on;
    * ``backward_weight(residuals)``: the cotangent of ``params`` (a pytree like it).

    Both are ``jax.tree_util.Partial``s: they can be returned from and passed into
    ``jit``-compiled functions, as ``jax.vjp``'s pullback can. Together they do the
    backward's work once.
    """
    outputs, pullback = jax.vjp(fn, params, *inputs)
    res_leaves, res_tree = jax.tree_util.tree_flatten(pullback)
    out_leaves, ct_tree = jax.tree_util.tree_flatten(outputs)
    ct_shapes = tuple(jax.ShapeDtypeStruct(o.shape, jcore.primal_dtype_to_tangent_dtype(o.dtype))
                      for o in out_leaves)

    def backward(res, cts):
        return jax.tree_util.tree_unflatten(res_tree, res)(jax.tree_util.tree_unflatten(ct_tree, cts))

    res_shapes = [jax.ShapeDtypeStruct(jax.numpy.shape(r), jax.numpy.result_type(r)) for r in res_leaves]
    closed, cts_shape = jax.make_jaxpr(backward, return_shape=True)(res_shapes, list(ct_shapes))
    cts_tree = jax.tree_util.tree_structure(cts_shape)
    program = _fold_transposed_products(_flatten(closed))
    num_param_cts = jax.tree_util.tree_structure(params).num_leaves

    producer = {o: i for i, e in enumerate(program.eqns) for o in e.outs if o is not None}
    effectful = {i for i, e in enumerate(program.eqns) if e.effectful}
    bi_roots = list(program.outputs[num_param_cts:]) + [r for i in effectful for r in program.eqns[i].ins]
    bi = _needed(program, bi_roots, producer) | effectful
    bw = _needed(program, program.outputs[:num_param_cts], producer) - bi
    bi, bw = _feeders_of_products_to_bi(program, bi, bw, num_param_cts)
    bi, bw = _keep_light_work_in_bi(program, bi, bw, num_param_cts)
    residual_ids = _residuals(program, bw, num_param_cts)
    halves = _Halves(program, tuple(program.eqns[i] for i in sorted(bi)), tuple(program.eqns[i] for i in sorted(bw)),
                     residual_ids, num_param_cts, ct_tree, ct_shapes, cts_tree)
    inputs_to_program = list(closed.consts) + list(res_leaves)
    return (outputs, Partial(halves.backward_input, *inputs_to_program), Partial(halves.backward_weight))
