"""Where a plan's data lies on one host: each leaf's boxes per device (``Layout``), views
of a buffer by box, and the destination slab a call's buffers are cut from
(``slab_regions``, ``destination_buffers``) with the coalesced buckets that land in it in
place. Pure NumPy (CuPy only where its arrays are passed in); no backend, no threads."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..resharding.plan import Leaf, Transfer
from ..spec import Box
from .backend import CommunicationError
from .host_memory import HOST_ALIGNMENT, aligned_empty


def numpy_dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes  # noqa: PLC0415 - optional

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError as e:
            raise CommunicationError("bfloat16 arrays need the ml_dtypes package") from e
    return np.dtype(name)


def array_module(*buffer_lists):
    """The array module of the buffers (CuPy for GPU arrays, else NumPy), found without
    importing CuPy where none is used."""
    for group in buffer_lists:
        for bufs in group:
            for b in (bufs or {}).values():
                if type(b).__module__.split(".")[0] == "cupy":
                    import cupy  # noqa: PLC0415 - only where its arrays are passed in

                    return cupy
    return np


class SlabLayout(NamedTuple):
    """Where a host's destination buffers lie in one flat slab (``slab_regions``)."""

    total: int
    regions: list  # (leaf, device, offset, bytes, shape) of every local destination buffer
    buckets: dict  # transfer id -> (offset, bytes): coalesced transfers that land in place
    by_leaf: tuple = ()  # per leaf: ((device, offset, bytes, shape), ...), the regions regrouped


class LeafViews(Mapping):
    """One leaf's destination buffers on this host (device -> array), views of the call's
    slab made on first use: a 200-leaf call's first receive is posted without first
    cutting 400 views (the in-place buckets are views of their own), and the views of a
    leaf are made where it is first needed, mostly on the placing thread as its bytes
    arrive. Making them twice at once is harmless."""

    __slots__ = ("_flat", "_regions", "_dtype", "_views")

    def __init__(self, flat: np.ndarray, regions: tuple, dtype: np.dtype):
        self._flat, self._regions, self._dtype, self._views = flat, regions, dtype, None

    def _get(self) -> dict:
        if self._views is None:
            flat, dtype = self._flat, self._dtype
            self._views = {d: flat[at:at + n].view(dtype).reshape(shape) for d, at, n, shape in self._regions}
        return self._views

    def __getitem__(self, device):
        return self._get()[device]

    def __contains__(self, device) -> bool:
        return any(d == device for d, _, _, _ in self._regions)

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._regions)


class Destinations(NamedTuple):
    """A call's destination buffers (per leaf: device -> buffer) and, per coalesced
    transfer that lands in place, the flat slab view it is received into."""

    buffers: list
    in_place: dict


def destination_buffers(layouts: list["Layout"], slab: SlabLayout, alloc_flat) -> Destinations:
    """Every leaf's destination buffers on this host cut from one flat slab
    (``alloc_flat(nbytes)``: aligned host bytes) as ``slab`` (``slab_regions``: the same
    for every repetition of a call, so worked out once) says, with the views the
    in-place buckets are received into (no search per call)."""
    flat = alloc_flat(slab.total)
    out = [LeafViews(flat, regions, lay.dtype) for lay, regions in zip(layouts, slab.by_leaf)]
    return Destinations(out, {tid: flat[at:at + nbytes] for tid, (at, nbytes) in slab.buckets.items()})


def slab_regions(layouts: list["Layout"], is_local: Callable[[int], bool],
                 transfers: Sequence[Transfer] = ()) -> SlabLayout:
    """Each local destination buffer's region, starting on a ``HOST_ALIGNMENT`` boundary,
    in the order this host's buckets (coalesced ``transfers``) carry them, the rest after
    in (leaf, device) order; a bucket whose parts are whole shards with one receiving
    device here each then lies back to back (where no padding falls between) and is
    received in place (``SlabLayout.buckets``). The slab lives while any of its arrays
    does."""
    order = {}
    for t in transfers:
        for p in t.parts:
            for r in p.receivers:
                if is_local(r) and p.index == layouts[p.leaf].dst_boxes.get(r):
                    order.setdefault((p.leaf, r), None)
    for i, lay in enumerate(layouts):
        for d in lay.dst_boxes:
            if is_local(d):
                order.setdefault((i, d), None)
    regions, total, at = [], 0, {}
    by_leaf: list[list] = [[] for _ in layouts]
    for i, d in order:
        shape = shape_of(layouts[i].dst_boxes[d])
        nbytes = int(np.prod(shape, dtype=np.int64)) * layouts[i].dtype.itemsize
        regions.append((i, d, total, nbytes, shape))
        by_leaf[i].append((d, total, nbytes, shape))
        at[i, d] = (total, nbytes)
        total += -(-nbytes // HOST_ALIGNMENT) * HOST_ALIGNMENT
    return SlabLayout(total, regions, _in_place_buckets(layouts, is_local, transfers, at),
                      tuple(tuple(r) for r in by_leaf))


def _in_place_buckets(layouts, is_local, transfers, at: dict) -> dict:
    """transfer id -> (offset, bytes) of every coalesced transfer whose parts are whole
    destination shards, one local receiver each, lying back to back in the slab in part
    order."""
    out = {}
    for t in transfers:
        if not t.parts:
            continue
        start = end = None
        for p in t.parts:
            mine = [r for r in p.receivers if is_local(r)]
            if len(mine) != 1 or p.index != layouts[p.leaf].dst_boxes.get(mine[0]):
                break
            offset, nbytes = at[p.leaf, mine[0]]
            if nbytes != p.nbytes or (end is not None and offset != end):
                break
            start = offset if start is None else start
            end = offset + nbytes
        else:
            if start is not None:
                out[t.id] = (start, end - start)
    return out


def view(buf: np.ndarray, buf_box: Box, index: Box) -> np.ndarray:
    """The part of ``buf`` (holding ``buf_box`` of the tensor) that covers ``index``."""
    if index == buf_box:  # a whole shard: the common case of a weight sync, no slicing
        return buf
    return buf[tuple(slice(a - b0, b - b0) for (a, b), (b0, _) in zip(index, buf_box))]


def shape_of(index: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in index)


@dataclass
class Layout:
    """Where every device's data sits in the global tensor (one leaf of a plan)."""

    dtype: np.dtype
    src_boxes: dict[int, Box]
    dst_boxes: dict[int, Box]
    sent_boxes: dict[int, Box]  # what the network delivers (differs from dst only for Alpa's rewrite)

    @classmethod
    def of(cls, leaf: Leaf) -> "Layout":
        dst = leaf.resharding.dst.device_boxes(leaf.shape)
        sent = dst if leaf.sent_spec is None else leaf.sent.device_boxes(leaf.shape)
        return cls(numpy_dtype(leaf.dtype), leaf.resharding.src.device_boxes(leaf.shape), dst, sent)

    def empty_destinations(self, is_local: Callable[[int], bool], zeros: bool = False,
                           alloc: Callable | None = None) -> dict[int, np.ndarray]:
        """Fresh buffers for the destination devices ``is_local`` accepts (``alloc(device,
        shape, dtype)`` makes one elsewhere than in host memory, e.g. on a GPU)."""
        make = alloc or (lambda _device, shape, dtype: aligned_empty(shape, dtype, zeros))
        return {d: make(d, shape_of(box), self.dtype) for d, box in self.dst_boxes.items() if is_local(d)}

    def source_shards(self, array: np.ndarray, is_local: Callable[[int], bool]) -> dict[int, np.ndarray]:
        """The source devices' shards of a whole ``array``, for the devices ``is_local`` accepts."""
        full = tuple((0, n) for n in array.shape)
        return {d: np.ascontiguousarray(view(array, full, box)) for d, box in self.src_boxes.items() if is_local(d)}
