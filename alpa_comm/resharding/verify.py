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
from dataclasses import dataclass, field

import numpy as np

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


PAIRWISE_BOXES = 64
"""A device's received boxes are checked against each other pair by pair while it has at
most this many; beyond, on the grid their boundaries cut (``_first_overlap``), so a device
taking thousands of pieces is checked in linear time, not quadratic."""
MAX_GRID_CELLS = 1 << 24


def _first_overlap(boxes: list) -> tuple[int, int] | None:
    """(i, j), i < j, of the first box j that overlaps an earlier box i, or None: every box
    marks the cells of the grid cut by all the boxes' boundaries; a cell marked twice is an
    overlap (pairwise where that grid would be too large)."""
    ndim = len(boxes[0])
    cuts = [np.unique([c for box in boxes for c in box[d]]) for d in range(ndim)]
    if math.prod(len(c) - 1 for c in cuts) > MAX_GRID_CELLS:
        for j in range(len(boxes)):
            for i in range(j):
                if _overlap(boxes[i], boxes[j]):
                    return i, j
        return None
    grid = np.zeros(tuple(len(c) - 1 for c in cuts), dtype=np.int32)
    for j, box in enumerate(boxes):
        where = tuple(slice(int(np.searchsorted(cuts[d], box[d][0])), int(np.searchsorted(cuts[d], box[d][1])))
                      for d in range(ndim))
        cells = grid[where]
        if cells.size and cells.max() > 0:
            return next(i for i in range(j) if _overlap(boxes[i], box)), j
        cells += 1
    return None


def verify_plan(plan, lost_hosts=()) -> None:
    """Raise ``PlanError`` naming the first transfer or device that goes wrong.

    Any plan: a single-array plan is read as a one-leaf plan, a tree plan leaf by
    leaf; a coalesced transfer delivers each of its parts. ``lost_hosts``: a plan made
    without them (``plan_resharding_tree(lost_hosts=...)``): their devices hold nothing
    and need nothing."""
    lost = frozenset(lost_hosts)
    ledger = _Ledger.of(plan.leaves, (lambda d: plan.cluster.host_of(d) in lost) if lost else None)
    for t in plan.transfers:
        ledger.run(t)
    ledger.check_many_boxes()
    if carries_data(plan.strategy):
        ledger.check_complete()


@dataclass
class _Ledger:
    """What every device holds and has received, leaf by leaf, as ``verify_plan`` plays
    a plan's transfers in order; each check is one method, raising on the first fault."""

    leaves: tuple
    need: list  # per leaf: destination device -> the box it must end with
    holds: list  # per leaf: device -> boxes it holds (its source box, then what it received)
    received: list  # per leaf: destination device -> boxes received, in order
    by: list  # per leaf: destination device -> the transfer that delivered each received box
    done: set = field(default_factory=set)  # ids of the transfers played so far

    @classmethod
    def of(cls, leaves, gone=None) -> "_Ledger":
        """``gone(device)``: whether a device takes no part (its host was lost)."""
        gone = gone or (lambda d: False)
        need = [{d: b for d, b in leaf.resharding.dst.device_boxes(leaf.shape).items() if not gone(d)}
                for leaf in leaves]
        holds = [{d: [b] for d, b in leaf.resharding.src.device_boxes(leaf.shape).items() if not gone(d)}
                 for leaf in leaves]
        return cls(leaves, need, holds, [{d: [] for d in n} for n in need], [{d: [] for d in n} for n in need])

    def where(self, t, leaf: int) -> str:
        path = self.leaves[leaf].path
        return f"transfer {t.id}" + ("" if path == "/" else f" ({path})")

    def run(self, t) -> None:
        """Play one transfer: its dependencies done, then each part it delivers."""
        missing = [d for d in t.deps if d not in self.done]
        if missing:
            raise PlanError(f"transfer {t.id} starts before its dependencies {missing}")
        if t.kind == ALLGATHER:
            _all_gather(t, self.received[t.leaf], self.holds[t.leaf])
        else:
            deliveries = [(p.leaf, p.sender, p.receivers, p.index) for p in t.parts] or [
                (t.leaf, t.sender, t.receivers, t.index)]
            for leaf, sender, receivers, index in deliveries:
                self.deliver(t, leaf, sender, receivers, index)
        self.done.add(t.id)

    def deliver(self, t, leaf: int, sender: int, receivers, index) -> None:
        """``sender`` must hold ``index``; each receiver must need it, inside its box, and
        not have any of it already (pairwise while it has few boxes, see
        ``check_many_boxes``)."""
        need, where = self.need[leaf], self.where(t, leaf)
        if not any(_inside(index, b) for b in self.holds[leaf].get(sender, [])):
            raise PlanError(f"{where}: sender device {sender} does not hold slice {index}")
        for r in receivers:
            if r not in need:
                raise PlanError(f"{where}: receiver {r} is not a destination device")
            if not _inside(index, need[r]):
                raise PlanError(f"{where}: device {r} receives {index}, outside its box {need[r]}")
            got = self.received[leaf][r]
            if len(got) < PAIRWISE_BOXES:
                for prior in got:
                    if _overlap(prior, index):
                        raise PlanError(f"{where}: device {r} receives {index} twice (already has {prior})")
            got.append(index)
            self.by[leaf][r].append(where)
            self.holds[leaf].setdefault(r, []).append(index)

    def check_many_boxes(self) -> None:
        """Devices that received more than ``PAIRWISE_BOXES`` boxes: checked on their grid."""
        for leaf, per_device in enumerate(self.received):
            for r, got in per_device.items():
                if len(got) > PAIRWISE_BOXES:
                    hit = _first_overlap(got)
                    if hit is not None:
                        i, j = hit
                        raise PlanError(f"{self.by[leaf][r][j]}: device {r} receives {got[j]} twice "
                                        f"(already has {got[i]})")

    def check_complete(self) -> None:
        """Every destination device ends with all of its box."""
        for leaf, n in enumerate(self.need):
            prefix = "" if self.leaves[leaf].path == "/" else f"{self.leaves[leaf].path}: "
            for d, box in n.items():
                got = [b for b in self.holds[leaf].get(d, []) if _inside(b, box)]
                # received boxes are pairwise disjoint (checked above); all-gathered ones are the whole box
                covered = _volume(box) if box in got else sum(_volume(b) for b in self.received[leaf][d])
                if covered != _volume(box):
                    raise PlanError(f"{prefix}destination device {d} ends with {covered} of the {_volume(box)} "
                                    f"elements of {box}")


def _all_gather(t, received: dict[int, list], holds: dict[int, list]) -> None:
    """Alpa's follow-up all-gather: its members together must hold the whole box."""
    parts = [b for m in t.receivers for b in received[m] if _inside(b, t.index)]
    if sum(_volume(b) for b in parts) != _volume(t.index):
        raise PlanError(f"all-gather {t.id} among devices {list(t.receivers)}: members hold "
                        f"{sum(_volume(b) for b in parts)} of {_volume(t.index)} elements of {t.index}")
    for m in t.receivers:
        holds.setdefault(m, []).append(t.index)


verify_tree_plan = verify_plan
"""The same check (kept for older code): a tree plan is verified leaf by leaf."""
