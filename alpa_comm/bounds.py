"""``even_bounds``: where a run of bytes is cut into equal parts, the same on every host.

Both ends of a message cut it alike without telling each other (a transfer's chunks, a
striped message's parts, an all-reduce's blocks), so the cut is exact integer arithmetic:
``lo + (hi - lo) * i // k``. A float ``numpy.linspace`` cast to integers gave the same
cuts only as long as rounding did, and cost 30-60 us a call inside a small reshard (one
per transfer on each host), more than the rest of cutting it.
"""
from __future__ import annotations


def even_bounds(lo: int, hi: int, k: int) -> list[int]:
    """``k + 1`` integer bounds from ``lo`` to ``hi`` of ``k`` parts as equal as integers
    allow (the longer ones last)."""
    lo, hi, k = int(lo), int(hi), int(k)
    span = hi - lo
    return [lo + span * i // k for i in range(k + 1)]
