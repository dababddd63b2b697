"""``LeafCompletion``: which leaves a call's transfers complete on this process.

A leaf is complete here once every transfer that writes into it here has ended
(``reshard._Share.writers``: transfer id -> the leaves it writes here). Both the
progressive placer (adopting a leaf as its ``jax.Array``) and the leaf-by-leaf ``out=``
(copying a leaf's staging into its previous arrays) act on exactly that moment.
"""
from __future__ import annotations


class LeafCompletion:
    """Counts the writers each of ``leaves`` leaves still has here. Not locked: its
    callers call ``ended`` under their own lock."""

    __slots__ = ("_writers", "_pending", "left")

    def __init__(self, leaves: int, writers: dict):
        self._writers = writers
        self._pending = [0] * leaves
        for written in writers.values():
            for i in written:
                self._pending[i] += 1
        self.left = sum(1 for n in self._pending if n)  # leaves some transfer here still writes into

    def unwritten(self, i: int) -> bool:
        """Whether no transfer writes leaf ``i`` here (nothing of it to wait for)."""
        return not self._pending[i]

    def ended(self, transfer_id: int) -> list[int]:
        """The leaves transfer ``transfer_id``, now ended here, was the last writer of."""
        ready = []
        for i in self._writers.get(transfer_id, ()):
            self._pending[i] -= 1
            if self._pending[i] == 0:
                ready.append(i)
        self.left -= len(ready)
        return ready
