"""Leaf groups for receiving leaf by leaf (``reshard_tree(..., out=, atomic=True)``) within
a memory budget.

Each leaf a process receives atomically lands in staging memory of its own and is
committed once all of its bytes are in. Within one plan a leaf's staging lives from its
first transfer to its last, and the plan's order (balanced across senders and links,
not leaf by leaf) keeps many leaves open at once: a 557 MiB model moved from FSDP to
tensor-parallel replicas held 159-167 MiB of staging at its peak on a process receiving
278 MiB. So the tree is cut into consecutive groups whose staging fits the budget on
every host, each group planned and run in turn: staging then never exceeds the limit
(a leaf over it alone forms a group, staged whole), whatever order the plan picks.
Pure: every process cuts the same groups from the same global picture.
"""
from __future__ import annotations

import math

from ..dtypes import itemsize
from ..placement import Resharding


def staged_bytes(move: Resharding, devices_per_host: int) -> dict[int, int]:
    """Host -> the staging bytes ``move`` needs there: one buffer per destination device,
    its shard's size."""
    out: dict[int, int] = {}
    size = itemsize(move.dtype)
    for device, box in move.dst.resolved(devices_per_host).device_boxes(move.shape).items():
        host = device // devices_per_host
        out[host] = out.get(host, 0) + math.prod(hi - lo for lo, hi in box) * size
    return out


def staging_groups(per_leaf: list[dict[int, int]], limit: int) -> list[list[int]]:
    """The leaves (indices into ``per_leaf``, host -> staging bytes each) cut, in order,
    into consecutive groups whose staging on every host stays within ``limit``; a leaf
    over ``limit`` on some host forms a group of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    used: dict[int, int] = {}
    for i, need in enumerate(per_leaf):
        alone = any(n > limit for n in need.values())
        if current and (alone or any(used.get(h, 0) + n > limit for h, n in need.items())):
            groups.append(current)
            current, used = [], {}
        current.append(i)
        for h, n in need.items():
            used[h] = used.get(h, 0) + n
        if alone:
            groups.append(current)
            current, used = [], {}
    if current:
        groups.append(current)
    return groups
