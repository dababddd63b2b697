"""A model of NCCL's semantics over NumPy buffers, standing in for ``cupy.cuda.nccl`` and
CuPy's streams and events, so the GPU path runs (and can fail) without a GPU.

The real backend code (``runtime.backend.NcclBackend``, the executor with CuPy buffers,
``alpa_comm.jax`` with ``backend="nccl"``) runs unchanged on it: ``install()`` puts a
fake ``cupy`` package (``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl``) in ``sys.modules``.
Ranks are threads of one process; buffers are NumPy arrays of a subclass whose
``.data.ptr`` is the array's address, and the model moves bytes between addresses as
NCCL would between device pointers.

The rules it encodes (NCCL's user guide, https://docs.nvidia.com/deeplearning/nccl/
user-guide/docs/; section names in brackets):

1. **Stream order** [CUDA Stream Semantics]: an operation is enqueued on a stream and
   runs after everything enqueued on that stream before it; a host call returns once
   the operation is enqueued. ``Stream.record()`` gives an event that is done when all
   of the stream's earlier work is; ``Stream.wait_event`` holds the stream's later work
   until the event is done.
2. **Point-to-point matching** [Point-to-point communication]: a send to a peer needs
   the peer's matching receive (same communicator, same byte count); sends and receives
   between two ranks of one communicator match in the order they were issued; a send
   (or receive) completes only together with its match, so it holds its stream until
   the peer's matching operation runs. A send and a receive on the same stream, each
   waiting for a peer whose stream holds the opposite order, deadlock ("a ring where
   every rank sends, then receives").
3. **Groups** [Group Calls]: operations issued between ``groupStart()`` and the
   outermost ``groupEnd()`` of a thread are launched together at ``groupEnd`` and
   progress concurrently; the group holds each stream it uses until all of its
   operations are done. A group holds at most 2048 operations (``MAX_GROUP_OPS``).
4. **Collectives** [Collective Operations]: every rank of a communicator calls the same
   collectives in the same order with the same count and type; the k-th collective of
   each rank matches the k-th of the others, and completes when all have started.
5. **Communicator creation** is collective: ``NcclCommunicator(n, id, rank)`` returns
   once all ``n`` ranks of that id have called it [Creating a communicator].
6. **No concurrency across streams is promised** [Using multiple NCCL communicators
   concurrently]: "NCCL kernels are blocking (waiting for data to arrive) ... Launching
   multiple communication operations (on different streams) might work provided they
   can fit within the GPU, but could break at any time." So by default
   (``concurrent_streams=False``) a device runs one NCCL launch (an operation or a
   group) at a time, in launch order over all its streams: code correct here is correct
   whatever the GPU co-schedules. (What only a GPU shows, e.g. that a small send may
   complete before its receive is posted, is in ``docs/runtime.md``.)

A device is (the thread that made the stream, the CuPy device current there): threads
stand for processes, each with its own GPUs.

A cycle of waits is reported instead of hanging: when nothing can progress and every
thread that uses the model is waiting on it (an event, a synchronize, a communicator's
creation) or has ended, each waiter raises ``NcclDeadlock`` with a report naming every
rank's blocked operations, where each was issued (file, line, function) and what it
waits for. A byte-count or collective mismatch raises ``NcclMismatch``.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import itertools
import sys
import threading
import time
import traceback
import types
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..errors import CommunicationError, InvalidTypeError

__all__ = ["ModelArray", "NcclDeadlock", "NcclMismatch", "NcclModel", "device_array", "install", "on_device"]

STALL_S = 1.0
"""How long nothing may happen (no progress, no new operation, no new thread), with every
thread the model knows waiting, before a deadlock is named: a thread that has not called
into the model yet (still starting, importing) is unknown to it, so this guards against
naming a deadlock before it has arrived."""


MAX_GROUP_OPS = 2048
"""Operations one group may hold (rule 3): "There is a maximum of 2048 NCCL operations that
can be inserted between the ncclGroupStart and ncclGroupEnd calls" (NCCL 2.9.9 and 2.11.4
API docs, Group Calls; later guides no longer state it). Code within it works with every
version; ``max_group_ops=None`` lifts it."""


class NcclDeadlock(RuntimeError):
    """Nothing can progress and every thread is waiting: the message is the report."""


class NcclMismatch(RuntimeError):
    """Two matched operations disagree (byte counts, collective kind or count)."""


# ------------------------------------------------------------------- buffers
class _Memory:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class ModelArray(np.ndarray):
    """A "device" array: a NumPy array whose ``.data.ptr`` is its address (CuPy's
    ``MemoryPointer``); its type's module reads as ``cupy`` (``executor.array_module``).
    As with CuPy, a NumPy function applied to it runs CuPy's function of that name where
    the model's ``cupy`` has one (NEP 18), and fails otherwise, so most host round trips
    on the GPU path show as errors (``np.asarray`` still gives a host view here, where
    CuPy refuses: use ``.get()``)."""

    _device: "int | None" = None

    def __array_finalize__(self, obj) -> None:
        self._device = getattr(obj, "_device", None)  # views keep their array's device

    @property
    def data(self):  # noqa: D401 - CuPy's name
        return _Memory(self.ctypes.data)

    @property
    def device(self) -> "Device":
        """The GPU it lives on: the one it was placed on (``on_device``), else the calling
        thread's current device."""
        return Device(self._device if self._device is not None else _current_device())

    def get(self) -> np.ndarray:
        return self.view(np.ndarray).copy()

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ not in _NEP18:
            raise InvalidTypeError(f"no implementation found for 'numpy.{func.__name__}' on CuPy arrays")
        return _on_host(func)(*args, **kwargs)


ModelArray.__module__ = "cupy"


def _dev(a) -> ModelArray:
    return a if isinstance(a, ModelArray) else np.asarray(a).view(ModelArray)


def _host(a):
    if isinstance(a, ModelArray):
        return a.view(np.ndarray)
    if isinstance(a, (list, tuple)):
        return type(a)(_host(x) for x in a)
    return a


def _on_host(fn):
    """``fn`` over host views of model arrays, its array result a model array (CuPy's
    function of that name)."""
    def call(*args, **kwargs):
        out = kwargs.get("out")
        got = fn(*[_host(a) for a in args], **{k: _host(v) for k, v in kwargs.items()})
        if out is not None:
            return out
        return _dev(got) if isinstance(got, np.ndarray) else got
    call.__name__ = fn.__name__
    return call


_NEP18 = {"empty_like", "zeros_like", "ones_like", "full_like", "concatenate", "array_equal", "copyto", "ravel",
          "reshape", "shares_memory", "may_share_memory", "sum", "allclose", "linspace", "ascontiguousarray",
          "result_type", "can_cast", "ndim", "shape", "size", "prod"}


# ------------------------------------------------------------------ the model
@dataclass(eq=False)
class _Op:
    kind: str  # send, recv, allreduce, bcast, wait_event, event
    comm: "_Comm | None"
    stream: "_Stream"
    nbytes: int = 0
    peer: int = -1
    ptr: int = 0
    ptr2: int = 0
    count: int = 0
    dtype: int = 0
    op: int = 0
    root: int = 0
    seq: int = 0  # p2p: k-th on (comm, src, dst); collective: k-th on the comm
    group: "_Group | None" = None
    launch: int = 0  # launch order on the device (rule 6)
    event: "Event | None" = None
    where: str = ""
    done: bool = False
    tried: bool = False  # offered for matching once started: its match completes it from then on
    space: "object | None" = None  # whose memory ``ptr``/``ptr2`` address: None is this process's


    def describe(self) -> str:
        r = f"rank {self.comm.rank} of communicator {self.comm.name}" if self.comm else "stream"
        if self.kind == "send":
            what = f"send of {self.nbytes} B to rank {self.peer} (#{self.seq + 1} on that pair)"
        elif self.kind == "recv":
            what = f"receive of {self.nbytes} B from rank {self.peer} (#{self.seq + 1} on that pair)"
        elif self.kind in ("allreduce", "bcast"):
            what = f"{self.kind} of {self.nbytes} B (collective #{self.seq + 1})"
        elif self.kind == "wait_event":
            what = "wait for an event of another stream"
        else:
            what = self.kind
        return f"{r}, stream {self.stream.name}: {what}, issued at {self.where}"


@dataclass(eq=False)
class _Group:
    ops: list = field(default_factory=list)
    launch: int = 0
    streams: list = field(default_factory=list)  # the streams its operations use, once each
    left: int = 0  # operations not done yet


class _Comm:
    def __init__(self, model: "NcclModel", uid: tuple, world: int, rank: int):
        self.uid, self.world, self.rank = uid, world, rank
        self.name = model._comm_name(uid)
        self.aborted = False


class _Stream:
    def __init__(self, name: str):
        self.name = name
        self.device = (threading.current_thread(), _current_device())
        self.queue: list = []  # _Op or _Group, in issue order


class NcclModel:
    """All communicators, streams and pending operations of one model world; every entry
    point takes ``lock``, applies what it issued, then progresses everything it can."""

    def __init__(self, stall_s: float = STALL_S, concurrent_streams: bool = False,
                 max_group_ops: int | None = MAX_GROUP_OPS):
        self.lock = threading.RLock()
        self.stall_s, self.concurrent_streams = stall_s, concurrent_streams
        self.max_group_ops = max_group_ops
        self._launches = itertools.count(1)
        self._active: dict[threading.Thread, object] = {}  # device -> its running NCCL launch
        self.streams: list[_Stream] = []
        self.by_ptr: dict[int, _Stream] = {}  # a CuPy stream's ``ptr`` -> its queue
        self._busy: dict[_Stream, None] = {}  # streams with queued work, in the order they got it
        self._stream_ids = itertools.count()
        self._uids = itertools.count(1)
        self._names: dict[tuple, str] = {}
        self._joining: dict[tuple, set] = {}
        self._p2p_seq: dict[tuple, int] = {}
        self._coll_seq: dict[tuple, int] = {}
        self._sends: dict[tuple, _Op] = {}
        self._recvs: dict[tuple, _Op] = {}
        self._colls: dict[tuple, dict[int, _Op]] = {}
        self._threads: set[threading.Thread] = set()
        self._waiting: dict[threading.Thread, str] = {}
        self._groups = threading.local()
        self._last_progress = time.monotonic()
        self.deadlock: str | None = None
        self.operations = 0  # completed operations (for tests' sanity checks)
        self.completed: list[tuple] = []  # (kind, communicator, rank, peer, seq) in completion order

    # ---------------------------------------------------------------- names
    def _comm_name(self, uid: tuple) -> str:
        with self.lock:
            return self._names.setdefault(uid, f"c{len(self._names)}")

    def new_uid(self) -> tuple:
        return (next(self._uids),) + (0,) * 127

    def _register(self) -> None:
        me = threading.current_thread()
        if me not in self._threads:
            self._threads.add(me)
            self._last_progress = time.monotonic()

    @staticmethod
    def _where() -> str:
        """Where the calling code issued the operation (a remote caller's, when it said)."""
        return getattr(_TLS, "where", None) or where_issued()

    # ------------------------------------------------------------ creation
    def join(self, uid: tuple, world: int, rank: int) -> _Comm:
        """Rule 5: a communicator exists once all its ranks have called."""
        with self.lock:
            self._register()
            self._comm_name(uid)
            members = self._joining.setdefault(uid, set())
            if rank in members:
                raise NcclMismatch(f"rank {rank} joined communicator {self._names[uid]} twice")
            members.add(rank)
        what = f"creating communicator {self._names[uid]} as rank {rank} of {world}"
        g = self._groups
        if getattr(g, "depth", 0):  # in a group, creation completes at groupEnd (several ranks per thread)
            g.joins = getattr(g, "joins", []) + [(uid, world, what)]
        else:
            self.wait_until(lambda: len(self._joining[uid]) >= world, what)
        return _Comm(self, uid, world, rank)

    def stream(self) -> _Stream:
        with self.lock:
            s = _Stream(f"s{next(self._stream_ids)}")
            self.streams.append(s)
            return s

    # ---------------------------------------------------------------- issue
    def group_start(self) -> None:
        g = self._groups
        g.depth = getattr(g, "depth", 0) + 1
        if g.depth == 1:
            g.ops = []

    def group_end(self) -> None:
        g = self._groups
        if getattr(g, "depth", 0) == 0:
            raise NcclMismatch("groupEnd without groupStart")
        g.depth -= 1
        if g.depth == 0:
            joins, g.joins = getattr(g, "joins", []), []
            for uid, world, what in joins:
                self.wait_until(lambda uid=uid, world=world: len(self._joining[uid]) >= world, what)
            ops, g.ops = g.ops, []
            if self.max_group_ops is not None and len(ops) > self.max_group_ops:
                raise NcclMismatch(f"a group of {len(ops)} operations: NCCL allows at most {self.max_group_ops} "
                                   f"between groupStart and groupEnd (first issued at {ops[0].where})")
            if ops:
                with self.lock:
                    grp = _Group(ops, next(self._launches), list(dict.fromkeys(op.stream for op in ops)), len(ops))
                    for s in grp.streams:
                        s.queue.append(grp)
                        self._busy[s] = None
                    for op in ops:
                        op.group = grp
                    self._progress()

    def issue(self, op: _Op) -> None:
        op.where = self._where()
        with self.lock:
            self._register()
            if self.deadlock:
                raise NcclDeadlock(self.deadlock)
            if op.comm is not None and op.comm.aborted:
                raise CommunicationError(f"NCCL error: communicator {op.comm.name} was aborted")
            self._number(op)
            self._last_progress = time.monotonic()
        g = self._groups
        if getattr(g, "depth", 0):
            g.ops.append(op)
            return
        with self.lock:
            op.stream.queue.append(op)
            self._busy[op.stream] = None
            if op.comm is not None:
                op.launch = next(self._launches)
            self._progress()

    def _number(self, op: _Op) -> None:
        c = op.comm
        if op.kind in ("send", "recv"):
            if not 0 <= op.peer < c.world or op.peer == c.rank:
                raise NcclMismatch(f"rank {c.rank} of communicator {c.name}: invalid peer {op.peer}")
            src, dst = (c.rank, op.peer) if op.kind == "send" else (op.peer, c.rank)
            key = (c.uid, src, dst, op.kind)
            op.seq = self._p2p_seq.get(key, 0)
            self._p2p_seq[key] = op.seq + 1
        elif op.kind in ("allreduce", "bcast"):
            key = (c.uid, c.rank)
            op.seq = self._coll_seq.get(key, 0)
            self._coll_seq[key] = op.seq + 1

    # ------------------------------------------------------------- progress
    @staticmethod
    def _streams_of(unit) -> list:
        return unit.streams if isinstance(unit, _Group) else [unit.stream]

    def _at_heads(self, unit) -> bool:
        return all(s.queue and s.queue[0] is unit for s in self._streams_of(unit))

    def _started(self, op: _Op) -> bool:
        """Whether ``op`` is running: at the head of its stream (its group at the head of
        every stream the group uses) and, unless streams run concurrently, its device's
        one running launch (rule 6: the earliest launched of those ready to run)."""
        unit = op.group or op
        if not self._at_heads(unit):
            return False
        if self.concurrent_streams or op.comm is None:
            return True
        for dev in dict.fromkeys(s.device for s in self._streams_of(unit)):
            active = self._active.get(dev)
            if active is None:
                ready = [st.queue[0] for st in self._busy if st.device == dev and st.queue
                         and _is_nccl(st.queue[0]) and self._at_heads(st.queue[0])]
                if min(ready, key=lambda u: u.launch) is not unit:
                    return False
                self._active[dev] = unit
            elif active is not unit:
                return False
        return True

    def _progress(self) -> None:
        changed = True
        while changed:
            changed = False
            for s in list(self._busy):
                if not s.queue:
                    self._busy.pop(s, None)
                    continue
                while s.queue:
                    head = s.queue[0]
                    ops = head.ops if isinstance(head, _Group) else [head]
                    lead = next((o for o in ops if o.comm is not None), ops[0])  # an NCCL op, if any (rule 6)
                    if self._started(lead):  # a group starts as one (rule 3)
                        for op in ops:
                            if not op.done and not op.tried:
                                self._try(op)
                    if (head.left == 0) if isinstance(head, _Group) else head.done:
                        for st in self._streams_of(head):
                            if st.queue and st.queue[0] is head:
                                st.queue.pop(0)
                            if self._active.get(st.device) is head:
                                del self._active[st.device]
                        changed = True
                        self._last_progress = time.monotonic()
                    else:
                        break

    def _try(self, op: _Op) -> None:
        c = op.comm
        if op.kind == "event":
            self._complete(op)
        elif op.kind == "wait_event":
            if op.event._op is None or op.event._op.done:
                self._complete(op)
        elif op.kind in ("send", "recv"):
            op.tried = True
            src, dst = (c.rank, op.peer) if op.kind == "send" else (op.peer, c.rank)
            key = (c.uid, src, dst, op.seq)
            mine, other = (self._sends, self._recvs) if op.kind == "send" else (self._recvs, self._sends)
            mine[key] = op
            peer = other.get(key)
            if peer is not None and self._started(peer):
                send, recv = (op, peer) if op.kind == "send" else (peer, op)
                if send.nbytes != recv.nbytes:
                    raise NcclMismatch(
                        f"communicator {c.name}: {send.describe()} matched {recv.describe()}: "
                        f"{send.nbytes} B sent, {recv.nbytes} B expected")
                _move(send, recv)
                for o in (send, recv):
                    self._complete(o)
                    self.completed.append((o.kind, c.name, o.comm.rank, o.peer, o.seq))
                del self._sends[key], self._recvs[key]
                self.operations += 1
        else:
            op.tried = True
            key = (c.uid, op.seq)
            ranks = self._colls.setdefault(key, {})
            ranks[c.rank] = op
            if len(ranks) == c.world and all(self._started(o) for o in ranks.values()):
                self._collective(list(ranks.values()))
                del self._colls[key]

    def _collective(self, ops: list[_Op]) -> None:
        first = ops[0]
        for o in ops[1:]:
            if (o.kind, o.count, o.dtype, o.op, o.root) != (first.kind, first.count, first.dtype, first.op, first.root):
                raise NcclMismatch(f"collective #{first.seq + 1} on communicator {first.comm.name} differs "
                                   f"between ranks: {first.describe()} vs {o.describe()}")
        dtype = _DTYPES[first.dtype]
        if first.kind == "allreduce" and first.op != 0:
            raise NcclMismatch(f"the model's all-reduce sums only (NCCL_SUM), got op {first.op}")
        if first.kind == "allreduce":
            total = sum(_load(o, o.ptr, first.count, dtype).astype(dtype) for o in ops)
            for o in ops:
                _store(o, o.ptr2, total.astype(dtype, copy=False))
        else:
            src = next(o for o in ops if o.comm.rank == first.root)
            data = _load(src, src.ptr, first.count, dtype).copy()
            for o in ops:
                _store(o, o.ptr2, data)
        for o in ops:
            self._complete(o)
        self.operations += 1

    @staticmethod
    def _complete(op: _Op) -> None:
        op.done = True
        if op.group is not None:
            op.group.left -= 1

    # ---------------------------------------------------------------- waits
    def wait_until(self, ready, what: str, timeout: float | None = None) -> bool:
        """Block this thread until ``ready()`` (checked under the lock after progress);
        False after ``timeout``; raises ``NcclDeadlock`` when every thread waits and
        nothing moves."""
        me = threading.current_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._look(ready, what):
                if deadline is not None and time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
            return True
        finally:
            with self.lock:
                self._waiting.pop(me, None)

    def poll(self, ready, what: str) -> bool:
        """One look at ``ready()`` (``Event.done``): a False counts this thread as waiting
        until its next call into the model."""
        return self._look(ready, what)

    def _look(self, ready, what: str) -> bool:
        """Progress, then ``ready()``; if not, this thread waits for ``what`` (and a
        deadlock, once every thread waits and nothing moves, is raised here)."""
        me = threading.current_thread()
        with self.lock:
            self._register()
            self._progress()
            if ready():
                self._waiting.pop(me, None)
                return True
            if not self.deadlock:
                self._waiting[me] = what
                self._check_deadlock()
            if self.deadlock:
                raise NcclDeadlock(self.deadlock)
            return False

    def _check_deadlock(self) -> None:
        live = [t for t in self._threads if t.is_alive()]
        if any(t not in self._waiting for t in live):
            self._last_progress = time.monotonic()
            return
        pending = [op for s in self._busy for u in s.queue[:1]
                   for op in (u.ops if isinstance(u, _Group) else [u]) if not op.done]
        joining = [w for w in self._waiting.values() if w.startswith("creating")]
        if not pending and not joining:
            return
        if time.monotonic() - self._last_progress < self.stall_s:
            return
        self.deadlock = self._report(pending)

    def _report(self, pending: list[_Op]) -> str:
        lines = ["NCCL model: deadlock: nothing can progress and every thread waits."]
        for t, what in sorted(self._waiting.items(), key=lambda kv: kv[0].name):
            lines.append(f"  thread {t.name} waits for: {what}")
        lines.append("  blocked operations (the first unfinished one on each stream):")
        for op in pending:
            lines.append(f"    - {op.describe()}")
            lines.append(f"      needs: {self._needs(op)}")
        return "\n".join(lines)

    def _needs(self, op: _Op) -> str:
        c = op.comm
        if op.kind in ("send", "recv"):
            want = "recv" if op.kind == "send" else "send"
            other = self._match(op)
            label = f"rank {op.peer}'s matching {'receive' if want == 'recv' else 'send'} #{op.seq + 1}"
            if other is None:
                return f"{label}, not issued yet"
            ahead = self._blocker(other)
            return f"{label}, queued behind {ahead.describe()}" if ahead is not None else f"{label}, ready"
        if op.kind == "wait_event":
            return "an event recorded on another stream"
        return f"every rank of communicator {c.name} to call collective #{op.seq + 1}"

    def _match(self, op: _Op) -> "_Op | None":
        c = op.comm
        want = "recv" if op.kind == "send" else "send"
        for s in self._busy:
            for unit in s.queue:
                for o in (unit.ops if isinstance(unit, _Group) else [unit]):
                    if (o.kind == want and o.comm is not None and o.comm.uid == c.uid and o.comm.rank == op.peer
                            and o.peer == c.rank and o.seq == op.seq):
                        return o
        return None

    def _blocker(self, op: _Op) -> "_Op | None":
        """The operation that keeps ``op`` from running: the head of its stream, or the
        device's running launch."""
        head = op.stream.queue[0] if op.stream.queue else None
        unit = op.group or op
        if head is not None and head is not unit:
            return head.ops[0] if isinstance(head, _Group) else head
        active = self._active.get(op.stream.device)
        if active is not None and active is not unit:
            return active.ops[0] if isinstance(active, _Group) else active
        return None


_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
           6: np.float16, 7: np.float32, 8: np.float64}


def where_issued(skip: tuple = ()) -> str:
    """The caller's last six frames outside the model (and files ``skip``), innermost first."""
    frames = [f for f in traceback.extract_stack() if f.filename != __file__ and f.filename not in skip]
    return " <- ".join(f"{f.filename.split('/alpa_comm/')[-1].split('/tests/')[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-6:]))


def _is_nccl(unit) -> bool:
    return isinstance(unit, _Group) or unit.comm is not None


def _view(ptr: int, count: int, dtype) -> np.ndarray:
    size = np.dtype(dtype).itemsize * count
    buf = (ctypes.c_char * size).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype, count=count)


# Where an operation's memory lives: this process's (``space`` None: the addresses are
# read and written directly), or another process's, reached through its ``space`` (an
# object with ``read(ptr, nbytes) -> bytes`` and ``write(ptr, data)``: nccl_model_remote).
def _move(send: _Op, recv: _Op) -> None:
    """The send's bytes into the receive's buffer, at the moment both run."""
    if send.space is None and recv.space is None:
        ctypes.memmove(recv.ptr, send.ptr, send.nbytes)
    elif recv.space is None:
        ctypes.memmove(recv.ptr, send.space.read(send.ptr, send.nbytes), send.nbytes)
    else:
        recv.space.write(recv.ptr, send.space.read(send.ptr, send.nbytes) if send.space is not None
                         else ctypes.string_at(send.ptr, send.nbytes))


def _load(op: _Op, ptr: int, count: int, dtype) -> np.ndarray:
    if op.space is None:
        return _view(ptr, count, dtype)
    return np.frombuffer(op.space.read(ptr, count * np.dtype(dtype).itemsize), dtype=dtype, count=count)


def _store(op: _Op, ptr: int, data: np.ndarray) -> None:
    if op.space is None:
        _view(ptr, data.size, data.dtype)[...] = data
    else:
        op.space.write(ptr, np.ascontiguousarray(data).tobytes())


# ------------------------------------------------------- the fake CuPy API
_TLS = threading.local()  # per thread (process): the current device, its current and default streams


def _current_device() -> int:
    return getattr(_TLS, "device", 0)


class Event:
    """``cupy.cuda.Event``: ``record(stream)``, ``done``, ``synchronize``."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False, *,
                 _model=None, _op=None):
        self._model, self._op = _model or _ACTIVE, _op

    def record(self, stream=None) -> None:
        stream = stream if stream is not None else get_current_stream()
        self._op = stream.record()._op

    @property
    def done(self) -> bool:
        op = self._op
        return op is None or self._model.poll(lambda: op.done, f"an event on stream {op.stream.name}")

    def synchronize(self) -> None:
        if self._op is not None:
            self._model.wait_until(lambda: self._op.done, f"synchronizing an event on stream {self._op.stream.name}")


class Stream:
    """``cupy.cuda.Stream``: ``record``, ``wait_event``, ``synchronize``, ``ptr``, ``done``,
    ``use``; ``Stream.null`` is each thread's (device's) default stream."""

    null = None  # set to a _NullStream at install

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, *, _model=None):
        self._model = _model or _ACTIVE
        self._s = self._model.stream()
        self.ptr = id(self._s)
        self._model.by_ptr[self.ptr] = self._s

    def _stream(self) -> _Stream:
        return self._s

    def record(self, event=None) -> Event:
        op = _Op("event", None, self._stream())
        self._model.issue(op)
        ev = Event(_model=self._model, _op=op)
        op.event = ev
        if event is not None:
            event._op = op
        return ev

    def wait_event(self, event: Event) -> None:
        self._model.issue(_Op("wait_event", None, self._stream(), event=event))

    def synchronize(self) -> None:
        self.record().synchronize()

    @property
    def done(self) -> bool:
        return self.record().done

    def use(self):
        _TLS.stream = self
        return self

    def __enter__(self):
        self._prev = getattr(_TLS, "stream", None)
        _TLS.stream = self
        return self

    def __exit__(self, *exc):
        _TLS.stream = self._prev
        return False


class _NullStream(Stream):
    """``Stream.null``: resolves to the calling thread's default stream of its current
    device (``ptr`` 0, as CUDA's legacy default stream)."""

    def __init__(self, model):
        self._model, self.ptr = model, 0

    def _stream(self) -> _Stream:
        return _default_stream()


def get_current_stream() -> Stream:
    return getattr(_TLS, "stream", None) or Stream.null


class Device:
    """``cupy.cuda.Device``: ``use()`` and ``with`` make it this thread's current device."""

    def __init__(self, device: int = 0):
        self.id = int(device)

    def use(self) -> None:
        _TLS.device = self.id

    def synchronize(self) -> None:
        """Wait for every stream of this device (of the calling thread)."""
        model, dev = _ACTIVE, (threading.current_thread(), self.id)
        mine = [s for s in model.streams if s.device == dev]
        model.wait_until(lambda: all(not s.queue for s in mine), f"synchronizing device {self.id}")

    def __enter__(self):
        self._prev = _current_device()
        _TLS.device = self.id
        return self

    def __exit__(self, *exc):
        _TLS.device = self._prev
        return False


_ACTIVE: NcclModel | None = None
DEVICES_PER_PROCESS = 8
"""What ``cupy.cuda.runtime.getDeviceCount()`` answers in every thread."""


class NcclCommunicator:
    """``cupy.cuda.nccl.NcclCommunicator`` over the model: creation is collective (rule 5);
    ``send``/``recv`` (rule 2), ``allReduce``/``bcast``/``broadcast`` (rule 4) are
    enqueued on the given stream (rule 1) or the thread's open group (rule 3)."""

    def __init__(self, ndev: int, commId, rank: int):
        self._model = _ACTIVE
        uid = tuple(int(b) for b in commId)
        self._c = self._model.join(uid, int(ndev), int(rank))

    def _op(self, kind, stream, **kw) -> None:
        s = self._model.by_ptr[stream] if stream else _default_stream()
        self._model.issue(_Op(kind, self._c, s, space=getattr(_TLS, "space", None), **kw))

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._op("send", stream, ptr=sendbuf, nbytes=count * _size(datatype), peer=int(peer))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._op("recv", stream, ptr=recvbuf, nbytes=count * _size(datatype), peer=int(peer))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream) -> None:
        self._op("allreduce", stream, ptr=sendbuf, ptr2=recvbuf, count=count, dtype=datatype, op=op,
                 nbytes=count * _size(datatype))

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream) -> None:
        self._op("bcast", stream, ptr=sendbuf, ptr2=recvbuf, count=count, dtype=datatype, root=root,
                 nbytes=count * _size(datatype))

    def bcast(self, buff, count, datatype, root, stream) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def rank_id(self) -> int:
        return self._c.rank

    def size(self) -> int:
        return self._c.world

    def abort(self) -> None:
        self._c.aborted = True

    def destroy(self) -> None:
        pass


def _default_stream() -> _Stream:
    """The calling thread's default stream on its current device (made on first use)."""
    streams = _TLS.__dict__.setdefault("defaults", {})
    key = (id(_ACTIVE), _current_device())
    if key not in streams:
        streams[key] = _ACTIVE.stream()
    return streams[key]


def _size(datatype: int) -> int:
    return np.dtype(_DTYPES[datatype]).itemsize


def _nccl_module() -> types.ModuleType:
    mod = types.ModuleType("cupy.cuda.nccl")
    names = {"NCCL_INT8": 0, "NCCL_CHAR": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_INT": 2, "NCCL_UINT32": 3,
             "NCCL_INT64": 4, "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_HALF": 6, "NCCL_FLOAT32": 7,
             "NCCL_FLOAT": 7, "NCCL_FLOAT64": 8, "NCCL_DOUBLE": 8, "NCCL_SUM": 0, "NCCL_PROD": 1,
             "NCCL_MIN": 2, "NCCL_MAX": 3}
    for k, v in names.items():
        setattr(mod, k, v)
    mod.NcclCommunicator = NcclCommunicator
    mod.get_unique_id = lambda: _ACTIVE.new_uid()
    mod.groupStart = lambda: _ACTIVE.group_start()
    mod.groupEnd = lambda: _ACTIVE.group_end()
    mod.get_version = lambda: 22300
    mod.get_build_version = lambda: 22300
    return mod


def _cupy_module(nccl: types.ModuleType) -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__path__ = []  # a package: ``from cupy.cuda import nccl`` works
    cp.__spec__ = importlib.machinery.ModuleSpec("cupy", None, is_package=True)  # importlib.util.find_spec finds it
    cp.NCCL_MODEL = True  # what stands in here: code that checks for a GPU may accept it
    cp.ndarray = ModelArray
    cuda = types.ModuleType("cupy.cuda")
    cuda.__path__ = []
    cuda.Stream, cuda.Event, cuda.Device, cuda.nccl = Stream, Event, Device, nccl
    cuda.get_current_stream = get_current_stream
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: DEVICES_PER_PROCESS)
    cp.cuda = cuda
    for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "bool_"):
        setattr(cp, name, getattr(np, name))
    for name in ("empty", "zeros", "ones", "arange", "full", "empty_like", "zeros_like", "concatenate",
                 "ascontiguousarray", "array", "asarray", "frombuffer", "array_equal"):
        setattr(cp, name, _on_host(getattr(np, name)))
    cp.asnumpy = lambda a: a.get() if isinstance(a, ModelArray) else np.array(a, copy=True)
    cp.get_array_module = lambda *a: cp
    cp.from_dlpack = lambda x: _dev(np.from_dlpack(x))
    return cp


@contextmanager
def install(stall_s: float = STALL_S, concurrent_streams: bool = False, max_group_ops: int | None = MAX_GROUP_OPS):
    """Run the block with the model standing in for CuPy (``sys.modules['cupy']``,
    ``cupy.cuda``, ``cupy.cuda.nccl``); yields the ``NcclModel``. What was there before
    (nothing, on a machine without CuPy) is put back after."""
    global _ACTIVE
    model = NcclModel(stall_s, concurrent_streams, max_group_ops)
    nccl = _nccl_module()
    cp = _cupy_module(nccl)
    saved = {k: sys.modules.get(k) for k in ("cupy", "cupy.cuda", "cupy.cuda.nccl")}
    previous, previous_null = _ACTIVE, Stream.null
    _ACTIVE = model
    Stream.null = _NullStream(model)
    sys.modules.update({"cupy": cp, "cupy.cuda": cp.cuda, "cupy.cuda.nccl": nccl})
    try:
        yield model
    finally:
        _ACTIVE, Stream.null = previous, previous_null
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def on_device(a, device: int) -> ModelArray:
    """``a``'s memory as a model array living on GPU ``device`` (no copy)."""
    out = np.asarray(a).view(ModelArray)
    out._device = int(device)
    return out


def device_array(a) -> ModelArray:
    """A copy of ``a`` as a model device array."""
    return np.array(a, copy=True).view(ModelArray)
