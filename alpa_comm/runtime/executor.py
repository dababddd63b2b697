"""Execute one host's part of a resharding plan over a ``Backend``.

Pure NumPy plus the backend interface, so the same code runs in Ray host
workers over gloo (or NCCL) and in threads over ``ThreadBackend`` in tests.

Every host runs the transfers it takes part in, in the plan's global order
(``host_operations``); because all hosts follow one total order, two hosts
that share two transfers meet them in the same order, so the sequence cannot
deadlock. Devices of a host are buffers of one process: intra-host copies and
intra-host all-gathers are memory copies; only inter-host bytes go through
the backend, as flat ``uint8`` messages.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..resharding.plan import Transfer
from ..resharding.strategies import ALLGATHER, LOCAL_COPY
from ..spec import Box
from .backend import DEFAULT_TIMEOUT_S, Backend, CommunicationError

RING_TAG = 512
TAGS_PER_TRANSFER = 1024  # chunk tags below RING_TAG, ring steps above


def numpy_dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes  # noqa: PLC0415 - optional

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError as e:
            raise CommunicationError("bfloat16 arrays need the ml_dtypes package") from e
    return np.dtype(name)


def view(buf: np.ndarray, buf_box: Box, index: Box) -> np.ndarray:
    """The part of ``buf`` (holding ``buf_box`` of the tensor) that covers ``index``."""
    return buf[tuple(slice(a - b0, b - b0) for (a, b), (b0, _) in zip(index, buf_box))]


def shape_of(index: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in index)


@dataclass
class Layout:
    """Where every device's data sits in the global tensor."""

    dtype: np.dtype
    src_boxes: dict[int, Box]
    dst_boxes: dict[int, Box]
    sent_boxes: dict[int, Box]  # what the network delivers (differs from dst only for Alpa's rewrite)


@dataclass
class TransferTiming:
    transfer: int
    kind: str
    start: float
    end: float


class HostExecutor:
    """Runs ``transfers`` (this host's, in plan order) moving data from ``src`` to ``dst`` buffers.

    ``layout``/``src``/``dst`` describe one array, or are lists with one entry per
    leaf of a tree plan (transfers name their ``leaf``; coalesced ones carry parts).
    """

    def __init__(self, host: int, layout, src, dst, backend: Backend, host_of: Callable[[int], int],
                 timeout: float = DEFAULT_TIMEOUT_S, min_rate: float | None = None, tag_base: int = 0):
        many = isinstance(layout, (list, tuple))
        self.layouts = list(layout) if many else [layout]
        self.srcs = list(src) if many else [src]
        self.dsts = list(dst) if many else [dst]
        self.host, self.backend, self.host_of, self.timeout = host, backend, host_of, timeout
        self.min_rate = min_rate  # bytes/s of the slowest NIC: lets big messages take their time
        self.wait_s = timeout
        self.tag_base = tag_base  # separates plans that run at the same time over one backend
        self._select(0)

    def _select(self, leaf: int) -> None:
        self.layout, self.src, self.dst = self.layouts[leaf], self.srcs[leaf], self.dsts[leaf]

    # ------------------------------------------------------------ helpers
    def _slice_bytes(self, device: int, index: Box, leaf: int | None = None) -> np.ndarray:
        lay, src = (self.layout, self.src) if leaf is None else (self.layouts[leaf], self.srcs[leaf])
        data = view(src[device], lay.src_boxes[device], index)
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def _write(self, device: int, index: Box, flat: np.ndarray, leaf: int | None = None) -> None:
        lay, dst = (self.layout, self.dst) if leaf is None else (self.layouts[leaf], self.dsts[leaf])
        target = view(dst[device], lay.dst_boxes[device], index)
        target[...] = flat.view(lay.dtype).reshape(shape_of(index))

    def _source(self, t: Transfer) -> np.ndarray:
        """The bytes this (sending) host puts on the wire for ``t``: one slice, or the
        parts of a coalesced transfer packed back to back."""
        if not t.parts:
            return self._slice_bytes(t.sender, t.index)
        return np.concatenate([self._slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])

    def _deliver(self, t: Transfer, flat: np.ndarray) -> None:
        """Write what arrived into this host's receiving devices (unpacking parts)."""
        if not t.parts:
            for r in self._mine(t):
                self._write(r, t.index, flat)
            return
        pos = 0
        for p in t.parts:
            for r in p.receivers:
                if self.host_of(r) == self.host:
                    self._write(r, p.index, flat[pos:pos + p.nbytes], p.leaf)
            pos += p.nbytes

    def _wait(self, handles) -> None:
        for h in handles:
            h.wait(self.wait_s)

    def _mine(self, t: Transfer) -> list[int]:
        return [r for r in t.receivers if self.host_of(r) == self.host]

    @staticmethod
    def _hosts_in_order(devices: Sequence[int], host_of) -> list[int]:
        return list(dict.fromkeys(host_of(d) for d in devices))

    # ------------------------------------------------------------------ run
    def run(self, transfers: Sequence[Transfer]) -> list[TransferTiming]:
        timings = []
        for t in transfers:
            t0 = time.perf_counter()
            try:
                self._run_one(t)
            except CommunicationError as e:
                raise CommunicationError(f"{e} (during transfer {t.id}: {t.kind} of slice "
                                         f"{[list(p) for p in t.index]})") from e
            timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
        return timings

    def _run_one(self, t: Transfer) -> None:
        self._select(t.leaf)
        # A wait may last the timeout plus twice what this transfer's bytes need on the
        # slowest NIC: no false alarm on a large slice, still bounded when a peer is gone.
        self.wait_s = self.timeout + (2 * t.nbytes / self.min_rate if self.min_rate else 0.0)
        tag0 = self.tag_base + (t.id % 1_000_000) * TAGS_PER_TRANSFER
        if t.kind == LOCAL_COPY:
            flat = self._slice_bytes(t.sender, t.index)
            for r in t.receivers:
                self._write(r, t.index, flat)
        elif t.kind in ("send_recv", "local_allgather"):
            self._point_to_point(t, tag0)
        elif t.kind in ("broadcast", "signal"):
            self._chain(t, tag0)
        elif t.kind == "global_allgather":
            self._global_allgather(t, tag0)
        elif t.kind == ALLGATHER:
            self._member_allgather(t, tag0)
        else:
            raise CommunicationError(f"host {self.host}: unknown transfer kind {t.kind!r}")

    def _point_to_point(self, t: Transfer, tag0: int) -> None:
        """send_recv: one message; local_allgather: one part per receiving device, then the
        host assembles the slice for all of them (its intra-host all-gather)."""
        dst_host = self.host_of(t.receivers[0])
        parts = 1 if t.kind == "send_recv" or t.parts else len(t.receivers)
        nbytes = t.nbytes
        bounds = np.linspace(0, nbytes, parts + 1).astype(np.int64)
        if self.host_of(t.sender) == self.host:
            flat = self._source(t)
            self._wait([self.backend.isend(flat[bounds[j]:bounds[j + 1]], dst_host, tag0 + j) for j in range(parts)])
        if dst_host == self.host:
            flat = np.empty(nbytes, np.uint8)
            src_host = self.host_of(t.sender)
            self._wait([self.backend.irecv(flat[bounds[j]:bounds[j + 1]], src_host, tag0 + j) for j in range(parts)])
            self._deliver(t, flat)

    def _chain(self, t: Transfer, tag0: int) -> None:
        """Chunk-pipelined chain: each host forwards chunk k while chunk k+1 arrives."""
        chain = [self.host_of(t.sender)] + [h for h in self._hosts_in_order(t.receivers, self.host_of)
                                            if h != self.host_of(t.sender)]
        if self.host not in chain:
            return
        p = chain.index(self.host)
        signal = t.kind == "signal"
        nbytes = 1 if signal else t.nbytes
        k = 1 if signal else max(1, min(t.chunks, nbytes))
        bounds = np.linspace(0, nbytes, k + 1).astype(np.int64)
        if p == 0:
            flat = np.zeros(1, np.uint8) if signal else self._source(t)
            self._wait([self.backend.isend(flat[bounds[c]:bounds[c + 1]], chain[1], tag0 + c) for c in range(k)])
            return
        mine = [] if signal or t.parts else self._mine(t)
        targets = [self._flat_target(r, t.index) for r in mine]
        # Receive straight into the first local device when its part of the buffer is
        # contiguous, and copy each chunk on to the other local devices as it arrives,
        # so the intra-host copies overlap the network instead of following it.
        direct = bool(targets) and targets[0] is not None
        flat = targets[0] if direct else np.empty(nbytes, np.uint8)
        recvs = [self.backend.irecv(flat[bounds[c]:bounds[c + 1]], chain[p - 1], tag0 + c) for c in range(k)]
        sends = []
        for c in range(k):
            recvs[c].wait(self.wait_s)
            lo, hi = bounds[c], bounds[c + 1]
            if p + 1 < len(chain):
                sends.append(self.backend.isend(flat[lo:hi], chain[p + 1], tag0 + c))
            for r, tgt in zip(mine, targets):
                if tgt is not None and tgt is not flat:
                    tgt[lo:hi] = flat[lo:hi]
        self._wait(sends)
        if t.parts and not signal:
            self._deliver(t, flat)
        for r, tgt in zip(mine, targets):
            if tgt is None:
                self._write(r, t.index, flat)

    def _flat_target(self, device: int, index: Box) -> np.ndarray | None:
        """The bytes of ``index`` inside ``device``'s buffer as a flat writable view, or
        None when that region is not contiguous."""
        target = view(self.dst[device], self.layout.dst_boxes[device], index)
        if not target.flags["C_CONTIGUOUS"]:
            return None
        return target.reshape(-1).view(np.uint8)

    def _ring(self, blocks: dict[int, np.ndarray], hosts: list[int], tag0: int) -> None:
        """Host-level ring all-gather: after A-1 steps every host has every host's block."""
        a = len(hosts)
        if a == 1 or self.host not in hosts:
            return
        p = hosts.index(self.host)
        nxt, prv = hosts[(p + 1) % a], hosts[(p - 1) % a]
        for s in range(a - 1):
            out_block = blocks[hosts[(p - s) % a]]
            in_block = blocks[hosts[(p - s - 1) % a]]
            send = self.backend.isend(out_block, nxt, tag0 + RING_TAG + s)
            recv = self.backend.irecv(in_block, prv, tag0 + RING_TAG + s)
            self._wait([recv, send])

    def _global_allgather(self, t: Transfer, tag0: int) -> None:
        """Scatter 1/N of the slice to each of the N receiving devices, then ring all-gather."""
        n = len(t.receivers)
        bounds = np.linspace(0, t.nbytes, n + 1).astype(np.int64)
        hosts = self._hosts_in_order(t.receivers, self.host_of)
        sender_host = self.host_of(t.sender)
        if sender_host == self.host:
            flat = self._slice_bytes(t.sender, t.index)
            self._wait([self.backend.isend(flat[bounds[j]:bounds[j + 1]], self.host_of(r), tag0 + j)
                        for j, r in enumerate(t.receivers)])
        if self.host not in hosts:
            return
        flat = np.empty(t.nbytes, np.uint8)
        self._wait([self.backend.irecv(flat[bounds[j]:bounds[j + 1]], sender_host, tag0 + j)
                    for j, r in enumerate(t.receivers) if self.host_of(r) == self.host])
        # receivers are host-major, so each host's parts are one contiguous block
        blocks = {}
        for h in hosts:
            js = [j for j, r in enumerate(t.receivers) if self.host_of(r) == h]
            blocks[h] = flat[bounds[js[0]]:bounds[js[-1] + 1]]
        self._ring(blocks, hosts, tag0)
        for r in self._mine(t):
            self._write(r, t.index, flat)

    def _member_allgather(self, t: Transfer, tag0: int) -> None:
        """Alpa's follow-up all-gather: each member holds its part (its box under the sent
        spec); afterwards every member holds the whole ``t.index``."""
        hosts = self._hosts_in_order(t.receivers, self.host_of)
        if self.host not in hosts:
            return
        parts = {m: self.layout.sent_boxes[m] for m in t.receivers}
        size = self.layout.dtype.itemsize
        offsets, pos = {}, 0
        for m in t.receivers:
            offsets[m] = pos
            pos += size * int(np.prod(shape_of(parts[m])))
        flat = np.empty(pos, np.uint8)
        mine = self._mine(t)
        for m in mine:
            data = np.ascontiguousarray(view(self.dst[m], self.layout.dst_boxes[m], parts[m]))
            flat[offsets[m]:offsets[m] + data.nbytes] = data.reshape(-1).view(np.uint8)
        blocks = {}
        for h in hosts:
            ms = [m for m in t.receivers if self.host_of(m) == h]
            last = ms[-1]
            blocks[h] = flat[offsets[ms[0]]:offsets[last] + size * int(np.prod(shape_of(parts[last])))]
        self._ring(blocks, hosts, tag0)
        for m in t.receivers:
            n = size * int(np.prod(shape_of(parts[m])))
            for r in mine:
                if r != m:
                    self._write(r, parts[m], flat[offsets[m]:offsets[m] + n])
