"""``HostWorker``: the Ray actor that owns one host's device buffers.

On CPU a device is a NumPy array; all devices of a host live in the worker's
process, so intra-host traffic is a memory copy and only inter-host traffic
goes through the backend. The class is plain Python; ``cluster.py`` wraps it
with ``ray.remote`` so this module imports without Ray.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from ..resharding.host_job import HostJob
from ..validation import one_of
from .backend import DEFAULT_TIMEOUT_S, CommunicationError, GlooBackend, Transport
from .executor import ExecutorOptions, HostExecutor, Layout


TRANSPORTS = tuple(t.value for t in (Transport.GLOO, Transport.TCP))
"""What a pipeline's mailbox may move its transfers over (``HostWorker.join_transport``):
``Transport`` names, as plain ``str`` (command-line choices, ``validation.one_of``)."""


COPY_PROBE_BYTES = 32 * 1024 * 1024
"""Bytes ``HostWorker.copy_gbps`` copies: large enough to leave the caches, small enough
to take milliseconds."""


def buffer_digest(buf: np.ndarray) -> str:
    """blake2b of a buffer's bytes, as ``Cluster.checksums`` reports it per device: a
    benchmark compares it with its own input's digest on the driver instead of fetching
    the data (on the emulated cluster a fetch crosses the shaped NICs: 1.5 GB took 40 s
    at 400 Mbit/s, and Ray's object transfers still ran into the next timed run)."""
    import hashlib  # noqa: PLC0415

    return hashlib.blake2b(np.ascontiguousarray(buf).view(np.uint8).reshape(-1), digest_size=16).hexdigest()


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class HostWorker:
    def __init__(self, host: int, num_hosts: int, devices_per_host: int, ifname: str | None = None):
        self.host, self.num_hosts, self.devices_per_host = host, num_hosts, devices_per_host
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname  # gloo must use this host's (shaped) interface
        self.arrays: dict[str, dict[int, np.ndarray]] = {}
        self.backend = None
        self.transports: dict[str, object] = {}  # name -> a second backend (``join_transport``)

    # ------------------------------------------------------------- set-up
    def address(self) -> tuple[str, int]:
        """(IP this worker is reachable at, a free port on it) for the gloo rendezvous."""
        import ray  # noqa: PLC0415

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def connect(self, master_addr: str, master_port: int, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        self.backend = GlooBackend(self.host, self.num_hosts, master_addr, master_port, timeout)
        return self.host

    def join_transport(self, name: str, timeout: float = DEFAULT_TIMEOUT_S,
                       pace_gbps: float | None = None) -> str:
        """Join a transport beside gloo (every host at once; ``TRANSPORTS``): ``"tcp"``,
        alpa_comm's own TCP streams (``runtime.tcp.TcpBackend``: one connection per pair
        of hosts, a peer's messages in posting order, each read whole), met through the
        gloo group's store (torch keeps it private: ``_get_default_store``; a second store
        would need a second rendezvous), each connection paced at ``pace_gbps`` (this host's
        NIC rate; ``tcp.PACE_FACTOR``). ``benchmarks/transport_compare.py`` measures it
        against gloo under the trainer's mailbox."""
        one_of(name, TRANSPORTS, "transport")
        if self.backend is None:
            raise CommunicationError(f"host {self.host}: not connected to the other hosts")
        if name != "gloo" and name not in self.transports:
            import ray  # noqa: PLC0415
            import torch.distributed as dist  # noqa: PLC0415

            from .tcp import TcpBackend  # noqa: PLC0415

            store = dist.PrefixStore(f"alpa_comm/{name}", dist.distributed_c10d._get_default_store())
            self.transports[name] = TcpBackend(self.host, range(self.num_hosts), store, timeout,
                                               address=ray.util.get_node_ip_address(), pace_gbps=pace_gbps)
        return name

    def transport(self, name: str):
        """The backend of transport ``name`` (joined before with ``join_transport``)."""
        if name == "gloo":
            return self.backend
        if name not in self.transports:
            raise CommunicationError(f"host {self.host}: transport {name!r} not joined")
        return self.transports[name]

    def ping(self) -> int:
        return self.host

    def copy_gbps(self, nbytes: int = COPY_PROBE_BYTES, repeats: int = 3) -> float:
        """Gbit/s of this host's device-to-device copy: on CPU a NumPy copy into freshly
        allocated memory (page faults included), as the executor's intra-host copies
        land in new destination buffers. The planner's chunk count weighs the last
        host's copies to its other devices against the wire; a spec's NVLink-class
        default there makes it pick a few large chunks whose copies then trail the wire."""
        src = np.ones(nbytes // 8, dtype=np.float64)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.copyto(np.empty_like(src), src)
            best = min(best, time.perf_counter() - t0)
        return nbytes * 8 / max(best, 1e-9) / 1e9

    def run(self, fn, *args):
        """``fn(worker, *args)`` in this host's process: tools and benchmarks that need the
        host's backend (e.g. ``benchmarks/allreduce.py``) without a method of their own here."""
        return fn(self, *args)

    def pid(self) -> int:
        return os.getpid()

    # --------------------------------------------------------------- arrays
    def put_shards(self, array_id: str, shards: dict[int, np.ndarray]) -> None:
        self.arrays.setdefault(array_id, {}).update({int(d): np.array(s, copy=True) for d, s in shards.items()})

    def get_shards(self, array_id: str) -> dict[int, np.ndarray]:
        return self.arrays.get(array_id, {})

    def checksums(self, array_id: str) -> dict[int, str]:
        """``buffer_digest`` of every device buffer of an array: verification without moving the data."""
        return {d: buffer_digest(b) for d, b in self.arrays.get(array_id, {}).items()}

    def delete(self, array_id: str) -> None:
        self.arrays.pop(array_id, None)

    # ------------------------------------------------------------- resharding
    def execute(self, job: HostJob, src_ids: list[str], dst_ids: list[str], timeout: float = DEFAULT_TIMEOUT_S,
                barrier: bool = True, in_order: bool = False) -> dict:
        """Run this host's share of one plan over one or more arrays (a tree plan: one
        per leaf); ``in_order``: one transfer after another in plan order. Returns
        wall-clock start/end and per-transfer timings."""
        if self.backend is None:
            raise CommunicationError(f"host {self.host}: not connected to the other hosts")
        layouts = [Layout.of(leaf) for leaf in job.leaves]
        dst = [lay.empty_destinations(job.is_local) for lay in layouts]
        src = [self.arrays.get(i, {}) for i in src_ids]
        if barrier:
            self.backend.barrier(timeout)
        start = time.time()
        options = ExecutorOptions(timeout, job.min_rate, max_concurrent=1 if in_order else None,
                                  latency_s=job.latency_s)
        timings = HostExecutor(self.host, layouts, src, dst, self.backend, job.host_of,
                               options=options).run(job.transfers)
        end = time.time()
        for i, leaf_dst in zip(dst_ids, dst):
            if leaf_dst:
                self.arrays[i] = leaf_dst
        return {"host": self.host, "start": start, "end": end,
                "timings": [(t.transfer, t.kind, t.start, t.end) for t in timings]}

    def close(self) -> None:
        for t in self.transports.values():
            t.close()
        self.transports.clear()
        if self.backend is not None:
            self.backend.close()
            self.backend = None
