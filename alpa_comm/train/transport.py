"""The mailbox of a stage's host worker: SEND/RECV as cross-mesh resharding on
communication threads, so transfers overlap with the stage's compute.

Every RECV of a step is posted when the step begins (``post``), so a peer's
SEND can always complete — with one thread per posted transfer no send waits
behind another, and the order stages reach their SENDs cannot deadlock
(sends through gloo may wait for the matching receive to be posted). A RECV
action then only waits for its own data. Concurrent transfers are kept apart
by tags: each (edge, key, microbatch) gets its own tag range. Edges join model stages
(the runners address the mailbox by them), so with virtual stages two transfers
between the same two meshes for one microbatch, on different model-stage edges,
never meet.

Over a backend that matches messages in issue order, not by tag (NCCL:
``Backend.issue_ordered``), posting every receive at once cannot work: the hosts
would issue their transfers in whatever order their threads reach them.
``OrderedMailbox`` runs a host's transfers one after another on one communication
thread, in the order ``pipeline.transfer_order`` gives every host (the module says
why that cannot deadlock); SEND hands the arrays to that thread, RECV waits for it.

This module moves NumPy buffers only; turning framework arrays into per-device
buffers and back is the worker's business (``to_buffers``/``from_buffers``).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..pipeline.ir import Schedule
from ..pipeline.edges import edge_name, transfer_edge
from ..pipeline.transfer_order import transfer_order
from ..resharding.host_job import HostJob
from ..runtime.backend import Backend, CommunicationError
from ..runtime.executor import TAGS_PER_TRANSFER, ExecutorOptions, HostExecutor, Layout
from ..runtime.pools import shutdown_now
from ..runtime.thread_cpu import name_os_thread

MAX_TRANSFERS_PER_PLAN = 128
TAG_STRIDE = MAX_TRANSFERS_PER_PLAN * TAGS_PER_TRANSFER
MAX_TAG_SLOTS = (1 << 31) // TAG_STRIDE - 64  # the top slots are left to the gradient all-reduce
MAX_KEYS = 8
ALLREDUCE_TAG_BASE = (MAX_TAG_SLOTS + 1) * TAG_STRIDE


def tag_slot(edge_index: int, key_index: int, mb: int, num_microbatches: int) -> int:
    slot = (edge_index * MAX_KEYS + key_index) * num_microbatches + mb
    if key_index >= MAX_KEYS or slot >= MAX_TAG_SLOTS:
        raise CommunicationError(f"too many concurrent transfers to tag apart (edge {edge_index}, key {key_index}, "
                                 f"microbatch {mb} of {num_microbatches}); use fewer microbatches")
    return slot


class ReshardMailbox:
    """``jobs``: edge name ("F:0->1") -> this host's job per key (``HostJob.for_host``);
    ``edge_index``: edge name -> a small integer (same on every host)."""

    def __init__(self, host: int, backend: Backend, jobs: dict[str, list[HostJob]], edge_index: dict[str, int],
                 keys: dict[str, list[str]], devices_per_host: int, num_microbatches: int, timeout: float,
                 to_buffers: Callable, from_buffers: Callable, zeros: bool = False, alloc: Callable | None = None):
        """``alloc(device, shape, dtype)`` makes a receive buffer where it is not host memory
        (device memory for NCCL), as ``Layout.empty_destinations`` takes it."""
        self.host, self.backend, self.jobs, self.edge_index, self.keys = host, backend, jobs, edge_index, keys
        self.alloc = alloc
        self.dph, self.M, self.timeout, self.zeros = devices_per_host, num_microbatches, timeout, zeros
        self.to_buffers, self.from_buffers = to_buffers, from_buffers
        for name, per_key in jobs.items():
            for job in per_key:
                if job.transfers and max(t.id for t in job.transfers) >= MAX_TRANSFERS_PER_PLAN:
                    raise CommunicationError(f"edge {name}: its plan has more than {MAX_TRANSFERS_PER_PLAN} transfers")
        # Layouts are the same every microbatch: built once per (edge, key).
        self.layouts = {name: [[Layout.of(leaf) for leaf in job.leaves] for job in per_key]
                        for name, per_key in jobs.items()}
        n_threads = max(4, 2 * num_microbatches * max(1, len(jobs)))
        self.pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix=f"comm-h{host}",
                                       initializer=name_os_thread, initargs=("mailbox",))
        self.pending: dict[tuple, Future] = {}
        self.sends: list[Future] = []
        # every job handed to the pool and not yet ended, whichever step it belongs to (an
        # abandoned step's are forgotten by ``pending`` and ``sends``): ``close`` cancels them
        self._submitted: set[Future] = set()
        self._submitted_lock = threading.Lock()  # the done-callbacks run on the pool's threads
        self.events: list[tuple[str, int, float, float]] = []  # sends: (edge name, mb, start, end)
        self.unpack_s = 0.0

    # ------------------------------------------------------------- transfers
    def _submit(self, fn: Callable, *args) -> Future:
        """``pool.submit``, remembered until it ends (``close`` cancels what has not started)."""
        fut = self.pool.submit(fn, *args)
        with self._submitted_lock:
            self._submitted.add(fut)
        fut.add_done_callback(self._forget)  # at once where it already ended
        return fut

    def _forget(self, fut: Future) -> None:
        with self._submitted_lock:
            self._submitted.discard(fut)

    def _run(self, name: str, mb: int, srcs: list[dict] | None) -> list[dict]:
        """This host's part of every key's plan of edge ``name`` for microbatch ``mb``."""
        out = []
        start = time.time()
        for k, (job, layouts) in enumerate(zip(self.jobs[name], self.layouts[name])):
            # 'signal' delivers no data: the stages then compute on finite zeros
            dst = layouts[0].empty_destinations(job.is_local, zeros=self.zeros, alloc=self.alloc)
            src = [srcs[k]] if srcs is not None else [{}]
            tag = tag_slot(self.edge_index[name], k, mb, self.M) * TAG_STRIDE
            # eager messages: a stage may wait for its send before it posts its next receive
            options = ExecutorOptions(self.timeout, job.min_rate, tag_base=tag, rendezvous=False)
            HostExecutor(self.host, layouts, src, [dst], self.backend, job.host_of, options=options).run(job.transfers)
            out.append(dst)
        if srcs is not None:  # the sender's view: from data ready to the last byte out
            self.events.append((name, mb, start, time.time()))
        return out

    def zero_sources(self, name: str) -> list[dict]:
        """Zero-filled source buffers of this host for every key of edge ``name`` (timing runs)."""
        out = []
        for job, layouts in zip(self.jobs[name], self.layouts[name]):
            lay = layouts[0]
            out.append({d: np.zeros(tuple(b - a for a, b in box), lay.dtype)
                        for d, box in lay.src_boxes.items() if job.is_local(d)})
        return out

    def _send_task(self, name: str, mb: int, arrays: dict) -> None:
        bufs = [self.to_buffers(arrays[key]) for key in self.keys[name]]
        self._run(name, mb, bufs)

    # ---------------------------------------------------------------- mailbox
    def post(self, direction: str, src: int, dst: int, mb: int) -> None:
        """Start receiving (called for every RECV of the step before it runs)."""
        name = edge_name(direction, src, dst)
        if name not in self.jobs:
            raise CommunicationError(f"host {self.host}: no plan for edge {name}")
        key = (name, mb)
        if key not in self.pending:
            self.pending[key] = self._submit(self._run, name, mb, None)

    def send(self, direction: str, src: int, dst: int, mb: int, arrays: dict) -> None:
        name = edge_name(direction, src, dst)
        if name not in self.jobs:
            raise CommunicationError(f"host {self.host}: no plan for edge {name}")
        self.sends.append(self._submit(self._send_task, name, mb, arrays))

    def recv(self, direction: str, src: int, dst: int, mb: int, block: bool = True) -> dict | None:
        name = edge_name(direction, src, dst)
        self.post(direction, src, dst, mb)
        fut = self.pending[(name, mb)]
        if not block and not fut.done():
            return None
        bufs = self._result(fut, f"receiving {name} microbatch {mb}")
        del self.pending[(name, mb)]
        t0 = time.time()
        out = {key: self.from_buffers(name, key, b) for key, b in zip(self.keys[name], bufs)}
        self.unpack_s = time.time() - t0  # busy time, not waiting: the trace shows it apart
        return out

    def _result(self, fut: Future, what: str):
        bound = self._wait_bound()
        try:
            return fut.result(timeout=bound)
        except FutureTimeout:
            raise CommunicationError(f"host {self.host}: {what} did not finish within {bound:g} s") from None

    def _wait_bound(self) -> float:
        """How long a RECV (or the step's sends) may take: one transfer's bound here, where
        every transfer runs on a thread of its own."""
        return 2 * self.timeout + 10

    def flush(self) -> None:
        """Wait for every send of the step (before the step counts as done)."""
        sends, self.sends = self.sends, []
        for f in sends:
            self._result(f, "a send")
        if self.pending:
            left = sorted(self.pending)
            self.pending.clear()
            raise CommunicationError(f"host {self.host}: receives posted but never consumed: {left[:4]}")

    def abandon(self) -> None:
        """After a failed step (not flushed): forget its transfers, so the next starts afresh
        (the backend is made anew after a failure where it must be: ``fresh_after_failure``)."""
        self.pending.clear()
        self.sends.clear()

    def close(self) -> None:
        """Cancel every job not yet started, this step's and any abandoned step's, and end
        the pool's threads once what runs has ended (Python 3.8: no ``cancel_futures``)."""
        with self._submitted_lock:
            submitted = list(self._submitted)
        shutdown_now(self.pool, submitted)


class OrderedMailbox(ReshardMailbox):
    """The mailbox for a backend that matches in issue order (NCCL): ``order`` lists this
    host's transfers of a step as (edge name, microbatch, "send" or "recv") in the order
    every host keeps (``ordered_transfers``). One thread per step runs them in that order:
    a send once its SEND action has handed the arrays over, a receive at once."""

    def __init__(self, *args, order: list[tuple[str, int, str]], **kw):
        super().__init__(*args, **kw)
        self.order = list(order)
        self._receives = {(name, mb) for name, mb, role in self.order if role == "recv"}
        self._step: _OrderedStep | None = None

    def _current(self) -> "_OrderedStep":
        """This step's hand-overs and receipts, its thread started on first use."""
        if self._step is None:
            step = _OrderedStep({(n, mb): Future() for n, mb, role in self.order if role == "send"},
                                {(n, mb): Future() for n, mb, role in self.order if role == "recv"})
            step.future = self._submit(self._run_in_order, step)
            self._step = step
        return self._step

    def _run_in_order(self, step: "_OrderedStep") -> None:
        """One step's transfers in the agreed order, on the step's own thread (it reads only
        ``step``: a later step has its own)."""
        wait_s = self._wait_bound()  # a SEND comes after the compute before it: as generous as a RECV
        try:
            for name, mb, role in self.order:
                if role == "recv":
                    step.received[(name, mb)].set_result(self._run(name, mb, None))
                    continue
                try:  # the stage hands the arrays over at its SEND action
                    arrays = step.handoff[(name, mb)].result(timeout=wait_s)
                except FutureTimeout:
                    raise CommunicationError(f"host {self.host}: the SEND of {name} microbatch {mb} did not come "
                                             f"within {wait_s:g} s") from None
                self._send_task(name, mb, arrays)
        except BaseException as e:  # every RECV still waiting learns why
            step.fail(e)
            raise

    def post(self, direction: str, src: int, dst: int, mb: int) -> None:
        name = edge_name(direction, src, dst)
        if (name, mb) not in self._receives:
            raise CommunicationError(f"host {self.host}: no transfer {name} microbatch {mb} in this host's order")
        self.pending[(name, mb)] = self._current().received[(name, mb)]

    def send(self, direction: str, src: int, dst: int, mb: int, arrays: dict) -> None:
        name = edge_name(direction, src, dst)
        slot = self._current().handoff.get((name, mb))
        if slot is None or slot.done():
            raise CommunicationError(f"host {self.host}: SEND {name} microbatch {mb} is not in this host's order "
                                     "or came twice")
        slot.set_result(arrays)

    def _wait_bound(self) -> float:
        """A RECV waits behind every earlier transfer of the step on the one thread, each
        bounded on its own (the executor's waits, a SEND's hand-over): their bounds added."""
        return max(1, len(self.order)) * (2 * self.timeout + 10)

    def flush(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            try:
                self._result(step.future, "this step's transfers")
            finally:  # a step given up on ends its thread, whatever it was waiting for
                step.fail(CommunicationError(f"host {self.host}: the step ended before this transfer"))
        super().flush()

    def abandon(self) -> None:
        """After a failed step (not flushed): its thread stops at its next hand-over, and the
        next step starts afresh."""
        step, self._step = self._step, None
        if step is not None:
            step.fail(CommunicationError(f"host {self.host}: the step was abandoned"))
        super().abandon()

    def close(self) -> None:
        self.abandon()
        super().close()


@dataclass
class _OrderedStep:
    """One step of an ``OrderedMailbox``: the SENDs' hand-overs and the RECVs' receipts."""

    handoff: dict[tuple, Future]
    received: dict[tuple, Future]
    future: Future | None = None

    def fail(self, error: BaseException) -> None:
        for fut in (*self.handoff.values(), *self.received.values()):
            if not fut.done():
                fut.set_exception(error)


def ordered_transfers(schedule: Schedule, stage: int, edges: set[str]) -> list[tuple[str, int, str]]:
    """Stage ``stage``'s part of ``transfer_order(schedule)`` as (edge name, microbatch,
    "send" or "recv"), keeping the edges this host has a job for (``edges``). Edges are
    named by the model stages they join (``transfer_edge``), as the runners address the
    mailbox, so with virtual stages two transfers between the same two stages for one
    microbatch stay apart."""
    out = []
    for key in transfer_order(schedule):
        direction, mb, src, dst, _ = key
        name = transfer_edge(key)
        if name in edges and stage in (src, dst):
            out.append((name, mb, "send" if stage == src else "recv"))
    return out


def make_mailbox(host: int, backend: Backend, jobs: dict[str, list[HostJob]], edge_index: dict[str, int],
                 keys: dict[str, list[str]], devices_per_host: int, schedule: Schedule, stage: int,
                 timeout: float, to_buffers: Callable, from_buffers: Callable, zeros: bool = False,
                 alloc: Callable | None = None) -> ReshardMailbox:
    """The mailbox for ``backend``: every receive posted at once over a tagged transport,
    one agreed order of transfers over one that matches in issue order (NCCL)."""
    args = (host, backend, jobs, edge_index, keys, devices_per_host, schedule.num_microbatches, timeout,
            to_buffers, from_buffers)
    if backend.issue_ordered:
        return OrderedMailbox(*args, zeros=zeros, alloc=alloc, order=ordered_transfers(schedule, stage, set(jobs)))
    return ReshardMailbox(*args, zeros=zeros, alloc=alloc)
