"""Receiving into the previous weights (``reshard_tree(..., out=old)``): the destination
buffers of a sync are the memory of arrays the caller gives up, so a receiver holds one
copy of the model, not the old weights, the received buffers and the new arrays at once.

JAX arrays are immutable to JAX programs, but their device memory is plain memory: on
CPU devices a shard's buffer is host memory at ``unsafe_buffer_pointer()`` (JAX's own
DLPack export marks it read-only, so a NumPy view is made from the pointer), on GPUs
device memory there that CuPy wraps as foreign memory (``cupy.cuda.UnownedMemory``;
not run here: no GPU). The sync writes there and returns the same ``jax.Array``
objects, now holding the new values: the caller donates ``out`` as it would to a jitted
function with ``donate_argnums``, and must not let another computation read those
arrays during the call (pending computations that write them are waited for first);
the host copy JAX caches once an array was read with ``np.asarray`` is refreshed after.
A call that fails mid-transfer deletes them (``reshard._Into.discarded_on_failure``):
never half-written arrays handed back or left readable.

Refused by name, before anything moves: a leaf of another shape, type or sharding than
the result would have, a deleted array, two leaves sharing memory, a shard whose memory
JAX does not expose, or a wire type other than the result's type (the bytes would need a
cast on arrival, i.e. a buffer of their own).
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..errors import InvalidOptionError


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
