"""Where a process's shards live while they move: the two ways from a ``jax.Array`` to the
executor's buffers and back.

* ``HostBuffers`` (``ProcessGroup(buffers="host")``, the default with tcp and gloo): shards read as
  NumPy (on CPU devices that is the shard's own memory, no copy), received into aligned
  host buffers from the group's ``BufferPool`` that one batched ``device_put`` adopts as
  the result's shards on CPU devices without a copy (``runtime.host_memory``). On GPUs
  this stages through host memory.
* ``DeviceBuffers`` (``buffers="device"``, the default with NCCL): shards handed over by
  DLPack, without a copy, as arrays of the device's array module (CuPy on GPUs, NumPy on
  CPUs); destination buffers made in device memory; results handed back by DLPack. The
  executor only moves bytes, so a type the array module lacks (bfloat16 in CuPy) travels
  as unsigned integers of its width (bit casts in JAX on either end).
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from ..runtime.executor import Destinations, Layout, destination_buffers, kept_threads
from ..runtime.host_memory import BufferPool
from .completion import LeafCompletion
from .placement import JaxHosts, has_device_memory


class LazyShards(Mapping):
    """A leaf's source shards (device id -> NumPy array in the wire type), read on first
    use: the executor then reads a bucket's leaves on its packing thread as it packs
    them, so a 200-leaf tree's first bytes leave without waiting for all 200 leaves'
    shards to be read (``addressable_shards`` and a type cast each). Reading twice at
    once is harmless."""

    __slots__ = ("_array", "_hosts", "_wire", "_shards")

    def __init__(self, array, hosts: JaxHosts, wire: np.dtype):
        self._array, self._hosts, self._wire, self._shards = array, hosts, wire, None

    def _get(self) -> dict:
        if self._shards is None:
            id_of, wire = self._hosts.id_of, self._wire
            self._shards = {id_of(s.device): np.asarray(s.data).astype(wire, copy=False)
                            for s in self._array.addressable_shards}
        return self._shards

    def __getitem__(self, device):
        return self._get()[device]

    def __contains__(self, device) -> bool:
        return device in self._get()

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class HostBuffers:
    name = "host"
    xp = np

    def __init__(self, pool: BufferPool | None = None):
        self.pool = pool or BufferPool(0)

    def destinations(self, layouts: list[Layout], share) -> Destinations:
        """This host's destination buffers of a prepared call (``share``), cut from one
        aligned slab out of the pool (buckets land in place; JAX adopts the regions)."""
        slab = share.slab_regions
        if not slab.regions:  # nothing arrives here (a process that only sends)
            return Destinations([{} for _ in layouts], {})
        dst = destination_buffers(layouts, slab, lambda n: self.pool.empty((n,), np.uint8))
        self.pool.trim()
        return dst

    def alloc(self, device: int, shape, dtype) -> np.ndarray:
        """An aligned host buffer from the pool (``device`` does not matter: host memory)."""
        return self.pool.empty(shape, dtype)

    def sources(self, x, hosts: JaxHosts, wire: np.dtype) -> "LazyShards":
        """This process's source shards of ``x`` by alpa_comm device id, in the wire type,
        read when the executor first asks (``LazyShards``)."""
        return LazyShards(x, hosts, wire)

    def layouts(self, layouts: list[Layout]) -> list[Layout]:
        return layouts

    def carrier(self, dtype: np.dtype) -> np.dtype:
        """The type buffers of ``dtype`` are held as here (host memory: the type itself)."""
        return np.dtype(dtype)

    def place(self, leaves, want, shardings, buffers, hosts: JaxHosts, wires) -> list:
        """The destination ``jax.Array`` of every leaf from this process's received buffers
        (``want``: the result type, None for each leaf's own). On CPU devices the aligned
        buffers become the shards as they are (``adopt``: one call per leaf, no copy);
        otherwise all shards go to their devices in one batched ``device_put`` (one call per
        shard costs about a millisecond; a weight sync has hundreds). A process that only
        sends gets arrays without addressable shards."""
        import jax  # noqa: PLC0415

        types = [want or np.dtype(dtype) for _, dtype in leaves]
        adopted = adopt(leaves, types, shardings, buffers, hosts)
        if adopted is not None:
            return adopted
        order = [(i, d) for i, bufs in enumerate(buffers) for d in sorted(bufs)]
        placed = jax.device_put([buffers[i][d].astype(types[i], copy=False) for i, d in order],
                                [hosts.device(d) for _, d in order]) if order else []
        return _arrays(leaves, types, shardings, order, placed)


    def placer(self, leaves, want, shardings, hosts: JaxHosts, wires, writers: dict) -> "Placer":
        """Places each leaf as soon as its buffers are written (``ProgressivePlacer``)."""
        return ProgressivePlacer(self, leaves, want, shardings, hosts, wires, writers)


class Placer:
    """Turns a call's received buffers into the result's ``jax.Array``s: ``start(buffers)``
    before the transfers run, ``done(transfer)`` as each ends here, ``results()`` after.
    This one places every leaf at the end (``io.place``)."""

    def __init__(self, io, leaves, want, shardings, hosts: JaxHosts, wires):
        self.io, self.leaves, self.want, self.shardings, self.hosts, self.wires = (io, leaves, want, shardings,
                                                                                    hosts, wires)
        self.buffers: list = []

    def start(self, buffers: list) -> None:
        self.buffers = buffers

    def done(self, transfer) -> None:
        pass

    def close(self) -> None:
        """After a failed call: let go of what was started (nothing here)."""

    def results(self) -> list:
        return self.io.place(self.leaves, self.want, self.shardings, self.buffers, self.hosts, self.wires)


class ProgressivePlacer(Placer):
    """Adopts a leaf's buffers as its ``jax.Array`` (``adopt_leaf``: no copy on CPU devices)
    as soon as the last transfer that writes into it on this host has ended, on a placing
    thread (kept between calls: ``runtime.executor.kept_threads``) while the other
    transfers are still on the wire: a 200-leaf tree otherwise pays its ~200 adoptions (a
    few milliseconds) after the last byte arrived, and adopting on the thread that posts
    the transfers would delay the next receive.
    ``writers``: transfer id -> the leaves it writes here (``_Share.writers``). Where JAX
    lacks the private path, every leaf is placed at the end by the public one."""

    def __init__(self, io, leaves, want, shardings, hosts: JaxHosts, wires, writers: dict):
        super().__init__(io, leaves, want, shardings, hosts, wires)
        self.completion = LeafCompletion(len(leaves), writers)
        self.types = [want or np.dtype(dtype) for _, dtype in leaves]
        self.out: list = [None] * len(leaves)
        self.public = False  # the private path failed: place everything at the end
        self._lock = threading.Lock()
        self._placing: list = []  # (future, leaves) of the batches handed to the placing thread
        # the caller's own kept placing thread (``done`` runs on the transfers' threads)
        self._pool = kept_threads("place", 1, "alpa-comm-place")
        self._closed = False

    @property
    def left(self) -> int:
        """Leaves some transfer here still writes into."""
        return self.completion.left

    def done(self, transfer) -> None:
        """``transfer`` ended here: the leaves it completes go to the placing thread, unless
        they are the last ones (nothing else is on its way in: the caller's ``results``
        adopts them at once, where a hand-off to a thread that must first wake only adds
        the wake-up: 10 x 1 MiB between two processes took 0.23-0.55 ms from the last byte
        to the results handed over, 0.21-0.27 ms adopted at once)."""
        with self._lock:
            ready = self.completion.ended(transfer.id)
            if not ready or self.public or self._closed or self.completion.left == 0:
                return
            self._placing.append((self._pool.submit(self._place, ready), ready))

    def _place(self, batch: list[int]) -> None:
        for i in batch:
            self._adopt(i)

    def _adopt(self, i: int) -> None:
        shape, _ = self.leaves[i]
        if self.public or self._closed:
            return
        got = adopt_leaf(tuple(shape), self.types[i], self.shardings[i], self.buffers[i], self.hosts)
        with self._lock:
            if got is None:
                self.public = True
            else:
                self.out[i] = got

    def close(self) -> None:
        """After a failed call: nothing more is placed (what is queued is skipped)."""
        with self._lock:
            self._closed = True

    def results(self) -> list:
        for f, batch in self._placing:
            if f.cancel():  # not begun: adopted here, without waking the placing thread (and this one after)
                self._place(batch)
            else:
                f.result()
        for i, got in enumerate(self.out):
            if got is None and not self.public:
                self._adopt(i)
        return super().results() if self.public else self.out


class DeviceBuffers:
    name = "device"

    def __init__(self, xp, hosts: JaxHosts):
        self.xp, self._hosts = xp, hosts

    def destinations(self, layouts: list[Layout], share) -> Destinations:
        """This host's destination buffers of a prepared call, one per device, in device
        memory (buckets are received into scratch and unpacked)."""
        return Destinations([lay.empty_destinations(share.job.is_local, alloc=self.alloc) for lay in layouts], {})

    def alloc(self, device: int, shape, dtype):
        """A destination buffer in ``device``'s memory."""
        if self.xp is np:
            return np.empty(shape, dtype)
        with self.xp.cuda.Device(self._hosts.device(device).local_hardware_id):
            return self.xp.empty(shape, dtype)

    def sources(self, x, hosts: JaxHosts, wire: np.dtype) -> dict:
        import jax  # noqa: PLC0415

        out = {}
        for s in x.addressable_shards:
            data = s.data if np.dtype(s.data.dtype) == wire else s.data.astype(wire)
            if carrier(wire) != wire:
                data = jax.lax.bitcast_convert_type(data, carrier(wire))
            out[hosts.id_of(s.device)] = self.xp.from_dlpack(data)
        return out

    def layouts(self, layouts: list[Layout]) -> list[Layout]:
        return [lay if carrier(lay.dtype) == lay.dtype else replace(lay, dtype=carrier(lay.dtype))
                for lay in layouts]

    def carrier(self, dtype: np.dtype) -> np.dtype:
        """The type buffers of ``dtype`` are held as on the device (``carrier``)."""
        return carrier(np.dtype(dtype))

    def placer(self, leaves, want, shardings, hosts: JaxHosts, wires, writers: dict) -> Placer:
        """Places every leaf at the end: one batched hand-back by DLPack."""
        return Placer(self, leaves, want, shardings, hosts, wires)

    def place(self, leaves, want, shardings, buffers, hosts: JaxHosts, wires) -> list:
        import jax  # noqa: PLC0415

        types = [want or np.dtype(dtype) for _, dtype in leaves]
        order = [(i, d) for i, bufs in enumerate(buffers) for d in sorted(bufs)]
        arrays = []
        for i, d in order:
            arr = jax.dlpack.from_dlpack(buffers[i][d])
            if carrier(wires[i]) != wires[i]:
                arr = jax.lax.bitcast_convert_type(arr, wires[i])
            arrays.append(arr if np.dtype(arr.dtype) == types[i] else arr.astype(types[i]))
        # on the device its memory is on already (a GPU buffer: no copy); CPU buffers land
        # on the first CPU device and are put where they belong
        placed = jax.device_put(arrays, [hosts.device(d) for _, d in order]) if order else []
        return _arrays(leaves, types, shardings, order, placed)


def adopt(leaves, types, shardings, buffers, hosts: JaxHosts) -> list | None:
    """Every leaf's global array straight from this process's buffers (``adopt_leaf``);
    None where this JAX lacks that path (the caller then takes the public one)."""
    out = []
    for (shape, _), t, sharding, bufs in zip(leaves, types, shardings, buffers):
        got = adopt_leaf(tuple(shape), t, sharding, bufs, hosts)
        if got is None:
            return None
        out.append(got)
    return out


def adopt_leaf(shape: tuple, dtype: np.dtype, sharding, bufs: dict, hosts: JaxHosts):
    """One leaf's global array straight from this process's buffers in one call (JAX's own
    per-array path under ``device_put`` of a NumPy array: ``pxla.batched_device_put``,
    which adopts aligned host buffers on CPU devices without a copy), instead of one
    ``device_put`` per shard plus one ``make_array_from_single_device_arrays``: about
    80 us per shard less, which is most of what a 200-leaf tree costs beyond its bytes.
    None where this JAX lacks that path."""
    try:
        put, aval, devices, ids = _adoption(shape, np.dtype(dtype), sharding, hosts)
        if not devices:
            return _remote_array(shape, np.dtype(dtype), sharding)
        return put(aval, sharding, [bufs[i].astype(dtype, copy=False) for i in ids], devices)
    except (ImportError, AttributeError, TypeError):
        return None


@functools.lru_cache(maxsize=4096)
def _adoption(shape: tuple, dtype: np.dtype, sharding, hosts: JaxHosts) -> tuple:
    """(JAX's per-array put, the abstract value, this process's devices of ``sharding``,
    their alpa_comm ids): worked out once per leaf shape, type and sharding, since a
    weight sync adopts the same leaves every step."""
    from jax._src import core  # noqa: PLC0415 - JAX's own, guarded: the public path stays
    from jax._src.interpreters import pxla  # noqa: PLC0415

    devices = list(sharding._addressable_device_assignment)
    return pxla.batched_device_put, core.ShapedArray(shape, dtype), devices, [hosts.id_of(d) for d in devices]


@functools.lru_cache(maxsize=4096)
def _remote_array(shape: tuple, dtype: np.dtype, sharding):
    """The result a process holding none of it gets: a global array without addressable
    shards (no buffers, immutable), made once per shape, type and sharding; a sender's
    200-leaf sync would otherwise spend milliseconds making them anew every call."""
    import jax  # noqa: PLC0415

    return jax.make_array_from_single_device_arrays(shape, sharding, [], dtype=dtype)


def carrier(dtype: np.dtype) -> np.dtype:
    """The type a leaf's bytes travel as in device memory: itself where NumPy (and so CuPy)
    knows it, else unsigned integers of its width (bfloat16 -> uint16)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.type.__module__ == "numpy" else np.dtype(f"u{dtype.itemsize}")


def _arrays(leaves, types, shardings, order, placed) -> list:
    import jax  # noqa: PLC0415

    per_leaf: list[list] = [[] for _ in leaves]
    for (i, _), arr in zip(order, placed):
        per_leaf[i].append(arr)
    return [jax.make_array_from_single_device_arrays(tuple(shape), sharding, local, dtype=t)
            for (shape, _), sharding, local, t in zip(leaves, shardings, per_leaf, types)]


def buffers_for(kind: str, hosts: JaxHosts, pool: BufferPool | None = None):
    """``HostBuffers`` (recycling ``pool``'s memory) or ``DeviceBuffers`` (CuPy where this
    process's devices are GPUs)."""
    if kind == "host":
        return HostBuffers(pool)
    import jax  # noqa: PLC0415

    if not has_device_memory(jax.local_devices()[0]):
        return DeviceBuffers(np, hosts)
    import cupy  # noqa: PLC0415 - only on GPUs (or the NCCL model's stand-in)

    return DeviceBuffers(cupy, hosts)
