"""A stand-in for what Alpa 0.2.3 imports from ``jax.interpreters.pxla`` (jax 0.3.22).

Alpa's resharding code builds and reads ``ShardingSpec(sharding, mesh_mapping)`` with
``NoSharding``/``Chunked``/``Unstacked`` per tensor dim and ``ShardedAxis``/``Replicated``
per mesh dim, asks a spec for its ``mesh_shape``, ``indices(shape)`` and
``sharding_proto()`` (an XLA ``OpSharding``: tile assignment dimensions and devices), and
calls ``spec_to_indices``. In jax 0.3.22 the types live in jaxlib's C++ ``pmap_lib`` and
the methods in ``pxla.py``; neither runs under today's jax. This module gives the same
Python-visible behaviour, written from the documented semantics, and
``tests/test_alpa_pxla_compat.py`` checks it against jax 0.3.22's own ``pxla.py``
functions, executed over random specs.

Semantics (jax 0.3.22):

* the logical mesh is ``arange(prod(mesh_shape)).reshape(mesh_shape)``; ``mesh_shape``
  has one entry per ``mesh_mapping`` item: the chunk count of the sharded axis it maps, or
  its replica count;
* the tile assignment lists the mesh axes sharding tensor dim 0, then dim 1, ... (in
  sharded-axis order within a ``Chunked``), then the replicated mesh axes (one trailing
  tile dim for all of them); its devices are the logical mesh transposed that way,
  flattened row-major;
* ``indices``: tiles in row-major order over the tensor dims, each tile to the next
  ``replicas`` devices of that list; fully replicated means every device holds all.
"""
from __future__ import annotations

import enum
import itertools
from typing import Sequence, Tuple

import numpy as np

from ...errors import InvalidSpecError, InvalidTypeError


class _Value:
    """Immutable-by-convention value: equal, hashed and printed by its ``_fields``."""

    _fields: tuple = ()

    def _key(self) -> tuple:
        return tuple(tuple(v) if isinstance(v, list) else v for v in (getattr(self, f) for f in self._fields))

    def __eq__(self, other):
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self):
        return hash((type(self).__name__, self._key()))

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self._fields)})"


class NoSharding(_Value):
    """A tensor dim that is not split."""


class Chunked(_Value):
    """A tensor dim split into ``prod(chunks)`` equal parts (one sharded axis per entry)."""

    _fields = ("chunks",)

    def __init__(self, chunks: Sequence[int]):
        # a list, as jaxlib's binding returns it: Alpa extends it with ``chunks + [n]``
        self.chunks = [int(c) for c in chunks]


class Unstacked(_Value):
    """A tensor dim of ``size`` taken apart into its elements (pmap)."""

    _fields = ("size",)

    def __init__(self, size: int):
        self.size = int(size)


class ShardedAxis(_Value):
    """A mesh dim that carries sharded axis number ``axis``."""

    _fields = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)


class Replicated(_Value):
    """A mesh dim of ``replicas`` devices holding the same data."""

    _fields = ("replicas",)

    def __init__(self, replicas: int):
        self.replicas = int(replicas)


class OpSharding:
    """The fields of XLA's ``OpSharding`` proto that jax 0.3.22 and Alpa read."""

    class Type(enum.IntEnum):  # XLA's values
        REPLICATED = 0
        MAXIMAL = 1
        TUPLE = 2
        OTHER = 3
        MANUAL = 4

    def __init__(self):
        self.type = OpSharding.Type.REPLICATED
        self.tile_assignment_dimensions: list = []
        self.tile_assignment_devices: list = []
        self.last_tile_dims: list = []
        self.replicate_on_last_tile_dim = False

    def __repr__(self):
        return (f"OpSharding(type={self.type.name}, dims={self.tile_assignment_dimensions}, "
                f"devices={self.tile_assignment_devices}, last_tile_dims={self.last_tile_dims})")


class ShardingSpec(_Value):
    """How an array's dims split (``sharding``) and how the splits and replicas map onto a
    logical device mesh (``mesh_mapping``)."""

    _fields = ("sharding", "mesh_mapping")

    def __init__(self, sharding, mesh_mapping):
        self.sharding = tuple(sharding)
        self.mesh_mapping = tuple(mesh_mapping)

    # ------------------------------------------------------------ derived
    def _sharded_axis_sizes(self) -> list[int]:
        sizes: list[int] = []
        for s in self.sharding:
            if isinstance(s, Unstacked):
                sizes.append(s.size)
            elif isinstance(s, Chunked):
                sizes.extend(s.chunks)
            elif not isinstance(s, NoSharding):
                raise InvalidTypeError(f"unknown dim sharding {s!r}")
        return sizes

    @property
    def mesh_shape(self) -> Tuple[int, ...]:
        sizes = self._sharded_axis_sizes()
        return tuple(sizes[m.axis] if isinstance(m, ShardedAxis) else m.replicas for m in self.mesh_mapping)

    def sharding_proto(self) -> OpSharding:
        mesh_shape = self.mesh_shape
        proto = OpSharding()
        replicated = [i for i, m in enumerate(self.mesh_mapping) if isinstance(m, Replicated)]
        if len(replicated) == len(self.mesh_mapping):
            return proto  # REPLICATED, no tile assignment
        proto.type = OpSharding.Type.OTHER
        mesh_axis_of = {m.axis: i for i, m in enumerate(self.mesh_mapping) if isinstance(m, ShardedAxis)}
        order: list[int] = []
        tile_dims: list[int] = []
        sharded_axis = 0
        for s in self.sharding:
            if isinstance(s, NoSharding):
                tile_dims.append(1)
            elif isinstance(s, Chunked):
                for n in s.chunks:
                    order.append(mesh_axis_of[sharded_axis])
                    if mesh_shape[order[-1]] != n:
                        raise InvalidSpecError(f"{self!r}: mesh axis {order[-1]} has {mesh_shape[order[-1]]} devices "
                                               f"for {n} chunks")
                    sharded_axis += 1
                tile_dims.append(int(np.prod(s.chunks)))
            else:
                raise InvalidSpecError(f"{self!r}: an unstacked dim has no XLA OpSharding")
        if replicated:
            proto.last_tile_dims = [OpSharding.Type.REPLICATED]
            tile_dims.append(int(np.prod([mesh_shape[i] for i in replicated])))
            order += replicated
        ids = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
        tiles = ids.transpose(order).reshape(tile_dims)
        proto.tile_assignment_dimensions = list(tiles.shape)
        proto.tile_assignment_devices = [int(d) for d in tiles.flat]
        return proto

    def indices(self, shape: Sequence[int]) -> np.ndarray:
        """Per logical-mesh position, the NumPy index of the part of an array of
        ``shape`` that device holds (slices, or ints for unstacked dims)."""
        shape = tuple(shape)
        if len(shape) != len(self.sharding):
            raise InvalidSpecError(f"shape {shape} has {len(shape)} dims, {self!r} has {len(self.sharding)}")
        if any(isinstance(s, Unstacked) for s in self.sharding):
            return self._unstacked_indices(shape)
        mesh_shape = self.mesh_shape
        n = int(np.prod(mesh_shape))
        out = np.empty(n, dtype=object)
        proto = self.sharding_proto()
        if proto.type == OpSharding.Type.REPLICATED or n == 1:
            out.fill((slice(None),) * len(shape))
            return out.reshape(mesh_shape)
        dims = list(proto.tile_assignment_dimensions)
        replicas = dims.pop() if proto.last_tile_dims else 1
        per_dim = [[slice(None)] if k == 1 else _even_slices(size, k) for size, k in zip(shape, dims)]
        devices = iter(proto.tile_assignment_devices)
        for index in itertools.product(*per_dim):
            for _ in range(replicas):
                out[next(devices)] = index
        return out.reshape(mesh_shape)

    def _unstacked_indices(self, shape: Tuple[int, ...]) -> np.ndarray:
        per_dim, grid = [], []
        for size, s in zip(shape, self.sharding):
            if isinstance(s, NoSharding):
                per_dim.append([slice(None)])
            elif isinstance(s, Unstacked):
                if size != s.size:
                    raise InvalidSpecError(f"dim of size {size} unstacked as {s.size}")
                per_dim.append(list(range(size)))
                grid.append(size)
            else:
                total = int(np.prod(s.chunks))
                per_dim.append(_even_slices(size, total))
                grid.extend(s.chunks)
        tiles = np.empty(int(np.prod(grid)), dtype=object)
        for i, index in enumerate(itertools.product(*per_dim)):
            tiles[i] = index
        tiles = tiles.reshape(grid)
        replicas = tuple(m.replicas for m in self.mesh_mapping if isinstance(m, Replicated))
        sharded = [m.axis for m in self.mesh_mapping if isinstance(m, ShardedAxis)]
        if sorted(sharded) != list(range(len(grid))):
            raise InvalidSpecError(f"{self!r}: every sharded axis must appear once in the mesh mapping")
        r, k = itertools.count(), iter(sharded)
        perm = [next(r) if isinstance(m, Replicated) else len(replicas) + next(k) for m in self.mesh_mapping]
        return np.broadcast_to(tiles, replicas + tiles.shape).transpose(perm)


def _even_slices(size: int, parts: int) -> list[slice]:
    step, ragged = divmod(size, parts)
    if ragged:
        raise InvalidSpecError(f"a dim of size {size} does not split into {parts} equal parts")
    return [slice(i * step, (i + 1) * step) for i in range(parts)]


def spec_to_indices(shape: Sequence[int], spec: ShardingSpec) -> tuple:
    """Every device's index, in row-major order over the logical mesh."""
    return tuple(spec.indices(shape).flat)
