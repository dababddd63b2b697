"""``broadcast``: a chunk-pipelined chain through the receiving hosts (paper: t + (A-1)t/K).

Each host forwards chunk k to the next host while it takes chunk k+1, so with
enough chunks a broadcast to A hosts costs about what one copy costs. Its chunks are
posted back to back on each stream, so the message latency is paid once a hop (by the
first chunk) and every later chunk only ``cost_model.chunk_gap``; the chunk count
weighs that gap against the chain's fill (``cost_model.auto_chunks``). The last host
copies each chunk on to its other devices as it arrives (one device after another), so
those copies too are a hop of the chain, not a tail after it.
"""
from __future__ import annotations

import numpy as np

from .. import cost_model
from ..resources import intra_link, nic_receive, nic_send
from .base import (Posted, TransferKind, chain_rates, chunk_bounds, fan_out, finish_posted,
                   groups_in_order, receive_buffer, receiving_hosts, store_received)


def broadcast_rates(sender_host, groups, cluster) -> list[float]:
    """Hop rates of the chain (``chain_rates``), the last host's intra-host hop taken as
    its copies to its other devices one after another (d - 1 copies of each chunk)."""
    rates = chain_rates(sender_host, groups, cluster)
    last = list(groups)[-1] if groups else None
    if last is not None and len(groups[last]) > 1:
        rates[-1] = rates[-1] / (len(groups[last]) - 1)
    return rates


class Broadcast(TransferKind):
    name = "broadcast"
    rotates_shared_receivers = True
    order = 40
    packable = True

    def resources(self, sender_host, receiver_hosts):
        hosts = list(receiver_hosts)
        return ((nic_send(sender_host),) + tuple(nic_receive(h) for h in hosts)
                + tuple(nic_send(h) for h in hosts[:-1]))

    def chunks_for(self, nbytes, num_elements, rates, cluster, chunks) -> tuple[int, int]:
        """(bytes on the wire, chunks): the asked count, else the cost model's best; never
        more than ``cost_model.MAX_AUTO_CHUNKS`` (the tags a transfer has for chunks)."""
        lat = cluster.latency_s
        k = chunks if chunks is not None else cost_model.auto_chunks(nbytes, rates, lat,
                                                                      gap=cost_model.chunk_gap(cluster))
        return nbytes, max(1, min(k, num_elements, cost_model.MAX_AUTO_CHUNKS))

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        rates = broadcast_rates(sender_host, groups, cluster)
        n, k = self.chunks_for(nbytes, num_elements, rates, cluster, chunks)
        lat = cluster.latency_s
        return cost_model.chain_time(n, rates, k, lat, cost_model.chunk_gap(cluster)), k

    def closed_form(self, t, hosts, devices, chunks=1):
        return t + (hosts - 1) * t / chunks

    def chain(self, t, cluster) -> tuple[list[float], tuple[int, ...]]:
        """Hop rates of the device chain and the resource keys its one flow holds."""
        groups = groups_in_order(t.receivers, cluster.host_of)
        s = cluster.host_of(t.sender)
        rates = broadcast_rates(s, groups, cluster)
        links = [nic_send(s)]
        hosts = list(groups)
        for h in hosts:
            links.append(nic_receive(h))
            if len(groups[h]) > 1:
                links.append(intra_link(h))
            if h != hosts[-1]:
                links.append(nic_send(h))
        return rates, tuple(links)

    def phases(self, t, cluster):
        # The chunk pipeline is one flow holding every hop at once (in steady state all
        # hops run at the chain's rate); fill and per-chunk latencies are a fixed delay.
        rates, links = self.chain(t, cluster)
        n = t.nbytes
        lat = cluster.latency_s
        fill = cost_model.chain_time(n, rates, t.chunks, lat, cost_model.chunk_gap(cluster)) - n / min(rates)
        return [(fill, [(n, links)])]

    def _chain(self, ex, t):
        """(hosts in chain order, this host's position or None, bytes, chunk bounds)."""
        sender_host = ex.host_of(t.sender)
        chain = [sender_host] + receiving_hosts(t, ex.host_of, exclude=sender_host)
        nbytes = 1 if not self.carries_data else t.nbytes
        k = 1 if not self.carries_data else max(1, min(t.chunks, nbytes))
        p = chain.index(ex.host) if ex.host in chain else None
        return chain, p, nbytes, chunk_bounds(t, nbytes, k)

    def post(self, ex, t, tag0):
        """The chain's ends post at once: the sender all its chunks, the last host all its
        receives (its intra-host copies follow the last chunk); a middle host forwards
        each chunk as it arrives, on a thread (``run``)."""
        chain, p, nbytes, bounds = self._chain(ex, t)
        if p is None:
            return Posted([])
        signal, k = not self.carries_data, len(bounds) - 1
        if p == 0:  # each chunk leaves as soon as it is packed (a coalesced buffer)
            pieces = ([ex.xp.zeros(1, np.uint8)[bounds[c]:bounds[c + 1]] for c in range(k)] if signal
                      else ex.source_pieces(t, bounds))
            return Posted([ex.isend(piece, chain[1], tag0 + c) for c, piece in enumerate(pieces)])
        if p + 1 < len(chain):
            return None
        if k > 1 and not signal and not t.parts and len(ex.local_receivers(t)) > 1:
            return None  # copies on to its other devices chunk by chunk, on a thread (``run``)
        flat, mine, targets = receive_buffer(ex, t, nbytes, data=not signal)

        def finish():
            fan_out(flat, targets, 0, nbytes)
            store_received(ex, t, flat, mine, targets, data=not signal)
        return Posted([ex.irecv(flat[bounds[c]:bounds[c + 1]], chain[p - 1], tag0 + c) for c in range(k)], finish)

    def run(self, ex, t, tag0):
        posted = self.post(ex, t, tag0)
        if posted is not None:
            finish_posted(ex, posted)
            return
        chain, p, nbytes, bounds = self._chain(ex, t)
        signal, k = not self.carries_data, len(bounds) - 1
        flat, mine, targets = receive_buffer(ex, t, nbytes, data=not signal)
        recvs = [ex.irecv(flat[bounds[c]:bounds[c + 1]], chain[p - 1], tag0 + c) for c in range(k)]
        sends = []
        for c in range(k):
            recvs[c].wait(ex.wait_s)
            lo, hi = bounds[c], bounds[c + 1]
            if p + 1 < len(chain):
                sends.append(ex.isend(flat[lo:hi], chain[p + 1], tag0 + c))
            fan_out(flat, targets, lo, hi)
        ex.wait(sends)
        store_received(ex, t, flat, mine, targets, data=not signal)
