"""Packing coalesced buffers ahead of their turn, on a packing thread.

gloo writes a send into the socket on the thread that posts it, so packing and sending
on one thread would take turns: a host packs the buffers it must pack (coalesced
transfers, strided slices; ``HostExecutor._packs``) ``PACK_AHEAD`` at a time ahead of
their turn on a thread of its own, part run by part run, and a chunked send takes each
chunk as soon as it is packed (``HostExecutor.source_pieces``).

The executor's ``_packed`` (transfer id -> the future of its buffer) and ``_packing``
(transfer id -> ``Packing``) are written here by the dispatching thread before the
transfer they belong to is admitted, and popped once by the thread that sends it.
"""
from __future__ import annotations

import bisect
import threading
from concurrent.futures import Future
from typing import Sequence

import numpy as np

from ..resharding.plan import Transfer
from .pools import packing_thread

# ``HostExecutor`` (runtime/executor.py, which imports this module) is named in annotations only.

PACK_AHEAD = 2
"""Coalesced buffers a sending host packs ahead of their turn, on a packing thread: gloo
writes a send into the socket on the thread that posts it, so packing and sending on one
thread would take turns."""
PACK_RUN_BYTES = 256 << 10
"""A coalesced buffer is packed in runs of parts of at least this many bytes, each
announced as packed, so a chunked send can start before the whole buffer is packed."""


class Packing:
    """A coalesced buffer being packed on the packing thread, part run by part run: a
    sender may put its first bytes on the wire while the rest are still being packed.
    ``_cond`` guards ``flat``, ``packed`` and ``failed``; the packing future's end (done,
    failed or cancelled) notifies it too, so a waiter never polls."""

    def __init__(self):
        self.flat: np.ndarray | None = None
        self.packed = 0  # bytes of ``flat`` packed so far
        self.failed = False
        self._cond = threading.Condition()

    def advance(self, flat: np.ndarray, packed: int) -> None:
        with self._cond:
            self.flat, self.packed = flat, packed
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()

    def follow(self, future: Future) -> None:
        """Wake the waiters once ``future`` (the packing) ends, however it ends."""
        future.add_done_callback(self._ended)

    def _ended(self, _future: Future) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, nbytes: int, future: Future) -> bool:
        """Wait until the first ``nbytes`` are packed; False where packing ended without
        them (``future`` then raises what it raised)."""
        with self._cond:
            while self.packed < nbytes and not self.failed:
                if future.done():
                    return self.packed >= nbytes
                self._cond.wait()
            return not self.failed


class PackAhead:
    """The buffers a host must pack, packed on the packing thread ``PACK_AHEAD`` at a time
    ahead of their turn into the executor's ``_packed`` (with their progress in
    ``_packing``), where ``source`` and ``source_pieces`` pick them up."""

    def __init__(self, ex: "HostExecutor", transfers: Sequence[Transfer]):
        self.ex, self.transfers = ex, transfers
        self.positions = [i for i, t in enumerate(transfers) if ex._packs(t)]  # ascending
        self._set = set(self.positions)
        self.pool = packing_thread() if self.positions else None

    def packs(self, i: int) -> bool:
        return i in self._set

    def submit_from(self, i: int) -> None:
        """Transfer ``i``'s buffer and the next ones this host packs, if not yet submitted."""
        if self.pool is None:
            return
        k = bisect.bisect_left(self.positions, i)
        for j in self.positions[k:k + PACK_AHEAD]:
            t = self.transfers[j]
            if t.id not in self.ex._packed:
                progress = Packing() if t.parts and self.ex.xp is np else None
                if progress is not None:
                    self.ex._packing[t.id] = progress
                future = self.pool.submit(self.ex._pack, t, progress)
                if progress is not None:
                    progress.follow(future)
                self.ex._packed[t.id] = future

    def close(self) -> None:
        """Cancel what has not started packing and wait for what has (the thread is kept)."""
        if self.pool is not None:
            futures = list(self.ex._packed.values())
            for f in futures:
                f.cancel()
            for f in futures:
                if not f.cancelled():
                    f.exception()  # waits; an error was raised to the transfer that needed it
            self.ex._packed.clear()
            self.ex._packing.clear()
