"""``dense(x, w)``: the matmul of the models, whose weight gradient can be deferred.

Splitting a backward into an input-gradient part (BI) and a weight-gradient
part (BW) pays only if BW does not redo BI's work. Taking the two halves of one
VJP does: to get the weight gradient of an early layer the output gradients of
every later op must be recomputed. So the models route their weight matmuls
through ``dense``; under a ``WeightTape`` (set while the training runtime traces
a stage's forward):

* the forward records each matmul's input ``x`` and which parameter ``w`` is;
* the backward of ``x @ w`` gives ``dy @ w.T`` for ``x`` and hands the output
  gradient ``dy`` out through a zero "tap" input (its cotangent is ``dy``),
  computing no weight gradient at all;
* BW is then one ``x^T dy`` per matmul (``weight_grads``): no recomputation, so
  BI + BW costs what the full backward costs.

Outside a tape ``dense`` is ``x @ w``: the single-device reference runs unchanged.
"""
from __future__ import annotations

import contextvars

import jax
import jax.numpy as jnp

_TAPE: contextvars.ContextVar = contextvars.ContextVar("alpa_comm_weight_tape", default=None)


def dense(x, w):
    tape = _TAPE.get()
    return x @ w if tape is None else tape.dense(x, w)


@jax.custom_vjp
def _tapped(x, w, tap):
    return x @ w


def _tapped_fwd(x, w, tap):
    return x @ w, w


def _tapped_bwd(w, dy):
    # no weight gradient here (BW computes it from the recorded x and this dy)
    return dy @ w.T, jnp.zeros_like(w), dy


_tapped.defvjp(_tapped_fwd, _tapped_bwd)


class WeightTape:
    """Collects, while a stage is traced, each ``dense`` call's input and parameter path.

    ``params`` are the (traced) parameters the stage is called with; ``taps`` the
    zero arrays that collect output gradients, or None to only discover their shapes.
    """

    def __init__(self, params, taps=None):
        self.path_of = {id(leaf): path for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
        self.taps = taps
        self.inputs: list = []
        self.paths: list = []
        self.shapes: list = []

    def dense(self, x, w):
        path = self.path_of.get(id(w))
        if path is None:  # not a parameter (e.g. a computed matrix): nothing to defer
            return x @ w
        i = len(self.paths)
        self.paths.append(path)
        self.inputs.append(x)
        if self.taps is None:
            y = x @ w
            self.shapes.append(jax.ShapeDtypeStruct(y.shape, y.dtype))
            return y
        return _tapped(x, w, self.taps[i])

    def __enter__(self):
        self._token = _TAPE.set(self)
        return self

    def __exit__(self, *exc):
        _TAPE.reset(self._token)


def weight_grads(partial, paths, inputs, output_grads):
    """The complete parameter gradient: ``partial`` (everything but the deferred
    matmuls, which it holds as zeros) plus ``x^T dy`` for every recorded matmul."""
    flat, tree = jax.tree_util.tree_flatten_with_path(partial)
    index = {path: i for i, (path, _) in enumerate(flat)}
    leaves = [leaf for _, leaf in flat]
    for path, x, dy in zip(paths, inputs, output_grads):
        i = index[path]
        g = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
        leaves[i] = leaves[i] + g.astype(leaves[i].dtype)
    return jax.tree_util.tree_unflatten(tree, leaves)
