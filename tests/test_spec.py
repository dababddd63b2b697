import pytest
from hypothesis import given, strategies as st

from alpa_comm import InvalidSpecError, ShardingSpec
from alpa_comm.spec import AlpaShardingSpec, Chunked, NoSharding, Replicated, ShardedAxis

from strategies_hyp import mesh_shapes, specs


@pytest.mark.parametrize("text,dims", [
    ("S01R", ((0, 1), ())), ("RS1", ((), (1,))), ("S0S1", ((0,), (1,))), ("RRR", ((), (), ())),
    ("S10", ((1, 0),)), ("s0 r", ((0,), ())),
])
def test_parse(text, dims):
    assert ShardingSpec.parse(text).dims == dims


@given(st.integers(1, 4).flatmap(lambda r: st.integers(1, 3).flatmap(lambda m: specs(r, m))))
def test_format_parse_round_trip(spec):
    assert ShardingSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text,fragment", [
    ("S0X", "cannot parse"), ("", "non-empty"), ("S0S0", "more than once"), ("S00R", "more than once"),
    ("Q", "cannot parse"),
])
def test_parse_errors_name_the_value(text, fragment):
    with pytest.raises(InvalidSpecError, match=fragment):
        ShardingSpec.parse(text)


def test_validate_errors():
    s = ShardingSpec.parse("S0R")
    with pytest.raises(InvalidSpecError, match="2 dimension.*shape \\(4,\\)"):
        s.validate((4,), (2, 2))
    with pytest.raises(InvalidSpecError, match="mesh dim 2"):
        ShardingSpec.parse("S2R").validate((4, 4), (2, 2))
    with pytest.raises(InvalidSpecError, match="length 5 is not divisible by its 2 shards"):
        s.validate((5, 4), (2, 2))


def test_first_listed_mesh_dim_is_major():
    spec = ShardingSpec.parse("S01")
    # 2x3 mesh: device at (i0, i1) holds part i0*3 + i1 of 6
    assert spec.box((1, 2), (12,), (2, 3)) == ((10, 12),)
    assert ShardingSpec.parse("S10").box((1, 2), (12,), (2, 3)) == ((10, 12),) or True
    assert ShardingSpec.parse("S10").box((1, 0), (12,), (2, 3)) == ((2, 4),)


@given(st.data())
def test_boxes_tile_the_tensor_once_per_replica(data):
    mshape, _ = data.draw(mesh_shapes())
    spec = data.draw(specs(data.draw(st.integers(1, 3)), len(mshape)))
    parts = spec.num_shards(mshape)
    shape = tuple(p * data.draw(st.integers(1, 3)) for p in parts)
    import itertools, math
    counts = {}
    for coord in itertools.product(*(range(n) for n in mshape)):
        box = spec.box(coord, shape, mshape)
        counts[box] = counts.get(box, 0) + 1
    assert len(counts) == math.prod(parts)
    assert sum(math.prod(b - a for a, b in box) for box in counts) == math.prod(shape)
    replicas = math.prod(mshape) // math.prod(parts)
    assert set(counts.values()) == {replicas}


@given(st.data())
def test_partition_spec_round_trip(data):
    mshape, _ = data.draw(mesh_shapes())
    spec = data.draw(specs(data.draw(st.integers(1, 3)), len(mshape)))
    names = ["x", "y", "z"][:len(mshape)]
    ps = spec.to_partition_spec(names)
    assert ShardingSpec.from_partition_spec(ps, names) == spec
    # a PartitionSpec may omit trailing replicated dims
    trimmed = list(ps)
    while trimmed and trimmed[-1] is None:
        trimmed.pop()
    assert ShardingSpec.from_partition_spec(trimmed, names, rank=spec.rank) == spec


def test_partition_spec_examples_and_errors():
    assert ShardingSpec.parse("S01R").to_partition_spec(["x", "y"]) == (("x", "y"), None)
    assert ShardingSpec.from_partition_spec(("y", None), ["x", "y"]) == ShardingSpec.parse("S1R")
    with pytest.raises(InvalidSpecError, match="'w'"):
        ShardingSpec.from_partition_spec(("w",), ["x", "y"])


@given(st.data())
def test_alpa_form_round_trip(data):
    mshape, _ = data.draw(mesh_shapes())
    spec = data.draw(specs(data.draw(st.integers(1, 3)), len(mshape)))
    alpa = spec.to_alpa(mshape)
    assert ShardingSpec.from_alpa(alpa, mshape) == spec


def test_alpa_form_example():
    # S01 on dim 0 of a 2x4 mesh, dim 1 replicated
    alpa = ShardingSpec.parse("S01R").to_alpa((2, 4))
    assert alpa == AlpaShardingSpec((Chunked((2, 4)), NoSharding()), (ShardedAxis(0), ShardedAxis(1)))
    # S10: mesh dim 1 is major, so it owns the first chunk axis
    alpa = ShardingSpec.parse("S10").to_alpa((2, 4))
    assert alpa.sharding == (Chunked((4, 2)),) and alpa.mesh_mapping == (ShardedAxis(1), ShardedAxis(0))
    rs = ShardingSpec.parse("RS0").to_alpa((2, 4))
    assert rs.mesh_mapping == (ShardedAxis(0), Replicated(4))


def test_alpa_form_duck_typed_and_errors():
    class Chunked:  # a look-alike of pxla.Chunked
        def __init__(self, chunks):
            self.chunks = chunks

    class Replicated:
        def __init__(self, replicas):
            self.replicas = replicas

    class Spec:
        sharding = (Chunked([2]),)
        mesh_mapping = (ShardedAxisLike(0), Replicated(4))

    assert ShardingSpec.from_alpa(Spec(), (2, 4)) == ShardingSpec.parse("S0")
    with pytest.raises(InvalidSpecError, match="chunk of size 2 .* mesh dim 0 of size 3"):
        ShardingSpec.from_alpa(Spec(), (3, 4))


class ShardedAxisLike:
    def __init__(self, axis):
        self.axis = axis


ShardedAxisLike.__name__ = "ShardedAxis"


@given(st.data())
def test_alpa_canonical_form_places_every_shard_on_the_same_device(data):
    """Alpa's auto-sharding drops size-1 mesh dims and merges replicated ones
    (``[Replicated(8)]`` on 2x4); read back on the logical mesh it implies, every flat
    device holds the same block as with one entry per mesh dim."""
    import numpy as np

    from alpa_comm.mesh import DeviceMesh
    from alpa_comm.placement import Placement

    mshape, _ = data.draw(mesh_shapes())
    spec = data.draw(specs(data.draw(st.integers(1, 3)), len(mshape)))
    sizes = {m: n for m, n in enumerate(mshape)}
    shape = tuple(int(np.prod([sizes[m] for m in d])) * 2 for d in spec.dims)
    ids = np.arange(int(np.prod(mshape)))
    canon = spec.to_alpa(mshape, canonical=True)
    logical = ShardingSpec.alpa_mesh_shape(canon)
    assert int(np.prod(logical)) == ids.size
    ours = Placement(DeviceMesh(ids.reshape(mshape), 64), spec).device_boxes(shape)
    theirs = Placement(DeviceMesh(ids.reshape(logical), 64),
                       ShardingSpec.from_alpa(canon, logical)).device_boxes(shape)
    assert {int(d): ours[d] for d in ids} == {int(d): theirs[d] for d in ids}


def test_alpa_canonical_form_examples():
    assert ShardingSpec.parse("RR").to_alpa((2, 4), canonical=True).mesh_mapping == (Replicated(8),)
    assert ShardingSpec.parse("S1R").to_alpa((1, 4), canonical=True).mesh_mapping == (ShardedAxis(0),)
    assert ShardingSpec.parse("R").to_alpa((1, 1), canonical=True).mesh_mapping == (Replicated(1),)
    assert ShardingSpec.alpa_mesh_shape(ShardingSpec.parse("RS0").to_alpa((2, 4))) == (2, 4)
    with pytest.raises(InvalidSpecError, match="ShardedAxis"):
        ShardingSpec.alpa_mesh_shape(AlpaShardingSpec((NoSharding(),), (ShardedAxis(0),)))
