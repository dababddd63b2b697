"""``TcpBackend``: alpa_comm's own transport, plain TCP sockets that gather and scatter.

Why a transport of our own beside gloo: gloo (through torch) sends one contiguous
buffer per message, so a bucket of a tree's small leaves must first be packed into one
(a copy of every byte) and unpacked after (another); at link speed those copies, not
the wire, set a 200-leaf tree's time. TCP's ``sendmsg``/``recvmsg_into`` take a list
of buffers, so a ``Pieces`` message leaves straight from the shards' memory and lands
straight in the destination regions: the kernel's own two copies are all there are,
as for one big buffer.

The protocol, per TCP stream (``streams`` per pair of hosts):

* a message is a header (tag, byte count) and its bytes; one sending thread per stream
  writes queued sends in the order they were posted, so ``isend`` never blocks its
  caller, and one receiving thread per stream reads messages in arrival order; where
  nothing is queued or being written, the thread that posts a message (or reads the
  clear-to-send it waited for) writes it itself, as much as the socket takes without
  blocking, and the sending thread finishes the rest before anything else: a small
  call's messages then leave without waking another thread (a wake-up is 0.1-1 ms on a
  virtual machine's idle core);
* an arriving message goes into the receive posted with its tag (the oldest such, so
  a tag used again in the next call matches in order, as in MPI); a message nobody
  has asked for yet is read into a buffer of its own and copied into the receive once
  it is posted (an eager protocol: the stream is never blocked behind a late receive,
  so no order of posting can deadlock it; the copy is the price of a late receive);
* a send posted with ``rendezvous=True`` of at least ``RENDEZVOUS_MIN_BYTES`` waits for
  its receiver's clear-to-send (a header with the ``CTS`` flag, which the receiving
  side writes when that receive, also posted with ``rendezvous=True``, is posted), and
  the sending thread meanwhile writes whatever else is ready, in posting order: a large
  message never arrives before its receive (no buffer of its own: a memory budget
  holds, and data crosses a link when its receiver has admitted it, as the simulator
  models it). Both ends must choose alike; the resharding executor does (every
  message of a plan), and a clear-to-send always comes (docs/runtime.md, "Why the
  executor cannot deadlock");
* a message of at least ``STRIPE_MIN_BYTES`` is cut into one part per stream, both
  ends cutting alike (``GlooSubgroupBackend`` does the same).

Failures: a peer that closes its sockets or dies fails every receive posted on them at
once, naming the host; a wait past its timeout names the host and what was awaited.
Setting up: every member listens on ``address`` (this host's address as the others
see it), publishes it in the subgroup's store, connects to every member above it and
accepts every member below it; a member that does not appear is named.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections import deque
from datetime import timedelta

import numpy as np

from ..bounds import even_bounds
from ..errors import InvalidArgumentError
from ..validation import check_streams, positive_number
from .backend import (DEFAULT_TIMEOUT_S, STRIPE_MIN_BYTES, Backend, CommunicationError, Handle, Transport, _Subgroup,
                      stream_of, striped_handle)
from .host_memory import raw_bytes
from .pieces import Pieces
from .thread_cpu import name_os_thread

HEADER = struct.Struct("!qQ")  # tag, bytes that follow (or CTS: a clear-to-send for that tag, no bytes)
CTS = 1 << 63
RENDEZVOUS_MIN_BYTES = 64 << 10
"""Messages at least this large that are posted with ``rendezvous=True`` wait for their
receiver's clear-to-send; smaller ones go eagerly, their early buffers being small. Not
lower: a clear-to-send is a message of its own, and on 16 emulated hosts at 50 Mbit/s
(2 cores) one per 16-24 KiB chunk kept 79-82 % of the cores busy (one host to 15:
broadcast 1.7x, double tree 1.4x slower), more than what holding small chunks gained
(broadcast of eight slices 1.26x faster)."""
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux's number; Python does not name it
PACE_FACTOR = 2.0
"""A connection is paced at no more than this many times its NIC's rate (``pace_gbps``).
TCP otherwise hands the NIC a window's worth of packets at once; several connections
leaving one host then overflow its queue together and back off (on 16 emulated hosts at
50 Mbit/s a double tree's sender dropped 10-20 thousand packets a run and ran 17-29 %
behind the simulator). Paced, the drops went to none and the error to 1-3 %; 1.2x
did as well as 1x, and 2x leaves room for a NIC rate stated low."""
HELLO = struct.Struct("!qq")  # the connecting member's host id, its stream number
try:
    IOV_BATCH = max(16, min(1024, os.sysconf("SC_IOV_MAX")))
except (ValueError, OSError, AttributeError):  # pragma: no cover - every Linux has it
    IOV_BATCH = 1024
"""Buffers one ``sendmsg``/``recvmsg_into`` call takes at most (the kernel's IOV_MAX)."""


def _views(buf, writable: bool) -> list[memoryview]:
    """The memory a message is written from or read into, as byte views."""
    arrays = buf.views if isinstance(buf, Pieces) else [buf]
    out = []
    for a in arrays:
        if a.nbytes:
            v = memoryview(a).cast("B")
            if writable and v.readonly:
                raise InvalidArgumentError(f"a receive buffer must be writable, got a read-only {type(a).__name__} "
                                           f"of {a.nbytes} bytes")
            out.append(v)
    return out


def _advance(views: list, i: int, done: int) -> int:
    """After ``done`` more bytes of ``views[i:]`` went through: the first unfinished view
    (trimmed in place)."""
    while done:
        n = len(views[i])
        if done >= n:
            done -= n
            i += 1
        else:
            views[i] = views[i][done:]
            done = 0
    return i


def send_all(sock: socket.socket, views: list) -> None:
    """Write every view, in order, gathering up to ``IOV_BATCH`` per call."""
    views, i = [v for v in views if len(v)], 0
    while i < len(views):
        i = _advance(views, i, sock.sendmsg(views[i:i + IOV_BATCH]))


def recv_all(sock: socket.socket, views: list, first: bool = False) -> bool:
    """Fill every view, in order, scattering up to ``IOV_BATCH`` per call. False where
    the peer closed before sending anything and ``first`` (a clean end between
    messages); a close midway raises."""
    views, i, got = [v for v in views if len(v)], 0, 0  # an empty view would read as a close
    while i < len(views):
        # MSG_WAITALL: the kernel fills the view before it returns, instead of waking this
        # thread (and its GIL) for every burst a paced link delivers
        n = (sock.recv_into(views[i], 0, socket.MSG_WAITALL) if len(views) - i == 1
             else sock.recvmsg_into(views[i:i + IOV_BATCH], 0, socket.MSG_WAITALL)[0])
        if n == 0:
            if first and got == 0:
                return False
            raise ConnectionError("the connection closed in the middle of a message")
        got += n
        i = _advance(views, i, n)
    return True


class _Op:
    """One posted send or receive on one stream (``waits``: a send that waits for its
    receiver's clear-to-send; ``control``: a clear-to-send this side writes)."""

    __slots__ = ("tag", "views", "nbytes", "done", "error", "cancelled", "waits", "control", "direct")

    def __init__(self, tag: int, views: list, nbytes: int, waits: bool = False, control: bool = False,
                 direct: bool = True):
        self.tag, self.views, self.nbytes = tag, views, nbytes
        self.done = threading.Event()
        self.error: str | None = None
        self.cancelled = False
        self.waits, self.control = waits, control
        self.direct = direct  # may be written by the thread that posts it or reads its clear-to-send

    def wire_views(self) -> list:
        """Its header (tag, and its byte count or ``CTS``) and its bytes, as written."""
        return [memoryview(HEADER.pack(self.tag, CTS if self.control else self.nbytes))] + self.views

    def fail(self, error: str) -> None:
        self.error = error
        self.done.set()


class _Stream:
    """One TCP connection to a peer: its sending thread, its receiving thread, the
    receives posted on it (tag -> oldest first) and the messages that came first."""

    def __init__(self, owner: int, peer: int, index: int, sock: socket.socket):
        self.owner, self.peer, self.index, self.sock = owner, peer, index, sock
        self.lock = threading.Lock()
        self.sends: deque = deque()  # posted sends and clear-to-sends, oldest first
        self.ready = threading.Condition()  # guards ``sends``, ``cleared`` and ``stopping``
        self.cleared: dict[int, int] = {}  # tag -> clear-to-sends that came and no send took yet
        self.stopping = False
        self.writing = False  # a thread is writing a message (guarded by ``ready``): nobody else may
        self.carry: tuple | None = None  # (op, views left, begun): the sending thread's next, before the queue
        self.posted: dict[int, deque] = {}
        self.early: dict[int, deque] = {}  # tag -> messages that arrived before their receive
        self.error: str | None = None
        self.closing = False
        self.current: _Op | None = None  # the receive whose bytes are being read right now
        self.threads = [threading.Thread(target=target, daemon=True, name=f"alpa-comm-tcp-{role}-{owner}-{peer}.{index}")
                        for target, role in ((self._send_loop, "send"), (self._recv_loop, "recv"))]
        for t in self.threads:
            t.start()

    # ----------------------------------------------------------------- posting
    def send(self, tag: int, buf, rendezvous: bool = False, direct: bool = True) -> _Op:
        """Post a send (``direct``: it may be written by the thread that posts it; not the
        parts of a striped message, which the streams' own threads write side by side)."""
        nbytes = int(buf.nbytes)
        op = _Op(tag, _views(buf, writable=False), nbytes, waits=rendezvous and nbytes >= RENDEZVOUS_MIN_BYTES,
                 direct=direct)
        if self.error is not None:
            op.fail(self.error)
            return op
        self._post(op)
        if self.error is not None:  # the stream failed while this was queued: fail it now
            self._fail_queued()
        return op

    def _post(self, op: _Op) -> None:
        """Write ``op`` from the calling thread where the stream is idle and ``op`` may go now
        (``_write_now``: never blocking), else queue it for the sending thread. Why: every
        hand-off to another thread is a wake-up, 0.1-1 ms on a virtual machine's idle core,
        and a small call's messages are mostly hand-offs."""
        with self.ready:
            if (not op.direct or self.sends or self.writing or self.carry is not None or self.stopping
                    or not self._may_go(op)):
                self.sends.append(op)
                self.ready.notify()
                return
            self.writing = True
        self._write_now(op, op.wire_views())

    def _may_go(self, op: _Op) -> bool:
        """(Under ``ready``.) A clear-to-send or an eager send may go; a rendezvous send once
        its clear-to-send came (taking it)."""
        if op.control or not op.waits:
            return True
        if self.cleared.get(op.tag):
            self.cleared[op.tag] -= 1
            if not self.cleared[op.tag]:
                del self.cleared[op.tag]
            return True
        return False

    def _write_now(self, op: _Op, views: list) -> None:
        """(Holding ``writing``.) As much of ``views`` as the socket takes without blocking,
        from this thread; what is left the sending thread writes before anything else
        (``carry``), so no thread that posts or reads ever waits on the wire."""
        views = [v for v in views if len(v)]
        try:
            if self.error is not None:
                raise OSError(self.error)
            try:
                n = self.sock.sendmsg(views[:IOV_BATCH], [], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                n = 0
        except Exception as e:  # noqa: BLE001 - the stream is unusable; never leave ``writing`` held
            with self.ready:
                self.writing = False
                self.ready.notify()
            self._fail(f"the connection to host {self.peer} broke while sending ({e})")
            op.fail(self.error or str(e))
            return
        i = _advance(views, 0, n)
        with self.ready:
            self.writing = False
            if i < len(views):
                self.carry = (op, views[i:], True)
            if self.carry is not None or self.sends:
                self.ready.notify()
        if i == len(views):
            op.done.set()

    def recv(self, tag: int, buf, rendezvous: bool = False) -> _Op:
        try:
            views = _views(buf, writable=True)
        except ValueError as e:  # a read-only buffer (InvalidArgumentError), or one memoryview refuses
            raise CommunicationError(f"host {self.owner}: receiving from host {self.peer} with tag {tag}: "
                                     f"{e}") from None
        op = _Op(tag, views, int(buf.nbytes))
        clear, data = False, None
        with self.lock:
            waiting = self.early.get(tag)
            if not waiting:
                if self.error is not None:
                    op.fail(self.error)
                else:
                    self.posted.setdefault(tag, deque()).append(op)
                    clear = rendezvous and op.nbytes >= RENDEZVOUS_MIN_BYTES  # its sender waits for this
            else:
                data = waiting.popleft()
                if not waiting:
                    del self.early[tag]
        if clear:
            self._post(_Op(tag, [], 0, control=True))
        if data is not None:
            self._deliver_copy(op, data)
        return op

    def forget(self, op: _Op) -> None:
        """A receive whose wait gave up: no later message lands in its memory. One whose
        bytes are being read right now (its peer stalled mid-message) cannot be stopped
        but by ending the stream, which is what happens: the peer is stuck anyway."""
        op.cancelled = True
        with self.lock:
            waiting = self.posted.get(op.tag)
            if waiting and op in waiting:
                waiting.remove(op)
            reading = self.current is op
        if reading:
            self._fail(f"gave up on a message from host {self.peer} in the middle of it (tag {op.tag})")
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ----------------------------------------------------------------- threads
    def _next_send(self) -> tuple | None:
        """The oldest queued send that may go now (a clear-to-send, an eager send, or a
        rendezvous send whose clear-to-send came), waiting until there is one; None once
        the stream stops. A send never passes an older one with its own tag (messages of
        a tag match in the order sent); clear-to-sends are never held back."""
        with self.ready:
            while True:
                if self.stopping:
                    return None
                if self.writing:  # another thread holds the socket
                    self.ready.wait()
                    continue
                got = self._pick()
                if got is None:
                    self.ready.wait()
                    continue
                self.writing = True
                return got

    def _pick(self) -> tuple | None:
        """(Under ``ready``, nobody writing.) The message part to write next and its views: a
        message another thread began, else the oldest queued send that may go now (taken
        off the queue), and whether it is begun; None if none may."""
        if self.carry is not None:
            got, self.carry = self.carry, None
            return got
        held: set[int] = set()  # tags of the waiting sends passed over
        for i, op in enumerate(self.sends):
            if op.cancelled or op.control or (op.tag not in held and self._may_go(op)):
                del self.sends[i]
                return op, op.wire_views(), False
            held.add(op.tag)
        return None

    def _write_ready(self) -> None:
        """Write, without blocking, what may go now if nobody is writing (the receiving
        thread, when a clear-to-send came: no wake-up of the sending thread)."""
        with self.ready:
            got = None if self.writing or self.stopping else self._pick()
            if got is None:
                return
            self.writing = True
        op, views, begun = got
        if not op.direct or (op.cancelled and not begun):
            with self.ready:
                self.writing = False
                if not op.cancelled:
                    self.carry = got  # next for the sending thread, as it would have been
                self.ready.notify()
            return
        self._write_now(op, views)

    def _send_loop(self) -> None:
        name_os_thread(f"tcp-send-{self.peer}.{self.index}")
        while True:
            got = self._next_send()
            if got is None:
                return
            op, views, begun = got
            try:
                if op.cancelled and not begun:
                    pass  # given up before it began: skip it
                elif self.error is not None:
                    op.fail(self.error)
                else:
                    send_all(self.sock, views)
                    op.done.set()
            except OSError as e:
                self._fail(f"the connection to host {self.peer} broke while sending ({e})")
                op.fail(self.error or str(e))
            finally:
                with self.ready:
                    self.writing = False

    def _recv_loop(self) -> None:
        name_os_thread(f"tcp-recv-{self.peer}.{self.index}")
        header = bytearray(HEADER.size)
        try:
            while True:
                if not recv_all(self.sock, [memoryview(header)], first=True):
                    self._fail(f"host {self.peer} closed its connection")
                    return
                tag, n = HEADER.unpack(header)
                if n & CTS:  # our rendezvous send with this tag may go
                    with self.ready:
                        self.cleared[tag] = self.cleared.get(tag, 0) + 1
                    self._write_ready()
                    continue
                with self.lock:
                    op = self._take_posted(tag)
                if op is None:
                    data = raw_bytes(n)  # freed pages go back to the system once it is copied out
                    recv_all(self.sock, [memoryview(data)])
                    with self.lock:
                        op = self._take_posted(tag)  # posted while the bytes came in
                        if op is None:
                            self.early.setdefault(tag, deque()).append(data)
                            continue
                    self._deliver_copy(op, data)
                elif op.nbytes != n:
                    recv_all(self.sock, [memoryview(np.empty(n, np.uint8))])  # keep the stream in step
                    op.fail(f"host {self.peer} sent {n} bytes with tag {tag}, {op.nbytes} were expected")
                else:
                    with self.lock:
                        self.current = op
                    recv_all(self.sock, op.views)
                    with self.lock:
                        self.current = None
                    op.done.set()
        except OSError as e:
            self._fail(f"the connection to host {self.peer} broke while receiving ({e})")
        except BaseException as e:  # noqa: BLE001 - e.g. no memory for a message: the stream is unusable
            self._fail(f"receiving from host {self.peer} failed: {type(e).__name__}: {e}")

    def _take_posted(self, tag: int) -> _Op | None:
        waiting = self.posted.get(tag)
        if not waiting:
            return None
        op = waiting.popleft()
        if not waiting:
            del self.posted[tag]
        return op

    def _deliver_copy(self, op: _Op, data: np.ndarray) -> None:
        if data.nbytes != op.nbytes:
            op.fail(f"host {self.peer} sent {data.nbytes} bytes with tag {op.tag}, {op.nbytes} were expected")
            return
        at = 0
        for v in op.views:
            np.frombuffer(v, np.uint8)[...] = data[at:at + len(v)]
            at += len(v)
        op.done.set()

    def _fail(self, error: str) -> None:
        """The stream is gone: every receive posted on it, and every send queued, fails."""
        with self.lock:
            if self.error is None:
                self.error = "this host closed the connection" if self.closing else error
            posted, self.posted = [op for ops in self.posted.values() for op in ops], {}
            if self.current is not None:  # the one whose bytes were coming in
                posted.append(self.current)
                self.current = None
            # messages that came before their receives stay: a peer may send and then close
        for op in posted:
            op.fail(self.error)
        self._fail_queued()

    def _fail_queued(self) -> None:
        with self.ready:
            queued, self.sends = list(self.sends), deque()
            if self.carry is not None:
                queued.append(self.carry[0])
                self.carry = None
        for op in queued:
            op.fail(self.error)

    def close(self) -> None:
        self.closing = True
        with self.ready:
            self.stopping = True
            self.ready.notify()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _Acceptor:
    """Accepts the ``expected`` connections of the members below this one, on a thread of
    its own, for at most ``timeout`` s: each opens with a ``HELLO`` naming (host, stream).
    ``_lock`` guards ``accepted`` against ``stop``: once stopped, a late connection is
    closed here, never left to a caller that has given up."""

    def __init__(self, listener: socket.socket, expected: int, timeout: float, rank: int):
        self.listener, self.expected, self.timeout = listener, expected, timeout
        self.accepted: dict[tuple[int, int], socket.socket] = {}
        self.errors: list[str] = []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"alpa-comm-tcp-accept-{rank}")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while len(self.accepted) < self.expected and not self._stop.is_set():
            self.listener.settimeout(max(0.01, min(0.5, deadline - time.monotonic())))
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                if time.monotonic() >= deadline:
                    return
                continue
            except OSError as e:
                self.errors.append(str(e))
                return
            if not self._keep(sock):
                return

    def _keep(self, sock: socket.socket) -> bool:
        """Read ``sock``'s hello and keep it; False once stopped (``sock`` then closed)."""
        try:
            sock.settimeout(self.timeout)
            buf = bytearray(HELLO.size)
            recv_all(sock, [memoryview(buf)])
        except (OSError, ConnectionError) as e:
            sock.close()
            self.errors.append(str(e))
            return True
        with self._lock:
            if self._stop.is_set():
                sock.close()
                return False
            self.accepted[HELLO.unpack(buf)] = sock
        return True

    def finish(self, join_s: float) -> dict:
        """Wait (at most ``join_s`` s) for the thread, then ``stop``."""
        self.thread.join(join_s)
        return self.stop()

    def stop(self) -> dict:
        """Accept no more; what was accepted ((host, stream) -> socket), now the caller's."""
        with self._lock:
            self._stop.set()
            return dict(self.accepted)


class TcpBackend(_Subgroup, Backend):
    """TCP among ``hosts`` (this process being ``host``), met through the rendezvous
    ``store``; ``streams`` connections per pair; ``address``: where the others reach this
    host. Gathers and scatters ``Pieces`` (``vectored``). ``pace_gbps``: the NIC's rate;
    each connection is then paced at ``PACE_FACTOR`` times it at most (None: unpaced)."""

    name = Transport.TCP
    vectored = True
    rendezvous = True  # isend/irecv take ``rendezvous=`` (see the module's docstring)
    fresh_after_failure = True  # early messages of a failed call stay buffered: start afresh
    chunk_gap_share = 1.0
    """A chunk costs this transport a whole message latency, even behind others on a busy
    stream: each is a message of its own with its own clear-to-send, and its hand-offs
    between the receiving, forwarding and sending threads of every middle host do not
    overlap on shared cores. Measured: the weight sync to four one-host replicas
    (``alpa-comm bench --suite weight-sync --mode processes``, 400 Mbit/s, 1 ms told) took
    0.81-0.83 s with the chunks this share picks (8 of 120 KiB a bucket), 1.39 s with a
    quarter of it (15 of 64 KiB) and 0.96 s with four times it (4 of 240 KiB)."""

    def __init__(self, host: int, hosts, store, timeout: float = DEFAULT_TIMEOUT_S, streams: int = 1,
                 address: str = "127.0.0.1", pace_gbps: float | None = None):
        check_streams(streams)
        if pace_gbps is not None:
            positive_number(pace_gbps, "pace_gbps", unit="Gbit/s or None")
        self.pace_gbps = pace_gbps
        self._member_of(host, hosts, store)
        self.rank, self.world, self.streams, self.timeout = host, len(self.hosts), streams, timeout
        self._streams: dict[tuple[int, int], _Stream] = {}
        self._barriers = 0
        if self.world > 1:
            self._connect(address, timeout)

    # ------------------------------------------------------------------ set-up
    def _connect(self, address: str, timeout: float) -> None:
        """Listen, publish where, connect to every member above this one and accept every
        member below it (on an ``_Acceptor`` thread meanwhile); a member that does not
        appear within ``timeout`` is named. On any failure nothing is left open."""
        lower = [h for h in self.hosts if h < self.rank]
        higher = [h for h in self.hosts if h > self.rank]
        try:
            listener = socket.create_server((address, 0), backlog=max(16, len(lower) * self.streams))
        except OSError as e:
            raise CommunicationError(f"host {self.rank}: cannot listen on {address} ({e}): set "
                                     f"ALPA_COMM_GROUP_ADDR to an address of this host") from e
        acceptor = _Acceptor(listener, len(lower) * self.streams, timeout, self.rank)
        try:
            self._store.set(f"tcp/{self.rank}", f"{address}:{listener.getsockname()[1]}")
            acceptor.start()
            for peer in higher:
                self._dial(peer, timeout)
            mine = acceptor.finish(timeout + 1)
            missing = sorted({p for p in lower for i in range(self.streams) if (p, i) not in mine})
            if missing:
                raise CommunicationError(f"host {self.rank}: host(s) {missing} did not connect within "
                                         f"{timeout:g} s" + (f" ({acceptor.errors[0]})" if acceptor.errors else ""))
            for (peer, index), sock in mine.items():
                self._add(peer, index, sock)
        except BaseException:
            late = list(acceptor.stop().values())
            self.close()
            for sock in late:
                sock.close()
            raise
        finally:
            listener.close()

    def _dial(self, peer: int, timeout: float) -> None:
        """Open this host's ``streams`` connections to ``peer`` (a member above it)."""
        ip, port = self._address_of(peer, timeout)
        for index in range(self.streams):
            try:
                sock = socket.create_connection((ip, port), timeout=timeout)
                sock.sendall(HELLO.pack(self.rank, index))
            except OSError as e:
                raise CommunicationError(f"host {self.rank}: connecting to host {peer} at {ip}:{port} "
                                         f"failed: {e}") from e
            self._add(peer, index, sock)

    def _address_of(self, peer: int, timeout: float) -> tuple[str, int]:
        key = f"tcp/{peer}"
        try:
            self._store.wait([key], timedelta(seconds=timeout))
            value = self._store.get(key)
        except Exception as e:  # noqa: BLE001 - the peer never published (or the store is gone)
            raise CommunicationError(f"host {self.rank}: host {peer} did not join the group of hosts {self.hosts} "
                                     f"within {timeout:g} s ({type(e).__name__}: {e})") from None
        text = value.decode() if isinstance(value, bytes) else str(value)
        ip, _, port = text.rpartition(":")
        if not ip or not port.isdigit():
            raise CommunicationError(f"host {self.rank}: host {peer} published {text!r} as its address, not HOST:PORT")
        return ip, int(port)

    def _add(self, peer: int, index: int, sock: socket.socket) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.pace_gbps is not None:
            try:  # TCP's own pacing (Linux 4.13 on), at most this many bytes a second
                sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                                struct.pack("Q", int(PACE_FACTOR * self.pace_gbps * 1e9 / 8)))
            except OSError:  # pragma: no cover - a kernel without it sends unpaced, as before
                pass
        self._streams[(peer, index)] = _Stream(self.rank, peer, index, sock)

    # ------------------------------------------------------------------ messages
    def _stripes(self, buf, tag: int) -> list:
        """(part, stream) of a message: one part per stream from ``STRIPE_MIN_BYTES`` on,
        else the whole message on the stream ``stream_of(tag)`` picks."""
        n, size = self.streams, int(buf.nbytes)
        if n == 1 or size < STRIPE_MIN_BYTES:
            return [(buf, stream_of(tag, n) if n > 1 else 0)]
        bounds = even_bounds(0, size, n)
        return [(buf[bounds[i]:bounds[i + 1]], i) for i in range(n)]

    def _stream(self, peer: int, index: int) -> _Stream:
        self._peer(peer)  # names a host outside the group
        try:
            return self._streams[(peer, index)]
        except KeyError:
            raise CommunicationError(f"host {self.rank}: no connection to host {peer}") from None

    def _handle(self, stream: _Stream, op: _Op, what: str, is_recv: bool) -> Handle:
        peer = stream.peer

        def wait(timeout: float) -> None:
            if not op.done.wait(timeout):
                if is_recv:
                    stream.forget(op)
                else:
                    op.cancelled = True
                raise CommunicationError(f"host {self.rank}: {what} host {peer} timed out after {timeout:g} s "
                                         f"(tag {op.tag}, {op.nbytes} bytes)")
            if op.error is not None:
                raise CommunicationError(f"host {self.rank}: {what} host {peer} failed: {op.error}")
        return Handle(wait, f"{what} host {peer}")

    def isend(self, buf, peer, tag, rendezvous: bool = False):
        return self._post(buf, peer, tag, is_recv=False, rendezvous=rendezvous)

    def irecv(self, buf, peer, tag, rendezvous: bool = False):
        return self._post(buf, peer, tag, is_recv=True, rendezvous=rendezvous)

    def _post(self, buf, peer: int, tag: int, is_recv: bool, rendezvous: bool = False) -> Handle:
        """One operation per stripe of the message, waited for as one."""
        handles, stripes = [], self._stripes(buf, tag)
        for part, index in stripes:
            stream = self._stream(peer, index)
            op = (stream.recv(tag, part, rendezvous) if is_recv
                  else stream.send(tag, part, rendezvous, direct=len(stripes) == 1))
            handles.append(self._handle(stream, op, "receiving from" if is_recv else "sending to", is_recv))
        return striped_handle(handles)

    def barrier(self, timeout=DEFAULT_TIMEOUT_S):
        """Everyone tells the lowest member, which then tells everyone (tags below zero
        are the backend's own: the executor's are never negative)."""
        if self.world == 1:
            return
        self._barriers += 1
        tag, root = -self._barriers, self.hosts[0]
        byte = np.zeros(1, np.uint8)
        try:
            if self.rank == root:
                others = self.hosts[1:]
                for h in [self.irecv(np.zeros(1, np.uint8), p, tag) for p in others]:
                    h.wait(timeout)
                for h in [self.isend(byte, p, tag) for p in others]:
                    h.wait(timeout)
            else:
                self.isend(byte, root, tag).wait(timeout)
                self.irecv(np.zeros(1, np.uint8), root, tag).wait(timeout)
        except CommunicationError as e:
            raise CommunicationError(f"host {self.rank}: barrier with hosts {self.hosts} failed: {e}") from e

    def close(self, join_s: float = 5.0) -> None:
        """Close every stream, then wait (at most ``join_s`` s in all) for their threads
        to end: once it returns, no byte lands in a posted receive's memory any more
        (the kernel still hands over what it buffered before the close)."""
        streams = list(self._streams.values())
        for stream in streams:
            stream.close()
        self._streams.clear()
        deadline = time.monotonic() + join_s
        me = threading.current_thread()
        for stream in streams:
            for t in stream.threads:
                if t is not me:
                    t.join(max(0.0, deadline - time.monotonic()))
