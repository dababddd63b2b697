"""Execute one host's part of a resharding plan over a ``Backend``.

Pure NumPy plus the backend interface, so the same code runs in Ray host
workers over gloo (or NCCL) and in threads over ``ThreadBackend`` in tests.

How each kind of transfer runs is written once, on its ``TransferKind``
(``resharding/kinds/``), against a ``TransferContext`` (``runtime/context.py``): one
transfer's frozen view of this executor, with the primitives ``isend``, ``irecv``,
``wait``, ``slice_bytes``/``source`` (read), ``write``/``deliver`` (write),
``ring_allgather``. The executor owns buffers, tags and timeouts; where the data lies
is ``runtime/layouts.py``, packing ahead ``runtime/packing.py``.

Every host admits the transfers it takes part in in the plan's global order
(``host_operations``) and keeps every admitted one in flight at once
(``runtime/dispatch.py``), bounded by ``max_concurrent`` and a memory budget
(``max_inflight_bytes``): chunk pipelines of different slices overlap each other
and the intra-host copies. Matching by (transfer, chunk) tags, not a serial
order, keeps it deadlock-free (docs/runtime.md, "Why the executor cannot deadlock").
A backend that matches in issue order (``Backend.issue_ordered``: NCCL) keeps
transfers in flight the same way but issues their operations in plan order on every
host; one that can do neither runs them one after another. Devices of a host are
buffers of one process: intra-host copies and intra-host all-gathers are memory
copies; only inter-host bytes go through the backend, as flat ``uint8`` messages.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import InvalidOptionError, InvalidTypeError
from ..resharding.admission import MAX_INFLIGHT_BYTES, MAX_PER_RESOURCE, latency_bound, window_units
from ..resharding.kinds import TransferKind, transfer_kind
from ..resharding.kinds.base import Posted, finish_posted
from ..resharding.plan import Transfer
from ..resharding.resources import nic_receive, nic_send
from ..spec import Box
from .backend import STRIPE_MIN_BYTES, Backend, CommunicationError
from .context import RING_TAG, TransferContext
from .dispatch import Dispatcher, TransferTiming
from .host_memory import BufferPool
from .layouts import (Destinations, LeafViews, Layout, SlabLayout, array_module, destination_buffers, numpy_dtype,
                      shape_of, slab_regions, view)
from .options import ExecutorOptions
from .packing import PACK_AHEAD, PACK_RUN_BYTES, PackAhead, Packing
from .pieces import Pieces
from .pools import kept_threads

__all__ = ["Destinations", "ExecutorOptions", "HostExecutor", "LeafViews", "Layout", "PACK_AHEAD",
           "PACK_RUN_BYTES", "RING_TAG", "SCRATCH", "SlabLayout", "TAGS_PER_TRANSFER", "TransferContext",
           "TransferTiming", "array_module", "destination_buffers", "kept_threads",
           "numpy_dtype", "shape_of", "slab_regions", "view"]

TAGS_PER_TRANSFER = 1024  # chunk tags below RING_TAG, ring steps above

SCRATCH = BufferPool(MAX_INFLIGHT_BYTES)
"""This process's recycled host scratch memory (at most ``MAX_INFLIGHT_BYTES`` kept unused)."""


def known_kind(name: str) -> TransferKind | None:
    """The kind called ``name``, or None where no kind has that name (running such a
    transfer raises ``CommunicationError`` naming it: ``HostExecutor.context``)."""
    try:
        return transfer_kind(name)
    except InvalidOptionError:
        return None


class _HostMap:
    """What a kind's ``transfer_resources`` reads of a cluster: which host a device is on."""

    def __init__(self, host_of):
        self.host_of = host_of


class HostExecutor:
    """Runs ``transfers`` (this host's, in plan order) moving data from ``src`` to ``dst`` buffers.

    ``layout``/``src``/``dst`` describe one array, or are lists with one entry per
    leaf of a tree plan (transfers name their ``leaf``; coalesced ones carry parts).
    ``options``: an ``ExecutorOptions`` (timeout, NIC rate, tags, limits, ...), by name;
    None: every option's default.

    Buffers are NumPy arrays, or arrays of another module with NumPy's interface (``xp``:
    CuPy for GPU memory, found from the buffers when not given): every buffer the
    executor makes (packs, receive buffers) comes from ``xp``, so device data is never
    staged through host memory.

    Shared between the threads of a run without a lock: the caches ``_kinds`` (filled by
    ``run`` before the first transfer is admitted), ``_in_place`` and ``_strided`` (a value
    is the same whoever computes it), and ``_packed``, ``_packing`` and ``_gathered``
    (written by the dispatching thread before the transfer they belong to is admitted,
    popped once by the thread that sends it). The dispatcher's own state is under its lock
    (``runtime/dispatch.py``).

    Raises:
        InvalidTypeError: ``options`` that is not an ``ExecutorOptions`` (a bad limit is
            refused where the options are made: ``InvalidOptionError``).
    """

    def __init__(self, host: int, layout, src, dst, backend: Backend, host_of: Callable[[int], int], *,
                 options: ExecutorOptions | None = None):
        if options is None:
            options = ExecutorOptions()
        elif not isinstance(options, ExecutorOptions):
            raise InvalidTypeError(f"HostExecutor's options must be an ExecutorOptions, got {options!r}")
        self.options = options
        many = isinstance(layout, (list, tuple))
        self.layouts = list(layout) if many else [layout]
        self.srcs = list(src) if many else [src]
        self.dsts = list(dst) if many else [dst]
        self.host, self.backend, self.host_of = host, backend, host_of
        # a plan's large messages wait for their receives where the backend can (runtime.tcp)
        self.rendezvous = options.rendezvous and backend.rendezvous is True
        self.xp = options.xp if options.xp is not None else array_module(self.srcs, self.dsts)
        self.max_concurrent: int = options.max_concurrent
        self.max_inflight_bytes: int = options.max_inflight_bytes
        # a message rides one of the backend's streams: each stream of a NIC gets its window
        self.streams: int = backend.streams
        self.max_per_resource: int = options.max_per_resource or MAX_PER_RESOURCE * self.streams
        # the backend sends a bucket's parts from where they lie (``Pieces``): nothing is packed
        self.vectored = backend.vectored is True and self.xp is np
        self._kinds: dict[str, TransferKind | None] = {}  # kind name -> its kind, resolved once
        self._packed: dict[int, Future] = {}  # transfer id -> its buffer, being packed ahead
        self._packing: dict[int, Packing] = {}  # transfer id -> how far its packing has come
        self._gathered: dict[int, Pieces] = {}  # transfer id -> its bucket's parts, cut before the run
        self._strided: dict[int, int] = {}  # transfer id -> bytes of its parts sent strided from here
        # transfer id -> where its bucket lands (given: ``Destinations.in_place``, else found)
        in_place = options.in_place
        self._in_place: dict[int, np.ndarray | None] = dict(in_place) if in_place is not None else {}
        self._in_place_known = in_place is not None
        self._dropped = None  # the transfer threads a failed run left (``join_dropped_threads``)

    @property
    def timeout(self) -> float:
        return self.options.timeout

    def _kind_of(self, t: Transfer) -> TransferKind | None:
        """``t``'s kind (None: no kind has its name), resolved once per name (``run`` resolves
        every transfer's before the first is admitted)."""
        name = t.kind
        if name not in self._kinds:
            self._kinds[name] = known_kind(name)
        return self._kinds[name]

    # ------------------------------------------------ primitives for the kinds
    # ``leaf`` is always given: a tree plan's transfers each name their own, and a default
    # would read leaf 0 for a caller that forgot it. Kinds call these through their
    # ``TransferContext``, whose default is the transfer's own leaf.
    def isend(self, buf: np.ndarray, host: int, tag: int):
        if self.rendezvous:  # see runtime.tcp: a large one waits for its receive
            return self.backend.isend(buf, host, tag, rendezvous=True)
        return self.backend.isend(buf, host, tag)

    def irecv(self, buf: np.ndarray, host: int, tag: int):
        if self.rendezvous:
            return self.backend.irecv(buf, host, tag, rendezvous=True)
        return self.backend.irecv(buf, host, tag)

    def source_view(self, device: int, index: Box, leaf: int):
        """``index`` of ``leaf`` as it lies in source ``device``'s shard (no copy), or None
        where this host holds no shard of ``leaf`` on ``device``."""
        src = self.srcs[leaf]
        return view(src[device], self.layouts[leaf].src_boxes[device], index) if device in src else None

    def slice_bytes(self, device: int, index: Box, leaf: int) -> np.ndarray:
        """The bytes of ``index`` of ``leaf`` held by source ``device``, flat and contiguous."""
        data = view(self.srcs[leaf][device], self.layouts[leaf].src_boxes[device], index)
        if self.xp is np and data.flags.c_contiguous:
            return data.reshape(-1).view(np.uint8)
        return self.xp.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def read_destination(self, device: int, index: Box, leaf: int) -> np.ndarray:
        """The bytes of ``index`` of ``leaf`` already written into destination ``device``, flat."""
        data = view(self.dsts[leaf][device], self.layouts[leaf].dst_boxes[device], index)
        return self.xp.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def write(self, device: int, index: Box, flat: np.ndarray, leaf: int) -> None:
        """Write flat bytes holding ``index`` of ``leaf`` into destination ``device``."""
        lay = self.layouts[leaf]
        target = view(self.dsts[leaf][device], lay.dst_boxes[device], index)
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
        kind = self._kind_of(t)
        return self.vectored and bool(t.parts) and kind is not None and kind.packable

    def _gather(self, t: Transfer) -> Pieces:
        return Pieces([self.slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])

    def gather_all(self, transfers: Sequence[Transfer]) -> None:
        """Cut every bucket this host sends into its ``Pieces`` before its turn comes (views
        only: no memory): once the wire runs, the stream threads' copies take the cores,
        and the posting thread, which would otherwise cut each bucket as its turn comes,
        gets them only now and then (a 200-leaf tree's 400 parts take about a millisecond
        to cut alone, over ten between the copies on two cores; cutting all but the first
        two after those two were posted started the third 2-6 ms late). Each part's view
        is made once: a bucket with a part that is not contiguous in its source shard is
        left to be cut at its turn, within ``max_inflight_bytes`` (``_strided_parts``)."""
        if not self.vectored:
            return
        for t in transfers:
            if t.id in self._gathered or not (self._gathers(t) and t.sender is not None
                                              and self.host_of(t.sender) == self.host):
                continue
            views = []
            for p in t.parts:
                data = self.source_view(p.sender, p.index, p.leaf) if self.host_of(p.sender) == self.host else None
                if data is None or not data.flags.c_contiguous:
                    break
                views.append(data.reshape(-1).view(np.uint8))
            else:
                self._strided[t.id] = 0
                self._gathered[t.id] = Pieces(views)

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
            data = self.source_view(p.sender, p.index, p.leaf)
            if data is not None and not data.flags.c_contiguous:
                out += p.nbytes
        self._strided[t.id] = out
        return out

    def _pack(self, t: Transfer, progress: Packing | None = None) -> np.ndarray:
        if not t.parts:
            return self.slice_bytes(t.sender, t.index, t.leaf)
        if progress is None:
            return self.concat([self.slice_bytes(p.sender, p.index, p.leaf) for p in t.parts])
        try:
            return self._pack_in_runs(t, progress)
        except BaseException:
            progress.fail()
            raise

    def _pack_in_runs(self, t: Transfer, progress: Packing) -> np.ndarray:
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
                self.write(r, t.index, flat, t.leaf)
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

    def flat_target(self, device: int, index: Box, leaf: int) -> np.ndarray | None:
        """The bytes of ``index`` of ``leaf`` inside ``device``'s buffer as a flat writable
        view, or None when that region is not contiguous."""
        target = view(self.dsts[leaf][device], self.layouts[leaf].dst_boxes[device], index)
        if not target.flags["C_CONTIGUOUS"]:
            return None
        return target.reshape(-1).view(np.uint8)

    # ------------------------------------------------------------------ run
    def run(self, transfers: Sequence[Transfer]) -> list[TransferTiming]:
        """Run this host's ``transfers``: concurrently where the backend allows it
        (``Backend.concurrent``, or ``Backend.issue_ordered``: concurrently, every
        transfer's operations issued in plan order; ``runtime/dispatch.py``), else one
        after another in plan order."""
        for t in transfers:
            self._kind_of(t)
        ordered = not self.backend.concurrent and self.backend.issue_ordered
        limit = self.max_concurrent if self.backend.concurrent or ordered else 1
        try:
            if limit > 1 and (len(transfers) > 1 or ordered):  # ordered: a posted one launches whole
                return Dispatcher(self, transfers, limit, ordered).run()
            return self._run_in_order(transfers)
        finally:
            SCRATCH.trim(self.max_inflight_bytes)  # kept for the next call: at most its budget

    def _run_in_order(self, transfers: Sequence[Transfer]) -> list[TransferTiming]:
        """One transfer at a time in plan order, packing the next coalesced buffer on a
        thread while the transfer before it is on the wire (backends whose operations must
        be issued in one order on every host: NCCL on one stream)."""
        timings = []
        ahead = PackAhead(self, transfers)
        try:
            for i, t in enumerate(transfers):
                ahead.submit_from(i)
                t0 = time.perf_counter()
                self.run_one(self.context(t))
                self.ended(t)
                timings.append(TransferTiming(t.id, t.kind, t0, time.perf_counter()))
        finally:
            ahead.close()
        return timings

    def join_dropped_threads(self, timeout: float) -> bool:
        """After a failed run: wait (at most ``timeout`` s) until the transfers it left on
        their threads have ended, e.g. before the memory they write into is freed (their
        waits end at once once the backend is closed). True when they all have."""
        pool = self._dropped
        if pool is None:
            return True
        waiter = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        waiter.join(timeout)
        return not waiter.is_alive()

    def ended(self, t: Transfer) -> None:
        """``t`` ended on this host: tell the caller (``ExecutorOptions.on_done``)."""
        if self.options.on_done is not None:
            self.options.on_done(t)

    # ------------------------------------------------ one transfer
    def context(self, t: Transfer) -> TransferContext:
        """``t``'s frozen context: its kind, first tag and wait bound. A wait may last the
        timeout plus twice the longer of what ``t``'s bytes need on the slowest NIC and when
        the plan expects it to end (a receiver may wait behind everything its sender sends
        first): no false alarm on a large slice or a long queue, still bounded when a peer
        is gone."""
        kind = self._kind_of(t)
        if kind is None:
            raise CommunicationError(f"host {self.host}: unknown transfer kind {t.kind!r}")
        min_rate = self.options.min_rate
        own = t.nbytes / min_rate if min_rate else 0.0
        wait_s = self.options.timeout + 2 * max(own, t.start + t.duration)
        tag0 = self.options.tag_base + (t.id % 1_000_000) * TAGS_PER_TRANSFER
        return TransferContext(self, t, kind, tag0, wait_s)

    def _named(self, t: Transfer, e: CommunicationError) -> CommunicationError:
        return CommunicationError(f"{e} (during transfer {t.id}: {t.kind} of slice {[list(p) for p in t.index]})")

    def run_one(self, ctx: TransferContext) -> None:
        """This host's part of ``ctx.t``, whole (``TransferKind.run``)."""
        try:
            ctx.kind.run(ctx, ctx.t, ctx.tag0)
        except CommunicationError as e:
            raise self._named(ctx.t, e) from e

    def post(self, ctx: TransferContext) -> Posted | None:
        """``ctx.t`` posted without blocking (``TransferKind.post``), or None."""
        try:
            return ctx.kind.post(ctx, ctx.t, ctx.tag0)
        except CommunicationError as e:
            raise self._named(ctx.t, e) from e

    def finish(self, ctx: TransferContext, part: Posted) -> None:
        """Wait for a posted ``ctx.t`` and finish it."""
        try:
            finish_posted(ctx, part)
        except CommunicationError as e:
            raise self._named(ctx.t, e) from e

    # ------------------------------------------------ admission (runtime/dispatch.py)
    def resource_keys(self, t: Transfer) -> tuple:
        """The NICs and intra-host links ``t`` holds, as the planner sees them (its kind's
        ``transfer_resources``), where it holds them long enough for its order there to
        matter (``ORDERED_LATENCIES``); none for a kind that cannot say, and none where this
        host only receives (it sends nothing, so it sets no order on any wire: its receives
        are posted as soon as they are admitted, since a late receive costs an eager
        transport a copy of the message and a rendezvous one its sender's time).

        Ordering is only an aid, so a kind that cannot say (no kind has its name: named
        when it runs, ``context``; or its ``resources`` are not written:
        ``NotImplementedError``) is admitted outside the windows rather than failing the
        run. Anything else it raises is a fault of the kind or the plan (a device no host
        holds), and is raised: the run's failure, not an order silently dropped."""
        return self.window_keys(t)[0]

    def held_keys(self, t: Transfer) -> tuple:
        """The NIC side a transfer this host only receives holds here (``nic_receive``), for
        the order of what comes after it: it is admitted at once (``resource_keys`` gives it
        none to wait for) but takes its room in that window, so a later transfer this host
        relays waits behind it there. Why: a relay admitted while earlier slices still pour
        into this host posts its receives, its sender starts, and the two share this
        host's ingress, so the earlier ones end late; the simulator keeps them in plan
        order (emulated, 1 Gbit/s, EP x FSDP to two replicas: the relayed chain slowed the
        one before it, 24-29 % past the simulated time)."""
        return self.window_keys(t)[1]

    def window_keys(self, t: Transfer) -> tuple[tuple, tuple]:
        """(``resource_keys(t)``, ``held_keys(t)``) from one look at ``t``'s resources: the
        keys ``t`` waits for room on here, and those it takes without waiting."""
        kind = self._kind_of(t)
        if kind is None or latency_bound(t.nbytes, self.options.latency_s, self.options.min_rate):
            return (), ()
        try:
            keys = tuple(kind.transfer_resources(t, _HostMap(self.host_of)))
        except NotImplementedError:
            return (), ()
        if nic_send(self.host) in keys:
            return keys, ()
        here = nic_receive(self.host)
        return (), ((here,) if here in keys else ())

    def stream_units(self, t: Transfer) -> int:
        """How much of a NIC's window ``t`` takes: one stream, or every stream where its
        messages are large enough to be striped over all of them (``STRIPE_MIN_BYTES``),
        so a few large transfers hold the NIC in the plan's order as one would; the whole
        window for a pipelined double tree (``admission.window_units``); one for a kind
        no kind has the name of (named when it runs: ``context``)."""
        if self._kind_of(t) is None:
            return 1
        units = self.streams if t.nbytes >= STRIPE_MIN_BYTES * max(1, t.chunks) else 1
        return window_units(t, units, self.max_per_resource, self.host_of, self.options.min_rate,
                            self.options.latency_s)

    def buffer_bytes(self, t: Transfer, packs: bool) -> int:
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
        kind = self._kind_of(t)
        if kind is None:
            return False  # named when it runs (``context``)
        if kind.receives_into_scratch:
            return True
        if t.sender is None or self.host_of(t.sender) == self.host:
            return False
        dst = self.dsts[t.leaf]
        if mine[0] not in dst:
            return False
        return not view(dst[mine[0]], self.layouts[t.leaf].dst_boxes[mine[0]], t.index).flags.c_contiguous

    def _packs(self, t: Transfer) -> bool:
        """Whether this host sends ``t`` from a buffer it must first pack: a coalesced
        transfer, or a slice that is not contiguous in its source shard (a layout change);
        a contiguous slice is sent from where it lies."""
        if t.sender is None or self.host_of(t.sender) != self.host:
            return False
        kind = self._kind_of(t)
        if kind is None or not kind.carries_data:
            return False  # an unknown kind is named when it runs (``context``)
        if t.parts:
            return not self._gathers(t)
        data = self.source_view(t.sender, t.index, t.leaf)
        return data is not None and not data.flags.c_contiguous
