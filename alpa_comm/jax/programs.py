"""Resharding between separate JAX programs: a trainer and inference engines that are
each their own ``jax.distributed`` program (or a single process), in Ray actors or any
processes that share a ``ProcessGroup``.

No process can see the other programs' devices, so no ``NamedSharding`` spans both sides.
Each process says what it knows: a source process passes its global ``jax.Array``s (in
its program), a destination process the shardings it wants (in its program), a process
that is both passes both. Every member of the group then exchanges one description
through the group's store (``ProcessGroup.exchange``): the source tree's shapes, types and
placements, and each destination program's placements, as group device ids (program
``k``'s process ``p`` is group rank ``first_k + p``: a program takes consecutive ranks).
Every member plans the same joint plan from the merged descriptions (cached, like all
plans), one move per (array, destination program), and runs its share.

The descriptions use mesh device ids, axis names and ``PartitionSpec`` entries, not array
ranks, because a destination learns the shapes only from the exchange.
"""
from __future__ import annotations

import json

import numpy as np

from ..errors import InvalidOptionError, InvalidSpecError
from ..mesh import DeviceMesh
from ..placement import Resharding
from ..resharding.staging import staged_bytes
from ..resharding.staging import staging_groups as cut_groups
from ..spec import ShardingSpec
from .placement import JaxHosts

TOPIC = "reshard"


def describe_sharding(sharding, hosts: JaxHosts) -> dict:
    """A ``NamedSharding`` (or ``SingleDeviceSharding``, or ``(mesh, "RS1")``) as group
    device ids, axis names and its spec, independent of the array's rank."""
    if isinstance(sharding, tuple) and len(sharding) == 2 and isinstance(sharding[1], (str, ShardingSpec)):
        mesh, spec = sharding
        return {"ids": _ids(mesh.devices, hosts), "axes": list(mesh.axis_names), "spec": str(spec)}
    if type(sharding).__name__ == "SingleDeviceSharding":
        (device,) = tuple(sharding.device_set)
        return {"ids": [hosts.id_of(device)], "axes": ["_single"], "pspec": []}
    mesh, pspec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or pspec is None or not hasattr(mesh, "axis_names"):
        raise InvalidSpecError(f"alpa_comm reshards with NamedShardings (mesh + PartitionSpec); got a "
                               f"{type(sharding).__name__}")
    entries = [e if e is None or isinstance(e, str) else list(e) for e in tuple(pspec)]
    return {"ids": _ids(mesh.devices, hosts), "axes": list(mesh.axis_names), "pspec": entries}


def _ids(devices, hosts: JaxHosts) -> list:
    return np.vectorize(hosts.id_of, otypes=[np.int64])(np.asarray(devices, dtype=object)).tolist()


def placement_of(desc: dict, ndim: int, devices_per_host: int) -> tuple[DeviceMesh, ShardingSpec]:
    """(mesh, spec) of a described sharding for an array of rank ``ndim``."""
    mesh = DeviceMesh(np.array(desc["ids"], dtype=np.int64), devices_per_host)
    if "spec" in desc:
        spec = ShardingSpec.parse(desc["spec"])
        if len(spec.dims) != ndim:
            raise InvalidSpecError(f"spec {spec} has {len(spec.dims)} dims for an array of rank {ndim}")
        return mesh, spec
    pspec = tuple(e if e is None or isinstance(e, str) else tuple(e) for e in desc["pspec"])
    return mesh, ShardingSpec.from_partition_spec(pspec, tuple(desc["axes"]), ndim)


def merge(descriptions: list[str]) -> dict:
    """Every member's description (JSON, by rank) as one picture every member agrees on:
    the source leaves, and per destination program (by its first rank) its leaves.
    Raises ``InvalidOptionError`` naming the ranks where the descriptions disagree."""
    parsed = [json.loads(d) for d in descriptions]
    dph = {d["devices_per_host"] for d in parsed}
    if len(dph) != 1:
        raise InvalidOptionError(f"all programs of a group need the same number of devices per process; the "
                                 f"members have {sorted(dph)}")
    sources = {r: d["src"] for r, d in enumerate(parsed) if d["src"] is not None}
    if not sources:
        raise InvalidOptionError("no member of the group passed the arrays to send (tree=None everywhere)")
    first = next(iter(sources.values()))
    differ = sorted(r for r, s in sources.items() if s != first)
    if differ:
        raise InvalidOptionError(f"members {sorted(sources)} pass source trees that differ (ranks {differ} differ "
                                 f"from rank {min(sources)}): every source process passes the same global arrays")
    paths = [path for path, _ in first]
    targets: dict[int, dict] = {}
    for r, d in enumerate(parsed):
        if d["dst"] is None:
            continue
        if set(d["dst"]) != set(paths):
            raise InvalidOptionError(f"rank {r}'s destination tree's leaves {sorted(d['dst'])} do not match the "
                                     f"source tree's {sorted(paths)}")
        seen = targets.setdefault(d["first"], d["dst"])
        if seen != d["dst"]:
            raise InvalidOptionError(f"rank {r} and another process of its program (from rank {d['first']}) want "
                                     f"different destination shardings")
    if not targets:
        raise InvalidOptionError("no member of the group passed destination shardings (dst_tree=None everywhere)")
    return {"devices_per_host": dph.pop(), "src": first, "dst": {str(k): v for k, v in sorted(targets.items())},
            "atomic": any(d.get("atomic", False) for d in parsed)}


def staging_groups(picture: dict, limit: int) -> list[list[str]]:
    """The source paths of ``picture`` cut into groups run in turn where a receiver takes
    its leaves atomically (``resharding.staging``: each group's staging within ``limit``
    on every host of every destination program)."""
    dph = picture["devices_per_host"]
    per_leaf = []
    for path, s in picture["src"]:
        need: dict[int, int] = {}
        for targets in picture["dst"].values():
            mesh, spec = placement_of(targets[path], len(s["shape"]), dph)
            move = Resharding.between(tuple(s["shape"]), s["wire"], mesh, spec, mesh, spec)
            for host, n in staged_bytes(move, dph).items():
                need[host] = need.get(host, 0) + n
        per_leaf.append(need)
    paths = [path for path, _ in picture["src"]]
    return [[paths[i] for i in g] for g in cut_groups(per_leaf, limit)]


def restricted(picture: dict, paths: list) -> dict:
    """``picture`` with only the leaves at ``paths`` (one group of ``staging_groups``)."""
    keep = set(paths)
    return {**picture, "src": [[p, s] for p, s in picture["src"] if p in keep],
            "dst": {first: {p: d for p, d in targets.items() if p in keep}
                    for first, targets in picture["dst"].items()}}
