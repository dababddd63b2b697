"""``Pieces``: one message made of several contiguous byte runs.

A 200-leaf bucket is 400 shard slices in 400 separate buffers; packing them into one
buffer before the send (and unpacking after the receive) copies every byte once more
than the wire needs, which on fast links is most of a tree's cost (50 MiB take about
9 ms to pack here, the wire about 12). A backend that can gather and scatter (TCP's
``sendmsg``/``recvmsg_into``: ``Backend.vectored``) sends a ``Pieces`` as one message
straight from the slices and receives one straight into the destination regions; the
other backends get it packed (``packed``) or received through one buffer
(``Backend.irecv`` on ``scratch`` then ``scatter``). Both ends of a message cut it into
chunks by byte offsets (``pieces[lo:hi]``) exactly as they would cut a flat buffer.
"""
from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError


class Pieces:
    """Contiguous flat ``uint8`` runs that travel back to back as one message of
    ``nbytes``; empty runs are dropped. Sliced by byte offsets like a flat buffer."""

    __slots__ = ("views", "nbytes", "_starts")

    def __init__(self, views: Sequence[np.ndarray]):
        self.views = [v for v in views if v.nbytes]
        for v in self.views:
            if v.ndim != 1 or v.dtype != np.uint8 or not v.flags.c_contiguous:
                raise InvalidArgumentError(f"a piece must be a contiguous flat uint8 array, got {v.dtype} {v.shape}")
        starts, pos = [], 0
        for v in self.views:
            starts.append(pos)
            pos += v.nbytes
        self.nbytes, self._starts = pos, starts

    @property
    def size(self) -> int:
        return self.nbytes

    def __len__(self) -> int:
        return self.nbytes

    def __getitem__(self, key) -> "Pieces":
        """Bytes ``lo`` .. ``hi`` (a slice with step 1) as pieces of the same memory."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise InvalidTypeError(f"Pieces are cut by byte ranges [lo:hi], got {key!r}")
        lo, hi, _ = key.indices(self.nbytes)
        if hi <= lo:
            return Pieces([])
        out = []
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while i < len(self.views) and self._starts[i] < hi:
            v, at = self.views[i], self._starts[i]
            out.append(v[max(0, lo - at):min(v.nbytes, hi - at)])
            i += 1
        return Pieces(out)

    def packed(self, out: np.ndarray | None = None) -> np.ndarray:
        """The bytes in one flat buffer (``out`` if given): for a backend that cannot gather."""
        if out is None:
            out = np.empty(self.nbytes, np.uint8)
        if self.views:
            np.concatenate(self.views, out=out[:self.nbytes])
        return out

    def scatter(self, flat: np.ndarray) -> None:
        """Write ``flat`` (``nbytes`` of them) into the runs, in order."""
        for v, at in zip(self.views, self._starts):
            v[...] = flat[at:at + v.nbytes]

    def __repr__(self) -> str:
        return f"Pieces({len(self.views)} runs, {self.nbytes} bytes)"

