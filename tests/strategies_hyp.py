"""Hypothesis strategies shared by the property tests: random meshes, specs, shapes."""
from __future__ import annotations

import math

from hypothesis import strategies as st

from alpa_comm import ShardingSpec


@st.composite
def mesh_shapes(draw, max_hosts=6, max_dph=4):
    """(mesh shape, hosts used) for a 1-d to 3-d mesh; dim 0 spans the hosts for 2-d+."""
    ndim = draw(st.integers(1, 3))
    if ndim == 1:
        n = draw(st.integers(1, max_dph))
        return (n,), 1
    hosts = draw(st.integers(1, max_hosts))
    if ndim == 2:
        return (hosts, draw(st.integers(1, max_dph))), hosts
    a = draw(st.sampled_from([d for d in range(1, max_dph + 1) if max_dph % d == 0 or d <= 2]))
    b = draw(st.integers(1, max(1, max_dph // a)))
    return (hosts, a, b), hosts


@st.composite
def specs(draw, rank, mesh_ndim):
    """A random valid spec of ``rank`` tensor dims over a mesh of ``mesh_ndim`` dims."""
    dims = [[] for _ in range(rank)]
    for m in draw(st.permutations(list(range(mesh_ndim)))):
        where = draw(st.integers(-1, rank - 1))
        if where >= 0:
            dims[where].append(m)
    return ShardingSpec(tuple(tuple(d) for d in dims))


@st.composite
def resharding_cases(draw, max_hosts=6, max_dph=4, overlap=False):
    """(shape, src mesh text, src spec, dst mesh text, dst spec, devices per host).
    With ``overlap`` the destination mesh starts on any host of the source mesh (or
    right after it): colocated meshes, identical ones included."""
    (sshape, shosts) = draw(mesh_shapes(max_hosts=max_hosts // 2, max_dph=max_dph))
    (dshape, dhosts) = draw(mesh_shapes(max_hosts=max_hosts - max_hosts // 2, max_dph=max_dph))
    rank = draw(st.integers(1, 3))
    sspec = draw(specs(rank, len(sshape)))
    dspec = draw(specs(rank, len(dshape)))
    sparts = sspec.num_shards(sshape)
    dparts = dspec.num_shards(dshape)
    shape = tuple(math.lcm(a, b) * draw(st.integers(1, 3)) for a, b in zip(sparts, dparts))
    dph = max(math.prod(sshape) // shosts, math.prod(dshape) // dhosts)
    src = "x".join(map(str, sshape)) + "@" + ",".join(str(h) for h in range(shosts))
    first = draw(st.integers(0, shosts)) if overlap else shosts
    dst = "x".join(map(str, dshape)) + "@" + ",".join(str(h) for h in range(first, first + dhosts))
    return shape, src, sspec, dst, dspec, dph
