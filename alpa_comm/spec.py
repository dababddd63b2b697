"""Sharding specs: which part of a tensor each device of a mesh holds.

Notation (DESIGN.md): one token per tensor dimension, ``R`` (replicated) or
``S`` followed by the mesh dimensions it is split over, e.g. ``S01R`` (dim 0
split over mesh dims 0 and 1, dim 1 replicated), ``RS1``, ``S0S1``.
``S01`` splits a dimension into |m0|*|m1| equal parts and the device at mesh
coordinates (i0, i1) holds part i0*|m1| + i1: the mesh dimension listed first
is major, as in JAX ``PartitionSpec(('x', 'y'))``.

Conversions to JAX ``PartitionSpec`` (as a plain tuple, or a real one when jax
is importable) and to Alpa's ``ShardingSpec`` form (plain data here) live in
this module so the notation has one home.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence, Tuple

from .errors import InvalidSpecError

_TOKEN = re.compile(r"R|S\d+")

Box = Tuple[Tuple[int, int], ...]  # one [start, stop) pair per tensor dimension (typing: Python 3.8)


@dataclass(frozen=True)
class ShardingSpec:
    """Per tensor dimension, the tuple of mesh dims it is split over (empty = R)."""

    dims: tuple[tuple[int, ...], ...]

    # ----------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, text: "str | ShardingSpec") -> "ShardingSpec":
        """Parse ``'S01R'``-style text; a ``ShardingSpec`` is returned as is."""
        if isinstance(text, ShardingSpec):
            return text
        if not isinstance(text, str) or not text:
            raise InvalidSpecError(f"sharding spec must be a non-empty string like 'S0R', got {text!r}")
        compact = text.replace(" ", "").upper()
        tokens = _TOKEN.findall(compact)
        if "".join(tokens) != compact:
            raise InvalidSpecError(
                f"cannot parse sharding spec {text!r}: expected tokens 'R' or 'S<mesh dims>' "
                f"such as 'S01R' or 'RS1'")
        dims = tuple(() if t == "R" else tuple(int(c) for c in t[1:]) for t in tokens)
        spec = cls(dims)
        spec._check_no_repeats(text)
        return spec

    def _check_no_repeats(self, shown) -> None:
        used: list[int] = [m for d in self.dims for m in d]
        for m in used:
            if used.count(m) > 1:
                raise InvalidSpecError(f"sharding spec {shown!r} uses mesh dim {m} more than once")

    def __str__(self) -> str:
        return "".join("R" if not d else "S" + "".join(map(str, d)) for d in self.dims)

    def __repr__(self) -> str:
        return f"ShardingSpec({str(self)!r})"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def used_mesh_dims(self) -> tuple[int, ...]:
        return tuple(m for d in self.dims for m in d)

    # -------------------------------------------------------------- validation
    def validate(self, shape: Sequence[int], mesh_shape: Sequence[int]) -> None:
        """Raise ``InvalidSpecError`` unless this spec fits ``shape`` on ``mesh_shape``."""
        if len(shape) != self.rank:
            raise InvalidSpecError(
                f"sharding spec {str(self)!r} has {self.rank} dimension(s) but the tensor "
                f"shape {tuple(shape)} has {len(shape)}")
        for m in self.used_mesh_dims:
            if not 0 <= m < len(mesh_shape):
                raise InvalidSpecError(
                    f"sharding spec {str(self)!r} names mesh dim {m}, but the mesh "
                    f"{'x'.join(map(str, mesh_shape))} has dims 0..{len(mesh_shape) - 1}")
        for d, (length, parts) in enumerate(zip(shape, self.num_shards(mesh_shape))):
            if length % parts:
                raise InvalidSpecError(
                    f"tensor dim {d} of length {length} is not divisible by its {parts} shards "
                    f"(spec {str(self)!r} on mesh {'x'.join(map(str, mesh_shape))})")

    # ------------------------------------------------------------- geometry
    def num_shards(self, mesh_shape: Sequence[int]) -> tuple[int, ...]:
        """Number of equal parts each tensor dimension is split into."""
        out = []
        for d in self.dims:
            n = 1
            for m in d:
                n *= mesh_shape[m]
            out.append(n)
        return tuple(out)

    def part_index(self, coords: Sequence[int], mesh_shape: Sequence[int]) -> tuple[int, ...]:
        """For a device at mesh ``coords``, the part it holds along each tensor dim."""
        out = []
        for d in self.dims:
            idx = 0
            for m in d:  # first listed mesh dim is major
                idx = idx * mesh_shape[m] + coords[m]
            out.append(idx)
        return tuple(out)

    def box(self, coords: Sequence[int], shape: Sequence[int], mesh_shape: Sequence[int]) -> Box:
        """The index box (``[start, stop)`` per dim) held by the device at ``coords``."""
        parts = self.num_shards(mesh_shape)
        idx = self.part_index(coords, mesh_shape)
        return tuple((i * (n // p), (i + 1) * (n // p)) for i, n, p in zip(idx, shape, parts))

    # ------------------------------------------------------ JAX PartitionSpec
    def to_partition_spec(self, axis_names: Sequence[str]) -> tuple:
        """Entries of the equivalent ``PartitionSpec`` (None, a name or a tuple of names)."""
        for m in self.used_mesh_dims:
            if m >= len(axis_names):
                raise InvalidSpecError(
                    f"spec {str(self)!r} names mesh dim {m} but only axis names {list(axis_names)} were given")
        out: list = []
        for d in self.dims:
            if not d:
                out.append(None)
            elif len(d) == 1:
                out.append(axis_names[d[0]])
            else:
                out.append(tuple(axis_names[m] for m in d))
        return tuple(out)

    def to_jax(self, axis_names: Sequence[str]):
        """A real ``jax.sharding.PartitionSpec`` (imports jax lazily)."""
        from jax.sharding import PartitionSpec  # noqa: PLC0415 - optional dependency

        return PartitionSpec(*self.to_partition_spec(axis_names))

    @classmethod
    def from_partition_spec(cls, pspec: Iterable, axis_names: Sequence[str], rank: int | None = None
                            ) -> "ShardingSpec":
        """From a ``PartitionSpec`` (or any sequence of its entries) and mesh axis names.

        A PartitionSpec shorter than the tensor rank means trailing ``None``s.
        """
        names = list(axis_names)
        entries = list(pspec)
        if rank is not None:
            if len(entries) > rank:
                raise InvalidSpecError(f"PartitionSpec {tuple(entries)} is longer than the tensor rank {rank}")
            entries += [None] * (rank - len(entries))
        dims = []
        for e in entries:
            group = () if e is None else ((e,) if isinstance(e, str) else tuple(e))
            try:
                dims.append(tuple(names.index(n) for n in group))
            except ValueError:
                raise InvalidSpecError(
                    f"PartitionSpec entry {e!r} names an axis not in the mesh axes {names}") from None
        spec = cls(tuple(dims))
        spec._check_no_repeats(tuple(entries))
        return spec

    # ------------------------------------------------------------ Alpa form
    def to_alpa(self, mesh_shape: Sequence[int], canonical: bool = False) -> "AlpaShardingSpec":
        """Alpa's (jax ``pxla``) form: ``Chunked``/``NoSharding`` + ``ShardedAxis``/``Replicated``,
        one ``mesh_mapping`` entry per mesh dim.

        ``canonical=True`` gives the form Alpa's auto-sharding emits
        (``hlo_sharding_to_sharding_spec``): mesh dims of size 1 dropped and adjacent
        replicated dims merged, so a replicated tensor on a 2x4 mesh is
        ``[Replicated(8)]``. Both place every shard on the same device (pxla orders
        devices row-major over ``mesh_mapping``); Alpa's local all-gather rewrite only
        accepts the canonical one."""
        alpa = self._to_alpa(mesh_shape)
        if not canonical:
            return alpa
        mapping: list = []
        for m in alpa.mesh_mapping:
            if isinstance(m, Replicated):
                if m.replicas == 1:
                    continue
                if mapping and isinstance(mapping[-1], Replicated):
                    m = Replicated(mapping.pop().replicas * m.replicas)
            mapping.append(m)
        return AlpaShardingSpec(alpa.sharding, tuple(mapping) or (Replicated(1),))

    def _to_alpa(self, mesh_shape: Sequence[int]) -> "AlpaShardingSpec":
        sharding: list = []
        mesh_mapping: list = [Replicated(int(n)) for n in mesh_shape]
        axis = 0
        for d in self.dims:
            if not d:
                sharding.append(NoSharding())
                continue
            sharding.append(Chunked(tuple(int(mesh_shape[m]) for m in d)))
            for m in d:
                mesh_mapping[m] = ShardedAxis(axis)
                axis += 1
        return AlpaShardingSpec(tuple(sharding), tuple(mesh_mapping))

    @staticmethod
    def alpa_mesh_shape(alpa_spec) -> tuple[int, ...]:
        """The logical mesh an Alpa spec is written for: one dim per ``mesh_mapping``
        entry, ``Replicated(n)`` of size n and ``ShardedAxis(a)`` of chunk axis a's
        size. Alpa's specs need not follow the physical (hosts, devices per host)
        shape: its auto-sharding drops untiled dims (``[Replicated(8)]`` on 2x4)."""
        sizes = [int(c) for s in alpa_spec.sharding if type(s).__name__ == "Chunked" for c in s.chunks]
        shape = []
        for m, mm in enumerate(alpa_spec.mesh_mapping):
            kind = type(mm).__name__
            if kind == "Replicated":
                shape.append(int(mm.replicas))
            elif kind == "ShardedAxis" and 0 <= mm.axis < len(sizes):
                shape.append(sizes[mm.axis])
            else:
                raise InvalidSpecError(f"unsupported Alpa mesh_mapping entry {mm!r} on mesh dim {m}")
        return tuple(shape)

    @classmethod
    def from_alpa(cls, alpa_spec, mesh_shape: Sequence[int] | None = None) -> "ShardingSpec":
        """From Alpa's form: any object with ``sharding`` and ``mesh_mapping`` whose
        entries are named ``NoSharding``/``Chunked(chunks)`` and
        ``ShardedAxis(axis)``/``Replicated(replicas)`` (real pxla objects work too)."""
        chunk_axes: list[tuple[int, int]] = []  # chunk axis -> (tensor dim, chunk size)
        for t, s in enumerate(alpa_spec.sharding):
            kind = type(s).__name__
            if kind == "NoSharding":
                continue
            if kind != "Chunked":
                raise InvalidSpecError(f"unsupported Alpa sharding entry {s!r} on tensor dim {t}")
            for c in s.chunks:
                chunk_axes.append((t, int(c)))
        owner: dict[int, int] = {}
        for m, mm in enumerate(alpa_spec.mesh_mapping):
            kind = type(mm).__name__
            if kind == "ShardedAxis":
                if not 0 <= mm.axis < len(chunk_axes):
                    raise InvalidSpecError(f"Alpa mesh_mapping {mm!r} on mesh dim {m} names a missing chunk axis")
                owner[mm.axis] = m
                if mesh_shape is not None and chunk_axes[mm.axis][1] != mesh_shape[m]:
                    raise InvalidSpecError(
                        f"Alpa chunk of size {chunk_axes[mm.axis][1]} is mapped to mesh dim {m} of size "
                        f"{mesh_shape[m]}; alpa_comm needs a chunk to span its whole mesh dim")
            elif kind == "Replicated":
                if mesh_shape is not None and mm.replicas != mesh_shape[m]:
                    raise InvalidSpecError(
                        f"Alpa Replicated({mm.replicas}) on mesh dim {m} does not match its size {mesh_shape[m]}")
            else:
                raise InvalidSpecError(f"unsupported Alpa mesh_mapping entry {mm!r} on mesh dim {m}")
        if len(owner) != len(chunk_axes):
            raise InvalidSpecError(f"Alpa spec {alpa_spec!r} has chunk axes no mesh dim is mapped to")
        dims: list[list[int]] = [[] for _ in alpa_spec.sharding]
        for a, (t, _) in enumerate(chunk_axes):
            dims[t].append(owner[a])
        return cls(tuple(tuple(d) for d in dims))


# ------------------------------------------------------- Alpa's data, as plain data
@dataclass(frozen=True)
class NoSharding:
    """Alpa/pxla: this tensor dim is not split."""


@dataclass(frozen=True)
class Chunked:
    """Alpa/pxla: this tensor dim is split into ``prod(chunks)`` parts, first chunk major."""

    chunks: Sequence[int]


@dataclass(frozen=True)
class ShardedAxis:
    """Alpa/pxla: this mesh dim indexes chunk axis ``axis``."""

    axis: int


@dataclass(frozen=True)
class Replicated:
    """Alpa/pxla: this mesh dim holds ``replicas`` copies."""

    replicas: int


@dataclass(frozen=True)
class AlpaShardingSpec:
    """Plain-data twin of ``jax.interpreters.pxla.ShardingSpec`` (Alpa 0.2.3)."""

    sharding: tuple
    mesh_mapping: tuple
