"""``global_allgather``: scatter 1/N of the slice to each of the N receiving devices,
then a ring all-gather among them (paper: 2t)."""
from __future__ import annotations

from ...bounds import even_bounds
from ..resources import nic_receive, nic_send, ring_resources
from .base import (TransferKind, groups_in_order, receiving_hosts, ring_allgather_seconds, ring_flows,
                   ring_links)


class GlobalAllGather(TransferKind):
    name = "global_allgather"
    receives_into_scratch = True
    order = 30

    def resources(self, sender_host, receiver_hosts):
        hosts = list(receiver_hosts)
        return (nic_send(sender_host),) + tuple(dict.fromkeys(ring_resources(hosts)
                                                             + tuple(nic_receive(h) for h in hosts)))

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        parts, lat = sum(len(d) for d in groups.values()), cluster.latency_s
        scatter = sum(len(devs) * (lat + nbytes / parts / cluster.link_rate(sender_host, h))
                      for h, devs in groups.items())
        return scatter + ring_allgather_seconds(nbytes, groups, cluster), 1

    def closed_form(self, t, hosts, devices, chunks=1):
        n = hosts * devices
        # With one receiving host the ring never leaves the (ideal) intra-host link.
        return t + (t * (n - 1) / n if hosts > 1 else 0.0)

    def host_flows(self, t, cluster):
        members, s = list(t.receivers), cluster.host_of(t.sender)
        scatter = [(s, cluster.host_of(r), t.nbytes // len(members)) for r in members if cluster.host_of(r) != s]
        return ring_flows(members, t.nbytes, cluster) + scatter

    def phases(self, t, cluster):
        groups = groups_in_order(t.receivers, cluster.host_of)
        members, n, lat = len(t.receivers), t.nbytes, cluster.latency_s
        s = cluster.host_of(t.sender)
        scatter = [(n * len(devs) / members, (nic_send(s), nic_receive(h))) for h, devs in groups.items()]
        return [(members * lat, scatter),
                ((members - 1) * lat, [((members - 1) * n / members, ring_links(groups))])]

    def run(self, ex, t, tag0):
        n = len(t.receivers)
        bounds = even_bounds(0, t.nbytes, n)
        hosts = receiving_hosts(t, ex.host_of)
        sender_host = ex.host_of(t.sender)
        if sender_host == ex.host:
            flat = ex.slice_bytes(t.sender, t.index)
            ex.wait([ex.isend(flat[bounds[j]:bounds[j + 1]], ex.host_of(r), tag0 + j)
                     for j, r in enumerate(t.receivers)])
        if ex.host not in hosts:
            return
        flat = ex.empty_bytes(t.nbytes)
        ex.wait([ex.irecv(flat[bounds[j]:bounds[j + 1]], sender_host, tag0 + j)
                 for j, r in enumerate(t.receivers) if ex.host_of(r) == ex.host])
        # receivers are host-major, so each host's parts are one contiguous block
        blocks = {}
        for h in hosts:
            js = [j for j, r in enumerate(t.receivers) if ex.host_of(r) == h]
            blocks[h] = flat[bounds[js[0]]:bounds[js[-1] + 1]]
        ex.ring_allgather(blocks, hosts, tag0)
        for r in ex.local_receivers(t):
            ex.write(r, t.index, flat)
