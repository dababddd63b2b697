"""JAX shardings as alpa_comm placements: processes are hosts, their devices are devices.

A multi-process JAX program has one process per host (``jax.distributed``); every
process sees every device (``jax.devices()``), each with its ``process_index``. Our
global device id of a JAX device is ``process_index * devices_per_host + its position
among that process's devices`` (ordered by id), so host h of a plan is process h, and a
``NamedSharding`` (any mesh axis names, any ``PartitionSpec``) is a ``DeviceMesh`` of
those ids plus our ``ShardingSpec``. Pure bookkeeping: no communication.
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from ..errors import InvalidMeshError, InvalidSpecError
from ..mesh import DeviceMesh
from ..spec import ShardingSpec


GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def has_device_memory(device) -> bool:
    """Whether ``device``'s arrays live in memory CuPy addresses: a GPU, or any device where
    the NCCL model stands in for CuPy (``alpa_comm.testing.nccl_model``: its "device"
    arrays are host memory, and CPU devices play the GPUs)."""
    return device.platform in GPU_PLATFORMS or getattr(sys.modules.get("cupy"), "NCCL_MODEL", False)


class JaxHosts:
    """JAX devices <-> alpa_comm device ids, from the global device list."""

    def __init__(self, devices: Sequence, first_host: int = 0):
        """``first_host``: the group rank of this JAX program's process 0 (a program that is
        one of several in a group takes consecutive ranks from there)."""
        per_process: dict[int, list] = {}
        for d in devices:
            per_process.setdefault(int(d.process_index), []).append(d)
        self.num_processes = max(per_process) + 1 if per_process else 0
        self.first_host = first_host
        self.devices_per_host = max((len(v) for v in per_process.values()), default=1)
        self._ids: dict = {}
        self._devices: dict[int, object] = {}
        for p, devs in per_process.items():
            for pos, d in enumerate(sorted(devs, key=lambda d: d.id)):
                gid = (p + first_host) * self.devices_per_host + pos
                self._ids[d] = gid
                self._devices[gid] = d

    @classmethod
    def current(cls) -> "JaxHosts":
        import jax  # noqa: PLC0415

        return cls(jax.devices())

    def id_of(self, device) -> int:
        try:
            return self._ids[device]
        except KeyError:
            raise InvalidMeshError(f"device {device} is not one of this program's JAX devices") from None

    def device(self, device_id: int):
        return self._devices[device_id]


def placement(sharding, ndim: int, hosts: JaxHosts) -> tuple[DeviceMesh, ShardingSpec]:
    """(mesh, spec) of a ``NamedSharding`` (or a ``SingleDeviceSharding``) over ``hosts``."""
    kind = type(sharding).__name__
    if kind == "SingleDeviceSharding":
        (device,) = tuple(sharding.device_set)
        return (DeviceMesh(np.array([hosts.id_of(device)]), hosts.devices_per_host),
                ShardingSpec(tuple(() for _ in range(ndim))))
    mesh = getattr(sharding, "mesh", None)
    pspec = getattr(sharding, "spec", None)
    if mesh is None or pspec is None or not hasattr(mesh, "axis_names"):
        raise InvalidSpecError(f"alpa_comm reshards arrays with a NamedSharding (mesh + PartitionSpec); this one "
                               f"has a {kind}")
    ids = np.vectorize(hosts.id_of, otypes=[np.int64])(np.asarray(mesh.devices, dtype=object))
    spec = ShardingSpec.from_partition_spec(tuple(pspec), tuple(mesh.axis_names), ndim)
    return DeviceMesh(ids, hosts.devices_per_host), spec


def named_sharding(dst, ndim: int):
    """``dst`` as a ``NamedSharding``: one already, or ``(mesh, "S01R")`` in our notation
    (mesh dim i is the mesh's i-th axis)."""
    if isinstance(dst, tuple) and len(dst) == 2 and isinstance(dst[1], (str, ShardingSpec)):
        from jax.sharding import NamedSharding  # noqa: PLC0415

        mesh, spec = dst
        spec = ShardingSpec.parse(spec) if isinstance(spec, str) else spec
        if len(spec.dims) != ndim:
            raise InvalidSpecError(f"spec {spec} has {len(spec.dims)} dims for an array of rank {ndim}")
        return NamedSharding(mesh, spec.to_jax(mesh.axis_names))
    if not hasattr(dst, "mesh") and type(dst).__name__ != "SingleDeviceSharding":
        raise InvalidSpecError(f"destination must be a NamedSharding or (jax Mesh, spec text), got "
                               f"{type(dst).__name__}")
    return dst
