"""Execute a ``ReshardingPlan`` on the fluid network and report what happened.

Each transfer becomes one or two *phases*; a phase is a fixed delay (message
latencies, pipeline fill) followed by flows. The plan's order is executed
faithfully: a transfer is released only when every earlier transfer on each of
its host resources (in plan order) and all its dependencies have finished, so
a bad order shows up as idle hosts and a longer makespan, never hidden.

How each kind maps to phases and flows is the kind's own ``phases``
(``resharding/kinds/``): e.g. a broadcast's chunk pipeline is one flow that
holds every hop of the chain at once, after a fixed delay for its fill.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..resharding.kinds import transfer_kind
from ..resharding.kinds.base import receiving_hosts
from ..resharding.plan import ReshardingPlan, Transfer
from ..resharding.resources import INTRA, RECEIVE, SEND, host_and_side, intra_link, nic_receive, nic_send
from ..topology import ClusterSpec
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
    return receiving_hosts(t, cluster.host_of)


def phases(t: Transfer, cluster: ClusterSpec) -> list[tuple[float, list[tuple[float, tuple[int, ...]]]]]:
    """[(delay, [(bytes, links), ...]), ...] for one transfer, from its kind."""
    return transfer_kind(t.kind).phases(t, cluster)


def capacities(cluster: ClusterSpec) -> dict[int, float]:
    cap: dict[int, float] = {}
    for h in range(cluster.num_hosts):
        cap[nic_send(h)] = cluster.send_rate(h)
        cap[nic_receive(h)] = cluster.recv_rate(h)
        cap[intra_link(h)] = cluster.intra_rate
    return cap


def simulate(plan: ReshardingPlan, cluster: ClusterSpec | None = None) -> SimResult:
    """Run ``plan`` on ``cluster`` (default: the plan's own cluster)."""
    cluster = cluster or plan.cluster
    net = FluidNetwork(capacities(cluster))
    transfers: Sequence[Transfer] = plan.transfers
    res_of = {}
    queues: dict[int, list[int]] = {}
    for t in transfers:  # transfers are in plan (start) order
        r = transfer_kind(t.kind).transfer_resources(t, cluster)
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
        h, side = host_and_side(link)
        if side == SEND:
            host_sent[h] = host_sent.get(h, 0.0) + b
        elif side == RECEIVE:
            host_recv[h] = host_recv.get(h, 0.0) + b
    for link, t in net.busy_time.items():
        h, side = host_and_side(link)
        if side != INTRA:
            busy[h] = max(busy.get(h, 0.0), t)
    frac = {h: (b / makespan if makespan > 0 else 0.0) for h, b in busy.items()}
    involved = set(host_sent) | set(host_recv)
    for h in involved:
        frac.setdefault(h, 0.0)
    return SimResult(makespan, host_sent, host_recv, frac, timeline)


def effective_gbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else math.inf
