"""``HostJob``: one host's share of a plan, the one thing every executor consumes.

Ray host workers, the thread executor of the tests, the pipeline trainer's
mailbox and the GPU check all run a plan the same way: per host, the plan's
leaves (where every array is and goes) and the transfers this host takes part
in, in the plan's global order. Building that share here, once, keeps the
executors from each deriving it their own way.
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import Leaf, Transfer


@dataclass(frozen=True)
class HostJob:
    """``leaves``: every array of the plan (a single-array plan has one); ``transfers``:
    this host's, in plan order; ``min_rate``: bytes/s of the slowest NIC of the cluster
    (lets a wait on a large message take the time its bytes need); ``latency_s``: what
    the planner was told one message costs beyond its bytes."""

    host: int
    devices_per_host: int
    min_rate: float
    leaves: tuple[Leaf, ...]
    transfers: tuple[Transfer, ...]
    latency_s: float = 0.0

    @classmethod
    def for_host(cls, plan, host: int) -> "HostJob":
        """``host``'s share of ``plan`` (a ``ReshardingPlan`` or a ``TreePlan``)."""
        spec = plan.cluster
        return cls(host, spec.devices_per_host,
                   spec.slowest_nic_rate,
                   tuple(plan.leaves), tuple(plan.transfers[i] for i in plan.host_operations.get(host, ())),
                   spec.latency_s)

    def host_of(self, device: int) -> int:
        return device // self.devices_per_host

    def is_local(self, device: int) -> bool:
        return device // self.devices_per_host == self.host
