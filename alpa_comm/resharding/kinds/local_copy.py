"""``local_copy``: an intra-host copy from a replica on the receiving host.

Planned for every receiving device whose host already holds the slice, so heavy
traffic stays on the fast link and never touches a NIC.
"""
from __future__ import annotations

from ... import topology
from .. import cost_model
from ..resources import intra_link
from .base import TransferKind


class LocalCopy(TransferKind):
    name = "local_copy"
    order = 80
    per_task_strategy = False

    def resources(self, sender_host, receiver_hosts):
        return (intra_link(receiver_hosts[0]),)

    def duration(self, nbytes, num_elements, sender_host, groups, cluster: topology.ClusterSpec, chunks):
        devices = sum(len(d) for d in groups.values())
        return devices * cost_model.p2p_time(nbytes, cluster.intra_rate, cluster.latency_s), 1

    def host_flows(self, t, cluster):
        return []

    def phases(self, t, cluster):
        m = len(t.receivers)
        return [(m * cluster.latency_s, [(m * t.nbytes, (intra_link(cluster.host_of(t.receivers[0])),))])]

    def run(self, ex, t, tag0):
        flat = ex.slice_bytes(t.sender, t.index)
        for r in t.receivers:
            ex.write(r, t.index, flat)
