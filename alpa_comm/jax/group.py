"""The processes that reshard together, and how they find each other.

A ``ProcessGroup`` is this process's membership of a set of ``world_size`` processes
(rank = its host index in the plans; in a ``jax.distributed`` program,
``jax.process_index()``). Only the processes of a resharding's two meshes take part in
it, so the group does not open one connection among everyone: for each set of
participating processes it makes, on first use, a gloo subgroup
(``runtime.backend.GlooSubgroupBackend``) among exactly those — its lowest member hosts
the subgroup's rendezvous store and publishes the address through the group's
key-value store:

* ``ProcessGroup.from_jax()`` (what ``default_group()`` makes): JAX's own distributed
  key-value store, so a ``jax.distributed`` program needs no set-up;
* ``ProcessGroup(rank, world_size, address="HOST:PORT")``: a TCP store at ``address``
  that rank 0 hosts (rank 0 must make its group, even if it reshards nothing).

Transfers then use the runtime's executor over that backend: same kinds, same
timeouts naming the peer host as in ``alpa_comm.Cluster``.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

from ..errors import AlpaCommError, InvalidOptionError
from ..runtime.backend import DEFAULT_TIMEOUT_S, CommunicationError, GlooSubgroupBackend

BACKENDS = ("gloo",)
_default: dict = {}


class _JaxKV:
    """JAX's distributed key-value store (``jax.distributed``'s client)."""

    def __init__(self, client):
        self.client = client

    def set(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value)

    def get(self, key: str, timeout: float) -> str:
        return self.client.blocking_key_value_get(key, int(timeout * 1000))


class _TcpKV:
    """A torch ``TCPStore`` at ``host:port`` (hosted by rank 0)."""

    def __init__(self, host: str, port: int, is_master: bool, timeout: float):
        import torch.distributed as dist  # noqa: PLC0415

        self.store = dist.TCPStore(host, port, None, is_master, timedelta(seconds=timeout), wait_for_workers=False)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str, timeout: float) -> str:
        self.store.set_timeout(timedelta(seconds=timeout))
        return self.store.get(key).decode()


def _reachable_ip(towards: str | None) -> str:
    """This process's address as others see it: ``$ALPA_COMM_GROUP_ADDR``, else the
    interface that routes towards ``towards`` (the coordinator), else loopback."""
    if os.environ.get("ALPA_COMM_GROUP_ADDR"):
        return os.environ["ALPA_COMM_GROUP_ADDR"]
    host = (towards or "").rpartition(":")[0]
    if not host or host.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the route
        return s.getsockname()[0]


class ProcessGroup:
    """This process's membership (``rank`` of ``world_size``) of a resharding group."""

    def __init__(self, rank: int, world_size: int, address: str | None = None, backend: str = "gloo",
                 timeout: float = DEFAULT_TIMEOUT_S, nic_gbps: float = 10.0, latency_s: float = 20e-6, _kv=None,
                 _name: str = "group"):
        if backend not in BACKENDS:
            raise InvalidOptionError(f"backend {backend!r} is not available; choose one of {', '.join(BACKENDS)}")
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int)
                and 0 <= rank < world_size):
            raise InvalidOptionError(f"rank {rank!r} must be in [0, world_size) with world_size {world_size!r} >= 1")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InvalidOptionError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (isinstance(nic_gbps, (int, float)) and nic_gbps > 0):
            raise InvalidOptionError(f"nic_gbps must be a positive number (Gbit/s), got {nic_gbps!r}")
        if not (isinstance(latency_s, (int, float)) and latency_s >= 0):
            raise InvalidOptionError(f"latency_s must be a number of seconds >= 0, got {latency_s!r}")
        self.rank, self.world_size, self.timeout, self.nic_gbps = rank, world_size, float(timeout), nic_gbps
        self.latency_s = float(latency_s)  # what one message costs beyond its bytes: sets chunk and bucket sizes
        self.address, self.name = address, _name
        self._subgroups: dict[tuple[int, ...], GlooSubgroupBackend] = {}
        self._stores: list = []
        self._attempts: dict[tuple[int, ...], int] = {}
        if _kv is not None:
            self.kv, self._towards = _kv, address
            return
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise InvalidOptionError(f"address {address!r} must be HOST:PORT")
        self.kv, self._towards = _TcpKV(host, int(port), rank == 0, self.timeout), address

    @classmethod
    def from_jax(cls, timeout: float = DEFAULT_TIMEOUT_S, **kw) -> "ProcessGroup":
        """The group of all processes of this ``jax.distributed`` program."""
        import jax  # noqa: PLC0415
        from jax._src import distributed  # noqa: PLC0415 - the client JAX itself uses

        state = distributed.global_state
        if state.client is None:
            raise AlpaCommError("jax.distributed is not initialized in this process: call "
                                "jax.distributed.initialize(...) first, or pass group=ProcessGroup(rank, "
                                "world_size, address='HOST:PORT')")
        return cls(jax.process_index(), jax.process_count(), state.coordinator_address, timeout=timeout,
                   _kv=_JaxKV(state.client), _name="jax", **kw)

    def backend(self, hosts) -> GlooSubgroupBackend:
        """The gloo subgroup of ``hosts`` (this process among them), made on first use by
        all of them."""
        key = tuple(sorted({int(h) for h in hosts}))
        if self.rank not in key:
            raise InvalidOptionError(f"rank {self.rank} is not among the participating processes {list(key)}")
        if key not in self._subgroups:
            self._subgroups[key] = self._join(key)
        return self._subgroups[key]

    def _join(self, hosts: tuple[int, ...]) -> GlooSubgroupBackend:
        import torch.distributed as dist  # noqa: PLC0415

        from ..runtime.worker import free_port  # noqa: PLC0415

        # every member counts its attempts alike, so a retry after a failed join gets a fresh key
        attempt = self._attempts[hosts] = self._attempts.get(hosts, -1) + 1
        name = f"alpa_comm/{self.name}/{'-'.join(map(str, hosts))}/{attempt}"
        if len(hosts) == 1:
            store = dist.HashStore()
        elif self.rank == hosts[0]:  # the lowest member hosts the subgroup's store
            ip = _reachable_ip(self._towards)
            port = free_port(ip)
            store = dist.TCPStore(ip, port, len(hosts), True, timedelta(seconds=self.timeout),
                                  wait_for_workers=False)
            self.kv.set(name, f"{ip}:{port}")
        else:
            try:
                address = self.kv.get(name, self.timeout)
            except Exception as e:  # noqa: BLE001 - the lowest member never came
                raise CommunicationError(f"host {self.rank}: host {hosts[0]} did not open the group of hosts "
                                         f"{list(hosts)} within {self.timeout:g} s: {e}") from e
            ip, _, port = address.rpartition(":")
            store = dist.TCPStore(ip, int(port), len(hosts), False, timedelta(seconds=self.timeout))
        self._stores.append(store)
        return GlooSubgroupBackend(self.rank, hosts, dist.PrefixStore(name, store), self.timeout)

    def close(self) -> None:
        self._subgroups.clear()
        self._stores.clear()

    def __repr__(self) -> str:
        return f"ProcessGroup(rank={self.rank}, world_size={self.world_size}, via={self.name!r})"


def default_group() -> ProcessGroup:
    """The group of this ``jax.distributed`` program, made on first use and kept."""
    if "group" not in _default:
        _default["group"] = ProcessGroup.from_jax()
    return _default["group"]
