"""The cluster a plan runs on: hosts, devices per host, and how fast they talk.

Hosts are the unit of network capacity: every device of a host shares that
host's NIC(s) for inter-host traffic, while traffic between devices of one host
uses the fast intra-host link (NVLink-class). Per-host values may differ; pass a
list with one value per host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .errors import InvalidClusterError
from .validation import positive_int


def _per_host(name: str, value, num_hosts: int, *, allow_inf: bool = False) -> tuple[float, ...]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * num_hosts
    if len(values) != num_hosts:
        raise InvalidClusterError(f"{name} has {len(values)} values but the cluster has {num_hosts} hosts")
    for v in values:
        if not isinstance(v, (int, float)) or v <= 0 or (math.isinf(v) and not allow_inf) or math.isnan(v):
            raise InvalidClusterError(f"{name} must be positive numbers, got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class ClusterSpec:
    """Hosts, devices and link speeds (Gbit/s, seconds).

    ``nic_send_gbps``/``nic_recv_gbps``/``nics_per_host`` may be one number or a
    list with one value per host. ``intra_host_gbps`` may be ``inf`` (an ideal
    intra-host link, as the paper's analysis assumes). ``latency_s`` is paid
    once per message. ``chunk_gap_s``: what a chunk costs beyond its bytes when it follows
    other chunks already posted on the same stream (a chain broadcast's later chunks);
    None: ``cost_model.PIPELINED_GAP_SHARE`` of ``latency_s``. A transport whose per-message
    cost does not overlap on a busy stream declares more (``runtime.backend.Backend
    .chunk_gap_share``; ``alpa_comm.jax`` groups pass it).
    """

    num_hosts: int
    devices_per_host: int
    nic_send_gbps: float | Sequence[float] = 10.0
    nic_recv_gbps: float | Sequence[float] | None = None
    nics_per_host: int | Sequence[int] = 1
    intra_host_gbps: float = 1200.0
    latency_s: float = 20e-6
    chunk_gap_s: float | None = None
    _send: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _recv: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _slowest: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("num_hosts", "devices_per_host"):
            positive_int(getattr(self, name), name, InvalidClusterError)
        n = self.num_hosts
        send = _per_host("nic_send_gbps", self.nic_send_gbps, n)
        recv = _per_host("nic_recv_gbps", send if self.nic_recv_gbps is None else self.nic_recv_gbps, n)
        nics = _per_host("nics_per_host", self.nics_per_host, n)
        _per_host("intra_host_gbps", self.intra_host_gbps, 1, allow_inf=True)
        if not isinstance(self.latency_s, (int, float)) or self.latency_s < 0 or math.isnan(self.latency_s):
            raise InvalidClusterError(f"latency_s must be >= 0, got {self.latency_s!r}")
        gap = self.chunk_gap_s
        if gap is not None and (isinstance(gap, bool) or not isinstance(gap, (int, float)) or gap < 0
                                or math.isnan(gap)):
            raise InvalidClusterError(f"chunk_gap_s must be None or >= 0, got {gap!r}")
        object.__setattr__(self, "_send", tuple(s * k * 1e9 / 8 for s, k in zip(send, nics)))
        object.__setattr__(self, "_recv", tuple(r * k * 1e9 / 8 for r, k in zip(recv, nics)))
        object.__setattr__(self, "_slowest", min(min(self._send), min(self._recv)))

    # Bytes per second --------------------------------------------------------
    def send_rate(self, host: int) -> float:
        """Bytes/s ``host`` can push through its NIC(s)."""
        return self._send[host]

    def recv_rate(self, host: int) -> float:
        """Bytes/s ``host`` can take in through its NIC(s)."""
        return self._recv[host]

    def link_rate(self, src_host: int, dst_host: int) -> float:
        """Bytes/s of one stream between two hosts (intra-host when equal)."""
        if src_host == dst_host:
            return self.intra_rate
        return min(self._send[src_host], self._recv[dst_host])

    @property
    def slowest_nic_rate(self) -> float:
        """Bytes/s of the slowest NIC side in the cluster (bounds how long a message may take)."""
        return self._slowest

    @property
    def intra_rate(self) -> float:
        return self.intra_host_gbps * 1e9 / 8

    @property
    def num_devices(self) -> int:
        return self.num_hosts * self.devices_per_host

    def host_of(self, device: int) -> int:
        return device // self.devices_per_host

    def describe(self) -> str:
        def fmt(v):
            return f"{v:g}" if not isinstance(v, (list, tuple)) else "[" + ",".join(f"{x:g}" for x in v) + "]"
        recv = "" if self.nic_recv_gbps is None else f"/{fmt(self.nic_recv_gbps)}"
        return (f"{self.num_hosts} hosts x {self.devices_per_host} devices, NIC {fmt(self.nic_send_gbps)}{recv} Gbit/s"
                f" x{fmt(self.nics_per_host)}, intra-host {self.intra_host_gbps:g} Gbit/s, "
                f"latency {self.latency_s * 1e6:g} us"
                + ("" if self.chunk_gap_s is None else f", chunk gap {self.chunk_gap_s * 1e6:g} us"))

    def to_dict(self) -> dict:
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in (
            ("num_hosts", self.num_hosts), ("devices_per_host", self.devices_per_host),
            ("nic_send_gbps", self.nic_send_gbps), ("nic_recv_gbps", self.nic_recv_gbps),
            ("nics_per_host", self.nics_per_host),
            ("intra_host_gbps", None if math.isinf(self.intra_host_gbps) else self.intra_host_gbps),
            ("latency_s", self.latency_s))}
        if self.chunk_gap_s is not None:  # only where declared: plans written before read the same
            d["chunk_gap_s"] = self.chunk_gap_s
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterSpec":
        d = dict(d)
        if d.get("intra_host_gbps", 0) is None:
            d["intra_host_gbps"] = math.inf
        return cls(**d)


PAPER_TESTBED = dict(devices_per_host=4, nic_send_gbps=10.0, intra_host_gbps=1200.0, latency_s=20e-6)
"""AWS p3.8xlarge as in the paper: 4 V100 on NVLink per host, 10 Gbit/s between hosts."""
