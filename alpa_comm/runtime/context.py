"""What a transfer kind runs against: one transfer's frozen view of its host's executor.

A kind's ``post``/``run`` (``resharding/kinds/``) is handed a ``TransferContext``: the
transfer's leaf, its first tag and its wait bound, fixed when the transfer is admitted,
and the primitives (send, receive, wait, read a slice, write a slice) bound to them.
Buffers, the backend and the caches stay on the shared ``HostExecutor``; nothing here
is rebound per transfer, so transfers of different leaves run at once on one executor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..resharding.plan import Transfer
from ..spec import Box
from .backend import Handle

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..resharding.kinds.base import TransferKind
    from .layouts import Layout

# ``HostExecutor`` (runtime/executor.py, which imports this module) is named in annotations only.

RING_TAG = 512
"""A transfer's tags from ``tag0 + RING_TAG`` on are its ring all-gather's steps; below,
its chunks."""


@dataclass(frozen=True)
class TransferContext:
    """Transfer ``t`` on host ``ex.host``: its ``kind``, first tag ``tag0`` (tags ``tag0``
    .. ``tag0 + 1023`` are the transfer's) and ``wait_s``, how long any one wait may
    last (``HostExecutor.context`` says why that long)."""

    ex: "HostExecutor"
    t: Transfer
    kind: "TransferKind"
    tag0: int
    wait_s: float

    # ------------------------------------------------- what kinds read
    @property
    def host(self) -> int:
        return self.ex.host

    @property
    def host_of(self):
        return self.ex.host_of

    @property
    def backend(self):
        return self.ex.backend

    @property
    def xp(self):
        return self.ex.xp

    @property
    def layout(self) -> "Layout":
        return self.ex.layouts[self.t.leaf]

    def _leaf(self, leaf: int | None) -> int:
        return self.t.leaf if leaf is None else leaf

    # ------------------------------------------------- messages
    def isend(self, buf, host: int, tag: int) -> Handle:
        return self.ex.isend(buf, host, tag)

    def irecv(self, buf, host: int, tag: int) -> Handle:
        return self.ex.irecv(buf, host, tag)

    def wait(self, handles) -> None:
        """Wait for every handle, each bounded by this transfer's wait time."""
        for h in handles:
            h.wait(self.wait_s)

    def ring_allgather(self, blocks: dict, hosts: list[int], tag0: int) -> None:
        """Host-level ring all-gather: after A-1 steps every host has every host's block
        (blocks may differ in size, and may be empty)."""
        a, me = len(hosts), self.host
        if a == 1 or me not in hosts:
            return
        p = hosts.index(me)
        nxt, prv = hosts[(p + 1) % a], hosts[(p - 1) % a]
        for s in range(a - 1):
            out_block = blocks[hosts[(p - s) % a]]
            in_block = blocks[hosts[(p - s - 1) % a]]
            # Both ends know every block's size, so empty blocks are skipped on both sides.
            handles = []
            if in_block.size:
                handles.append(self.irecv(in_block, prv, tag0 + RING_TAG + s))
            if out_block.size:
                handles.append(self.isend(out_block, nxt, tag0 + RING_TAG + s))
            self.wait(handles)

    # ------------------------------------------------- reading and writing
    def slice_bytes(self, device: int, index: Box, leaf: int | None = None) -> np.ndarray:
        return self.ex.slice_bytes(device, index, self._leaf(leaf))

    def read_destination(self, device: int, index: Box) -> np.ndarray:
        return self.ex.read_destination(device, index, self.t.leaf)

    def write(self, device: int, index: Box, flat: np.ndarray, leaf: int | None = None) -> None:
        self.ex.write(device, index, flat, self._leaf(leaf))

    def flat_target(self, device: int, index: Box) -> np.ndarray | None:
        return self.ex.flat_target(device, index, self.t.leaf)

    def source(self, t: Transfer) -> np.ndarray:
        return self.ex.source(t)

    def source_pieces(self, t: Transfer, bounds) -> Iterator[np.ndarray]:
        return self.ex.source_pieces(t, bounds)

    def outgoing(self, t: Transfer):
        return self.ex.outgoing(t)

    def deliver(self, t: Transfer, flat: np.ndarray) -> None:
        self.ex.deliver(t, flat)

    def bucket_target(self, t: Transfer) -> np.ndarray | None:
        return self.ex.bucket_target(t)

    def local_receivers(self, t: Transfer) -> list[int]:
        return self.ex.local_receivers(t)

    def empty_bytes(self, nbytes: int) -> np.ndarray:
        return self.ex.empty_bytes(nbytes)

    def concat(self, pieces: list) -> np.ndarray:
        return self.ex.concat(pieces)
