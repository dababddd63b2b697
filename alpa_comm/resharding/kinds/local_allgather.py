"""``local_allgather``: send/recv to one host, one part per receiving device, then an
intra-host all-gather (paper: A*t)."""
from __future__ import annotations

from .. import cost_model
from ..resources import intra_link, nic_receive, nic_send
from .send_recv import SendRecv


class LocalAllGather(SendRecv):
    name = "local_allgather"
    order = 20

    def split_receivers(self, remote):
        return [(g,) for g in remote]

    def jobs_per_task(self, hosts, devices):
        return hosts

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        ((h, receivers),) = groups.items()
        b, lat = len(receivers), cluster.latency_s
        send = b * lat + nbytes / cluster.link_rate(sender_host, h)  # b parts of n/b bytes
        return send + cost_model.ring_allgather_time(nbytes, [cluster.intra_rate] * b, lat), 1

    def closed_form(self, t, hosts, devices, chunks=1):
        return hosts * t

    def phases(self, t, cluster):
        s, h = cluster.host_of(t.sender), cluster.host_of(t.receivers[0])
        b, lat, n = len(t.receivers), cluster.latency_s, t.nbytes
        out = [(b * lat, [(n, (nic_send(s), nic_receive(h)))])]
        if b > 1:
            out.append(((b - 1) * lat, [((b - 1) * n / b, (intra_link(h),))]))
        return out

    def message_parts(self, t) -> int:
        # A coalesced buffer travels whole; otherwise one part per receiving device,
        # and the host assembles the slice for all of them (its intra-host all-gather).
        return 1 if t.parts else len(t.receivers)
