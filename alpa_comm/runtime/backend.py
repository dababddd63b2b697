"""Communication backends behind one small interface (``Backend``, an ABC).

A backend connects the host workers (one rank per host) and moves flat byte
buffers (``numpy.uint8`` arrays) between them: ``isend``/``irecv`` return a
handle whose ``wait(timeout)`` raises ``CommunicationError`` naming the peer
host; ``send``/``recv`` are the blocking forms; plus ``barrier`` and
``close``. What a backend can do beyond that is declared, not probed: the class
attributes ``concurrent``, ``issue_ordered``, ``vectored``, ``rendezvous``,
``streams`` and ``fresh_after_failure`` (``Backend`` says what each means). Its
``name`` is a ``Transport`` (a ``str`` enum: ``"tcp"``, ``"gloo"``, ... compare equal to
it). Strategies are written once on top of it (``executor``); backends differ only in
the primitive calls.

* ``GlooBackend``: ``torch.distributed`` gloo on CPU tensors, zero-copy from
  NumPy (``torch.from_numpy``). gloo's own broadcast (``gloo::broadcast``, what
  torch's ProcessGroupGloo calls) sends the whole buffer along a binomial tree
  and does not pipeline, so chunked broadcasts are built from isend/irecv.
* ``NcclBackend``: CuPy ``NcclCommunicator`` send/recv on a CUDA stream, for
  CuPy buffers; imported lazily, exercised only where a GPU exists.
* ``ThreadBackend``: ranks as threads of one process, for fast tests of the
  executor without Ray or sockets.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from abc import ABC, abstractmethod
from datetime import timedelta
from enum import Enum
from typing import ClassVar, Sequence

import numpy as np

from .._extras import require
from ..bounds import even_bounds
from ..errors import CommunicationError, InvalidArgumentError
from ..validation import MAX_STREAMS, check_streams  # noqa: F401 - MAX_STREAMS: this module's name for it, kept

DEFAULT_TIMEOUT_S = 30.0


class Handle:
    """A pending send or receive."""

    def __init__(self, wait_fn, what: str):
        self._wait, self.what = wait_fn, what

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._wait(timeout)


class Transport(str, Enum):
    """The transports a ``Backend`` is (its ``name``); each value is the name users write,
    and compares equal to it (``Transport.TCP == "tcp"``)."""

    THREAD = "thread"
    TCP = "tcp"
    GLOO = "gloo"
    NCCL = "nccl"

    def __str__(self) -> str:
        return self.value


class Backend(ABC):
    """The transport interface: ``rank`` is the host id, ``world`` the number of hosts.
    A subclass implements ``isend``, ``irecv`` and ``barrier`` and declares what it can do
    in the class attributes below (the executor reads them, it never probes)."""

    name: ClassVar[Transport]
    rank: int
    world: int
    concurrent: ClassVar[bool] = True
    """Sends and receives of different transfers may be posted from several threads at once
    and match by (peer, tag) whatever their order: the executor keeps many in flight."""
    issue_ordered: ClassVar[bool] = False
    """Messages between two hosts match in the order they were issued, not by tag (NCCL).
    The executor still keeps transfers in flight at once, but issues every transfer's
    operations in the plan's order on every host: posted ones from its dispatching thread,
    one that must react to arrivals alone (``runtime/dispatch.py``)."""
    vectored: ClassVar[bool] = False
    """``isend``/``irecv`` take ``Pieces`` (several buffers, one message) as they are."""
    rendezvous: ClassVar[bool] = False
    """``isend``/``irecv`` take ``rendezvous=True``: a large send then waits for its
    receive to be posted (``runtime.tcp``)."""
    streams: int = 1
    """Connections per pair of hosts; a message rides one (large ones are striped over all)."""
    chunk_gap_share: ClassVar[float | None] = None
    """What a chunk posted behind others on a busy stream costs beyond its bytes, as a share
    of the message latency the planner is told (``topology.ClusterSpec.chunk_gap_s``); None:
    the cost model's ``PIPELINED_GAP_SHARE``, measured with gloo. A group passes it to the
    planner, which picks a chain's chunk count from it."""
    fresh_after_failure: ClassVar[bool] = False
    """After a failed call its user closes this backend and makes a new one: messages of
    the failed call may still be held (an eager transport) and must not meet a later one."""

    @abstractmethod
    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Handle:
        """Post a send of ``buf`` to host ``peer`` with ``tag``; never blocks."""

    @abstractmethod
    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Handle:
        """Post a receive into ``buf`` from host ``peer`` with ``tag``; never blocks."""

    @abstractmethod
    def barrier(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Return once every host has called it; a host missing after ``timeout`` is named."""

    def send(self, buf: np.ndarray, peer: int, tag: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.isend(buf, peer, tag).wait(timeout)

    def recv(self, buf: np.ndarray, peer: int, tag: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.irecv(buf, peer, tag).wait(timeout)

    def launch_posted(self) -> None:
        """Start every operation posted so far now, together (a backend that starts them
        only when waited for: NCCL). The executor calls it before it blocks where it keeps
        several transfers in flight on an ``issue_ordered`` backend."""

    def transfer_posted(self) -> None:
        """What was posted since the last call is one whole transfer: a backend that starts
        posted operations as one group may end a group here (NCCL: before it grows past
        the operations a group may hold)."""

    def allreduce_sum(self, flat: np.ndarray, hosts: Sequence[int], tag_base: int,
                      timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Sum the 1-D ``flat`` over ``hosts`` in place; every host in ``hosts`` calls it.
        Here a bandwidth-optimal ring over ``isend``/``irecv`` (tags from ``tag_base``);
        backends with a collective of their own (gloo) use it instead."""
        ring_allreduce_sum(self, flat, hosts, tag_base, timeout)

    def close(self) -> None:
        pass


def ring_allreduce_sum(backend: Backend, flat: np.ndarray, hosts: Sequence[int], tag_base: int,
                       timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Ring all-reduce (reduce-scatter, then all-gather): every host sends and receives
    2(n-1)/n of ``flat``, the bandwidth-optimal amount."""
    hosts = list(hosts)
    n = len(hosts)
    if n == 1:
        return
    if backend.rank not in hosts:
        raise InvalidArgumentError(f"host {backend.rank} is not in the all-reduce group {hosts}")
    p = hosts.index(backend.rank)
    nxt, prv = hosts[(p + 1) % n], hosts[(p - 1) % n]
    bounds = even_bounds(0, flat.size, n)
    chunk = [flat[bounds[c]:bounds[c + 1]] for c in range(n)]  # contiguous: ``flat`` is 1-D
    scratch = np.empty_like(flat, shape=(max(c.size for c in chunk),))  # flat's own memory kind (CuPy: device)

    def exchange(out: np.ndarray, into: np.ndarray, tag: int) -> None:
        send = backend.isend(out.view(np.uint8), nxt, tag)
        recv = backend.irecv(into.view(np.uint8), prv, tag)
        recv.wait(timeout)
        send.wait(timeout)

    for s in range(n - 1):  # reduce-scatter: afterwards host p owns the sum of chunk p+1
        into = chunk[(p - s - 1) % n]
        tmp = scratch[:into.size]
        exchange(chunk[(p - s) % n], tmp, tag_base + s)
        into += tmp
    for s in range(n - 1):  # all-gather the summed chunks around the ring
        exchange(chunk[(p + 1 - s) % n], chunk[(p - s) % n], tag_base + n + s)


# ------------------------------------------------------------------------ gloo
def _readable_tensor(buf):
    """A torch view of ``buf`` for sending: a read-only array (a jax.Array's host view) is
    shared as is, without torch's warning about writes (a send never writes)."""
    import warnings  # noqa: PLC0415

    import torch  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(buf)


def gloo_handle(rank: int, work, peer: int | str, what: str) -> Handle:
    """A handle on a gloo ``Work``: its wait is bounded and names the peer host."""
    def wait(timeout: float) -> None:
        try:
            ok = work.wait(timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001
            raise CommunicationError(f"host {rank}: {what} host {peer} failed: {e}") from e
        if ok is False:
            raise CommunicationError(f"host {rank}: {what} host {peer} timed out after {timeout:g} s")
    return Handle(wait, f"{what} host {peer}")


class GlooBackend(Backend):
    """torch.distributed gloo; one process group over all host workers."""

    name = Transport.GLOO

    def __init__(self, rank: int, world: int, master_addr: str, master_port: int,
                 timeout: float = DEFAULT_TIMEOUT_S):
        dist = require("torch.distributed")  # optional: the extra to install named when absent

        self._dist = dist
        self.rank, self.world = rank, world
        try:
            dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - re-raised with the host named
            raise CommunicationError(f"host {rank}: joining the gloo group at {master_addr}:{master_port} "
                                     f"failed: {e}") from e

    def _handle(self, work, peer: int | str, what: str) -> Handle:
        return gloo_handle(self.rank, work, peer, what)

    def isend(self, buf, peer, tag):
        return self._handle(self._dist.isend(_readable_tensor(buf), peer, tag=tag), peer, "sending to")

    def irecv(self, buf, peer, tag):
        import torch  # noqa: PLC0415

        return self._handle(self._dist.irecv(torch.from_numpy(buf), peer, tag=tag), peer, "receiving from")

    def barrier(self, timeout=DEFAULT_TIMEOUT_S):
        try:
            self._dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
        except Exception as e:  # noqa: BLE001 - names the missing ranks
            raise CommunicationError(f"host {self.rank}: barrier failed: {e}") from e

    def allreduce_sum(self, flat, hosts, tag_base, timeout=DEFAULT_TIMEOUT_S):
        """gloo's own all-reduce on a process group of ``hosts`` (made once, by the
        member hosts only)."""
        import torch  # noqa: PLC0415

        hosts = sorted(hosts)
        if len(hosts) == 1:
            return
        if self.rank not in hosts:
            raise InvalidArgumentError(f"host {self.rank} is not in the all-reduce group {hosts}")
        work = self._dist.all_reduce(torch.from_numpy(flat), group=self._group(hosts, timeout), async_op=True)
        self._handle(work, ",".join(map(str, hosts)), "all-reducing with").wait(timeout)

    def _group(self, hosts: list[int], timeout: float):
        if len(hosts) == self.world:
            return None  # the default group
        groups = self.__dict__.setdefault("_groups", {})
        key = tuple(hosts)
        if key not in groups:
            try:
                groups[key] = self._dist.new_group(hosts, timeout=timedelta(seconds=timeout),
                                                   use_local_synchronization=True)
            except Exception as e:  # noqa: BLE001 - re-raised with the hosts named
                raise CommunicationError(f"host {self.rank}: forming the all-reduce group with hosts {hosts} "
                                         f"failed: {e}") from e
        return groups[key]

    def close(self):
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


class _Subgroup:
    """What the subgroup backends share: members are host ids, mapped to the backend's own
    ranks (their position among ``hosts``), and a rendezvous ``store`` that records the
    group's first failure."""

    def _member_of(self, host: int, hosts, store) -> None:
        self.hosts = sorted(int(h) for h in hosts)
        if host not in self.hosts:
            raise InvalidArgumentError(f"host {host} is not one of the group's hosts {self.hosts}")
        self._index = {h: i for i, h in enumerate(self.hosts)}
        self._store = store

    def _peer(self, peer: int) -> int:
        try:
            return self._index[peer]
        except KeyError:
            raise CommunicationError(f"host {self.rank}: host {peer} is not in this group {self.hosts}") from None

    def report_failure(self, message: str) -> str:
        """Record ``message`` as the group's first failure unless one is there already;
        returns the first (a host blocked behind a failed peer learns what failed first:
        the peers of a dead process see it go at once, the others only time out)."""
        try:
            first = self._store.compare_set("failure", "", message)
            return first.decode() if isinstance(first, bytes) else str(first)
        except Exception:  # noqa: BLE001 - the store's host may be the one that died
            return message


STRIPE_MIN_BYTES = 4 << 20
"""A message this large is split over every stream (smaller ones ride one: ``stream_of``)."""
TAG_LIMIT = 2**31
"""gloo tags are 32-bit signed integers."""


def stream_of(tag: int, streams: int) -> int:
    """The stream a whole (unstriped) message with ``tag`` rides: a multiplicative hash of
    the tag, so tags that differ by a power of two (the executor's transfers are 1,024
    tags apart) spread over the streams instead of all riding one; both ends agree."""
    return (((tag * 0x9E3779B1) & 0xFFFFFFFF) >> 16) % streams


def striped_handle(handles: list) -> Handle:
    """One handle over the parts of a striped message: its wait waits for every part,
    all within the one timeout."""
    if len(handles) == 1:
        return handles[0]

    def wait(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for h in handles:
            h.wait(max(0.001, deadline - time.monotonic()))
    return Handle(wait, handles[0].what)


class GlooSubgroupBackend(_Subgroup, Backend):
    """gloo among some of the hosts only (``hosts``, this process being ``host``), from a
    rendezvous store: no default process group, so processes outside ``hosts`` take no
    part, and a program's own ``torch.distributed`` use is left alone. Peers are host
    ids, as everywhere in the executor.

    ``streams``: TCP connections per pair of hosts, 1 to ``MAX_STREAMS`` (one gloo device,
    so one context and one I/O thread, each). Where one stream cannot fill a link (loopback, 100 Gbit/s
    NICs), large messages are striped over all of them (``_stripes``)."""

    name = Transport.GLOO
    chunk_gap_share = 1.0
    """In the user's own processes a chunk costs a whole message latency, as over TCP
    (``TcpBackend.chunk_gap_share``): the weight sync to four one-host replicas over this
    backend (``alpa-comm bench --suite weight-sync --mode processes``, 400 Mbit/s, 1 ms
    told) took 0.99 s with 15 chunks of 64 KiB a bucket (a quarter of the latency) and
    0.81 s with the 8 of 120 KiB this share picks. ``Cluster``'s hosts (``GlooBackend``)
    keep the cost model's quarter, measured there with one chain."""

    def __init__(self, host: int, hosts, store, timeout: float = DEFAULT_TIMEOUT_S, streams: int = 1):
        dist = require("torch.distributed")  # optional: the extra to install named when absent

        check_streams(streams)
        self._member_of(host, hosts, store)
        self.rank, self.world, self.streams = host, len(self.hosts), streams
        self._join_barrier(timeout)
        pg_class = dist.ProcessGroupGloo
        opts = pg_class._Options()
        opts._timeout = timedelta(seconds=timeout)
        ifname = os.environ.get("GLOO_SOCKET_IFNAME")
        # one gloo device per stream: a context (own TCP connections, own I/O thread) each;
        # ProcessGroupGloo sends a message with tag t over context t % streams
        opts._devices = [pg_class.create_device(interface=ifname) if ifname else pg_class.create_default_device()
                         for _ in range(streams)]
        try:
            self._pg = pg_class(store, self._index[host], self.world, opts)
        except Exception as e:  # noqa: BLE001 - re-raised with the hosts named
            raise CommunicationError(f"host {host}: joining the gloo group of hosts {self.hosts} failed: {e}") from e

    def _join_barrier(self, timeout: float) -> None:
        """Every member says it is here; one missing after ``timeout`` is named."""
        self._store.set(f"joined/{self.rank}", "1")
        keys = [f"joined/{h}" for h in self.hosts]
        try:
            self._store.wait(keys, timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - find out who is missing
            missing = [h for h, k in zip(self.hosts, keys) if not self._store.check([k])]
            raise CommunicationError(f"host {self.rank}: host(s) {missing} did not join the group of hosts "
                                     f"{self.hosts} within {timeout:g} s") from None

    def _handle(self, work, peer: int, what: str) -> Handle:
        return gloo_handle(self.rank, work, peer, what)

    def _stripes(self, buf, tag: int) -> list:
        """(part, wire tag) of a message: with several streams a message of at least
        ``STRIPE_MIN_BYTES`` goes as one part per stream (wire tag ``tag * n + i`` rides
        context i), a smaller one whole on the stream ``stream_of(tag)`` picks; both ends
        split alike, knowing the size."""
        n = self.streams
        if n == 1:
            return [(buf, tag)]
        base = (tag % (TAG_LIMIT // n)) * n
        if buf.nbytes < STRIPE_MIN_BYTES:
            return [(buf, base + stream_of(tag, n))]
        bounds = even_bounds(0, buf.shape[0], n)
        return [(buf[bounds[i]:bounds[i + 1]], base + i) for i in range(n)]

    def isend(self, buf, peer, tag):
        rank = self._peer(peer)
        return striped_handle([self._handle(self._pg.send([_readable_tensor(part)], rank, t), peer, "sending to")
                               for part, t in self._stripes(buf, tag)])

    def irecv(self, buf, peer, tag):
        import torch  # noqa: PLC0415

        rank = self._peer(peer)
        return striped_handle([self._handle(self._pg.recv([torch.from_numpy(part)], rank, t), peer, "receiving from")
                               for part, t in self._stripes(buf, tag)])

    def barrier(self, timeout=DEFAULT_TIMEOUT_S):
        try:
            self._pg.barrier().wait(timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001
            raise CommunicationError(f"host {self.rank}: barrier with hosts {self.hosts} failed: {e}") from e

    def collective_broadcast(self, buf, root: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """gloo's own broadcast of ``buf`` (in place) from host ``root`` to every member: what
        ``torch.distributed.broadcast`` does on gloo (a binomial tree, the whole buffer each
        round). Not used by plans; it is the gather-then-broadcast baseline's second half."""
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = self._peer(root), 0
        self._handle(self._pg.broadcast([torch.from_numpy(buf)], opts), root, "broadcast from").wait(timeout)


# ------------------------------------------------------------------------ nccl
class NcclBackend(Backend):
    """CuPy NCCL: same interface on CuPy device buffers (imported lazily).

    NCCL matches sends and receives per peer in issue order, runs a stream's work in
    order, and promises no concurrency across streams; a send holds the device until its
    receive runs, so sends and receives that must progress together must be in one
    ``ncclGroupStart/End`` (NCCL's user guide: Point-to-point communication, Group
    calls; ``alpa_comm.testing.nccl_model`` encodes these rules). So ``isend``/``irecv``
    only record the operation, and waiting on a handle launches, as one group on the
    backend's one stream: every send not yet launched, and the receives issued up to the
    awaited one. A ring step (receive, send, wait) becomes one send-receive; a chain's
    middle host that waits for chunk c+1 after issuing the forward of chunk c launches
    both together, so the broadcast stays pipelined; later receives are launched only
    when waited for, so an early group never waits on a peer that needs our later work.
    Per peer, launches keep the issue order, so matching is as issued. The concurrent
    executor (``issue_ordered``) issues transfers in plan order and launches what it
    posted as one group before it blocks (``launch_posted``). A wait polls the group's
    event (never a blocking synchronize) and, past its timeout, aborts the communicator
    and names the peer."""

    name = Transport.NCCL
    MAX_GROUP_OPS = 2048
    """NCCL 2.9-2.11 document at most 2048 operations between groupStart and groupEnd."""
    concurrent = False  # one thread at a time on a communicator
    issue_ordered = True  # matched per peer in issue order: the executor issues in plan order
    fresh_after_failure = True  # unmatched operations of a failed call would shift every later match

    def __init__(self, rank: int, world: int, unique_id, timeout: float = DEFAULT_TIMEOUT_S):
        cupy = require("cupy")  # only where a GPU exists; the extra 'gpu' named when absent
        from cupy.cuda import nccl  # noqa: PLC0415

        self._cupy, self._nccl = cupy, nccl
        self.rank, self.world, self.timeout = rank, world, timeout
        self.comm = nccl.NcclCommunicator(world, unique_id, rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._pending: list = []  # [kind, buf, peer, its group's event once launched], in issue order
        self._lock = threading.RLock()  # NCCL: one thread at a time on a communicator

    @staticmethod
    def new_unique_id():
        from cupy.cuda import nccl  # noqa: PLC0415

        return nccl.get_unique_id()

    def _nccl_peer(self, peer: int) -> int:
        return peer

    def _post(self, kind: str, buf, peer: int, what: str) -> Handle:
        op = [kind, buf, peer, None]
        with self._lock:
            self._pending.append(op)

        def wait(timeout: float) -> None:
            if op[3] is None:
                self._launch_through(op)
            self._wait_event(op[3], timeout, f"{what} host {peer}")
        return Handle(wait, f"{what} host {peer}")

    def launch_posted(self) -> None:
        """Launch every pending operation now, as one group: a transfer the executor posts
        while others are in flight starts at once, its group behind theirs on the stream."""
        with self._lock:
            if self._pending:
                self._launch_through(self._pending[-1])

    def transfer_posted(self) -> None:
        """Past half a group's worth of pending operations, launch them, so that groups end
        between whole transfers where a transfer has fewer than half a group's operations
        (``_launch_through`` cuts a larger group in issue order)."""
        with self._lock:
            if len(self._pending) >= self.MAX_GROUP_OPS // 2:
                self.launch_posted()

    def _launch_through(self, awaited: list) -> None:
        """Launch, as one group, every pending send and the pending receives issued up to
        ``awaited`` (which is launched too)."""
        nccl = self._nccl
        with self._lock:
            if awaited[3] is not None:
                return
            cut = next(i for i, op in enumerate(self._pending) if op is awaited)
            chosen = [op[0] == "send" or i <= cut for i, op in enumerate(self._pending)]
            group = [op for op, c in zip(self._pending, chosen) if c]
            self._pending = [op for op, c in zip(self._pending, chosen) if not c]
            # the NCCL stream is non-blocking: it waits for what the caller's stream (packing,
            # copies) enqueued before these buffers are read or written
            self.stream.wait_event(self._cupy.cuda.get_current_stream().record())
            for at in range(0, len(group), self.MAX_GROUP_OPS):  # consecutive groups, in issue order
                part = group[at:at + self.MAX_GROUP_OPS]
                nccl.groupStart()
                try:
                    for kind, buf, peer, _ in part:
                        fn = self.comm.send if kind == "send" else self.comm.recv
                        fn(buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, self._nccl_peer(peer), self.stream.ptr)
                finally:
                    nccl.groupEnd()
            event = self.stream.record()
            for op in group:
                op[3] = event

    def _wait_event(self, event, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not event.done:
            if time.monotonic() > deadline:
                self.comm.abort()
                raise CommunicationError(f"host {self.rank}: {what} timed out after {timeout:g} s")
            time.sleep(0.0002)

    def isend(self, buf, peer, tag):  # NCCL matches by order per peer; tags are not needed
        return self._post("send", buf, peer, "sending to")

    def irecv(self, buf, peer, tag):
        return self._post("recv", buf, peer, "receiving from")

    def barrier(self, timeout=DEFAULT_TIMEOUT_S):
        one = self._cupy.zeros(1, dtype=self._cupy.float32)
        with self._lock:
            self.comm.allReduce(one.data.ptr, one.data.ptr, 1, self._nccl.NCCL_FLOAT32, self._nccl.NCCL_SUM,
                                self.stream.ptr)
            event = self.stream.record()
        self._wait_event(event, timeout, "barrier with every host")

    def close(self):
        self.comm.destroy()


class NcclSubgroupBackend(_Subgroup, NcclBackend):
    """NCCL among some hosts only (``hosts``, this process being ``host``) on this process's
    one GPU, for ``alpa_comm.jax``: the lowest member makes the NCCL id and shares it
    through the subgroup's rendezvous ``store`` (as ``GlooSubgroupBackend`` shares its
    group); peers are host ids. Runs here on the NCCL model, in threads and in processes
    (``testing.nccl_model_remote``); not on GPUs yet: one GPU cannot hold NCCL ranks of two
    processes."""

    def __init__(self, host: int, hosts, store, device_ordinal: int, timeout: float = DEFAULT_TIMEOUT_S):
        import json  # noqa: PLC0415

        cupy = require("cupy")  # only where a GPU exists; the extra 'gpu' named when absent

        self._member_of(host, hosts, store)
        if host == self.hosts[0]:
            store.set("nccl_id", json.dumps([int(b) for b in self.new_unique_id()]))
        try:
            store.wait(["nccl_id"], timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001
            raise CommunicationError(f"host {host}: host {self.hosts[0]} did not share the NCCL id of the group "
                                     f"of hosts {self.hosts} within {timeout:g} s") from None
        uid = tuple(json.loads(store.get("nccl_id")))
        cupy.cuda.Device(device_ordinal).use()
        super().__init__(self._index[host], len(self.hosts), uid, timeout)
        self.rank = host  # errors name hosts, as everywhere in the executor

    def _nccl_peer(self, peer: int) -> int:
        return self._peer(peer)  # NCCL's rank of host ``peer``; errors still name the host


# ---------------------------------------------------------------------- threads
class ThreadHub:
    """Mailboxes shared by the ThreadBackend ranks of one process."""

    def __init__(self, world: int):
        self.world = world
        self.hosts: list[int] = list(range(world))  # the ranks that take part (a run may use fewer)
        self._boxes: dict[tuple[int, int, int], queue.Queue] = {}
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(world)
        self.dead: set[int] = set()

    def box(self, src: int, dst: int, tag: int) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((src, dst, tag), queue.Queue())


class ThreadBackend(Backend):
    """Ranks as threads; a send copies into the peer's mailbox (eager, like small TCP sends)."""

    name = Transport.THREAD

    def __init__(self, rank: int, hub: ThreadHub):
        self.rank, self.world, self.hub = rank, hub.world, hub

    def isend(self, buf, peer, tag):
        self.hub.box(self.rank, peer, tag).put(np.array(buf, copy=True))
        return Handle(lambda timeout: None, f"sending to host {peer}")

    def irecv(self, buf, peer, tag):
        box = self.hub.box(peer, self.rank, tag)

        def wait(timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    data = box.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                    break
                except queue.Empty:
                    if peer in self.hub.dead:
                        raise CommunicationError(f"host {self.rank}: receiving from host {peer} failed: "
                                                 f"host {peer} is gone") from None
                    if time.monotonic() >= deadline:
                        raise CommunicationError(f"host {self.rank}: receiving from host {peer} timed out "
                                                 f"after {timeout:g} s") from None
            if data.nbytes != buf.nbytes:
                raise CommunicationError(f"host {self.rank}: got {data.nbytes} bytes from host {peer}, "
                                         f"expected {buf.nbytes} (tag {tag})")
            buf[...] = data.reshape(buf.shape)
        return Handle(wait, f"receiving from host {peer}")

    def barrier(self, timeout=DEFAULT_TIMEOUT_S):
        try:
            self.hub._barrier.wait(timeout)
        except threading.BrokenBarrierError:
            raise CommunicationError(f"host {self.rank}: barrier timed out after {timeout:g} s") from None
