"""``double_tree``: one slice to hundreds of hosts over two pipelined binary trees.

A chain (``broadcast``) pays one hop of fill per receiving host: t + (A-1)t/K, so
one host's data to 1,000 hosts takes about 3x a copy even with 512 chunks. A
binary tree has log2(A) levels, but each inner host sends every byte twice, so
it runs at half the NIC rate. Two trees fix both (NCCL's double binary tree):
the slice is cut in halves, each half goes down its own tree, and a host that
is inner in one tree is a leaf in the other, so every host sends about one copy
and receives one copy, at the NIC rate, after a fill of log2(A) steps:

    t + (depth - 1) t / K        depth = floor(log2 A) + 1 network hops

Tree 0 is a heap over the receiving hosts in order (host i feeds 2i+1 and 2i+2),
tree 1 the same heap over the hosts reversed: the inner hosts of a heap are its
first floor(A/2) positions, so the two trees' inner hosts never meet. The
sender feeds both roots. Each byte crosses into a host once and fans out to its
devices by memory copies, chunk by chunk, as a chain's hosts do.
"""
from __future__ import annotations

from typing import Sequence


from ...bounds import even_bounds
from .. import cost_model
from ..resources import intra_link, nic_receive, nic_send
from .base import (TransferKind, fan_out, group_by_host, receive_buffer, receiving_hosts, run_side_by_side,
                   store_received)

TREES = 2
MAX_CHUNKS_PER_TREE = cost_model.MAX_AUTO_CHUNKS // TREES
"""Each tree's chunk messages take their own tags below the executor's ring tags."""


def tree_edges(sender: int, hosts: Sequence[int], tree: int) -> list[tuple[int, int]]:
    """(parent, child) host pairs of ``tree`` (0 or 1) over ``hosts``, the sender feeding the root."""
    order = list(hosts) if tree == 0 else list(hosts)[::-1]
    if not order:
        return []
    return [(sender, order[0])] + [(order[(p - 1) // 2], order[p]) for p in range(1, len(order))]


def depth(hosts: int) -> int:
    """Network hops from the sender to the deepest leaf of a heap over ``hosts`` hosts."""
    return max(1, hosts).bit_length()


def halves(nbytes: int) -> list[tuple[int, int]]:
    """Byte range [lo, hi) each tree carries."""
    mid = nbytes // 2
    return [(0, mid), (mid, nbytes)]


def chunk_bounds(lo: int, hi: int, chunks: int) -> list[int]:
    """Chunk boundaries of [lo, hi): at most ``chunks`` chunks, none empty."""
    return even_bounds(lo, hi, max(1, min(chunks, hi - lo)))


class DoubleTree(TransferKind):
    name = "double_tree"
    rotates_shared_receivers = True
    order = 42
    auto_min_hosts = 3
    packable = True

    # ------------------------------------------------------------- planning
    def resources(self, sender_host, receiver_hosts):
        hosts = [h for h in receiver_hosts if h != sender_host]
        inner = {p for tree in range(TREES) for p, _ in tree_edges(sender_host, hosts, tree)}
        return ((nic_send(sender_host),) + tuple(nic_receive(h) for h in hosts)
                + tuple(nic_send(h) for h in hosts if h in inner))

    def step_rates(self, sender_host: int, groups, cluster) -> list[float]:
        """One rate per pipeline step: each step moves one chunk of each half, i.e. nbytes/K
        through every host's NIC (an inner host sends its half's chunk to two children, a
        host takes one chunk from each tree), so a step runs at the slowest link."""
        hosts = [h for h in groups if h != sender_host]
        edges = [e for tree in range(TREES) for e in tree_edges(sender_host, hosts, tree)]
        slowest = min(cluster.link_rate(a, b) for a, b in edges) if edges else cluster.intra_rate
        rates = [slowest] * depth(len(hosts))
        if any(len(groups[h]) > 1 for h in hosts):
            rates.append(cluster.intra_rate)  # the last chunk's copy to the other devices of a host
        return rates

    @staticmethod
    def step_latency_s(latency_s: float) -> float:
        return TREES * latency_s

    @staticmethod
    def step_latency(cluster) -> float:
        """Each step a host takes two messages (one chunk per tree) and an inner host sends
        two; a NIC side takes one message at a time, so a step pays two latencies. This is
        what keeps ``auto`` on a chain for a handful of hosts, where the tree saves little
        fill and costs twice the messages (measured on the emulated cluster: 1.3x the bound
        on 3-4 hosts where a chain is 1.0x)."""
        return DoubleTree.step_latency_s(cluster.latency_s)

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        rates = self.step_rates(sender_host, groups, cluster)
        limit = max(1, min(num_elements, MAX_CHUNKS_PER_TREE))
        lat = self.step_latency(cluster)
        k = chunks if chunks is not None else cost_model.auto_chunks(nbytes, rates, lat, limit)
        k = max(1, min(k, limit))
        return cost_model.chain_time(nbytes, rates, k, lat), k

    def busy_fraction(self, t, host_of, rate, latency_s):
        """A pipelined tree moves every byte through every NIC it holds, so a host's NICs
        are busy for its bytes' time out of its fill, steps and latencies: near 1 for many
        chunks, 1/depth for one chunk (store and forward: one level at a time)."""
        if not rate:
            return None
        _, hosts = self._hosts(t, host_of)
        hops = depth(len(hosts))
        whole = cost_model.chain_time(t.nbytes, [rate] * hops, max(1, t.chunks), self.step_latency_s(latency_s))
        return (t.nbytes / rate) / whole if whole > 0 else None

    def closed_form(self, t, hosts, devices, chunks=1):
        return t + (depth(hosts) - 1) * t / chunks

    # ----------------------------------------------------------- simulation
    def _hosts(self, t, host_of) -> tuple[int, list[int]]:
        sender = host_of(t.sender)
        return sender, receiving_hosts(t, host_of, exclude=sender)

    def host_flows(self, t, cluster):
        sender, hosts = self._hosts(t, cluster.host_of)
        return [(p, c, hi - lo) for tree, (lo, hi) in enumerate(halves(t.nbytes))
                for p, c in tree_edges(sender, hosts, tree)]

    def phases(self, t, cluster):
        # One flow per tree, holding the sender's NIC, every host's receive side and the
        # tree's inner hosts' send sides: each receive side is shared by the two trees'
        # flows, so each half streams at half the NIC rate, as in the pipeline's steady
        # state (an inner host's two children also share its NIC, which one flow cannot
        # express; but the transfer holds those NICs alone, so nothing else is slowed).
        # Two flows instead of one per edge keep a 1,000-host tree cheap to simulate.
        # The fill and per-chunk latencies are a fixed delay, as for a chain.
        sender, hosts = self._hosts(t, cluster.host_of)
        groups = group_by_host(t.receivers, cluster)
        fan_out = tuple(intra_link(h) for h in hosts if len(groups.get(h, ())) > 1)
        receive = tuple(nic_receive(h) for h in hosts)
        flows = []
        for tree, (lo, hi) in enumerate(halves(t.nbytes)):
            edges = tree_edges(sender, hosts, tree)
            if hi > lo and edges:
                inner = tuple(dict.fromkeys(nic_send(p) for p, _ in edges))
                flows.append((hi - lo, inner + receive + fan_out))
        rates = self.step_rates(sender, groups, cluster)
        fill = cost_model.chain_time(t.nbytes, rates, t.chunks, self.step_latency(cluster)) - t.nbytes / min(rates)
        return [(max(0.0, fill), flows)]

    # ------------------------------------------------------------- execution
    def run(self, ex, t, tag0):
        sender, hosts = self._hosts(t, ex.host_of)
        if ex.host != sender and ex.host not in hosts:
            return
        trees = []  # (chunk bounds, parent, children) of each tree, from this host's view
        for tree, (lo, hi) in enumerate(halves(t.nbytes)):
            edges = tree_edges(sender, hosts, tree) if hi > lo else []
            parent = next((p for p, c in edges if c == ex.host), None)
            children = [c for p, c in edges if p == ex.host]
            trees.append((chunk_bounds(lo, hi, t.chunks), parent, children))

        def tag(tree: int, c: int) -> int:
            return tag0 + tree * MAX_CHUNKS_PER_TREE + c

        if ex.host == sender:  # every byte is here: both trees' chunks go at once, in (chunk, tree) order
            flat = ex.outgoing(t)
            rounds = max(len(b) - 1 for b, _, _ in trees)
            ex.wait([ex.isend(flat[b[c]:b[c + 1]], kids[0], tag(i, c))
                     for c in range(rounds) for i, (b, _, kids) in enumerate(trees) if kids and c < len(b) - 1])
            return
        flat, mine, targets = receive_buffer(ex, t, t.nbytes)
        # Receives are posted in (chunk, tree) order, the order the sender sends in: a host
        # that takes both trees from the sender (the only receiving host) then matches on
        # a backend that matches per peer in issue order (NCCL), not by tag.
        recvs: list[list] = [[] for _ in trees]
        for c in range(max(len(b) - 1 for b, _, _ in trees)):
            for i, (b, parent, _) in enumerate(trees):
                if parent is not None and c < len(b) - 1:
                    recvs[i].append(ex.irecv(flat[b[c]:b[c + 1]], parent, tag(i, c)))

        def forward(i: int, c: int) -> list:
            """Wait for tree ``i``'s chunk ``c``, pass it on to the children and the devices."""
            b, _, kids = trees[i]
            recvs[i][c].wait(ex.wait_s)
            lo, hi = b[c], b[c + 1]
            sends = [ex.isend(flat[lo:hi], kid, tag(i, c)) for kid in kids]
            fan_out(flat, targets, lo, hi)
            return sends

        if not ex.backend.concurrent:
            # One thread at a time on the backend (NCCL: operations run in issue order on
            # one stream): issue in (chunk, tree) order, as the sender does. This couples
            # the trees (a host forwards tree 0's next chunk only after tree 1's last one
            # came), so the pipeline steps slower than the cost model says.
            sends = [s for c in range(max(len(r) for r in recvs))
                     for i in range(TREES) if c < len(recvs[i]) for s in forward(i, c)]
        else:
            # Each tree forwards on its own: a chunk goes on the moment it lands. Waiting
            # for the other tree's chunk first chains every host to both trees' depths,
            # and the whole pipeline then steps at several hops a chunk (measured on 16
            # emulated hosts at 50 Mbit/s: 4.5 s against the 1.5 s this takes).
            sends = run_side_by_side([lambda i=i: [s for c in range(len(recvs[i])) for s in forward(i, c)]
                                      for i in range(TREES)])
        ex.wait(sends)
        store_received(ex, t, flat, mine, targets)
