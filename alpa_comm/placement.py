"""Where an array lives (``Placement``) and one array's move (``Resharding``).

A placement is a device mesh plus a sharding spec; like JAX's sharding
``devices_indices_map`` it answers which index box each device holds. A
resharding is the record every layer shares for one array: its shape and
dtype, where it is and where it should go. Plans, tree leaves, benchmark cases
and host jobs all carry this one record instead of spelling out six fields.

Meshes and specs may be given as text (``'2x4@0,1'``, ``'S0RR'``) or objects;
``Resharding.resolve`` parses and checks them against a cluster once, before
any planning, with errors that name the offending value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .dtypes import dtype_name, itemsize
from .errors import InvalidMeshError, InvalidSpecError
from .mesh import DeviceMesh
from .spec import Box, ShardingSpec
from .topology import ClusterSpec


@dataclass(frozen=True)
class Placement:
    """A mesh and a spec (objects or text), e.g. ``Placement("1x4@2", "RS1")``."""

    mesh: Any
    spec: Any

    def resolved(self, devices_per_host: int) -> "Placement":
        """The same placement with the mesh and spec parsed into objects."""
        return Placement(DeviceMesh.parse(self.mesh, devices_per_host), ShardingSpec.parse(self.spec))

    def device_boxes(self, shape) -> dict[int, Box]:
        """Index box each device of the (resolved) mesh holds under the spec."""
        mesh, spec = self.mesh, self.spec
        if not isinstance(mesh, DeviceMesh) or not isinstance(spec, ShardingSpec):
            raise InvalidMeshError(f"placement {self.label()} is not resolved: call .resolved(devices_per_host)")
        return {dev: spec.box(coord, shape, mesh.shape) for coord, dev in mesh.coords()}

    def label(self) -> str:
        mesh = self.mesh.label() if isinstance(self.mesh, DeviceMesh) else str(self.mesh)
        return f"{self.spec}@{mesh}"

    def to_dict(self) -> dict:
        return {"mesh": self.mesh.to_dict() if isinstance(self.mesh, DeviceMesh) else self.mesh,
                "spec": str(self.spec)}

    @classmethod
    def from_dict(cls, d: dict) -> "Placement":
        mesh = d["mesh"]
        return cls(DeviceMesh.from_dict(mesh) if isinstance(mesh, dict) else mesh, ShardingSpec.parse(d["spec"]))


def device_boxes(shape, mesh: DeviceMesh, spec: ShardingSpec) -> dict[int, Box]:
    """Index box each device of ``mesh`` holds under ``spec`` (``Placement.device_boxes``)."""
    return Placement(mesh, spec).device_boxes(shape)


def positive_shape(shape) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InvalidSpecError(f"shape must be a sequence of positive integers, got {shape!r}") from None
    if any(s <= 0 for s in out) or any(o != s for o, s in zip(out, shape)):
        raise InvalidSpecError(f"shape must be positive integers, got {tuple(shape)}")
    return out


def check_fits(mesh: DeviceMesh, cluster: ClusterSpec, role: str = "") -> None:
    """A clear error when ``mesh`` assumes another host size or names hosts the cluster lacks
    (``role``, e.g. "source", starts the message)."""
    what = f"{role} mesh" if role else "mesh"
    if mesh.devices_per_host != cluster.devices_per_host:
        raise InvalidMeshError(f"{what} {mesh.label()} assumes {mesh.devices_per_host} devices per host, "
                               f"the cluster has {cluster.devices_per_host}")
    bad = [d for d in mesh.devices if d >= cluster.num_devices]
    if bad:
        raise InvalidMeshError(f"{what} {mesh.label()} uses device(s) {bad[:4]} on host(s) "
                               f"{sorted({cluster.host_of(d) for d in bad})[:4]}, but the cluster has only "
                               f"hosts 0..{cluster.num_hosts - 1}")


@dataclass(frozen=True)
class Resharding:
    """One array's move: shape, dtype, source placement, destination placement."""

    shape: tuple
    dtype: Any
    src: Placement
    dst: Placement

    @classmethod
    def between(cls, shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec) -> "Resharding":
        """The six values as one record (meshes and specs as objects or text)."""
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise InvalidSpecError(f"shape must be a sequence of positive integers, got {shape!r}")
        return cls(tuple(shape), dtype, Placement(src_mesh, src_spec), Placement(dst_mesh, dst_spec))

    src_mesh = property(lambda self: self.src.mesh)
    src_spec = property(lambda self: self.src.spec)
    dst_mesh = property(lambda self: self.dst.mesh)
    dst_spec = property(lambda self: self.dst.spec)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)

    def resolve(self, cluster: ClusterSpec, where: str = "") -> "Resharding":
        """Parse and check this move on ``cluster`` before any planning. ``where``
        prefixes error messages (a tree leaf's path)."""
        prefix = f"{where}: " if where else ""
        shape = positive_shape(self.shape)
        src = self.src.resolved(cluster.devices_per_host)
        dst = self.dst.resolved(cluster.devices_per_host)
        check_fits(src.mesh, cluster, f"{prefix}source")
        check_fits(dst.mesh, cluster, f"{prefix}destination")
        src.spec.validate(shape, src.mesh.shape)
        dst.spec.validate(shape, dst.mesh.shape)
        return Resharding(shape, dtype_name(self.dtype), src, dst)

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": dtype_name(self.dtype), "src": self.src.to_dict(),
                "dst": self.dst.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Resharding":
        return cls(tuple(d["shape"]), d["dtype"], Placement.from_dict(d["src"]), Placement.from_dict(d["dst"]))


class ReshardingFields:
    """The move's values by name (``shape``, ``src_mesh``, ...) for a record that holds
    a ``resharding``: plans, tree leaves, suite cases and the Alpa adapter's inputs
    read alike without repeating the six fields."""

    resharding: Resharding

    shape = property(lambda self: self.resharding.shape)
    dtype = property(lambda self: self.resharding.dtype)
    src_mesh = property(lambda self: self.resharding.src_mesh)
    src_spec = property(lambda self: self.resharding.src_spec)
    dst_mesh = property(lambda self: self.resharding.dst_mesh)
    dst_spec = property(lambda self: self.resharding.dst_spec)
    nbytes = property(lambda self: self.resharding.nbytes)
