"""The rules a host admits a plan's transfers by: how many it keeps in flight, and on
which NIC in which order. The executor (``runtime.executor``) runs by them and the
simulator (``sim.simulate``) plays plans by them, so both live here, once.

* A host keeps at most ``MAX_CONCURRENT`` of its transfers in flight.
* On each NIC (and intra-host link) a transfer holds, at most ``MAX_PER_RESOURCE`` of
  the transfers that hold it for long are in flight at once (per stream of the
  backend), taken in the plan's order there: the planner balanced and ordered each
  NIC's work as a sequence, and a second one admitted while the first is on the wire
  hides the per-transfer start-up (a chain's fill, a message's latency) without turning
  the sequence into a free-for-all.
* A transfer that keeps its NICs busy ``ALONE_BUSY`` of its time or more
  (``TransferKind.busy_fraction``: a pipelined double tree) takes a whole window: it
  runs alone there (``window_units``).
* A transfer whose bytes take fewer than ``ORDERED_LATENCIES`` message latencies on the
  slowest NIC is latency-bound: its order on a NIC hardly matters, and overlapping it
  with others hides what it costs, so it is admitted outside the NIC windows (only the
  host's ``MAX_CONCURRENT`` bounds it). A receiving host that takes a hundred small
  messages from a hundred senders therefore pays about one latency per
  ``MAX_CONCURRENT`` of them, not one per message.

``admitted_seconds`` estimates a plan's time under these rules in one pass over its
transfers; ``strategy="auto"`` ranks the kinds it plans by it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .kinds import transfer_kind
from .resources import host_and_side, intra_link, nic_receive, nic_send

if TYPE_CHECKING:
    from ..topology import ClusterSpec

MAX_INFLIGHT_BYTES = 256 * 2**20
"""Bytes of packing and unpacking buffers a host holds at once for the transfers in
flight, beyond the source and destination memory (a transfer larger than this runs when
nothing else is in flight); the planner streams slices together up to this size."""
MAX_CONCURRENT = 32
"""Transfers a host keeps in flight at once (each on a thread of its own)."""
MAX_PER_RESOURCE = 2
"""Transfers that hold a NIC for long that a host keeps in flight on any one NIC (or
intra-host link) at once, per stream of its backend (a message below the striping size
rides one stream, so one stream's worth would leave the others idle), in the plan's
order there."""
ALONE_BUSY = 0.8
"""A transfer that keeps its NICs busy this share of its time or more runs alone on them
(``window_units``). Two such pipelined trees over the same hosts could only split their
NICs, and two pipelines through shared hosts step at the slower one's pace: on 16
emulated hosts (8 double trees over the same 8 hosts, 50 Mbit/s) trees busy 0.85 of
their time ran 1.35x the simulated time two at a time and within 9 % of it one at a
time (1.80 s against 2.05-2.25 s on the wire); trees busy 0.73 took the same time on
the wire either way (0.46 s), the simulator 10-14 % off either way, so they share and
overlap their fills and message latencies."""
ORDERED_LATENCIES = 8
"""A transfer whose bytes take fewer than this many message latencies on the slowest NIC
is latency-bound and admitted outside the NIC windows."""


def latency_bound(nbytes: int, latency_s: float, min_rate: float | None) -> bool:
    """Whether a transfer of ``nbytes`` is latency-bound on NICs whose slowest rate is
    ``min_rate`` bytes/s with ``latency_s`` per message (no rate known: never)."""
    return bool(min_rate) and nbytes < ORDERED_LATENCIES * latency_s * min_rate


def runs_alone(t, host_of, rate: float | None, latency_s: float) -> bool:
    """Whether transfer ``t`` keeps its NICs busy at least ``ALONE_BUSY`` of its time
    (``TransferKind.busy_fraction``: a pipelined double tree), so it runs alone on them."""
    busy = transfer_kind(t.kind).busy_fraction(t, host_of, rate, latency_s)
    return busy is not None and busy >= ALONE_BUSY


def window_units(t, units: int, window: int, host_of, rate: float | None, latency_s: float) -> int:
    """How much of a NIC's ``window`` transfer ``t`` takes where it would take ``units``
    (one, or one per stream it is striped over): all of it where it ``runs_alone``."""
    return window if runs_alone(t, host_of, rate, latency_s) else units


def admitted_seconds(transfers: Sequence, cluster: "ClusterSpec", limit: float = math.inf) -> float:
    """An estimate of how long ``transfers`` take played by these rules, cheap enough to
    rank ``strategy="auto"``'s candidate plans by (the load balancer's prediction plays
    every resource one transfer at a time, which charges a host that takes 256 small
    messages 256 latencies where admission overlaps them 32 at a time).

    Each transfer is read as its kind plays it in the simulator (``phases``: a fixed delay,
    then flows, phase after phase); its *busy* time is, phase by phase, its bytes on its
    most loaded resource at that resource's rate. On every resource (NIC side, intra-host
    link) the estimate charges:

    * long transfers (``MAX_PER_RESOURCE`` in flight, in plan order): each keeps its place
      in the window until its last phase ends, and the transfers in flight together share
      their bottleneck (a plan's transfers on a resource are alike: the same kind over
      like slices), so the window passes them at their busy times one after another, while
      their fixed delays (latencies, a chain's fill) overlap ``MAX_PER_RESOURCE`` at a
      time (never less than the longest one). A scatter's sending NIC thus waits out the
      ring all-gather that follows it, as in the simulator; a transfer that
      ``runs_alone`` overlaps none: its delays add up;
    * latency-bound transfers (``MAX_CONCURRENT`` a host, outside the windows): their
      bytes at the resource's rate, and their delays overlapped ``MAX_CONCURRENT`` at a
      time on their host (a host taking 256 messages pays 8 latencies, not 256);
    * never less than all the bytes that cross it at its rate.

    The estimate is the most loaded resource, and at least the longest transfer alone.
    It leaves out dependencies between transfers and head-of-line waits in plan order.
    Where it would exceed ``limit`` (another plan's estimate) it may stop early and return
    ``inf``."""
    tally = _Tally.of(cluster, limit)
    try:
        for t in transfers:
            tally.add(t, cluster)
    except _OverLimit:
        return math.inf
    return tally.estimate()


class _OverLimit(Exception):
    """Raised inside ``_Tally`` once a term that only grows passes ``limit``: the plan
    cannot come under it, so ``admitted_seconds`` stops and returns ``inf``."""


@dataclass
class _Tally:
    """What ``admitted_seconds`` adds up over a plan's transfers, by resource key
    (``resources``: 3 x host + side), so that each rule of the estimate is one method.

    The lists are indexed by resource key, and the hot loops bind them to locals: a
    plan of tens of thousands of transfers passes through ``add`` once each."""

    limit: float
    latency_s: float
    min_rate: float | None
    rate: list  # bytes/s of each resource
    load: list  # seconds of all the bytes that cross each resource, at its rate
    serial: list  # busy seconds of its long transfers + its latency-bound bytes
    held: dict = field(default_factory=dict)  # resource -> [sum, max, count] of its long transfers' delays
    quick: dict = field(default_factory=dict)  # host -> [sum, max, count] of its latency-bound transfers' delays
    longest: float = 0.0  # the longest transfer alone (its delays plus its busy time)

    @classmethod
    def of(cls, cluster: "ClusterSpec", limit: float) -> "_Tally":
        rate = [0.0] * (3 * cluster.num_hosts)
        for h in range(cluster.num_hosts):
            rate[nic_send(h)], rate[nic_receive(h)], rate[intra_link(h)] = (
                cluster.send_rate(h), cluster.recv_rate(h), cluster.intra_rate)
        return cls(limit, cluster.latency_s, cluster.slowest_nic_rate, rate, [0.0] * len(rate), [0.0] * len(rate))

    def add(self, t, cluster: "ClusterSpec") -> None:
        """Charge one transfer: its bytes everywhere, then its busy time and delays by
        the rule that admits it (latency-bound, long, or long and ``runs_alone``)."""
        kind = transfer_kind(t.kind)
        small = latency_bound(t.nbytes, self.latency_s, self.min_rate)
        delay, busy = self._play(kind.phases(t, cluster), small)
        if delay + busy > self.longest:
            self.longest = delay + busy
            if self.longest > self.limit:
                raise _OverLimit
        resources = kind.transfer_resources(t, cluster)
        if small:
            self._overlap({host_and_side(k)[0] for k in resources}, self.quick, MAX_CONCURRENT, delay)
            return
        self._serialize(resources, busy)
        if runs_alone(t, cluster.host_of, self.min_rate, self.latency_s):  # nothing hides its delays
            self._serialize(resources, delay)
            return
        self._overlap(resources, self.held, MAX_PER_RESOURCE, delay)

    def _play(self, phases, small: bool) -> tuple[float, float]:
        """(fixed delay, busy time) of a transfer's phases, each phase busy for its
        bytes on its most loaded resource; every flow's bytes go into ``load`` (and, for
        a latency-bound transfer, into ``serial``: it is outside the windows, so only its
        bytes queue there)."""
        rate, load, serial, limit = self.rate, self.load, self.serial, self.limit
        delay = busy = 0.0
        for d, flows in phases:
            delay += d
            top = 0.0
            if len(flows) == 1:  # the common case: one flow, its bytes on every link it crosses
                nbytes, links = flows[0]
                for k in links:
                    sec = nbytes / rate[k]
                    load[k] += sec
                    if sec > top:
                        top = sec
                    if small:
                        serial[k] += sec
                        if serial[k] > limit:
                            raise _OverLimit
            elif flows:
                top = self._shared_phase(flows, small)
            busy += top
        return delay, busy

    def _shared_phase(self, flows, small: bool) -> float:
        """Charge a phase of several flows, where flows that share a link share its rate;
        its busy time is its most loaded link's."""
        rate, load, serial = self.rate, self.load, self.serial
        phase: dict[int, float] = {}
        for nbytes, links in flows:
            for k in links:
                phase[k] = phase.get(k, 0.0) + nbytes / rate[k]
        for k, sec in phase.items():
            load[k] += sec
            if small:
                serial[k] += sec
        return max(phase.values())

    def _serialize(self, resources, seconds: float) -> None:
        """Add ``seconds`` that pass one after another on each of ``resources``."""
        serial, limit = self.serial, self.limit
        for k in resources:
            serial[k] += seconds
            if serial[k] > limit:  # every term only grows: this plan cannot come under the limit
                raise _OverLimit

    def _overlap(self, keys, into: dict, at_once: int, delay: float) -> None:
        """Add a fixed delay that overlaps ``at_once`` at a time on each of ``keys``
        (resources for long transfers, hosts for latency-bound ones): ``_waves`` reads
        the [sum, max, count] kept here."""
        if delay <= 0:
            return
        for k in keys:
            acc = into.get(k)
            if acc is None:
                into[k] = [delay, delay, 1]
            else:
                acc[0] += delay
                if delay > acc[1]:
                    acc[1] = delay
                acc[2] += 1
                if acc[0] > self.limit * at_once:  # at most its waves' delays (``_waves``)
                    raise _OverLimit

    def estimate(self) -> float:
        """The most loaded resource (its serial time or all its bytes, plus the waves of
        delays on it and on its host), at least the longest transfer alone."""
        worst = self.longest
        for k in range(len(self.rate)):
            est = max(self.load[k], self.serial[k])
            if k in self.held:
                est += _waves(self.held[k], MAX_PER_RESOURCE)
            h = host_and_side(k)[0]
            if h in self.quick:
                est += _waves(self.quick[h], MAX_CONCURRENT)
            if est > worst:
                worst = est
        return worst


def _waves(delays: list, at_once: int) -> float:
    """Fixed delays ([sum, max, count]) of transfers admitted ``at_once`` at a time, in
    waves that start together: ceil(count / at_once) mean delays, at least the longest."""
    total, longest, n = delays
    return max(-(-n // at_once) * total / n, longest)
