"""``allgather``: Alpa's follow-up all-gather after its local-allgather rewrite.

Each member already holds its part (its box under the sent spec); afterwards
every member holds the whole slice. ``sender`` is None and ``task`` is -1; the
job depends on the send/recv jobs that delivered the parts.
"""
from __future__ import annotations

import numpy as np

from ..resources import ring_resources
from .base import (TransferKind, groups_in_order, receiving_hosts, ring_allgather_seconds, ring_flows,
                   ring_links)


class MemberAllGather(TransferKind):
    name = "allgather"
    receives_into_scratch = True
    order = 90
    per_task_strategy = False

    def resources(self, sender_host, receiver_hosts):
        return ring_resources(list(receiver_hosts))

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        return ring_allgather_seconds(nbytes, groups, cluster), 1

    def host_flows(self, t, cluster):
        return ring_flows(list(t.receivers), t.nbytes, cluster)

    def phases(self, t, cluster):
        members, n = len(t.receivers), t.nbytes
        groups = groups_in_order(t.receivers, cluster.host_of)
        return [((members - 1) * cluster.latency_s, [((members - 1) * n / members, ring_links(groups))])]

    def run(self, ex, t, tag0):
        hosts = receiving_hosts(t, ex.host_of)
        if ex.host not in hosts:
            return
        parts = {m: ex.layout.sent_boxes[m] for m in t.receivers}
        size = ex.layout.dtype.itemsize
        nbytes = {m: size * int(np.prod([b - a for a, b in parts[m]])) for m in t.receivers}
        offsets, pos = {}, 0
        for m in t.receivers:
            offsets[m] = pos
            pos += nbytes[m]
        flat = ex.empty_bytes(pos)
        mine = ex.local_receivers(t)
        for m in mine:
            data = ex.read_destination(m, parts[m])
            flat[offsets[m]:offsets[m] + data.nbytes] = data
        blocks = {}
        for h in hosts:
            ms = [m for m in t.receivers if ex.host_of(m) == h]
            blocks[h] = flat[offsets[ms[0]]:offsets[ms[-1]] + nbytes[ms[-1]]]
        ex.ring_allgather(blocks, hosts, tag0)
        for m in t.receivers:
            for r in mine:
                if r != m:
                    ex.write(r, parts[m], flat[offsets[m]:offsets[m] + nbytes[m]])
