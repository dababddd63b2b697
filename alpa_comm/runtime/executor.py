"""Execute one host's part of a resharding plan over a ``Backend``.

Pure NumPy plus the backend interface, so the same code runs in Ray host
workers over gloo (or NCCL) and in threads over ``ThreadBackend`` in tests.

How each kind of transfer runs is written once, on its ``TransferKind``
(``resharding/kinds/``), against the primitives this class offers: ``isend``,
``irecv``, ``wait``, ``slice_bytes``/``source`` (read), ``write``/``deliver``
(write), ``ring_allgather``. The executor owns buffers, tags and timeouts.

Every host runs the transfers it takes part in, in the plan's global order
(``host_operations``); because all hosts follow one total order, two hosts
that share two transfers meet them in the same order, so the sequence cannot
deadlock. Devices of a host are buffers of one process: intra-host copies and
intra-host all-gathers are memory copies; only inter-host bytes go through
the backend, as flat ``uint8`` messages.
"""
from __future__ import annotations

import bisect
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import InvalidOptionError
from ..resharding.kinds import transfer_kind
from ..resharding.plan import Leaf, Transfer
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


def array_module(*buffer_lists):
    """The array module of the buffers (CuPy for GPU arrays, else NumPy), found without
    importing CuPy where none is used."""
    for group in buffer_lists:
        for bufs in group:
            for b in (bufs or {}).values():
                if type(b).__module__.split(".")[0] == "cupy":
                    import cupy  # noqa: PLC0415 - only where its arrays are passed in

                    return cupy
    return np


def view(buf: np.ndarray, buf_box: Box, index: Box) -> np.ndarray:
    """The part of ``buf`` (holding ``buf_box`` of the tensor) that covers ``index``."""
    return buf[tuple(slice(a - b0, b - b0) for (a, b), (b0, _) in zip(index, buf_box))]


def shape_of(index: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in index)


@dataclass
class Layout:
    """Where every device's data sits in the global tensor (one leaf of a plan)."""

    dtype: np.dtype
    src_boxes: dict[int, Box]
    dst_boxes: dict[int, Box]
    sent_boxes: dict[int, Box]  # what the network delivers (differs from dst only for Alpa's rewrite)

    @classmethod
    def of(cls, leaf: Leaf) -> "Layout":
        dst = leaf.resharding.dst.device_boxes(leaf.shape)
        sent = dst if leaf.sent_spec is None else leaf.sent.device_boxes(leaf.shape)
        return cls(numpy_dtype(leaf.dtype), leaf.resharding.src.device_boxes(leaf.shape), dst, sent)

    def empty_destinations(self, is_local: Callable[[int], bool], zeros: bool = False,
                           alloc: Callable | None = None) -> dict[int, np.ndarray]:
        """Fresh buffers for the destination devices ``is_local`` accepts (``alloc(device,
        shape, dtype)`` makes one elsewhere than in host memory, e.g. on a GPU)."""
        new = np.zeros if zeros else np.empty
        make = alloc or (lambda _device, shape, dtype: new(shape, dtype))
        return {d: make(d, shape_of(box), self.dtype) for d, box in self.dst_boxes.items() if is_local(d)}

    def source_shards(self, array: np.ndarray, is_local: Callable[[int], bool]) -> dict[int, np.ndarray]:
        """The source devices' shards of a whole ``array``, for the devices ``is_local`` accepts."""
        full = tuple((0, n) for n in array.shape)
        return {d: np.ascontiguousarray(view(array, full, box)) for d, box in self.src_boxes.items() if is_local(d)}


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

    Buffers are NumPy arrays, or arrays of another module with NumPy's interface (``xp``:
    CuPy for GPU memory, found from the buffers when not given): every buffer the
    executor makes (packs, receive buffers) comes from ``xp``, so device data is never
    staged through host memory.
    """

    def __init__(self, host: int, layout, src, dst, backend: Backend, host_of: Callable[[int], int],
                 timeout: float = DEFAULT_TIMEOUT_S, min_rate: float | None = None, tag_base: int = 0,
                 xp=None):
        many = isinstance(layout, (list, tuple))
        self.layouts = list(layout) if many else [layout]
        self.srcs = list(src) if many else [src]
        self.dsts = list(dst) if many else [dst]
        self.host, self.backend, self.host_of, self.timeout = host, backend, host_of, timeout
        self.min_rate = min_rate  # bytes/s of the slowest NIC: lets big messages take their time
        self.wait_s = timeout
        self.tag_base = tag_base  # separates plans that run at the same time over one backend
        self._packed: dict[int, Future] = {}  # transfer id -> its buffer, being packed ahead
        self.xp = xp if xp is not None else array_module(self.srcs, self.dsts)
        self._select(0)

    def _select(self, leaf: int) -> None:
        self.layout, self.src, self.dst = self.layouts[leaf], self.srcs[leaf], self.dsts[leaf]

    # ------------------------------------------------ primitives for the kinds
    def isend(self, buf: np.ndarray, host: int, tag: int):
        return self.backend.isend(buf, host, tag)

    def irecv(self, buf: np.ndarray, host: int, tag: int):
        return self.backend.irecv(buf, host, tag)

    def wait(self, handles) -> None:
        """Wait for every handle, each bounded by this transfer's wait time."""
        for h in handles:
            h.wait(self.wait_s)

    def slice_bytes(self, device: int, index: Box, leaf: int | None = None) -> np.ndarray:
        """The bytes of ``index`` held by source ``device``, flat and contiguous."""
        lay, src = (self.layout, self.src) if leaf is None else (self.layouts[leaf], self.srcs[leaf])
        data = view(src[device], lay.src_boxes[device], index)
        return self.xp.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def read_destination(self, device: int, index: Box) -> np.ndarray:
        """The bytes of ``index`` already written into destination ``device``, flat."""
        data = view(self.dst[device], self.layout.dst_boxes[device], index)
        return self.xp.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def write(self, device: int, index: Box, flat: np.ndarray, leaf: int | None = None) -> None:
        """Write flat bytes holding ``index`` into destination ``device``."""
        lay, dst = (self.layout, self.dst) if leaf is None else (self.layouts[leaf], self.dsts[leaf])
        target = view(dst[device], lay.dst_boxes[device], index)
        target[...] = flat.view(lay.dtype).reshape(shape_of(index))

    def source(self, t: Transfer) -> np.ndarray:
        """The bytes this (sending) host puts on the wire for ``t``: one slice, or the
        parts of a coalesced transfer packed back to back (packed ahead by ``run``, while
        the transfer before it was on the wire, where it could be)."""
        if not t.parts:
            return self.slice_bytes(t.sender, t.index)
        ahead = self._packed.pop(t.id, None)
        return ahead.result() if ahead is not None else self._pack(t)

    def _pack(self, t: Transfer) -> np.ndarray:
        return self.concat([self.slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])

    def empty_bytes(self, nbytes: int) -> np.ndarray:
        """A flat byte buffer of this executor's array module (host or device memory)."""
        return self.xp.empty(int(nbytes), np.uint8)

    def concat(self, pieces: list) -> np.ndarray:
        return self.xp.concatenate(pieces)

    def deliver(self, t: Transfer, flat: np.ndarray) -> None:
        """Write what arrived into this host's receiving devices (unpacking parts)."""
        if not t.parts:
            for r in self.local_receivers(t):
                self.write(r, t.index, flat)
            return
        pos = 0
        for p in t.parts:
            for r in p.receivers:
                if self.host_of(r) == self.host:
                    self.write(r, p.index, flat[pos:pos + p.nbytes], p.leaf)
            pos += p.nbytes

    def local_receivers(self, t: Transfer) -> list[int]:
        """The receiving devices of ``t`` on this host."""
        return [r for r in t.receivers if self.host_of(r) == self.host]

    def flat_target(self, device: int, index: Box) -> np.ndarray | None:
        """The bytes of ``index`` inside ``device``'s buffer as a flat writable view, or
        None when that region is not contiguous."""
        target = view(self.dst[device], self.layout.dst_boxes[device], index)
        if not target.flags["C_CONTIGUOUS"]:
            return None
        return target.reshape(-1).view(np.uint8)

    def ring_allgather(self, blocks: dict[int, np.ndarray], hosts: list[int], tag0: int) -> None:
        """Host-level ring all-gather: after A-1 steps every host has every host's block
        (blocks may differ in size, and may be empty)."""
        a = len(hosts)
        if a == 1 or self.host not in hosts:
            return
        p = hosts.index(self.host)
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

    # ------------------------------------------------------------------ run
    def run(self, transfers: Sequence[Transfer]) -> list[TransferTiming]:
        timings = []
        packing = [i for i, t in enumerate(transfers) if self._packs(t)]  # positions, ascending
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alpa-comm-pack") if packing else None
        try:
            for i, t in enumerate(transfers):
                if pool is not None:  # this transfer's buffer and the next one this host packs
                    k = bisect.bisect_left(packing, i)
                    for j in packing[k:k + 2]:
                        if transfers[j].id not in self._packed:
                            self._packed[transfers[j].id] = pool.submit(self._pack, transfers[j])
                t0 = time.perf_counter()
                try:
                    self._run_one(t)
                except CommunicationError as e:
                    raise CommunicationError(f"{e} (during transfer {t.id}: {t.kind} of slice "
                                             f"{[list(p) for p in t.index]})") from e
                timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        return timings

    def _packs(self, t: Transfer) -> bool:
        """Whether this host sends ``t`` from a buffer it must first pack (a coalesced
        transfer; a single slice is sent from where it lies when contiguous)."""
        if not t.parts or self.host_of(t.sender) != self.host:
            return False
        try:
            return transfer_kind(t.kind).carries_data
        except InvalidOptionError:
            return False  # _run_one names the unknown kind

    def _run_one(self, t: Transfer) -> None:
        try:
            kind = transfer_kind(t.kind)
        except InvalidOptionError:
            raise CommunicationError(f"host {self.host}: unknown transfer kind {t.kind!r}") from None
        self._select(t.leaf)
        # A wait may last the timeout plus twice the longer of what this transfer's bytes
        # need on the slowest NIC and when the plan expects it to end (a receiver may wait
        # behind everything its sender sends first): no false alarm on a large slice or a
        # long queue, still bounded when a peer is gone.
        own = t.nbytes / self.min_rate if self.min_rate else 0.0
        self.wait_s = self.timeout + 2 * max(own, t.start + t.duration)
        kind.run(self, t, self.tag_base + (t.id % 1_000_000) * TAGS_PER_TRANSFER)
