"""The processes that reshard together, and how they find each other.

A ``ProcessGroup`` is this process's membership of a set of ``world_size`` processes
(rank = its host index in the plans; in a ``jax.distributed`` program,
``jax.process_index()``). Only the processes of a resharding's two meshes take part in
it, so the group does not open one connection among everyone: for each set of
participating processes it makes, on first use, a subgroup among exactly those: over
TCP each member publishes where it listens in the group's key-value store
(``_SubgroupStore``: a group of JAX processes or Ray actors needs no torch); for gloo and NCCL the lowest member hosts a torch
``TCPStore`` for the subgroup and publishes its address there. The subgroup's transport
(``backend``):

* ``"tcp"`` (the default): alpa_comm's own TCP streams (``runtime.tcp.TcpBackend``),
  which send a bucket of many leaves straight from their shards and receive it straight
  into the result's memory (no packing copy: at link speed a 200-leaf tree moves about
  1.2x faster than over gloo);
* ``"gloo"``: torch's gloo (``runtime.backend.GlooSubgroupBackend``);
* ``"nccl"``: NCCL on one GPU per process.

The key-value store the members meet through:

* ``ProcessGroup.from_jax()`` (what ``default_group()`` makes): JAX's own distributed
  key-value store, so a ``jax.distributed`` program needs no set-up;
* ``ProcessGroup(rank, world_size, address="HOST:PORT")``: a TCP store at ``address``
  that rank 0 hosts (rank 0 must make its group, even if it reshards nothing);
* ``ProcessGroup.from_ray(name, rank, world_size)``: Ray actors (or tasks, or a driver)
  meet at a named Ray actor holding the key-value store, made by whichever arrives first.

Transfers then use the runtime's executor over that backend: same kinds, same
timeouts naming the peer host as in ``alpa_comm.Cluster``. ``backend="nccl"`` (one GPU
per process) moves device memory handed over by DLPack (``buffers="device"``, see
``buffers``); tcp and gloo move host memory, or CPU devices' own memory by DLPack with
``buffers="device"``.
"""
from __future__ import annotations

import math
import os
import socket
import threading
import time
from datetime import timedelta

from .._extras import require
from ..errors import AlpaCommError, CommunicationTimeoutError, InvalidOptionError
from ..runtime.backend import (DEFAULT_TIMEOUT_S, Backend, CommunicationError, GlooSubgroupBackend,
                               NcclSubgroupBackend, Transport)
from ..runtime.host_memory import DEFAULT_MAX_FREE_BYTES, BufferPool
from ..validation import (MAX_STREAMS, check_streams, is_choice, is_int, non_negative_int, non_negative_number,
                          positive_number)
from .placement import has_device_memory

BACKENDS = tuple(t.value for t in (Transport.TCP, Transport.GLOO, Transport.NCCL))
"""The transports a ``ProcessGroup`` runs on: ``Transport`` names, as plain ``str``."""
DEFAULT_BACKEND = Transport.TCP.value
DEFAULT_STREAM_GBPS = 10.0
"""What one TCP stream between two hosts carries, for ``streams="auto"``: about what a
Linux TCP stream sustains between hosts; on this kind of machine, over loopback, one
gloo stream moved 27-31 Gbit/s, two 36-42 and four up to 49, and four streams of the TCP
transport about 30-35 (``alpa-comm bench --mode processes --suite same-layout --streams
N`` measures both transports' raw rate on N streams)."""
DEFAULT_NIC_GBPS = 40.0
"""What a group told no NIC rate (``nic_gbps=None``) plans for and sizes its streams by:
a fast link (a loopback link carried 36-42 Gbit/s over two streams; cluster NICs carry
100-400). Such a group paces nothing: a guess must never hold a faster link back (paced
at twice a 10 Gbit/s guess, a 200 x 256 KiB tree on loopback took 1.8x its time)."""
BUFFERS = ("host", "device")
_default: dict = {}


class _JaxKV:
    """JAX's distributed key-value store (``jax.distributed``'s client)."""

    def __init__(self, client):
        self.client = client

    def set(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value)

    def get(self, key: str, timeout: float) -> str:
        return self.client.blocking_key_value_get(key, int(timeout * 1000))

    def set_if_absent(self, key: str, value: str) -> str:
        """What is under ``key``: ``value`` if it was not there (JAX refuses a key twice)."""
        try:
            self.client.key_value_set(key, value)
            return value
        except Exception:  # noqa: BLE001 - ALREADY_EXISTS: another member was first
            return self.get(key, 5.0)


class _TcpKV:
    """A torch ``TCPStore`` at ``host:port`` (hosted by rank 0)."""

    def __init__(self, host: str, port: int, is_master: bool, timeout: float):
        dist = require("torch.distributed")  # optional: a missing torch names its extra

        self.store = dist.TCPStore(host, port, None, is_master, timedelta(seconds=timeout), wait_for_workers=False)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str, timeout: float) -> str:
        self.store.set_timeout(timedelta(seconds=timeout))
        return self.store.get(key).decode()

    def set_if_absent(self, key: str, value: str) -> str:
        """What is under ``key``: ``value`` if it was not there (one atomic step)."""
        got = self.store.compare_set(key, "", value)
        return got.decode() if isinstance(got, bytes) else str(got)


class _RayStore:
    """The key-value store of a Ray group: a tiny named actor (methods run one at a time).

    Detached, so it outlives whichever member made it (that member may be the one that
    dies); it ends itself after ``idle_s`` seconds without a call, so nothing is left
    behind on a long-lived Ray cluster."""

    def __init__(self, idle_s: float):
        self.data: dict[str, str] = {}
        self.members: set[int] = set()
        self.last = time.monotonic()

        def watch():
            while time.monotonic() - self.last < idle_s:
                time.sleep(min(1.0, idle_s / 10))
            os._exit(0)  # an actor may end its own process; Ray records it as exited

        threading.Thread(target=watch, daemon=True).start()

    def set(self, key: str, value: str) -> None:
        self.last = time.monotonic()
        self.data[key] = value

    def get(self, key: str):
        self.last = time.monotonic()
        return self.data.get(key)

    def set_if_absent(self, key: str, value: str) -> str:
        """What is under ``key``: ``value`` if it was not there (the actor runs one call at
        a time, so this is atomic)."""
        self.last = time.monotonic()
        return self.data.setdefault(key, value)

    def join(self, rank: int) -> bool:
        """False when ``rank`` joined this group before (its keys would be stale)."""
        self.last = time.monotonic()
        fresh = rank not in self.members
        self.members.add(rank)
        return fresh


class _RayKV:
    """A named ``_RayStore`` actor, made by the first member that asks for it; a get polls
    until the key is there or the timeout passes."""

    POLL_S = 0.01
    IDLE_S = 24 * 3600.0  # longer than any pause between weight syncs (an RL rollout phase)

    def __init__(self, name: str, namespace: str | None, rank: int):
        import ray  # noqa: PLC0415

        self._ray, self.name = ray, f"alpa_comm_group:{name}"
        # detached actors need a named namespace; one per Ray job keeps jobs apart
        namespace = namespace or f"alpa_comm-{ray.get_runtime_context().get_job_id()}"
        actor = ray.remote(num_cpus=0)(_RayStore)
        self.actor = actor.options(name=self.name, namespace=namespace, get_if_exists=True,
                                   lifetime="detached").remote(self.IDLE_S)
        if not self._call(self.actor.join, rank):
            raise InvalidOptionError(f"rank {rank} already joined the Ray group {name!r} in this job (namespace "
                                     f"{namespace}): a new group needs a new name")

    def _call(self, method, *args):
        try:
            return self._ray.get(method.remote(*args))
        except self._ray.exceptions.RayError as e:
            raise CommunicationError(f"the group's Ray store {self.name} is gone: {e}") from e

    def set(self, key: str, value: str) -> None:
        self._call(self.actor.set, key, value)

    def set_if_absent(self, key: str, value: str) -> str:
        return self._call(self.actor.set_if_absent, key, value)

    def get(self, key: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            value = self._call(self.actor.get, key)
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise CommunicationTimeoutError(f"key {key!r} did not appear in the Ray group store within {timeout:g} s")
            time.sleep(self.POLL_S)


class _SubgroupStore:
    """A subgroup's rendezvous in the group's own key-value store, under ``prefix``: what
    the TCP transport needs of a store (``set``, ``wait``, ``get``, ``compare_set``),
    without torch, so a group of JAX processes or Ray actors makes its first transfer
    without importing ``torch.distributed`` (1-2.5 s here)."""

    def __init__(self, kv, prefix: str, timeout: float):
        self.kv, self.prefix, self.timeout = kv, prefix, timeout
        self._seen: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.kv.set(f"{self.prefix}/{key}", value)

    def wait(self, keys, timeout: timedelta) -> None:
        for key in keys:
            if key not in self._seen:
                self._seen[key] = self.kv.get(f"{self.prefix}/{key}", timeout.total_seconds())

    def get(self, key: str) -> str:
        self.wait([key], timedelta(seconds=self.timeout))
        return self._seen[key]

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        """``desired`` under ``key`` if nothing is there yet (``expected`` is only ever "":
        the first failure of a group is what its members report), else what is there."""
        return self.kv.set_if_absent(f"{self.prefix}/{key}", desired)


def _import_in_background(module: str) -> None:
    """Start importing ``module`` on a thread: ``torch.distributed`` takes 1-2.5 s to import
    here, which would otherwise be most of the first call's join (the join itself, store
    and gloo connections, takes milliseconds). A later import waits for this one. A module
    that is not installed is left to that import (``_extras.require``), which names the
    extra to install in one line; this thread prints nothing."""
    import importlib  # noqa: PLC0415
    import sys  # noqa: PLC0415

    def load() -> None:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the import where the module is needed raises MissingExtraError naming its extra

    if module not in sys.modules:
        threading.Thread(target=load, daemon=True, name=f"alpa-comm-import-{module}").start()


def streams_for(streams, nic_gbps: float, stream_gbps: float) -> int:
    """TCP streams per pair of hosts: as asked, or ``"auto"``: as many as the NIC needs at
    ``stream_gbps`` a stream (at most ``MAX_STREAMS``)."""
    if streams == "auto":
        positive_number(stream_gbps, "stream_gbps", unit="Gbit/s")
        return max(1, min(MAX_STREAMS, math.ceil(nic_gbps / stream_gbps - 1e-9)))
    return check_streams(streams, allow_auto=True)


def _transport_class(backend: str) -> type[Backend]:
    """The class a group of ``backend`` makes its subgroups of (``_join``), for what it
    declares; neither torch nor CuPy is needed to read it."""
    if backend == "tcp":
        from ..runtime.tcp import TcpBackend  # noqa: PLC0415

        return TcpBackend
    return GlooSubgroupBackend if backend == "gloo" else NcclSubgroupBackend


def _buffers(backend: str, buffers: str | None) -> str:
    """The buffers a group keeps: as asked, else device memory for NCCL and host for tcp and gloo."""
    return buffers or ("device" if backend == "nccl" else "host")


DEFAULT_LATENCY_S = 200e-6
"""What a group told nothing plans one message to cost beyond its bytes: about what a
striped message costs the TCP transport's threads end to end (a clear-to-send per
stripe, a thread hand-off on each side), not the wire's latency. It sizes the buckets
a tree is packed into (``coalesce.auto_bucket_bytes``: 20 x latency x rate, 20 MB at
the default 40 Gbit/s) and the chunks of a chain. Measured with
``benchmarks/user_script.py`` (two processes on loopback, medians of 15): against 50 us,
the sweep's reshard_tree times were 0.62-0.92x at 64 KiB to 4 MiB leaves (100 x 1 MiB:
49 -> 31 ms) and 20 us cut few-leaf trees into buckets too small to keep the wire busy."""


def _check_rank(rank, world_size) -> None:
    if not (is_int(world_size) and world_size >= 1 and is_int(rank) and 0 <= rank < world_size):
        raise InvalidOptionError(f"rank {rank!r} must be in [0, world_size) with world_size {world_size!r} >= 1")


def _reachable_ip(towards: str | None, own: str | None = None) -> str:
    """This process's address as others see it: ``$ALPA_COMM_GROUP_ADDR``, else ``own``
    (what the rendezvous knows of it, e.g. Ray's node address), else the interface that
    routes towards ``towards`` (the coordinator), else loopback."""
    if os.environ.get("ALPA_COMM_GROUP_ADDR") or own:
        return os.environ.get("ALPA_COMM_GROUP_ADDR") or own
    host = (towards or "").rpartition(":")[0]
    if not host or host.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the route
        return s.getsockname()[0]


class ProcessGroup:
    """This process's membership (``rank`` of ``world_size``) of a resharding group.

    ``nic_gbps``/``latency_s``: the network the planner plans for; a rate given is also
    the TCP transport's pace (each connection at no more than twice ``nic_gbps``:
    ``runtime.tcp.PACE_FACTOR``, so a shaped link's queue is never flooded); None (the
    default) plans for ``DEFAULT_NIC_GBPS`` and paces nothing;
    ``streams``: TCP connections per pair of processes (``"auto"``: one per ``stream_gbps``
    of the NIC, at most 8); ``recycle_bytes``: unused result memory kept for the next call (0: none);
    ``buffers``/``backend``: see the module's docstring; ``timeout``: every wait's bound."""

    def __init__(self, rank: int, world_size: int, address: str | None = None, backend: str = DEFAULT_BACKEND,
                 timeout: float = DEFAULT_TIMEOUT_S, nic_gbps: float | None = None,
                 latency_s: float = DEFAULT_LATENCY_S,
                 buffers: str | None = None, streams: int | str = "auto", stream_gbps: float = DEFAULT_STREAM_GBPS,
                 recycle_bytes: int = DEFAULT_MAX_FREE_BYTES, _kv=None, _name: str = "group"):
        if not is_choice(backend, BACKENDS):
            raise InvalidOptionError(f"backend {backend!r} is not available; choose one of {', '.join(BACKENDS)}")
        buffers = _buffers(backend, buffers)
        if not is_choice(buffers, BUFFERS):
            raise InvalidOptionError(f"buffers {buffers!r} must be one of {', '.join(BUFFERS)}")
        if backend == "nccl" and buffers == "host":
            raise InvalidOptionError("NCCL moves device memory: backend 'nccl' needs buffers='device'")
        self.backend_name, self.buffers = backend, buffers
        _check_rank(rank, world_size)
        positive_number(timeout, "timeout", unit="seconds")
        if nic_gbps is not None:
            positive_number(nic_gbps, "nic_gbps", unit="Gbit/s or None")
        self.pace_gbps = nic_gbps  # a rate the user gave paces the TCP transport; a guess paces nothing
        nic_gbps = DEFAULT_NIC_GBPS if nic_gbps is None else nic_gbps
        non_negative_number(latency_s, "latency_s", unit="seconds")
        non_negative_int(recycle_bytes, "recycle_bytes")
        self.rank, self.world_size, self.timeout, self.nic_gbps = rank, world_size, float(timeout), nic_gbps
        self.streams = streams_for(streams, nic_gbps, stream_gbps)
        self.pool = BufferPool(recycle_bytes)  # destination memory recycled across calls
        # what one message costs beyond its bytes (sets chunk and bucket sizes; DEFAULT_LATENCY_S)
        self.latency_s = float(latency_s)
        self._chunk_gap_share = _transport_class(backend).chunk_gap_share  # read once: every call's key holds it
        self.address, self.name = address, _name
        self._subgroups: dict[tuple[int, ...], Backend] = {}
        self._stores: list = []
        self._attempts: dict[tuple[int, ...], int] = {}
        self._exchanges: dict[str, int] = {}
        self._own_ip: str | None = None
        if backend == "gloo":  # gloo meets through torch's TCPStore; tcp through the group's own store
            _import_in_background("torch.distributed")
        if _kv is not None:
            self.kv, self._towards = _kv, address
            return
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise InvalidOptionError(f"address {address!r} must be HOST:PORT")
        self.kv, self._towards = _TcpKV(host, int(port), rank == 0, self.timeout), address

    @classmethod
    def from_jax(cls, timeout: float = DEFAULT_TIMEOUT_S, name: str | None = None, **kw) -> "ProcessGroup":
        """The group of all processes of this ``jax.distributed`` program. Its keys in JAX's
        store carry ``name``: by default ``jax`` (tcp, host buffers) or ``jax-<backend>-
        <buffers>``, the same in every process whatever order groups are made in; a second
        group of the same kind in one program needs its own ``name``."""
        import jax  # noqa: PLC0415
        from jax._src import distributed  # noqa: PLC0415 - the client JAX itself uses

        state = distributed.global_state
        if state.client is None:
            raise AlpaCommError("jax.distributed is not initialized in this process: call "
                                "jax.distributed.initialize(...) first, or pass group=ProcessGroup(rank, "
                                "world_size, address='HOST:PORT')")
        if name is None:
            backend = kw.get("backend", DEFAULT_BACKEND)
            buffers = _buffers(backend, kw.get("buffers"))
            name = "jax" if (backend, buffers) == (DEFAULT_BACKEND, "host") else f"jax-{backend}-{buffers}"
        return cls(jax.process_index(), jax.process_count(), state.coordinator_address, timeout=timeout,
                   _kv=_JaxKV(state.client), _name=name, **kw)

    @classmethod
    def from_ray(cls, name: str, rank: int, world_size: int, namespace: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, **kw) -> "ProcessGroup":
        """The group ``name`` of Ray actors (or tasks): each member calls this with its own
        ``rank``; they meet at a named Ray actor (``alpa_comm_group:<name>``, made by the
        first to arrive, in a namespace of this Ray job, ending itself after a day without
        a call). A name serves one group per job. Needs ``ray.init`` (done in actors)."""
        import ray  # noqa: PLC0415

        if not isinstance(name, str) or not name:
            raise InvalidOptionError(f"a Ray group needs a name, got {name!r}")
        if not ray.is_initialized():
            raise AlpaCommError("ProcessGroup.from_ray needs Ray: call ray.init() first (actors have it)")
        _check_rank(rank, world_size)  # before joining the store under that rank
        group = cls(rank, world_size, f"ray:{name}", timeout=timeout, _kv=_RayKV(name, namespace, rank),
                    _name=f"ray-{name}", **kw)
        group._own_ip = ray.util.get_node_ip_address()  # where other members reach this one
        return group

    def exchange(self, topic: str, value: str) -> list[str]:
        """Every member's ``value`` for the next round of ``topic``, by rank: every member
        of the group must take part in each round (rounds are counted per topic)."""
        n = self._exchanges[topic] = self._exchanges.get(topic, -1) + 1
        base = f"alpa_comm/{self.name}/exchange/{topic}/{n}"
        self.kv.set(f"{base}/{self.rank}", value)
        out = []
        for r in range(self.world_size):
            if r == self.rank:
                out.append(value)
                continue
            try:
                out.append(self.kv.get(f"{base}/{r}", self.timeout))
            except TimeoutError as e:  # the store's own timeout names a key, not who did not come
                raise CommunicationTimeoutError(f"host {self.rank}: host {r} did not take part in {topic!r} "
                                                f"(round {n}) within {self.timeout:g} s: {e}") from e
            except CommunicationError:
                raise
            except Exception as e:  # noqa: BLE001 - say who did not come
                raise CommunicationError(f"host {self.rank}: host {r} did not take part in {topic!r} (round {n}) "
                                         f"within {self.timeout:g} s: {e}") from e
        return out

    @property
    def vectored(self) -> bool:
        """Whether the group's transport sends a bucket's parts from where they lie (TCP over
        host buffers: ``TcpBackend.vectored``): its plans then cut no bucket into chunks
        for a packing that does not happen (``plan_resharding_tree(vectored=...)``)."""
        return self.backend_name == "tcp" and self.buffers == "host"

    @property
    def chunk_gap_s(self) -> float | None:
        """What the group's transport declares a chunk behind others costs, in seconds
        (``Backend.chunk_gap_share`` of ``latency_s``; None: the cost model's own share):
        the planner's chain chunk counts follow from it (``ClusterSpec.chunk_gap_s``)."""
        share = self._chunk_gap_share
        return None if share is None else share * self.latency_s

    def backend(self, hosts) -> Backend:
        """The subgroup of ``hosts`` (this process among them) over the group's transport,
        made on first use by all of them."""
        key = tuple(sorted({int(h) for h in hosts}))
        if self.rank not in key:
            raise InvalidOptionError(f"rank {self.rank} is not among the participating processes {list(key)}")
        if key not in self._subgroups:
            self._subgroups[key] = self._join(key)
        return self._subgroups[key]

    def _join(self, hosts: tuple[int, ...]) -> Backend:
        # every member counts its attempts alike, so a retry after a failed join gets a fresh key
        attempt = self._attempts[hosts] = self._attempts.get(hosts, -1) + 1
        name = f"alpa_comm/{self.name}/{'-'.join(map(str, hosts))}/{attempt}"
        if self.backend_name == "tcp":
            from ..runtime.tcp import TcpBackend  # noqa: PLC0415

            return TcpBackend(self.rank, hosts, _SubgroupStore(self.kv, name, self.timeout), self.timeout,
                              streams=self.streams, address=_reachable_ip(self._towards, self._own_ip),
                              pace_gbps=self.pace_gbps)
        dist = require("torch.distributed")  # optional: a missing torch names its extra

        from ..runtime.worker import free_port  # noqa: PLC0415

        if len(hosts) == 1:
            store = dist.HashStore()
        elif self.rank == hosts[0]:  # the lowest member hosts the subgroup's store
            ip = _reachable_ip(self._towards, self._own_ip)
            port = free_port(ip)
            store = dist.TCPStore(ip, port, len(hosts), True, timedelta(seconds=self.timeout),
                                  wait_for_workers=False)
            try:
                self.kv.set(name, f"{ip}:{port}")
            except Exception as e:  # noqa: BLE001 - JAX's store refuses a key twice
                if "ALREADY_EXISTS" in str(e) or "already exists" in str(e):
                    raise InvalidOptionError(f"two groups named {self.name!r} in this program: give the second "
                                             f"its own name (ProcessGroup.from_jax(name=...))") from e
                raise
        else:
            try:
                address = self.kv.get(name, self.timeout)
            except Exception as e:  # noqa: BLE001 - the lowest member never came
                raise CommunicationError(f"host {self.rank}: host {hosts[0]} did not open the group of hosts "
                                         f"{list(hosts)} within {self.timeout:g} s: {e}") from e
            ip, _, port = address.rpartition(":")
            store = dist.TCPStore(ip, int(port), len(hosts), False, timedelta(seconds=self.timeout))
        self._stores.append(store)
        if self.backend_name == "nccl":
            return _nccl_subgroup(self.rank, hosts, dist.PrefixStore(name, store), self.timeout)
        return GlooSubgroupBackend(self.rank, hosts, dist.PrefixStore(name, store), self.timeout,
                                   streams=self.streams)

    def discard(self, hosts) -> None:
        """Close the subgroup of ``hosts`` (after a failed call): what was in flight in it is
        dropped, and the next call among them joins a fresh one. Its peers see it close,
        fail their next call on it at once and do the same, so no message of a failed call
        can be taken for one of a later call."""
        backend = self._subgroups.pop(tuple(sorted({int(h) for h in hosts})), None)
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - a broken backend may not close cleanly; it is dropped anyway
                pass

    def close(self) -> None:
        """Close every subgroup (connections, threads) this process made."""
        for hosts in list(self._subgroups):
            self.discard(hosts)
        self._stores.clear()

    def __repr__(self) -> str:
        return f"ProcessGroup(rank={self.rank}, world_size={self.world_size}, via={self.name!r})"


def _nccl_subgroup(rank: int, hosts, store, timeout: float):
    """NCCL among ``hosts`` on this process's one GPU (NCCL binds a communicator to one)."""
    import importlib.util  # noqa: PLC0415

    import jax  # noqa: PLC0415

    if importlib.util.find_spec("cupy") is None:
        raise AlpaCommError("backend 'nccl' needs CuPy (pip install cupy-cuda12x) and a GPU")

    local = jax.local_devices()
    if len(local) != 1 or not has_device_memory(local[0]):
        raise AlpaCommError(f"backend 'nccl' needs one GPU per process (a communicator is bound to one); this "
                            f"process has {len(local)} {local[0].platform} device(s): use backend='gloo'")
    return NcclSubgroupBackend(rank, hosts, store, local[0].local_hardware_id, timeout)


def default_group() -> ProcessGroup:
    """The group of this ``jax.distributed`` program, made on first use and kept."""
    if "group" not in _default:
        _default["group"] = ProcessGroup.from_jax()
    return _default["group"]
