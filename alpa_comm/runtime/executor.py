"""Execute one host's part of a resharding plan over a ``Backend``.

Pure NumPy plus the backend interface, so the same code runs in Ray host
workers over gloo (or NCCL) and in threads over ``ThreadBackend`` in tests.

How each kind of transfer runs is written once, on its ``TransferKind``
(``resharding/kinds/``), against the primitives this class offers: ``isend``,
``irecv``, ``wait``, ``slice_bytes``/``source`` (read), ``write``/``deliver``
(write), ``ring_allgather``. The executor owns buffers, tags and timeouts.

Every host admits the transfers it takes part in in the plan's global order
(``host_operations``) and keeps every admitted one in flight at once, each on a
thread of its own, bounded by ``max_concurrent`` and a memory budget
(``max_inflight_bytes``): chunk pipelines of different slices overlap each other
and the intra-host copies. Matching by (transfer, chunk) tags, not a serial
order, keeps it deadlock-free (``_run_concurrently`` says why). A backend that
matches in issue order (``Backend.issue_ordered``: NCCL) keeps transfers in flight
the same way but issues their operations in plan order on every host; one that can
do neither runs them one after another. Devices of a
host are buffers of one process: intra-host copies and intra-host all-gathers
are memory copies; only inter-host bytes go through the backend, as flat
``uint8`` messages.
"""
from __future__ import annotations

import bisect
import copy
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from ..errors import InvalidOptionError
from ..resharding.kinds import transfer_kind
from ..resharding.kinds.base import finish_posted
from ..resharding.admission import MAX_CONCURRENT, MAX_INFLIGHT_BYTES, MAX_PER_RESOURCE, latency_bound, window_units
from ..resharding.plan import Leaf, Transfer
from ..resharding.resources import nic_send
from ..spec import Box
from .backend import DEFAULT_TIMEOUT_S, STRIPE_MIN_BYTES, Backend, CommunicationError
from .host_memory import HOST_ALIGNMENT, BufferPool, aligned_empty
from .pieces import Pieces
from .thread_cpu import name_os_thread

RING_TAG = 512
TAGS_PER_TRANSFER = 1024  # chunk tags below RING_TAG, ring steps above
PACK_AHEAD = 2
"""Coalesced buffers a sending host packs ahead of their turn, on a packing thread: gloo
writes a send into the socket on the thread that posts it, so packing and sending on one
thread would take turns."""
PACK_RUN_BYTES = 256 << 10
"""A coalesced buffer is packed in runs of parts of at least this many bytes, each
announced as packed, so a chunked send can start before the whole buffer is packed."""


def check_positive(name: str, value, default: int) -> int:
    """``value`` (None: ``default``) as a positive int, or an error naming it."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return value


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


class SlabLayout(NamedTuple):
    """Where a host's destination buffers lie in one flat slab (``slab_regions``)."""

    total: int
    regions: list  # (leaf, device, offset, bytes, shape) of every local destination buffer
    buckets: dict  # transfer id -> (offset, bytes): coalesced transfers that land in place
    by_leaf: tuple = ()  # per leaf: ((device, offset, bytes, shape), ...), the regions regrouped


class LeafViews(Mapping):
    """One leaf's destination buffers on this host (device -> array), views of the call's
    slab made on first use: a 200-leaf call's first receive is posted without first
    cutting 400 views (the in-place buckets are views of their own), and the views of a
    leaf are made where it is first needed, mostly on the placing thread as its bytes
    arrive. Making them twice at once is harmless."""

    __slots__ = ("_flat", "_regions", "_dtype", "_views")

    def __init__(self, flat: np.ndarray, regions: tuple, dtype: np.dtype):
        self._flat, self._regions, self._dtype, self._views = flat, regions, dtype, None

    def _get(self) -> dict:
        if self._views is None:
            flat, dtype = self._flat, self._dtype
            self._views = {d: flat[at:at + n].view(dtype).reshape(shape) for d, at, n, shape in self._regions}
        return self._views

    def __getitem__(self, device):
        return self._get()[device]

    def __contains__(self, device) -> bool:
        return any(d == device for d, _, _, _ in self._regions)

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._regions)


class Destinations(NamedTuple):
    """A call's destination buffers (per leaf: device -> buffer) and, per coalesced
    transfer that lands in place, the flat slab view it is received into."""

    buffers: list
    in_place: dict


def destination_buffers(layouts: list["Layout"], slab: SlabLayout, alloc_flat) -> Destinations:
    """Every leaf's destination buffers on this host cut from one flat slab
    (``alloc_flat(nbytes)``: aligned host bytes) as ``slab`` (``slab_regions``: the same
    for every repetition of a call, so worked out once) says, with the views the
    in-place buckets are received into (no search per call)."""
    flat = alloc_flat(slab.total)
    out = [LeafViews(flat, regions, lay.dtype) for lay, regions in zip(layouts, slab.by_leaf)]
    return Destinations(out, {tid: flat[at:at + nbytes] for tid, (at, nbytes) in slab.buckets.items()})


def slab_regions(layouts: list["Layout"], is_local: Callable[[int], bool],
                 transfers: Sequence[Transfer] = ()) -> SlabLayout:
    """Each local destination buffer's region, starting on a ``HOST_ALIGNMENT`` boundary,
    in the order this host's buckets (coalesced ``transfers``) carry them, the rest after
    in (leaf, device) order; a bucket whose parts are whole shards with one receiving
    device here each then lies back to back (where no padding falls between) and is
    received in place (``SlabLayout.buckets``). The slab lives while any of its arrays
    does."""
    order = {}
    for t in transfers:
        for p in t.parts:
            for r in p.receivers:
                if is_local(r) and p.index == layouts[p.leaf].dst_boxes.get(r):
                    order.setdefault((p.leaf, r), None)
    for i, lay in enumerate(layouts):
        for d in lay.dst_boxes:
            if is_local(d):
                order.setdefault((i, d), None)
    regions, total, at = [], 0, {}
    by_leaf: list[list] = [[] for _ in layouts]
    for i, d in order:
        shape = shape_of(layouts[i].dst_boxes[d])
        nbytes = int(np.prod(shape, dtype=np.int64)) * layouts[i].dtype.itemsize
        regions.append((i, d, total, nbytes, shape))
        by_leaf[i].append((d, total, nbytes, shape))
        at[i, d] = (total, nbytes)
        total += -(-nbytes // HOST_ALIGNMENT) * HOST_ALIGNMENT
    return SlabLayout(total, regions, _in_place_buckets(layouts, is_local, transfers, at),
                      tuple(tuple(r) for r in by_leaf))


def _in_place_buckets(layouts, is_local, transfers, at: dict) -> dict:
    """transfer id -> (offset, bytes) of every coalesced transfer whose parts are whole
    destination shards, one local receiver each, lying back to back in the slab in part
    order."""
    out = {}
    for t in transfers:
        if not t.parts:
            continue
        start = end = None
        for p in t.parts:
            mine = [r for r in p.receivers if is_local(r)]
            if len(mine) != 1 or p.index != layouts[p.leaf].dst_boxes.get(mine[0]):
                break
            offset, nbytes = at[p.leaf, mine[0]]
            if nbytes != p.nbytes or (end is not None and offset != end):
                break
            start = offset if start is None else start
            end = offset + nbytes
        else:
            if start is not None:
                out[t.id] = (start, end - start)
    return out


def view(buf: np.ndarray, buf_box: Box, index: Box) -> np.ndarray:
    """The part of ``buf`` (holding ``buf_box`` of the tensor) that covers ``index``."""
    if index == buf_box:  # a whole shard: the common case of a weight sync, no slicing
        return buf
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
        make = alloc or (lambda _device, shape, dtype: aligned_empty(shape, dtype, zeros))
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


SCRATCH = BufferPool(MAX_INFLIGHT_BYTES)
"""This process's recycled host scratch memory (at most ``MAX_INFLIGHT_BYTES`` kept unused)."""

_THREADS = threading.local()


def kept_threads(key, workers: int, prefix: str) -> ThreadPoolExecutor:
    """The calling thread's own pool ``key`` of ``workers`` threads, kept between runs
    (starting a thread costs about a millisecond, a cached small reshard a few). Per
    calling thread, so executors that run side by side in one process (hosts as threads,
    a pipeline's stages) never wait for each other's threads."""
    pools = _THREADS.__dict__.setdefault("pools", {})
    if key not in pools:
        pools[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix,
                                        initializer=name_os_thread, initargs=(prefix.removeprefix("alpa-comm-"),))
    return pools[key]


def _transfer_threads(limit: int) -> ThreadPoolExecutor:
    return kept_threads(limit, limit, "alpa-comm-transfer")


def _packing_thread() -> ThreadPoolExecutor:
    """A thread started afresh each call would delay a sync's first bucket by its start-up."""
    return kept_threads("pack", 1, "alpa-comm-pack")


def _drop_transfer_threads(pool: ThreadPoolExecutor) -> None:
    """After a failure: the transfers still in flight end within their own timeouts on
    the old pool's threads; the next run gets fresh ones."""
    pools = _THREADS.__dict__.get("pools", {})
    for k, v in list(pools.items()):
        if v is pool:
            del pools[k]
    pool.shutdown(wait=False, cancel_futures=True)


class _Packing:
    """A coalesced buffer being packed on the packing thread, part run by part run: a
    sender may put its first bytes on the wire while the rest are still being packed
    (``HostExecutor.source_pieces``)."""

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

    def wait_for(self, nbytes: int, future: Future) -> bool:
        """Wait until the first ``nbytes`` are packed; False where packing ended without
        them (``future`` then raises what it raised)."""
        with self._cond:
            while self.packed < nbytes and not self.failed:
                if future.done():
                    return self.packed >= nbytes
                self._cond.wait(0.05)
            return not self.failed


class _PackAhead:
    """The buffers a host must pack (``HostExecutor._packs``: coalesced transfers, strided
    slices), packed on a packing thread ``PACK_AHEAD`` at a time ahead of their turn into
    the executor's ``_packed`` (with their progress in ``_packing``), where ``source`` and
    ``source_pieces`` pick them up."""

    def __init__(self, ex: "HostExecutor", transfers: Sequence[Transfer]):
        self.ex, self.transfers = ex, transfers
        self.positions = [i for i, t in enumerate(transfers) if ex._packs(t)]  # ascending
        self._set = set(self.positions)
        self.pool = _packing_thread() if self.positions else None

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
                progress = _Packing() if t.parts and self.ex.xp is np else None
                if progress is not None:
                    self.ex._packing[t.id] = progress
                self.ex._packed[t.id] = self.pool.submit(self.ex._pack, t, progress)

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


def _packable(kind: str) -> bool:
    try:
        return transfer_kind(kind).packable
    except InvalidOptionError:
        return False  # _run_one names the unknown kind


class _HostMap:
    """What a kind's ``transfer_resources`` reads of a cluster: which host a device is on."""

    def __init__(self, host_of):
        self.host_of = host_of


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
                 xp=None, max_concurrent: int | None = None, max_inflight_bytes: int | None = None,
                 max_per_resource: int | None = None, latency_s: float = 0.0,
                 in_place: dict | None = None, on_done: Callable[[Transfer], None] | None = None,
                 rendezvous: bool = True):
        many = isinstance(layout, (list, tuple))
        self.layouts = list(layout) if many else [layout]
        self.srcs = list(src) if many else [src]
        self.dsts = list(dst) if many else [dst]
        self.host, self.backend, self.host_of, self.timeout = host, backend, host_of, timeout
        # a plan's large messages wait for their receives where the backend can (runtime.tcp:
        # safe because every transfer's receives are posted once it is admitted); False for a
        # caller that may wait for a send before its peer posts the receive
        self.rendezvous = rendezvous and getattr(backend, "rendezvous", False) is True
        self.min_rate = min_rate  # bytes/s of the slowest NIC: lets big messages take their time
        self.wait_s = timeout
        self.tag_base = tag_base  # separates plans that run at the same time over one backend
        self._packed: dict[int, Future] = {}  # transfer id -> its buffer, being packed ahead
        self._packing: dict[int, _Packing] = {}  # transfer id -> how far its packing has come
        self._gathered: dict[int, Pieces] = {}  # transfer id -> its bucket's parts, cut before the run
        self._strided: dict[int, int] = {}  # transfer id -> bytes of its parts sent strided from here
        # transfer id -> where its bucket lands (given: ``Destinations.in_place``, else found)
        self._in_place: dict[int, np.ndarray | None] = dict(in_place) if in_place is not None else {}
        self._in_place_known = in_place is not None
        # called as each transfer ends on this host (from whichever thread ran it), so a
        # caller can use what arrived (``jax.reshard`` adopts a leaf whose writers ended)
        self.on_done = on_done
        self.xp = xp if xp is not None else array_module(self.srcs, self.dsts)
        self.max_concurrent = check_positive("max_concurrent", max_concurrent, MAX_CONCURRENT)
        self.max_inflight_bytes = check_positive("max_inflight_bytes", max_inflight_bytes, MAX_INFLIGHT_BYTES)
        # a message rides one of the backend's streams: each stream of a NIC gets its window
        self.streams = getattr(backend, "streams", 1)
        self.max_per_resource = check_positive("max_per_resource", max_per_resource,
                                               MAX_PER_RESOURCE * self.streams)
        self.latency_s = latency_s  # what one message costs beyond its bytes (the planner's figure)
        # the backend sends a bucket's parts from where they lie (``Pieces``): nothing is packed
        self.vectored = bool(getattr(backend, "vectored", False)) and self.xp is np
        self._select(0)

    def _select(self, leaf: int) -> None:
        self.layout, self.src, self.dst = self.layouts[leaf], self.srcs[leaf], self.dsts[leaf]

    # ------------------------------------------------ primitives for the kinds
    def isend(self, buf: np.ndarray, host: int, tag: int):
        if self.rendezvous:  # see runtime.tcp: a large one waits for its receive
            return self.backend.isend(buf, host, tag, rendezvous=True)
        return self.backend.isend(buf, host, tag)

    def irecv(self, buf: np.ndarray, host: int, tag: int):
        if self.rendezvous:
            return self.backend.irecv(buf, host, tag, rendezvous=True)
        return self.backend.irecv(buf, host, tag)

    def wait(self, handles) -> None:
        """Wait for every handle, each bounded by this transfer's wait time."""
        for h in handles:
            h.wait(self.wait_s)

    def slice_bytes(self, device: int, index: Box, leaf: int | None = None) -> np.ndarray:
        """The bytes of ``index`` held by source ``device``, flat and contiguous."""
        lay, src = (self.layout, self.src) if leaf is None else (self.layouts[leaf], self.srcs[leaf])
        data = view(src[device], lay.src_boxes[device], index)
        if self.xp is np and data.flags.c_contiguous:
            return data.reshape(-1).view(np.uint8)
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
        self._packing.pop(t.id, None)
        ahead = self._packed.pop(t.id, None)
        return ahead.result() if ahead is not None else self._pack(t)

    def source_pieces(self, t: Transfer, bounds) -> Iterator[np.ndarray]:
        """``source(t)`` piece by piece (bytes ``bounds[c]`` .. ``bounds[c + 1]``), each as
        soon as it is packed: a chunked send of a coalesced buffer packed ahead starts
        once its first chunk is packed, not the whole buffer."""
        progress = self._packing.pop(t.id, None)
        ahead = self._packed.pop(t.id, None) if progress is not None else None
        if ahead is None:
            flat = self.outgoing(t)
            for c in range(len(bounds) - 1):
                yield flat[bounds[c]:bounds[c + 1]]
            return
        for c in range(len(bounds) - 1):
            if not progress.wait_for(int(bounds[c + 1]), ahead):
                ahead.result()  # raises what packing raised
            yield progress.flat[bounds[c]:bounds[c + 1]]
        ahead.result()

    def outgoing(self, t: Transfer):
        """What a sending host puts on the wire for ``t``, to be cut by byte ranges and
        sent: a coalesced transfer's parts as ``Pieces`` of their own memory where the
        backend gathers (``vectored``; gathered before the run by ``gather_all``), else
        ``source(t)``."""
        if self._gathers(t):
            gathered = self._gathered.pop(t.id, None)
            return gathered if gathered is not None else self._gather(t)
        return self.source(t)

    def _gathers(self, t: Transfer) -> bool:
        """Whether ``t``'s sender sends its parts gathered rather than packed: a bucket of a
        packable kind (all its parts leave from the sender's host) over a vectored backend."""
        return self.vectored and bool(t.parts) and _packable(t.kind)

    def _gather(self, t: Transfer) -> Pieces:
        return Pieces([self.slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])

    def gather_all(self, transfers: Sequence[Transfer]) -> None:
        """Cut every bucket this host sends into its ``Pieces`` before the first byte
        leaves (views only: no memory): once the wire runs, the stream threads' copies
        take the cores, and the posting thread, which would otherwise cut each bucket
        as its turn comes, gets them only now and then (a 200-leaf tree's 400 parts take
        about a millisecond to cut alone, over ten between the copies on two cores)."""
        if not self.vectored:
            return
        for t in transfers:
            if (self._gathers(t) and t.sender is not None and self.host_of(t.sender) == self.host
                    and all(self.host_of(p.sender) == self.host for p in t.parts) and not self._strided_parts(t)):
                self._gathered[t.id] = self._gather(t)

    def _strided_parts(self, t: Transfer) -> int:
        """Bytes of ``t``'s parts sent from here that are not contiguous in their source
        shard: gathering copies them (``slice_bytes``), so they are gathered at their turn,
        within ``max_inflight_bytes``, not all before the first byte leaves. Worked out
        once per transfer (``gather_all`` and the admission both ask)."""
        known = self._strided.get(t.id)
        if known is not None:
            return known
        out = 0
        for p in t.parts:
            if self.host_of(p.sender) != self.host:
                continue
            lay, src = self.layouts[p.leaf], self.srcs[p.leaf]
            if p.sender in src and not view(src[p.sender], lay.src_boxes[p.sender], p.index).flags.c_contiguous:
                out += p.nbytes
        self._strided[t.id] = out
        return out

    def _pack(self, t: Transfer, progress: _Packing | None = None) -> np.ndarray:
        if not t.parts:
            return self.slice_bytes(t.sender, t.index, t.leaf)
        if progress is None:
            return self.concat([self.slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])
        try:
            return self._pack_in_runs(t, progress)
        except BaseException:
            progress.fail()
            raise

    def _pack_in_runs(self, t: Transfer, progress: _Packing) -> np.ndarray:
        """Pack ``t``'s parts in runs of at least ``PACK_RUN_BYTES`` (one concatenate each),
        saying after each run how far packing has come."""
        flat = self.empty_bytes(t.nbytes)
        pos, run, run_bytes = 0, [], 0
        for p in t.parts:
            run.append(self.slice_bytes(p.sender, p.index, p.leaf))
            run_bytes += run[-1].nbytes
            if run_bytes >= PACK_RUN_BYTES or p is t.parts[-1]:
                np.concatenate(run, out=flat[pos:pos + run_bytes])
                pos += run_bytes
                progress.advance(flat, pos)
                run, run_bytes = [], 0
        return flat

    def empty_bytes(self, nbytes: int) -> np.ndarray:
        """A flat byte buffer of this executor's array module (host or device memory); host
        scratch (packed buckets, receive buffers that are not destination memory) comes
        from ``SCRATCH``, so a repeated sync does not pay fresh pages' faults each time."""
        if self.xp is np:
            return SCRATCH.empty((int(nbytes),), np.uint8)
        return self.xp.empty(int(nbytes), np.uint8)

    def concat(self, pieces: list) -> np.ndarray:
        if self.xp is np:
            return np.concatenate(pieces, out=self.empty_bytes(sum(p.nbytes for p in pieces)))
        return self.xp.concatenate(pieces)

    def bucket_target(self, t: Transfer) -> np.ndarray | None:
        """Where a coalesced ``t`` can be received in place: when every part has one
        receiving device here and their regions lie back to back in memory, in part order
        (destination buffers cut from one slab in the order buckets carry them, as
        ``destination_buffers`` makes them), the flat view spanning them: the one the
        executor was given (``in_place``, worked out once per prepared call), else found
        from the buffers' addresses. None otherwise: the bucket lands in scratch memory
        and is unpacked."""
        if not t.parts or self.xp is not np:
            return None
        if t.id in self._in_place or self._in_place_known:
            return self._in_place.get(t.id)
        self._in_place[t.id] = found = self._find_bucket_target(t)
        return found

    def _find_bucket_target(self, t: Transfer) -> np.ndarray | None:
        start = end = None
        first = None
        for p in t.parts:
            mine = [r for r in p.receivers if self.host_of(r) == self.host]
            if len(mine) != 1:
                return None
            lay = self.layouts[p.leaf]
            target = view(self.dsts[p.leaf][mine[0]], lay.dst_boxes[mine[0]], p.index)
            if not target.flags.c_contiguous or target.nbytes != p.nbytes:
                return None
            at = target.__array_interface__["data"][0]
            if first is None:
                first, start = target, at
            elif at != end:
                return None
            end = at + p.nbytes
        base = first.base if first.base is not None else first
        offset = start - base.__array_interface__["data"][0]
        if base.ndim != 1 or base.dtype != np.uint8 or not 0 <= offset <= base.nbytes - (end - start):
            return None
        return base[offset:offset + (end - start)]

    def deliver(self, t: Transfer, flat: np.ndarray) -> None:
        """Write what arrived into this host's receiving devices (unpacking parts; nothing
        to do for a bucket received in place, see ``bucket_target``)."""
        if t.parts and self.xp is np and flat.size and self._landed_in_place(t, flat):
            return
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

    def _landed_in_place(self, t: Transfer, flat: np.ndarray) -> bool:
        target = self._in_place.get(t.id)
        return target is not None and target is flat

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
        """Run this host's ``transfers``: concurrently where the backend allows it
        (``Backend.concurrent``, or ``Backend.issue_ordered``: concurrently, every
        transfer's operations issued in plan order), else one after another in plan order."""
        ordered = not self.backend.concurrent and getattr(self.backend, "issue_ordered", False)
        limit = self.max_concurrent if self.backend.concurrent or ordered else 1
        try:
            if limit > 1 and (len(transfers) > 1 or ordered):  # ordered: a posted one launches whole
                return self._run_concurrently(transfers, limit, alone_if_threaded=ordered)
            return self._run_in_order(transfers)
        finally:
            SCRATCH.trim(self.max_inflight_bytes)  # kept for the next call: at most its budget

    def _run_concurrently(self, transfers: Sequence[Transfer], limit: int,
                          alone_if_threaded: bool = False) -> list[TransferTiming]:
        """Every transfer whose turn has come is in flight at once, up to ``limit`` of them
        and ``max_inflight_bytes`` of buffers this host must make for them (packed sends,
        receive buffers that are not destination memory). Where this host only sends and
        receives (``TransferKind.post``: a point-to-point message, a chain's ends) its
        operations are posted from this thread and collected in order later; a host that
        must react to arrivals (a chain's middle, a ring) runs its part on a thread of its
        own, over a copy of this executor bound to the transfer's leaf.

        On each NIC (and intra-host link) a transfer uses, at most ``max_per_resource`` of
        this host's transfers are in flight (by default ``MAX_PER_RESOURCE`` per stream of
        the backend), in the plan's order there: the planner balanced and ordered each
        NIC's work as a sequence. Only transfers this host sends or forwards count: a
        receive-only one is posted as soon as it is admitted.

        Why it cannot deadlock: every host admits its transfers in the plan's one global
        order, admits one whenever nothing else is in flight, and when it must wait for
        room it waits for transfers admitted before (its oldest posted one, any threaded
        one, or the oldest on a NIC it needs). Take the
        earliest transfer still unfinished: on each of its hosts every earlier transfer
        has ended, so it is admitted there, and every message has its own (transfer,
        chunk) tag, so its sends and receives match whatever else is on the wire. It
        ends; induction. A transfer that reads what others delivered (``deps``, always
        earlier in the order) starts once they have ended here.

        ``alone_if_threaded`` (a backend that matches messages between two hosts in issue
        order, not by tag: NCCL) keeps that order on every pair of hosts: a posted transfer
        issues all its operations at once from this thread, in the plan's order, and one
        that must react to arrivals (or reads what a transfer still in flight delivers)
        runs on this thread while nothing later is admitted, so
        on every host each transfer's operations on a pair are issued before any later
        transfer's, and both ends of a pair issue them in one order (every kind issues a
        pair's messages in one order at both ends). The argument above holds with "issued
        in order" in place of "its own tag". Before this thread blocks, what it posted since
        it last blocked starts as one step (``Backend.launch_posted``: one NCCL group, so
        the sends of several transfers progress together): each step holds consecutive
        transfers, so the steps before the one holding the earliest unfinished transfer
        hold only earlier, finished ones, and a stream that runs one step at a time reaches
        it on every host. A step larger than a backend's group is cut in issue order; the
        argument then needs a transfer's operations on a pair issued in one order at both
        ends, which holds: a posted transfer's operations on a pair all go one way."""
        timings: list[TransferTiming] = []
        state = threading.Condition()
        inflight = {"count": 0, "bytes": 0}
        failure: list[BaseException] = []
        ended = {t.id: threading.Event() for t in transfers}
        posted: deque = deque()  # (transfer, its executor, Posted, bytes, start), oldest first
        posted_ids: set[int] = set()
        windows: dict[int, deque] = {}  # resource key -> (transfer, stream units) in flight here, oldest first

        def release(t: Transfer, need: int) -> None:
            ended[t.id].set()
            with state:
                inflight["count"] -= 1
                inflight["bytes"] -= need
                state.notify_all()

        def one(t: Transfer, need: int) -> None:
            t0 = time.perf_counter()
            try:
                for d in t.deps:
                    while d in ended and not ended[d].wait(0.05) and not failure:
                        pass  # a failure elsewhere sets no dependency: stop waiting for it
                if failure:
                    return
                self._scoped(t)._run_one(t)
                self._ended(t)
                with state:
                    timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
            except BaseException as e:  # noqa: BLE001 - handed to the dispatcher, which raises it
                with state:
                    failure.append(e)
            finally:
                release(t, need)

        def launch() -> None:
            """Before this thread blocks: what it posted since it last blocked starts now, as
            one step of consecutive transfers (``Backend.launch_posted``; NCCL: one group)."""
            if alone_if_threaded:
                self.backend.launch_posted()

        def collect_oldest() -> None:
            launch()
            t, ex, part, need, t0 = posted.popleft()
            posted_ids.discard(t.id)
            try:
                ex._finish(t, part)
                self._ended(t)
                timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
            except BaseException as e:  # noqa: BLE001 - raised below, as a thread's would be
                with state:
                    failure.append(e)
            finally:
                release(t, need)

        pool = None
        ahead = _PackAhead(self, transfers)  # gloo writes a send on the posting thread: pack on another
        try:
            self.gather_all(transfers)
            for i, t in enumerate(transfers):
                ahead.submit_from(i)
                need = self._buffer_bytes(t, ahead.packs(i))
                keys = self._resource_keys(t)
                units = self._stream_units(t)
                for key in keys:  # the plan's order on each NIC, at most max_per_resource deep
                    window = windows.setdefault(key, deque())
                    while window and sum(u for _, u in window) + units > self.max_per_resource and not failure:
                        oldest, _ = window.popleft()
                        while not ended[oldest].is_set() and not failure:
                            if oldest in posted_ids:
                                collect_oldest()
                            else:
                                launch()
                                ended[oldest].wait(0.05)
                while True:
                    with state:
                        full = inflight["count"] and (inflight["count"] >= limit
                                                      or inflight["bytes"] + need > self.max_inflight_bytes)
                        if failure or not full:
                            break
                        if not posted:
                            launch()
                            state.wait()
                            continue
                    collect_oldest()
                if failure:
                    break
                for key in keys:
                    windows[key].append((t.id, units))
                with state:
                    inflight["count"] += 1
                    inflight["bytes"] += need
                ex = self._scoped(t)
                t0 = time.perf_counter()
                try:
                    part = ex._post(t) if not any(d in ended and not ended[d].is_set() for d in t.deps) else None
                except BaseException as e:  # noqa: BLE001 - raised below, as a thread's would be
                    failure.append(e)
                    release(t, need)
                    break
                if part is not None:
                    if alone_if_threaded:
                        self.backend.transfer_posted()
                    posted.append((t, ex, part, need, t0))
                    posted_ids.add(t.id)
                    continue
                if alone_if_threaded:  # on this thread; its waits launch what is posted before it
                    while posted and not failure and any(d in ended and not ended[d].is_set() for d in t.deps):
                        collect_oldest()  # what it reads arrives in a posted transfer
                    if failure:
                        release(t, need)
                        break
                    launch()
                    one(t, need)
                    continue
                pool = pool or _transfer_threads(limit)
                pool.submit(one, t, need)
            while posted and not failure:
                collect_oldest()
            launch()
            with state:
                while inflight["count"] and not failure:
                    state.wait()
        finally:
            ahead.close()
            if failure:  # none waits for a cancelled one; the next run gets fresh threads
                for event in ended.values():
                    event.set()
                if pool is not None:
                    _drop_transfer_threads(pool)
                    self._dropped = pool
        if failure:
            e = failure[0]
            raise e
        return sorted(timings, key=lambda x: x.start)

    def join_dropped_threads(self, timeout: float) -> bool:
        """After a failed run: wait (at most ``timeout`` s) until the transfers it left on
        their threads have ended, e.g. before the memory they write into is freed (their
        waits end at once once the backend is closed). True when they all have."""
        pool = getattr(self, "_dropped", None)
        if pool is None:
            return True
        waiter = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        waiter.join(timeout)
        return not waiter.is_alive()

    def _ended(self, t: Transfer) -> None:
        if self.on_done is not None:
            self.on_done(t)

    def _scoped(self, t: Transfer) -> "HostExecutor":
        """A shallow copy bound to ``t``'s leaf (buffers, backend and caches shared), so
        transfers of different leaves can run at once."""
        ex = copy.copy(self)
        ex._select(t.leaf)
        return ex

    def _resource_keys(self, t: Transfer) -> tuple:
        """The NICs and intra-host links ``t`` holds, as the planner sees them (its kind's
        ``transfer_resources``), where it holds them long enough for its order there to
        matter (``ORDERED_LATENCIES``); none for a kind that cannot say, and none where this
        host only receives (it sends nothing, so it sets no order on any wire: its receives
        are posted as soon as they are admitted, since a late receive costs an eager
        transport a copy of the message and a rendezvous one its sender's time)."""
        if latency_bound(t.nbytes, self.latency_s, self.min_rate):
            return ()
        try:
            keys = tuple(transfer_kind(t.kind).transfer_resources(t, _HostMap(self.host_of)))
        except Exception:  # noqa: BLE001 - _run_one names an unknown kind; ordering is only an aid
            return ()
        return keys if nic_send(self.host) in keys else ()

    def _stream_units(self, t: Transfer) -> int:
        """How much of a NIC's window ``t`` takes: one stream, or every stream where its
        messages are large enough to be striped over all of them (``STRIPE_MIN_BYTES``),
        so a few large transfers hold the NIC in the plan's order as one would; the whole
        window for a pipelined double tree (``admission.window_units``)."""
        units = self.streams if t.nbytes >= STRIPE_MIN_BYTES * max(1, t.chunks) else 1
        return window_units(t, units, self.max_per_resource, self.host_of, self.min_rate, self.latency_s)

    def _buffer_bytes(self, t: Transfer, packs: bool) -> int:
        """Bytes of buffers this host makes for ``t`` beyond source and destination memory:
        a coalesced transfer is packed (sender) or received (receiver) through one unless it
        lands in place, a strided slice is packed (``packs``) before it is sent, and one
        whose region here is strided (a column block of a row-major shard) is received
        into one (``kinds.base.receive_buffer``)."""
        if t.parts:
            receives = any(self.host_of(r) == self.host for r in t.receivers)
            sends = self.host_of(t.sender) == self.host
            if receives or (sends and not self._gathers(t)):
                return t.nbytes
            return self._strided_parts(t) if sends else 0
        return t.nbytes if packs or self._receives_into_scratch(t) else 0

    def _receives_into_scratch(self, t: Transfer) -> bool:
        """Whether this host takes a slice ``t`` into scratch memory: a kind that always
        does (``TransferKind.receives_into_scratch``), or its first receiving device here
        has a strided region for it."""
        mine = [r for r in t.receivers if self.host_of(r) == self.host]
        if not mine:
            return False
        try:
            if transfer_kind(t.kind).receives_into_scratch:
                return True
        except InvalidOptionError:
            return False  # _run_one names the unknown kind
        if t.sender is None or self.host_of(t.sender) == self.host:
            return False
        dst = self.dsts[t.leaf]
        if mine[0] not in dst:
            return False
        return not view(dst[mine[0]], self.layouts[t.leaf].dst_boxes[mine[0]], t.index).flags.c_contiguous

    def _run_in_order(self, transfers: Sequence[Transfer]) -> list[TransferTiming]:
        """One transfer at a time in plan order, packing the next coalesced buffer on a
        thread while the transfer before it is on the wire (backends whose operations must
        be issued in one order on every host: NCCL on one stream)."""
        timings = []
        ahead = _PackAhead(self, transfers)
        try:
            for i, t in enumerate(transfers):
                ahead.submit_from(i)
                t0 = time.perf_counter()
                self._run_one(t)
                self._ended(t)
                timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
        finally:
            ahead.close()
        return timings

    def _packs(self, t: Transfer) -> bool:
        """Whether this host sends ``t`` from a buffer it must first pack: a coalesced
        transfer, or a slice that is not contiguous in its source shard (a layout change);
        a contiguous slice is sent from where it lies."""
        if t.sender is None or self.host_of(t.sender) != self.host:
            return False
        try:
            if not transfer_kind(t.kind).carries_data:
                return False
        except InvalidOptionError:
            return False  # _run_one names the unknown kind
        if t.parts:
            return not self._gathers(t)
        lay, src = self.layouts[t.leaf], self.srcs[t.leaf]
        data = view(src[t.sender], lay.src_boxes[t.sender], t.index) if t.sender in src else None
        return data is not None and not data.flags.c_contiguous

    def _begin(self, t: Transfer) -> tuple:
        """(kind, first tag) of ``t``, with this executor bound to its leaf and its wait
        time set."""
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
        return kind, self.tag_base + (t.id % 1_000_000) * TAGS_PER_TRANSFER

    def _named(self, t: Transfer, e: CommunicationError) -> CommunicationError:
        return CommunicationError(f"{e} (during transfer {t.id}: {t.kind} of slice {[list(p) for p in t.index]})")

    def _run_one(self, t: Transfer) -> None:
        kind, tag0 = self._begin(t)
        try:
            kind.run(self, t, tag0)
        except CommunicationError as e:
            raise self._named(t, e) from e

    def _post(self, t: Transfer):
        """``t`` posted without blocking (``TransferKind.post``), or None."""
        kind, tag0 = self._begin(t)
        try:
            return kind.post(self, t, tag0)
        except CommunicationError as e:
            raise self._named(t, e) from e

    def _finish(self, t: Transfer, part) -> None:
        """Wait for a posted ``t`` and finish it."""
        try:
            finish_posted(self, part)
        except CommunicationError as e:
            raise self._named(t, e) from e
