"""Decomposition of a cross-mesh resharding into unit tasks (paper, Appendix B.2).

Per tensor dimension the cut points of both specs are merged (0, l/k, 2l/k, ...
for a dimension split k ways on either side); the Cartesian product of the
resulting intervals gives the unique data slices. Each slice is one unit task:
the source devices holding it, the destination devices needing it, its bytes.

Because every interval lies inside exactly one source part and one destination
part of its dimension, the devices of a slice are found by a dictionary lookup
on the tuple of part indices, which keeps decomposition linear in the number of
slices (tens of thousands are routine for large meshes).
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Sequence

from ..mesh import DeviceMesh
from ..spec import Box, ShardingSpec


class UnitTask(NamedTuple):
    """One unique data slice and who has it / who needs it (a NamedTuple: plans
    hold tens of thousands and build them fast)."""

    id: int
    index: Box
    src_devices: tuple[int, ...]
    dst_devices: tuple[int, ...]
    nbytes: int

    @property
    def num_elements(self) -> int:
        n = 1
        for a, b in self.index:
            n *= b - a
        return n


def cut_points(length: int, *num_parts: int) -> list[int]:
    """Sorted union of the equal-split boundaries of ``length`` for each part count."""
    cuts = {0, length}
    for k in num_parts:
        cuts.update(i * (length // k) for i in range(1, k))
    return sorted(cuts)


def _devices_by_parts(mesh: DeviceMesh, spec: ShardingSpec) -> dict[tuple[int, ...], list[int]]:
    out: dict[tuple[int, ...], list[int]] = {}
    for coord, dev in mesh.coords():
        out.setdefault(spec.part_index(coord, mesh.shape), []).append(dev)
    return out


def decompose(shape: Sequence[int], itemsize: int, src_mesh: DeviceMesh, src_spec: ShardingSpec,
              dst_mesh: DeviceMesh, dst_spec: ShardingSpec) -> list[UnitTask]:
    """Unit tasks of resharding ``shape`` from (src_mesh, src_spec) to (dst_mesh, dst_spec).

    Specs must already be validated against the shape and meshes.
    """
    src_parts = src_spec.num_shards(src_mesh.shape)
    dst_parts = dst_spec.num_shards(dst_mesh.shape)
    per_dim = []  # per dim: list of (interval, src part, dst part, length)
    for length, ks, kd in zip(shape, src_parts, dst_parts):
        cuts = cut_points(length, ks, kd)
        ss, ds = length // ks, length // kd
        per_dim.append([((a, b), a // ss, a // ds, b - a) for a, b in zip(cuts, cuts[1:])])
    src_by = {k: tuple(v) for k, v in _devices_by_parts(src_mesh, src_spec).items()}
    dst_by = {k: tuple(v) for k, v in _devices_by_parts(dst_mesh, dst_spec).items()}
    tasks = []
    prod = math.prod
    for i, combo in enumerate(itertools.product(*per_dim)):
        index, sp, dp, lengths = zip(*combo) if combo else ((), (), (), ())
        tasks.append(UnitTask(i, index, src_by[sp], dst_by[dp], itemsize * prod(lengths)))
    return tasks
