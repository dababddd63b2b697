"""Check a plan by executing it symbolically on index boxes.

Every device starts with the box its source spec gives it; transfers run in
start order (dependencies first); a sender must hold what it sends, an
all-gather's members together must hold the whole box. At the end each
destination device must hold exactly the box its destination spec asks for,
every byte received once, nothing it does not need. Executors and tests use
this to reject a wrong plan before any byte moves.
"""
from __future__ import annotations

import math

from ..errors import AlpaCommError
from .strategies import ALLGATHER, carries_data


class PlanError(AlpaCommError):
    """A plan that would not deliver the right data."""


def _inside(inner, outer) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (i0, i1), (o0, o1) in zip(inner, outer))


def _overlap(a, b) -> bool:
    return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(a, b))


def _volume(box) -> int:
    return math.prod(b - a for a, b in box)


def verify_plan(plan) -> None:
    """Raise ``PlanError`` naming the first transfer or device that goes wrong."""
    src_boxes = plan.resharding.src.device_boxes(plan.shape)
    need = plan.resharding.dst.device_boxes(plan.shape)
    received: dict[int, list] = {d: [] for d in need}
    holds: dict[int, list] = {d: [b] for d, b in src_boxes.items()}
    done: set[int] = set()
    signal = not carries_data(plan.strategy)
    for t in plan.transfers:
        missing = [d for d in t.deps if d not in done]
        if missing:
            raise PlanError(f"transfer {t.id} starts before its dependencies {missing}")
        if t.kind == ALLGATHER:
            parts = [b for m in t.receivers for b in received[m] if _inside(b, t.index)]
            if sum(_volume(b) for b in parts) != _volume(t.index):
                raise PlanError(f"all-gather {t.id} among devices {list(t.receivers)}: members hold "
                                f"{sum(_volume(b) for b in parts)} of {_volume(t.index)} elements of {t.index}")
            for m in t.receivers:
                holds.setdefault(m, []).append(t.index)
            done.add(t.id)
            continue
        if not any(_inside(t.index, b) for b in holds.get(t.sender, [])):
            raise PlanError(f"transfer {t.id}: sender device {t.sender} does not hold slice {t.index}")
        for r in t.receivers:
            if r not in need:
                raise PlanError(f"transfer {t.id}: receiver {r} is not a destination device")
            if not _inside(t.index, need[r]):
                raise PlanError(f"transfer {t.id}: device {r} receives {t.index}, outside its box {need[r]}")
            for prior in received[r]:
                if _overlap(prior, t.index):
                    raise PlanError(f"transfer {t.id}: device {r} receives {t.index} twice (already has {prior})")
            received[r].append(t.index)
            holds.setdefault(r, []).append(t.index)
        done.add(t.id)
    if signal:
        return
    for d, box in need.items():
        got = [b for b in holds.get(d, []) if _inside(b, box)]
        # received boxes are pairwise disjoint (checked above); all-gathered ones are the whole box
        covered = _volume(box) if box in got else sum(_volume(b) for b in received[d])
        if covered != _volume(box):
            raise PlanError(f"destination device {d} ends with {covered} of the {_volume(box)} elements of {box}")


def verify_tree_plan(plan) -> None:
    """``verify_plan`` for a ``TreePlan``: every leaf, packed parts unpacked."""
    src = [leaf.resharding.src.device_boxes(leaf.shape) for leaf in plan.leaves]
    need = [leaf.resharding.dst.device_boxes(leaf.shape) for leaf in plan.leaves]
    received: list[dict[int, list]] = [{d: [] for d in n} for n in need]
    for t in plan.transfers:
        deliveries = [(p.leaf, p.sender, p.receivers, p.index) for p in t.parts] or [(t.leaf, t.sender, t.receivers,
                                                                                       t.index)]
        for leaf, sender, receivers, index in deliveries:
            where = f"transfer {t.id} ({plan.leaves[leaf].path})"
            if not _inside(index, src[leaf].get(sender, ((0, 0),) * len(index))):
                raise PlanError(f"{where}: sender device {sender} does not hold slice {index}")
            for r in receivers:
                if r not in need[leaf] or not _inside(index, need[leaf][r]):
                    raise PlanError(f"{where}: device {r} receives {index}, which it does not need")
                if any(_overlap(prior, index) for prior in received[leaf][r]):
                    raise PlanError(f"{where}: device {r} receives {index} twice")
                received[leaf][r].append(index)
    if not carries_data(plan.strategy):
        return
    for leaf, n in enumerate(need):
        for d, box in n.items():
            got = sum(_volume(b) for b in received[leaf][d])
            if got != _volume(box):
                raise PlanError(f"{plan.leaves[leaf].path}: destination device {d} ends with {got} of the "
                                f"{_volume(box)} elements of {box}")
