"""Execute a ``ReshardingPlan`` on the fluid network and report what happened.

Each transfer becomes one or two *phases*; a phase is a fixed delay (message
latencies, pipeline fill) followed by flows. The plan's order is executed
faithfully, by the executor's own admission rules (``resharding.admission``): on
each host resource a transfer holds, it starts only after every earlier transfer
there has started and while fewer than ``MAX_PER_RESOURCE`` of them are in flight
(a chain's fill overlaps the previous chain's drain, as on the wire); a
latency-bound transfer (a few KiB) starts outside those windows, in plan order on
each of its hosts, at most ``MAX_CONCURRENT`` per host, so a host taking a
hundred small messages pays about one latency per ``MAX_CONCURRENT`` of them.
A transfer also waits for all its dependencies. A bad order still shows up as idle
hosts and a longer makespan, never hidden.

How each kind maps to phases and flows is the kind's own ``phases``
(``resharding/kinds/``): e.g. a broadcast's chunk pipeline is one flow that
holds every hop of the chain at once, after a fixed delay for its fill.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import InternalError
from ..resharding.admission import MAX_CONCURRENT, MAX_PER_RESOURCE, latency_bound, window_units
from ..resharding.kinds import transfer_kind
from ..resharding.kinds.base import receiving_hosts
from ..resharding.plan import ReshardingPlan, Transfer
from ..resharding.resources import INTRA, RECEIVE, SEND, host_and_side, intra_link, nic_receive, nic_send
from ..topology import ClusterSpec
from .network import FAIR_SHARE, MAX_MIN, FluidNetwork


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


EXACT_SHARING_TRANSFERS = 2048
"""Plans of at most this many transfers share links max-min fairly (exact); larger ones,
where tens of thousands of small messages are in flight together, by each flow's
smallest equal share of its links (``network.FAIR_SHARE``: never faster, and far
cheaper: only flows on a changed link get a new rate; a 65,536-message all-to-all
simulates in about 9 s)."""


def simulate(plan: ReshardingPlan, cluster: ClusterSpec | None = None, *,
             window: int = MAX_PER_RESOURCE, max_concurrent: int = MAX_CONCURRENT,
             sharing: str | None = None) -> SimResult:
    """Run ``plan`` on ``cluster`` (default: the plan's own cluster) by the executor's
    admission rules (``resharding.admission``): on each host resource a transfer holds,
    at most ``window`` of the transfers that hold it for long are in flight, started in
    the plan's order there; a latency-bound transfer starts outside those windows, in the
    plan's order on each of its hosts, at most ``max_concurrent`` of them per host.
    ``window=1, max_concurrent=1`` plays every resource strictly one transfer at a time.
    ``sharing`` (``"max-min"`` or ``"fair-share"``) defaults by the plan's size
    (``EXACT_SHARING_TRANSFERS``)."""
    cluster = cluster or plan.cluster
    if sharing is None:
        sharing = MAX_MIN if len(plan.transfers) <= EXACT_SHARING_TRANSFERS else FAIR_SHARE
    net = FluidNetwork(capacities(cluster), sharing)
    transfers: Sequence[Transfer] = plan.transfers
    min_rate, lat = cluster.slowest_nic_rate, cluster.latency_s
    res_of: dict[int, tuple[int, ...]] = {}  # every resource a transfer holds (timeline, busy)
    gates: dict[int, tuple] = {}  # the queues it is admitted through: windows or host slots
    units: dict[int, int] = {}  # how much of each window (or host slot) it takes
    queues: dict = {}
    for t in transfers:  # transfers are in plan (start) order
        r = transfer_kind(t.kind).transfer_resources(t, cluster)
        res_of[t.id] = r
        if latency_bound(t.nbytes, lat, min_rate):
            gate = tuple(("host", h) for h in sorted({host_and_side(k)[0] for k in r}))
            units[t.id] = 1
        else:
            gate = tuple(("nic", k) for k in r)
            units[t.id] = window_units(t, 1, window, cluster.host_of, min_rate, lat)
        gates[t.id] = gate
        for key in gate:
            queues.setdefault(key, []).append(t.id)
    limit = {key: (window if key[0] == "nic" else max_concurrent) for key in queues}
    head = {key: 0 for key in queues}  # the next transfer to start on each queue
    running = {key: 0 for key in queues}
    done: set[int] = set()
    started: set[int] = set()
    start_time: dict[int, float] = {}
    timeline: list[TimelineEntry] = []
    dependents: dict[int, list[int]] = {}
    for t in transfers:
        for d in t.deps:
            dependents.setdefault(d, []).append(t.id)
    pending: deque = deque()  # transfers to look at, and a flag so that releases never nest
    draining = [False]

    def ready(tid: int) -> bool:
        if tid in started:
            return False
        for key in gates[tid]:
            at = head[key]
            if at >= len(queues[key]) or queues[key][at] != tid or (
                    running[key] and running[key] + units[tid] > limit[key]):
                return False
        return all(d in done for d in transfers[tid].deps)

    def consider(tids) -> None:
        pending.extend(tids)
        if draining[0]:  # a release inside a release: the outer loop takes it
            return
        draining[0] = True
        try:
            while pending:
                tid = pending.popleft()
                if ready(tid):
                    release(tid)
        finally:
            draining[0] = False

    def release(tid: int) -> None:
        started.add(tid)
        start_time[tid] = net.now
        nxt = []
        for key in gates[tid]:
            head[key] += 1
            running[key] += units[tid]
            if head[key] < len(queues[key]):
                nxt.append(queues[key][head[key]])
        pending.extend(sorted(set(nxt)))
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
        for key in gates[tid]:
            running[key] -= units[tid]
            if head[key] < len(queues[key]):
                candidates.add(queues[key][head[key]])
        consider(sorted(candidates))

    consider([t.id for t in transfers])
    makespan = net.run()
    if len(done) != len(transfers):
        stuck = [t.id for t in transfers if t.id not in done][:5]
        raise InternalError(f"simulation deadlocked: transfers {stuck} never became ready (their per-host "
                            "order contradicts their dependencies; the planner never orders them so: a plan "
                            "written by hand must put each transfer after the ones it depends on)")
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
