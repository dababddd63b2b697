"""Plain objects with Alpa 0.2.3's field names, built the way Alpa builds them, so the
translation layer is tested against Alpa's formats without Alpa installed."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from alpa_comm.mesh import DeviceMesh
from alpa_comm.placement import device_boxes
from alpa_comm.spec import ShardingSpec


@dataclass
class Aval:
    shape: tuple
    dtype: object


@dataclass
class PhysicalMesh:
    host_ips: list
    num_devices_per_host: int

    @property
    def shape(self):
        return (len(self.host_ips), self.num_devices_per_host)


@dataclass
class Tile:
    tile_index: tuple
    indices: list            # global slices
    tile_shape: tuple
    replica_device_strs: list


class TileSlice(Tile):
    """As in Alpa 0.2.3: a ``Tile`` (its own ``indices``, the whole source tile) plus the
    ``offset`` of the slice inside it; there is no ``.tile`` attribute."""

    def __init__(self, tile: Tile, offset: list):
        super().__init__(tile.tile_index, tile.indices, tile.tile_shape, tile.replica_device_strs)
        self.offset = offset

    @property
    def slice_size(self):
        return int(np.prod([o.stop - o.start for o in self.offset]))


@dataclass
class VirtualDistributedArray:
    device_mesh: PhysicalMesh
    aval: Aval
    sharding_spec: object
    tiles: dict = field(default_factory=dict)


@dataclass
class ReshardingTaskSpec:
    src: VirtualDistributedArray
    dst: VirtualDistributedArray
    dst_tile_to_src_tiles_map: list


def ip(host):
    return f"10.0.0.{host + 1}"


def _array(shape, dtype, mesh_text, spec_text, dph):
    mesh = DeviceMesh.parse(mesh_text, dph)
    spec = ShardingSpec.parse(spec_text)
    phys = PhysicalMesh([ip(h) for h in mesh.hosts], mesh.shape[1] if mesh.ndim == 2 else mesh.size)
    boxes = device_boxes(shape, mesh, spec)
    parts = spec.num_shards(mesh.shape)
    tiles = {}
    for coord, dev in mesh.coords():
        idx = spec.part_index(coord, mesh.shape)
        box = boxes[dev]
        t = tiles.setdefault(idx, Tile(idx, [slice(a, b) for a, b in box], tuple(b - a for a, b in box), []))
        t.replica_device_strs.append(f"{ip(dev // dph)}:gpu:{dev % dph}")
    arr = VirtualDistributedArray(phys, Aval(tuple(shape), np.dtype(dtype)), spec.to_alpa(mesh.shape), tiles)
    return arr, parts


def task_spec(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec, dph):
    src, src_parts = _array(shape, dtype, src_mesh, src_spec, dph)
    dst, dst_parts = _array(shape, dtype, dst_mesh, dst_spec, dph)
    mapping = []
    for didx in itertools.product(*(range(p) for p in dst_parts)):  # row-major, as Alpa's tiles.flatten()
        tile = dst.tiles[didx]
        ranges = []
        for d, sl in enumerate(tile.indices):
            length = shape[d] // src_parts[d]
            ranges.append(range(sl.start // length, (sl.stop - 1) // length + 1))
        slices, in_dst = [], []
        for sidx in itertools.product(*ranges):
            stile = src.tiles[sidx]
            off, ind = [], []
            for d, (ss, ds) in enumerate(zip(stile.indices, tile.indices)):
                lo, hi = max(ss.start, ds.start), min(ss.stop, ds.stop)
                off.append(slice(lo - ss.start, hi - ss.start))
                ind.append(slice(lo - ds.start, hi - ds.start))
            slices.append(TileSlice(stile, off))
            in_dst.append(ind)
        mapping.append((tile, slices, in_dst))
    return ReshardingTaskSpec(src, dst, mapping)
