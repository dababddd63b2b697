"""Execute a ``ReshardingPlan`` on the fluid network and report what happened.

Each transfer becomes one or two *phases*; a phase is a fixed delay (message
latencies, pipeline fill) followed by flows. The plan's order is executed
faithfully: a transfer is released only when every earlier transfer on each of
its host resources (in plan order) and all its dependencies have finished, so
a bad order shows up as idle hosts and a longer makespan, never hidden.

How each kind maps to flows (t = bytes / bottleneck rate):

* ``send_recv`` / ``local_copy``: one flow over the sender's NIC send side and
  the receiver's receive side (intra-host link for a copy).
* ``broadcast``: the chunk pipeline is one flow that holds every hop of the
  chain at once (each host forwards chunk k while taking chunk k+1, so in
  steady state all hops run at the chain's rate); the pipeline fill and the
  per-chunk latencies, ``chain_time - t``, are a fixed delay before it.
* ``local_allgather``: the slice to the host, then an intra-host ring
  all-gather; ``global_allgather``: a scatter (flows per receiving host) then a
  ring all-gather as one flow over the ring's links; ``allgather`` (Alpa):
  the ring only; ``signal``: latency only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..cluster import ClusterSpec
from ..resharding import cost_model as cm
from ..resharding.plan import ReshardingPlan, Transfer
from ..resharding.strategies import ALLGATHER, LOCAL_COPY, intra, rx, transfer_resources, tx
from .network import FluidNetwork


@dataclass(frozen=True)
class TimelineEntry:
    transfer: int
    task: int
    kind: str
    hosts: tuple[int, ...]
    start: float
    end: float
    nbytes: int
    resources: tuple[int, ...]


@dataclass
class SimResult:
    """Makespan, per-host NIC bytes and busy fractions, and every transfer's timeline."""

    makespan: float
    host_sent: dict[int, float]
    host_received: dict[int, float]
    host_busy_fraction: dict[int, float]
    timeline: list[TimelineEntry] = field(default_factory=list)

    def idle_hosts(self, threshold: float = 0.5) -> list[int]:
        """Hosts whose NIC carried traffic less than ``threshold`` of the makespan."""
        return sorted(h for h, f in self.host_busy_fraction.items() if f < threshold)


def _hosts_in_order(t: Transfer, cluster: ClusterSpec) -> list[int]:
    return list(dict.fromkeys(cluster.host_of(r) for r in t.receivers))


def _groups(t: Transfer, cluster: ClusterSpec) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in t.receivers:
        out.setdefault(cluster.host_of(r), []).append(r)
    return out


def _ring_links(hosts: list[int], groups: dict[int, list[int]]) -> tuple[int, ...]:
    if len(hosts) == 1:
        return (intra(hosts[0]),)
    links = []
    for i, h in enumerate(hosts):
        nxt = hosts[(i + 1) % len(hosts)]
        links += [tx(h), rx(nxt)]
        if len(groups[h]) > 1:
            links.append(intra(h))
    return tuple(links)


def phases(t: Transfer, cluster: ClusterSpec) -> list[tuple[float, list[tuple[float, tuple[int, ...]]]]]:
    """[(delay, [(bytes, links), ...]), ...] for one transfer."""
    lat = cluster.latency_s
    n = t.nbytes
    hosts = _hosts_in_order(t, cluster)
    groups = _groups(t, cluster)
    s = None if t.sender is None else cluster.host_of(t.sender)
    if t.kind == LOCAL_COPY:
        m = len(t.receivers)
        return [(m * lat, [(m * n, (intra(hosts[0]),))])]
    if t.kind == "send_recv":
        (h,) = hosts
        return [(lat, [(n, (tx(s), rx(h)) if h != s else (intra(h),))])]
    if t.kind == "local_allgather":
        (h,) = hosts
        b = len(t.receivers)
        out = [(b * lat, [(n, (tx(s), rx(h)))])]
        if b > 1:
            out.append(((b - 1) * lat, [((b - 1) * n / b, (intra(h),))]))
        return out
    if t.kind in ("broadcast", "signal"):
        rates, prev = [], s
        links = [tx(s)]
        for h in hosts:
            rates.append(cluster.link_rate(prev, h))
            rates += [cluster.intra_rate] * (len(groups[h]) - 1)
            links.append(rx(h))
            if len(groups[h]) > 1:
                links.append(intra(h))
            if h != hosts[-1]:
                links.append(tx(h))
            prev = h
        if t.kind == "signal":
            return [(cm.chain_time(1, rates, 1, lat), [])]
        fill = cm.chain_time(n, rates, t.chunks, lat) - n / min(rates)
        return [(fill, [(n, tuple(links))])]
    if t.kind == "global_allgather":
        members = len(t.receivers)
        scatter = [(n * len(groups[h]) / members, (tx(s), rx(h))) for h in hosts]
        ring = _ring_links(hosts, groups)
        return [(members * lat, scatter), ((members - 1) * lat, [((members - 1) * n / members, ring)])]
    if t.kind == ALLGATHER:
        members = len(t.receivers)
        return [((members - 1) * lat, [((members - 1) * n / members, _ring_links(hosts, groups))])]
    raise ValueError(f"cannot simulate transfer kind {t.kind!r}")


def capacities(cluster: ClusterSpec) -> dict[int, float]:
    cap: dict[int, float] = {}
    for h in range(cluster.num_hosts):
        cap[tx(h)] = cluster.send_rate(h)
        cap[rx(h)] = cluster.recv_rate(h)
        cap[intra(h)] = cluster.intra_rate
    return cap


def simulate(plan: ReshardingPlan, cluster: ClusterSpec | None = None) -> SimResult:
    """Run ``plan`` on ``cluster`` (default: the plan's own cluster)."""
    cluster = cluster or plan.cluster
    net = FluidNetwork(capacities(cluster))
    transfers: Sequence[Transfer] = plan.transfers
    res_of = {}
    queues: dict[int, list[int]] = {}
    for t in transfers:  # transfers are in plan (start) order
        sender_host = None if t.sender is None else cluster.host_of(t.sender)
        r = transfer_resources(t.kind, sender_host, _hosts_in_order(t, cluster))
        res_of[t.id] = r
        for key in r:
            queues.setdefault(key, []).append(t.id)
    head = {key: 0 for key in queues}
    done: set[int] = set()
    started: set[int] = set()
    start_time: dict[int, float] = {}
    timeline: list[TimelineEntry] = []
    dependents: dict[int, list[int]] = {}
    for t in transfers:
        for d in t.deps:
            dependents.setdefault(d, []).append(t.id)

    def ready(tid: int) -> bool:
        t = transfers[tid]
        return (tid not in started and all(queues[k][head[k]] == tid for k in res_of[tid])
                and all(d in done for d in t.deps))

    def release(tid: int) -> None:
        started.add(tid)
        start_time[tid] = net.now
        run_phase(tid, phases(transfers[tid], cluster), 0)

    def run_phase(tid: int, ph, i: int) -> None:
        if i == len(ph):
            complete(tid)
            return
        delay, flows = ph[i]

        def after_delay(_now):
            if not flows:
                run_phase(tid, ph, i + 1)
                return
            left = [len(flows)]

            def flow_done(_now2):
                left[0] -= 1
                if left[0] == 0:
                    run_phase(tid, ph, i + 1)

            for nbytes, links in flows:
                net.add_flow(links, nbytes, flow_done)

        if delay > 0:
            net.at(delay, after_delay)
        else:
            after_delay(net.now)

    def complete(tid: int) -> None:
        t = transfers[tid]
        done.add(tid)
        hosts = set(_hosts_in_order(t, cluster))
        if t.sender is not None:
            hosts.add(cluster.host_of(t.sender))
        timeline.append(TimelineEntry(tid, t.task, t.kind, tuple(sorted(hosts)), start_time[tid], net.now,
                                      t.nbytes, res_of[tid]))
        candidates = set(dependents.get(tid, ()))
        for key in res_of[tid]:
            head[key] += 1
            if head[key] < len(queues[key]):
                candidates.add(queues[key][head[key]])
        for c in sorted(candidates):
            if ready(c):
                release(c)

    for t in transfers:
        if ready(t.id):
            release(t.id)
    makespan = net.run()
    if len(done) != len(transfers):
        stuck = [t.id for t in transfers if t.id not in done][:5]
        raise RuntimeError(f"simulation deadlocked: transfers {stuck} never became ready "
                           "(their per-host order contradicts their dependencies)")
    timeline.sort(key=lambda e: (e.start, e.transfer))
    host_sent: dict[int, float] = {}
    host_recv: dict[int, float] = {}
    busy: dict[int, float] = {}
    for link, b in net.bytes_on.items():
        h, kind = divmod(link, 3)
        if kind == 0:
            host_sent[h] = host_sent.get(h, 0.0) + b
        elif kind == 1:
            host_recv[h] = host_recv.get(h, 0.0) + b
    for link, t in net.busy_time.items():
        h, kind = divmod(link, 3)
        if kind < 2:
            busy[h] = max(busy.get(h, 0.0), t)
    frac = {h: (b / makespan if makespan > 0 else 0.0) for h, b in busy.items()}
    involved = set(host_sent) | set(host_recv)
    for h in involved:
        frac.setdefault(h, 0.0)
    return SimResult(makespan, host_sent, host_recv, frac, timeline)


def effective_gbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else math.inf
