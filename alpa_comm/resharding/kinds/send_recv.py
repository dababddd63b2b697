"""``send_recv``: one point-to-point message per receiving device (paper: A*B*t)."""
from __future__ import annotations

from ...bounds import even_bounds
from .. import cost_model
from ..resources import intra_link, nic_receive, nic_send
from .base import Posted, TransferKind, fan_out, receive_buffer, store_received


class SendRecv(TransferKind):
    name = "send_recv"
    order = 10
    packable = True

    def split_receivers(self, remote):
        return [((h, (d,)),) for h, devs in remote for d in devs]

    def jobs_per_task(self, hosts, devices):
        return devices

    def resources(self, sender_host, receiver_hosts):
        return (nic_send(sender_host), nic_receive(receiver_hosts[0]))

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        (h,) = groups
        return cost_model.p2p_time(nbytes, cluster.link_rate(sender_host, h), cluster.latency_s), 1

    def closed_form(self, t, hosts, devices, chunks=1):
        return hosts * devices * t

    def phases(self, t, cluster):
        s, h = cluster.host_of(t.sender), cluster.host_of(t.receivers[0])
        return [(cluster.latency_s, [(t.nbytes, (nic_send(s), nic_receive(h)) if h != s else (intra_link(h),))])]

    def message_parts(self, t) -> int:
        """Messages the slice is sent as (one here)."""
        return 1

    def post(self, ex, t, tag0):
        """The sender's host sends the slice in ``message_parts`` messages; the receiving
        host takes them and writes every local receiver."""
        dst_host, src_host = ex.host_of(t.receivers[0]), ex.host_of(t.sender)
        parts = self.message_parts(t)
        bounds = even_bounds(0, t.nbytes, parts)
        handles, finish = [], None
        if src_host == ex.host:
            flat = ex.outgoing(t)
            handles += [ex.isend(flat[bounds[j]:bounds[j + 1]], dst_host, tag0 + j) for j in range(parts)]
        if dst_host == ex.host:  # straight into the first local receiver where it is contiguous
            into, mine, targets = receive_buffer(ex, t, t.nbytes)
            handles += [ex.irecv(into[bounds[j]:bounds[j + 1]], src_host, tag0 + j) for j in range(parts)]

            def finish():
                fan_out(into, targets, 0, t.nbytes)
                store_received(ex, t, into, mine, targets)
        return Posted(handles, finish)
