"""Where a process's shards live while they move: the two ways from a ``jax.Array`` to the
executor's buffers and back.

* ``HostBuffers`` (``ProcessGroup(buffers="host")``, the default with gloo): shards read as
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
from dataclasses import replace

import numpy as np

from ..runtime.executor import Layout, destination_buffers
from ..runtime.host_memory import BufferPool
from .placement import JaxHosts


class HostBuffers:
    name = "host"
    xp = np

    def __init__(self, pool: BufferPool | None = None):
        self.pool = pool or BufferPool(0)

    def destinations(self, layouts: list[Layout], share) -> list[dict]:
        """This host's destination buffers of a prepared call (``share``), cut from one
        aligned slab out of the pool (buckets land in place; JAX adopts the regions)."""
        dst = destination_buffers(layouts, share.slab_regions, lambda n: self.pool.empty((n,), np.uint8))
        self.pool.trim()
        return dst

    def sources(self, x, hosts: JaxHosts, wire: np.dtype) -> dict[int, np.ndarray]:
        """This process's source shards of ``x`` by alpa_comm device id, in the wire type."""
        return {hosts.id_of(s.device): np.asarray(s.data).astype(wire, copy=False) for s in x.addressable_shards}

    def layouts(self, layouts: list[Layout]) -> list[Layout]:
        return layouts

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


class DeviceBuffers:
    name = "device"

    def __init__(self, xp, hosts: JaxHosts):
        self.xp, self._hosts = xp, hosts

    def destinations(self, layouts: list[Layout], share) -> list[dict]:
        """This host's destination buffers of a prepared call, one per device, in device memory."""
        return [lay.empty_destinations(share.job.is_local, alloc=self.alloc) for lay in layouts]

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
    """Every leaf's global array straight from this process's buffers, one call per leaf
    (JAX's own per-array path under ``device_put`` of a NumPy array:
    ``pxla.batched_device_put``, which adopts aligned host buffers on CPU devices without
    a copy), instead of one ``device_put`` per shard plus one
    ``make_array_from_single_device_arrays`` per leaf: about 80 us per shard less, which
    is most of what a 200-leaf tree costs beyond its bytes. None where this JAX lacks that
    path (the caller then takes the public one)."""
    import jax  # noqa: PLC0415

    try:
        from jax._src import core  # noqa: PLC0415 - JAX's own, guarded: the public path stays
        from jax._src.interpreters import pxla  # noqa: PLC0415
    except ImportError:
        return None
    out = []
    try:
        for (shape, _), t, sharding, bufs in zip(leaves, types, shardings, buffers):
            devices = list(sharding._addressable_device_assignment)
            if not devices:
                out.append(_remote_array(tuple(shape), np.dtype(t), sharding))
                continue
            xs = [bufs[hosts.id_of(d)].astype(t, copy=False) for d in devices]
            out.append(pxla.batched_device_put(core.ShapedArray(tuple(shape), t), sharding, xs, devices))
    except (AttributeError, TypeError):
        return None
    return out


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

    if jax.local_devices()[0].platform not in ("gpu", "cuda", "rocm"):
        return DeviceBuffers(np, hosts)
    import cupy  # noqa: PLC0415 - only on GPUs

    return DeviceBuffers(cupy, hosts)
