"""Receiving into the previous weights (``reshard_tree(..., out=old)``): the results are
written into the memory of arrays the caller gives up, so a receiver holds the model
once (plus what is in flight), not the old weights, the received buffers and the new
arrays at once.

JAX arrays are immutable to JAX programs, but their device memory is plain memory: on
CPU devices a shard's buffer is host memory at ``unsafe_buffer_pointer()`` (JAX's own
DLPack export marks it read-only, so a NumPy view is made from the pointer), on GPUs
device memory there that CuPy wraps as foreign memory (``cupy.cuda.UnownedMemory``;
not run here: no GPU). The call returns the same ``jax.Array`` objects, now holding
the new values: the caller donates ``out`` as it would to a jitted function with
``donate_argnums``, and must not let another computation read those arrays during the
call (pending computations that write them are waited for first); the host copy JAX
caches once an array was read with ``np.asarray`` is refreshed after.

By default the bytes land in the previous arrays as they arrive, so a call that fails
mid-transfer deletes them (``reshard._drop_out``): never half-written arrays handed back
or left readable. With ``atomic=True`` (``ReceiveInto``) each leaf's bytes land in
staging buffers of its own, made when its first transfer here starts, and are copied
into its previous arrays in one step once every transfer writing it here has ended (the
staging memory then goes back to the pool, for the leaves after it); a call that fails
part of the way raises ``PartialUpdateError`` naming the leaves that hold the new values
and those that still hold their previous ones, and every array stays usable. The staging
stays within the budget: the tree runs as groups of leaves in turn whose staging fits half
of it on every host (``resharding.staging``), the plans and executors within the other
half.

Refused by name, before anything moves: a leaf of another shape, type or sharding than
the result would have, a deleted array, two leaves sharing memory, a shard whose memory
JAX does not expose, or a wire type other than the result's type (the bytes would need a
cast on arrival).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping

import numpy as np

from ..errors import InternalError, InvalidOptionError
from .completion import LeafCompletion


def check_out(out_leaves: list, paths: list, shapes: list, types: list, shardings: list, wires: list,
              sources: list = ()) -> None:
    """Refuse an ``out`` tree that cannot take the results in place, naming the leaf:
    also where its memory overlaps another leaf's or that of a source the call reads
    (``sources``: (path, jax.Array) pairs); replicas of one leaf may share memory."""
    ranges: list[tuple[int, int, str, bool]] = []  # (start, end, path, is a source)
    for path, y, shape, want, sharding, wire in zip(paths, out_leaves, shapes, types, shardings, wires):
        if not hasattr(y, "is_deleted") or not hasattr(type(y), "addressable_shards"):
            raise InvalidOptionError(f"out leaf {path}: expected a jax.Array, got {type(y).__name__}")
        if y.is_deleted():
            raise InvalidOptionError(f"out leaf {path} is deleted (donated or freed): nothing to receive into")
        if tuple(y.shape) != tuple(shape) or np.dtype(y.dtype) != np.dtype(want):
            raise InvalidOptionError(f"out leaf {path} is {np.dtype(y.dtype).name}{list(y.shape)}; the result is "
                                     f"{np.dtype(want).name}{list(shape)}")
        if np.dtype(wire) != np.dtype(want):
            raise InvalidOptionError(f"out leaf {path}: it travels as {np.dtype(wire).name} and the result is "
                                     f"{np.dtype(want).name}; receiving in place needs the wire type to be the "
                                     f"result's (pass dtype={np.dtype(wire).name!r}, or leave out 'out')")
        if not y.sharding.is_equivalent_to(sharding, len(shape)):
            raise InvalidOptionError(f"out leaf {path} has sharding {y.sharding}, the destination is {sharding}")
        for s in y.addressable_shards:
            at = _pointer(s.data, path)
            ranges.append((at, at + _nbytes(s.data), path, False))
    for path, x in sources:
        for s in getattr(x, "addressable_shards", ()):
            try:
                at = int(s.data.unsafe_buffer_pointer())
            except Exception:  # noqa: BLE001 - a source whose memory is not exposed cannot be out's
                continue
            ranges.append((at, at + _nbytes(s.data), path, True))
    _refuse_overlaps(ranges)


def _nbytes(data) -> int:
    return int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize


def _refuse_overlaps(ranges: list) -> None:
    """Name the first two memory ranges that overlap, but for replicas of one out leaf
    lying on the very same bytes (they receive the same values)."""
    widest = None
    for r in sorted(ranges):
        start, end, path, source = r
        if widest is not None and start < widest[1] and end > start and not (source and widest[3]):
            same_replica = (not source and not widest[3] and path == widest[2] and (start, end) == widest[:2])
            if not same_replica:
                other = f"the source leaf {widest[2]}" if widest[3] else f"out leaf {widest[2]}"
                mine = f"the source leaf {path}" if source else f"out leaf {path}"
                raise InvalidOptionError(f"{mine} and {other} share memory: out needs memory of its own "
                                         f"(each leaf its own, none of the arrays being sent)")
        if widest is None or end > widest[1]:
            widest = r


def writable_shards(y, hosts, carrier: np.dtype, xp) -> dict:
    """``y``'s addressable shards (alpa_comm device id -> a writable array of ``carrier``
    over the shard's own memory), after every pending computation writing ``y`` ended."""
    y.block_until_ready()
    out = {}
    for s in y.addressable_shards:
        data = s.data
        if xp is np:
            nbytes = int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize
            raw = (ctypes.c_char * nbytes).from_address(_pointer(data, str(s.device))) if nbytes else bytearray(0)
            view = np.frombuffer(raw, np.uint8).view(carrier).reshape(data.shape)
        else:  # a GPU: the device buffer wrapped by CuPy as foreign memory, no copy
            nbytes = int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize
            memory = xp.cuda.UnownedMemory(_pointer(data, str(s.device)), nbytes, data, s.device.local_hardware_id)
            view = xp.ndarray(data.shape, carrier, xp.cuda.MemoryPointer(memory, 0))
        out[hosts.id_of(s.device)] = view
    return out


def forget_host_copies(y) -> None:
    """Refresh the host copy JAX keeps of an array once ``np.asarray`` read it
    (``_npy_value``, which JAX's C++ array does not let one clear): its memory now holds
    new values. Costs a copy only for an array that was read to the host before."""
    cached = getattr(y, "_npy_value", None)
    if cached is None:
        return
    cached.flags.writeable = True
    try:
        for s in y.addressable_shards:
            cached[s.index] = np.asarray(s.data)
    finally:
        cached.flags.writeable = False


def _pointer(data, path: str) -> int:
    try:
        return int(data.unsafe_buffer_pointer())
    except Exception as e:  # noqa: BLE001 - whatever this JAX or platform says, named
        raise InvalidOptionError(f"out leaf {path}: this platform does not expose the shard's memory ({e}); "
                                 f"leave out 'out'") from None


class Staging(Mapping):
    """One leaf's staging buffers on this process (device -> an array shaped and typed as
    that device's previous shard), made together on first use: a transfer asks for them
    when it starts, so a leaf's staging lives from its first transfer to its commit, not
    for the whole call. ``release`` lets them go (to the pool they came from)."""

    __slots__ = ("_views", "_alloc", "_bufs", "_lock")

    def __init__(self, views: dict, alloc):
        self._views, self._alloc, self._bufs, self._lock = views, alloc, None, threading.Lock()

    def __getitem__(self, device):
        bufs = self._bufs
        if bufs is None:
            with self._lock:
                if self._bufs is None:
                    self._bufs = {d: self._alloc(d, v.shape, v.dtype) for d, v in self._views.items()}
                bufs = self._bufs
        return bufs[device]

    def __contains__(self, device) -> bool:
        return device in self._views

    def __iter__(self):
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def made(self) -> dict:
        """The buffers made so far (none before the leaf's first transfer)."""
        return self._bufs or {}

    def release(self) -> None:
        self._bufs = None


class ReceiveInto:
    """``out=``: the executor's destination buffers (``buffers``: one entry per leaf of the
    plan) are the previous arrays' shards themselves, or with ``atomic`` each leaf's
    ``Staging``, which ``done`` (the executor's ``on_done``) copies into the previous
    arrays once the last transfer writing the leaf here has ended: under one lock, so
    after ``close`` nothing more is copied and ``updated`` tells exactly which leaves hold
    the new values.

    ``arrays``/``paths``/``views``: the previous arrays, their paths and their shards as
    writable views (``writable_shards``), one entry per leaf this process receives;
    ``alloc(device, shape, dtype)``: a staging buffer (of ``xp``, the views' module).
    ``bind`` says which plan leaf each one is and which transfers write which plan leaves
    here."""

    def __init__(self, arrays: list, paths: list, views: list, alloc, xp=np, atomic: bool = False):
        self.arrays, self.paths, self.views, self.xp, self.atomic = arrays, paths, views, xp, atomic
        self.staging = [Staging(v, alloc) if atomic else v for v in views]
        self.updated = [False] * len(arrays)
        self.buffers: list = []  # per plan leaf (``bind``)
        self._out_of: list = []  # plan leaf -> index into arrays (None: not ours)
        self._completion: LeafCompletion | None = None
        self._lock = threading.Lock()
        self._closed = False

    def bind(self, plan_leaves: int, plan_leaf_of: dict, writers: dict) -> None:
        """The plan about to run: ``plan_leaf_of[j]``, the plan leaf that ``arrays[j]``
        receives, for the arrays it moves (all of them, or one group of leaves after
        another: ``resharding.staging``); ``writers``: transfer id -> the plan leaves it
        writes here (``reshard._Share.writers``). A leaf that no transfer writes here
        (nothing of it to move) counts as updated."""
        with self._lock:
            self._out_of = [None] * plan_leaves
            self.buffers = [{} for _ in range(plan_leaves)]
            for j, i in plan_leaf_of.items():
                self._out_of[i] = j
                self.buffers[i] = self.staging[j]
            self._completion = LeafCompletion(plan_leaves, writers)
            for j, i in plan_leaf_of.items():
                if self._completion.unwritten(i):
                    self.updated[j] = True

    def done(self, transfer) -> None:
        """``transfer`` ended here: commit the leaves it was the last writer of (the
        executor's ``on_done`` with ``atomic`` only: in place there is nothing to commit)."""
        with self._lock:
            for i in self._completion.ended(transfer.id):
                j = self._out_of[i]
                if self._closed or j is None:
                    continue
                staged = self.staging[j].made()
                for device, view in self.views[j].items():
                    if device in staged:
                        view[...] = staged[device]
                self.staging[j].release()
                self.updated[j] = True

    def close(self) -> None:
        """Nothing more is committed (a failed call); an ongoing commit ends first."""
        with self._lock:
            self._closed = True

    def report(self) -> tuple[list, list]:
        """(paths of the leaves holding the new values, paths of those holding the previous)."""
        with self._lock:
            return ([p for p, u in zip(self.paths, self.updated) if u],
                    [p for p, u in zip(self.paths, self.updated) if not u])

    def results(self) -> list:
        """The previous arrays, every leaf committed, JAX's host copies refreshed."""
        missing = [p for p, u in zip(self.paths, self.updated) if not u]
        if missing and self.atomic:  # every transfer ended, so every leaf's last writer did: a plan that missed one
            raise InternalError(f"out leaves {missing} were not written by the call's transfers")
        if self.xp is not np and hasattr(self.xp, "cuda"):  # the commits are copies on the device: wait for them
            self.xp.cuda.runtime.deviceSynchronize()
        for y in self.arrays:
            forget_host_copies(y)
        return self.arrays

    def staged_buffers(self) -> list:
        """The staging buffers still held (what a late write could land in)."""
        return [st.made() for st in self.staging if self.atomic and st.made()]
