"""Keeping a host's transfers in flight at once: the executor's dispatcher.

A ``Dispatcher`` is one run of ``HostExecutor.run`` over a backend that allows more than
one transfer in flight. The dispatching thread (the caller's) admits the host's
transfers in the plan's global order; a transfer this host only sends and receives is
posted from it and collected later (oldest first), one that must react to arrivals
runs on a transfer thread, or, on an ``issue_ordered`` backend, on the dispatching
thread while nothing later is admitted. Why this cannot deadlock is written once, in
docs/runtime.md ("Why the executor cannot deadlock").

Lock invariant: ``_cond`` guards the state every thread shares, ``_count`` and
``_bytes`` (transfers in flight and the buffer bytes they hold), ``_ended`` (ids of
the transfers that ended), ``_failure`` and ``_timings``. They are read and changed
only while holding it, and every change that can let a waiter go on (a transfer ended,
a failure) notifies all waiters; no thread sleeps on a timer. ``_posted``,
``_posted_ids``, ``_windows`` and ``_futures`` belong to the dispatching thread alone.

A posted transfer ends only when the dispatching thread collects it, so that thread
never blocks on a transfer that waits, itself or through what it reads, for something
it posted and has not collected: it collects the oldest posted transfer instead.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from ..resharding.kinds.base import Posted
from ..resharding.plan import Transfer
from .context import TransferContext
from .packing import PackAhead
from .pools import drop_threads, transfer_threads

# ``HostExecutor`` (runtime/executor.py, which imports this module) is named in annotations only.


@dataclass
class TransferTiming:
    transfer: int
    kind: str
    start: float
    end: float


class _PostedTransfer:
    """A transfer posted from the dispatching thread, waiting to be collected."""

    __slots__ = ("ctx", "part", "need", "t0")

    def __init__(self, ctx: TransferContext, part: Posted, need: int, t0: float):
        self.ctx, self.part, self.need, self.t0 = ctx, part, need, t0


class Dispatcher:
    """One concurrent run of ``transfers`` (this host's, in plan order) on ``ex``, at most
    ``limit`` in flight; ``ordered``: the backend matches in issue order (NCCL)."""

    def __init__(self, ex: "HostExecutor", transfers: Sequence[Transfer], limit: int, ordered: bool):
        self.ex, self.transfers, self.limit, self.ordered = ex, transfers, limit, ordered
        self._ids = {t.id for t in transfers}  # a dependency outside the run has ended
        self._cond = threading.Condition()
        self._count = self._bytes = 0
        self._ended: set[int] = set()
        self._failure: list[BaseException] = []
        self._timings: list[TransferTiming] = []
        self._posted: deque = deque()  # _PostedTransfer, oldest first
        self._posted_ids: set[int] = set()  # the ids in _posted
        self._by_id = {t.id: t for t in transfers}
        self._windows: dict[int, deque] = {}  # resource key -> (transfer id, stream units) here, oldest first
        self._futures: list = []  # what was handed to the transfer threads
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------ shared state (under _cond)
    def _done(self, tid: int) -> bool:
        """Whether transfer ``tid`` has ended (one outside this run has); holding ``_cond``."""
        return tid not in self._ids or tid in self._ended

    def _failed(self) -> bool:
        with self._cond:
            return bool(self._failure)

    def _release(self, t: Transfer, need: int, timing: TransferTiming | None = None,
                 error: BaseException | None = None) -> None:
        """``t`` ended (with ``timing``, or failing with ``error``): its room is free."""
        with self._cond:
            self._ended.add(t.id)
            self._count -= 1
            self._bytes -= need
            if timing is not None:
                self._timings.append(timing)
            if error is not None:
                self._failure.append(error)
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            self._failure.append(error)
            self._cond.notify_all()

    def _wait_ended(self, tid: int) -> bool:
        """Block until ``tid`` ended or anything failed; True where it ended."""
        with self._cond:
            while not self._done(tid) and not self._failure:
                self._cond.wait()
            return self._done(tid)

    def _unfinished_dep(self, t: Transfer) -> bool:
        with self._cond:
            return any(not self._done(d) for d in t.deps)

    # ------------------------------------------------ ending transfers
    def _launch(self) -> None:
        """Before this thread blocks: what it posted since it last blocked starts now, as
        one step of consecutive transfers (``Backend.launch_posted``; NCCL: one group)."""
        if self.ordered:
            self.ex.backend.launch_posted()

    def _collect_oldest(self) -> None:
        """Wait for the oldest posted transfer and finish it."""
        self._launch()
        p = self._posted.popleft()
        t = p.ctx.t
        self._posted_ids.discard(t.id)
        try:
            self.ex.finish(p.ctx, p.part)
            self.ex.ended(t)
        except BaseException as e:  # noqa: BLE001 - raised by run, as a thread's would be
            self._release(t, p.need, error=e)
            return
        self._release(t, p.need, TransferTiming(t.id, t.kind, p.t0, time.perf_counter()))

    def _run_alone(self, ctx: TransferContext, need: int) -> None:
        """``t`` whole, once what it reads (``deps``) has ended here (a transfer thread's
        work, or the dispatching thread's on an ``issue_ordered`` backend)."""
        t, t0 = ctx.t, time.perf_counter()
        try:
            for d in t.deps:
                if not self._wait_ended(d):
                    break  # a failure elsewhere ends no dependency: stop waiting for it
            if self._failed():
                self._release(t, need)
                return
            self.ex.run_one(ctx)
            self.ex.ended(t)
        except BaseException as e:  # noqa: BLE001 - handed to the dispatcher, which raises it
            self._release(t, need, error=e)
            return
        self._release(t, need, TransferTiming(t.id, t.kind, t0, time.perf_counter()))

    # ------------------------------------------------ admitting transfers
    def _await_window(self, keys: tuple, units: int) -> None:
        """Room on every NIC ``t`` holds: at most ``max_per_resource`` stream units of this
        host's transfers in flight there, taken in the plan's order there."""
        cap = self.ex.max_per_resource
        for key in keys:
            window = self._windows.setdefault(key, deque())
            while window and sum(u for _, u in window) + units > cap and not self._failed():
                oldest, _ = window.popleft()
                while not self._wait_posted_or_ended(oldest):
                    self._collect_oldest()

    def _wait_posted_or_ended(self, tid: int) -> bool:
        """True once ``tid`` ended (or anything failed); False while ``tid`` waits for
        something posted from this thread and not yet collected, so the caller collects
        the oldest posted transfer first: ``tid`` may be posted itself, or run on a thread
        and read (``deps``, directly or through other threaded transfers) what a posted
        one delivers, which ends only once this thread collects it (waiting for ``tid``
        then would wait forever). Otherwise ``tid`` ends without this thread, which waits
        for it and keeps its posted transfers in flight meanwhile."""
        with self._cond:
            if self._done(tid) or self._failure:
                return True
        if self._waits_on_posted(tid):
            return False
        self._launch()
        self._wait_ended(tid)
        return True

    def _waits_on_posted(self, tid: int) -> bool:
        """Whether unfinished ``tid`` is posted and uncollected, or reads (through the
        chain of its unfinished ``deps`` in this run) a transfer that is."""
        seen, todo = set(), [tid]
        while todo:
            i = todo.pop()
            if i in self._posted_ids:
                return True
            if i in seen:
                continue
            seen.add(i)
            with self._cond:
                todo += [d for d in self._by_id[i].deps if not self._done(d)] if i in self._by_id else []
        return False

    def _await_room(self, need: int) -> None:
        """Room within ``limit`` transfers and ``max_inflight_bytes``: one is admitted
        whenever nothing else is in flight.

        With nothing posted, what is in flight runs on transfer threads, and this thread
        waits for one to end. Nothing is left to launch then: only an ``issue_ordered``
        backend launches, and there every transfer in flight is a posted one (one that
        runs alone has ended before the next is admitted), so the wait is not reached."""
        budget = self.ex.max_inflight_bytes
        while True:
            with self._cond:
                full = self._count and (self._count >= self.limit or self._bytes + need > budget)
                if self._failure or not full:
                    return
                if not self._posted:
                    self._cond.wait()
                    continue
            self._collect_oldest()

    def _admit(self, i: int, t: Transfer, ahead: PackAhead) -> bool:
        """Admit transfer ``i`` of the run; False once the run has failed."""
        ahead.submit_from(i)
        need = self.ex.buffer_bytes(t, ahead.packs(i))
        (keys, held), units = self.ex.window_keys(t), self.ex.stream_units(t)
        self._await_window(keys, units)
        self._await_room(need)
        with self._cond:
            if self._failure:
                return False
            self._count += 1
            self._bytes += need
        for key in keys:
            self._windows[key].append((t.id, units))
        for key in held:  # taken without waiting (``HostExecutor.held_keys``)
            self._windows.setdefault(key, deque()).append((t.id, units))
        return self._start(t, need)

    def _start(self, t: Transfer, need: int) -> bool:
        """Post ``t`` from this thread where it can be posted, else run it alone."""
        t0 = time.perf_counter()
        try:
            ctx = self.ex.context(t)
            part = None if self._unfinished_dep(t) else self.ex.post(ctx)
        except BaseException as e:  # noqa: BLE001 - raised by run, as a thread's would be
            self._release(t, need, error=e)
            return False
        if part is not None:
            if self.ordered:
                self.ex.backend.transfer_posted()
            self._posted.append(_PostedTransfer(ctx, part, need, t0))
            self._posted_ids.add(t.id)
            return True
        if self.ordered:  # on this thread; its waits launch what is posted before it
            while self._posted and not self._failed() and self._unfinished_dep(t):
                self._collect_oldest()  # what it reads arrives in a posted transfer
            if self._failed():
                self._release(t, need)
                return False
            self._launch()
            self._run_alone(ctx, need)
            return True
        self._pool = self._pool or transfer_threads(self.limit)
        self._futures.append(self._pool.submit(self._run_alone, ctx, need))
        return True

    # ------------------------------------------------ the run
    def run(self) -> list[TransferTiming]:
        """Admit, post and collect every transfer; their timings, or the first failure
        raised. What this thread itself raises (admission's arithmetic, a backend call,
        a KeyboardInterrupt) is the run's failure too: the transfer threads waiting for
        a transfer that will not end wake and stop, and their pool is dropped."""
        ahead = PackAhead(self.ex, self.transfers)  # gloo writes a send on the posting thread: pack on another
        try:
            self.ex.gather_all(self.transfers)
            for i, t in enumerate(self.transfers):
                if not self._admit(i, t, ahead):
                    break
            while self._posted and not self._failed():
                self._collect_oldest()
            self._launch()
            with self._cond:
                while self._count and not self._failure:
                    self._cond.wait()
        except BaseException as e:  # noqa: BLE001 - recorded so that every waiter wakes, then raised
            self._fail(e)
            raise
        finally:
            ahead.close()
            self._after_failure()
        with self._cond:
            if self._failure:
                raise self._failure[0]
            return sorted(self._timings, key=lambda x: x.start)

    def _after_failure(self) -> None:
        """None waits for a cancelled transfer; the next run gets fresh threads, and the
        executor keeps the old ones for ``join_dropped_threads``."""
        with self._cond:
            failed = bool(self._failure)
            self._cond.notify_all()
        if failed and self._pool is not None:
            drop_threads(self._pool, self._futures)
            self.ex._dropped = self._pool
