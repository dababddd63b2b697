import math

from hypothesis import given, settings

from alpa_comm import DeviceMesh
from alpa_comm.resharding import decompose, device_boxes
from alpa_comm.resharding.unit_tasks import cut_points

from strategies_hyp import resharding_cases


def test_cut_points():
    assert cut_points(12, 2, 3) == [0, 4, 6, 8, 12]
    assert cut_points(8, 1, 1) == [0, 8]


def test_paper_figure_10_case():
    # S01R on a 2x2 mesh -> S0R on a 2x2 mesh, 4x4 tensor: 4 row slices
    src = DeviceMesh.parse("2x2@0", 4)
    dst = DeviceMesh.parse("2x2@1", 4)
    from alpa_comm import ShardingSpec
    tasks = decompose((4, 4), 4, src, ShardingSpec.parse("S01R"), dst, ShardingSpec.parse("S0R"))
    assert [t.index for t in tasks] == [((i, i + 1), (0, 4)) for i in range(4)]
    assert [t.src_devices for t in tasks] == [(0,), (1,), (2,), (3,)]
    assert [t.dst_devices for t in tasks] == [(4, 5), (4, 5), (6, 7), (6, 7)]
    assert all(t.nbytes == 16 for t in tasks)


@settings(max_examples=150, deadline=None)
@given(resharding_cases())
def test_tasks_partition_tensor_and_match_device_boxes(case):
    shape, src_t, sspec, dst_t, dspec, dph = case
    src, dst = DeviceMesh.parse(src_t, dph), DeviceMesh.parse(dst_t, dph)
    tasks = decompose(shape, 2, src, sspec, dst, dspec)
    assert sum(t.num_elements for t in tasks) == math.prod(shape)  # slices tile the tensor
    assert sum(t.nbytes for t in tasks) == 2 * math.prod(shape)
    sbox, dbox = device_boxes(shape, src, sspec), device_boxes(shape, dst, dspec)

    def inside(i, o):
        return all(o0 <= a and b <= o1 for (a, b), (o0, o1) in zip(i, o))

    for t in tasks:
        assert set(t.src_devices) == {d for d, b in sbox.items() if inside(t.index, b)}
        assert set(t.dst_devices) == {d for d, b in dbox.items() if inside(t.index, b)}
    for d, box in dbox.items():
        assert sum(t.num_elements for t in tasks if d in t.dst_devices) == math.prod(b - a for a, b in box)
