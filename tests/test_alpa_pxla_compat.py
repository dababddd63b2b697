"""The pxla stand-in behaves as jax 0.3.22 does: jax 0.3.22's own ``pxla.py`` functions
(mesh shape, OpSharding proto, indices, ``spec_to_indices``), taken from its source
distribution and executed on the stand-in's data types, give the same answers as the
stand-in over random sharding specs. Skipped, with the reason, where the package
registry cannot be reached."""
import __future__
import ast
import itertools
import math
import types
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union, cast

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm.integrations.alpa_harness import pxla_compat as px
from alpa_comm.integrations.alpa_harness.sources import SourcesUnavailable, jax_pxla_source

JAX_FUNCTIONS = ("sharding_spec_mesh_shape", "_get_logical_mesh_ids", "sharding_spec_sharding_proto",
                 "_get_num_ways_dim_sharded", "_op_sharding_to_numpy_indices", "sharding_spec_indices",
                 "is_op_sharding_replicated", "spec_to_indices")


@pytest.fixture(scope="module")
def jax_spec():
    """A ShardingSpec class whose methods are jax 0.3.22's own, on the stand-in's types."""
    try:
        source = jax_pxla_source()
    except SourcesUnavailable as e:
        pytest.skip(str(e))
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in JAX_FUNCTIONS]
    assert sorted(d.name for d in defs) == sorted(JAX_FUNCTIONS)
    module = ast.Module(body=defs, type_ignores=[])
    ns = {"np": np, "it": itertools, "prod": math.prod, "cast": cast, "Tuple": Tuple, "Mapping": Mapping,
          "Dict": Dict, "List": List, "Sequence": Sequence, "Any": Any, "Union": Union, "defaultdict": defaultdict,
          "Index": Any, "OpShardingType": Any, "MeshAxisName": Any, "NoSharding": px.NoSharding,
          "Chunked": px.Chunked, "Unstacked": px.Unstacked, "ShardedAxis": px.ShardedAxis,
          "Replicated": px.Replicated, "xc": types.SimpleNamespace(OpSharding=px.OpSharding),
          "xla_extension_version": 0,  # the proto-type test, not XLA's HloSharding
          "assert_unreachable": lambda x: (_ for _ in ()).throw(AssertionError(x))}
    flags = __future__.annotations.compiler_flag  # as the file itself says at its top
    exec(compile(module, "jax-0.3.22/jax/interpreters/pxla.py", "exec", flags=flags), ns)  # noqa: S102

    class JaxSpec(px.ShardingSpec):
        mesh_shape = property(ns["sharding_spec_mesh_shape"])
        sharding_proto = ns["sharding_spec_sharding_proto"]
        indices = ns["sharding_spec_indices"]

    JaxSpec.spec_to_indices = staticmethod(ns["spec_to_indices"])
    return JaxSpec


@st.composite
def specs(draw):
    """A random (shape, sharding, mesh_mapping) of the forms jax and Alpa build."""
    rank = draw(st.integers(1, 3))
    sharding, shape, chunk_sizes = [], [], []
    for _ in range(rank):
        kind = draw(st.sampled_from(["none", "chunked", "chunked2"] + (["unstacked"] if draw(st.booleans()) else [])))
        if kind == "none":
            sharding.append(px.NoSharding())
            shape.append(draw(st.integers(1, 6)))
        elif kind == "unstacked":
            n = draw(st.integers(1, 3))
            sharding.append(px.Unstacked(n))
            shape.append(n)
            chunk_sizes.append(n)
        else:
            chunks = [draw(st.integers(1, 3)) for _ in range(1 if kind == "chunked" else 2)]
            sharding.append(px.Chunked(chunks))
            shape.append(math.prod(chunks) * draw(st.integers(1, 3)))
            chunk_sizes.extend(chunks)
    mapping = [px.ShardedAxis(a) for a in draw(st.permutations(range(len(chunk_sizes))))]
    for _ in range(draw(st.integers(0, 2))):
        mapping.insert(draw(st.integers(0, len(mapping))), px.Replicated(draw(st.integers(1, 3))))
    if not mapping:
        mapping = [px.Replicated(draw(st.integers(1, 4)))]
    return tuple(shape), sharding, mapping


@settings(max_examples=300, deadline=None)
@given(specs())
def test_the_stand_in_matches_jax_0_3_22(jax_spec, case):
    shape, sharding, mapping = case
    ours, theirs = px.ShardingSpec(sharding, mapping), jax_spec(sharding, mapping)
    assert ours.mesh_shape == theirs.mesh_shape
    if not any(isinstance(s, px.Unstacked) for s in sharding):
        a, b = ours.sharding_proto(), theirs.sharding_proto()
        assert (a.type, a.tile_assignment_dimensions, a.tile_assignment_devices, list(a.last_tile_dims)) == \
               (b.type, b.tile_assignment_dimensions, b.tile_assignment_devices, list(b.last_tile_dims))
    assert px.spec_to_indices(shape, ours) == jax_spec.spec_to_indices(shape, theirs)


def test_a_replicated_spec_and_alpa_s_benchmark_forms(jax_spec):
    """Alpa's own benchmark specs: [Replicated(8)] and [ShardedAxis(0)] on (1024, 1024, 512)."""
    for sharding, mapping in (([px.NoSharding()] * 3, [px.Replicated(8)]),
                              ([px.Chunked([8]), px.NoSharding(), px.NoSharding()], [px.ShardedAxis(0)])):
        ours, theirs = px.ShardingSpec(sharding, mapping), jax_spec(sharding, mapping)
        assert px.spec_to_indices((1024, 1024, 512), ours) == jax_spec.spec_to_indices((1024, 1024, 512), theirs)
