"""A flow-level (fluid) network: concurrent flows share link capacity max-min fairly.

Links are the host resources of ``resharding.strategies`` (NIC send side,
NIC receive side, intra-host link), each with a capacity in bytes/s (``inf``
allowed). A flow crosses a set of links and optionally has its own rate cap.
Whenever flows start or finish, rates are recomputed by progressive filling —
but only inside the connected component (flows linked by shared links) that
changed, so thousands of independent transfers stay cheap.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable, Iterable

from ..validation import one_of

EPS = 1e-12


class Flow:
    """``nbytes`` over ``links``; ``on_done(now)`` is called when the last byte arrives."""

    __slots__ = ("id", "links", "nbytes", "remaining", "rate", "t_last", "version", "cap", "on_done")

    def __init__(self, fid: int, links: tuple[int, ...], nbytes: float, cap: float,
                 on_done: Callable[[float], None]):
        self.id, self.links, self.nbytes, self.remaining = fid, links, float(nbytes), float(nbytes)
        self.rate, self.t_last, self.version, self.cap, self.on_done = 0.0, 0.0, 0, cap, on_done


def max_min_rates(flows: list[Flow], capacity: dict[int, float]) -> dict[int, float]:
    """Max-min fair rates by progressive filling: all unfrozen flows rise together until
    a link saturates or a flow reaches its cap; those flows freeze; repeat.

    Water-filling with a heap of each link's fair share (what is left of it over its
    unfrozen flows), so a component of thousands of flows costs O(flows x links a flow
    crosses x log links), not a pass over every link per frozen level. A flow's own cap
    acts as a link of its own that only it crosses."""
    rem: dict = {}
    users: dict = {}
    for f in flows:
        for link in f.links:
            if link not in rem:
                rem[link] = capacity[link]
                users[link] = []
            users[link].append(f)
        if not math.isinf(f.cap):
            key = ("cap", f.id)
            rem[key], users[key] = f.cap, [f]
    count = {link: len(fs) for link, fs in users.items()}
    order = {link: i for i, link in enumerate(users)}  # ties broken by first use: links mix ints and tuples
    heap = [(rem[link] / count[link], order[link], link) for link in users if not math.isinf(rem[link])]
    heapq.heapify(heap)
    rate: dict[int, float] = {}
    while heap:
        share, _, link = heapq.heappop(heap)
        if count[link] == 0 or share != rem[link] / count[link]:
            continue  # stale: the link's share changed since this entry was pushed
        level = max(share, 0.0)
        for f in users[link]:
            if f.id in rate:
                continue
            rate[f.id] = level
            keys = list(f.links) + ([("cap", f.id)] if not math.isinf(f.cap) else [])
            for other in keys:
                rem[other] -= level
                count[other] -= 1
                if other != link and count[other] > 0 and not math.isinf(rem[other]):
                    heapq.heappush(heap, (rem[other] / count[other], order[other], other))
        count[link] = 0
    for f in flows:  # only links of infinite capacity, and no cap: unbounded
        rate.setdefault(f.id, math.inf)
    return rate


MAX_MIN = "max-min"
FAIR_SHARE = "fair-share"


class FluidNetwork:
    """Event-driven fluid simulation of flows and timed callbacks.

    ``sharing`` says how concurrent flows share links: ``"max-min"`` (exact max-min
    fairness over the connected group of flows that changed) or ``"fair-share"``
    (each flow gets the smallest equal share of the links it crosses, capacity over
    flows there: only the flows on a changed link change rate, so tens of thousands of
    concurrent messages stay cheap). A flow's max-min rate is at least that share, so
    ``"fair-share"`` is never faster than ``"max-min"``, and as fast wherever the flows
    on a link are bottlenecked there alike (an all-to-all, a gather)."""

    def __init__(self, capacity: dict[int, float], sharing: str = MAX_MIN):
        one_of(sharing, (MAX_MIN, FAIR_SHARE), "link sharing")
        self.sharing = sharing
        self.capacity = capacity
        self.now = 0.0
        self._events: list = []  # (time, seq, kind, payload, version)
        self._seq = 0
        self._flows: dict[int, Flow] = {}
        self._on_link: dict[int, set[int]] = {}
        self.busy_time: dict[int, float] = {}
        self._busy_since: dict[int, float] = {}
        self.bytes_on: dict[int, float] = {}
        self._dirty: set[int] = set()  # links whose flows changed at this instant: rates to recompute

    # ---------------------------------------------------------------- public
    def at(self, delay: float, callback: Callable[[float], None]) -> None:
        """Call ``callback(now)`` after ``delay`` seconds."""
        self._push(self.now + delay, "call", callback, 0)

    def add_flow(self, links: Iterable[int], nbytes: float, on_done: Callable[[float], None],
                 cap: float = math.inf) -> None:
        links = tuple(dict.fromkeys(links))
        fid = self._seq
        self._seq += 1
        flow = Flow(fid, links, nbytes, cap, on_done)
        flow.t_last = self.now
        if nbytes <= 0 or not links:
            self._push(self.now, "call", on_done, 0)
            return
        self._flows[fid] = flow
        for link in links:
            users = self._on_link.setdefault(link, set())
            if not users:
                self._busy_since[link] = self.now
            users.add(fid)
        self._dirty.update(links)

    def run(self) -> float:
        """Process events until none remain; returns the time of the last one. Rates are
        recomputed once per instant, after every event of that instant (a wave of
        messages that start or end together costs one recomputation, not one each)."""
        while self._events or self._dirty:
            if self._dirty and (not self._events or self._events[0][0] > self.now):
                dirty, self._dirty = self._dirty, set()
                self._reallocate(dirty)
                continue
            t, _, kind, payload, version = heapq.heappop(self._events)
            if kind == "flow":
                flow = self._flows.get(payload)
                if flow is None or flow.version != version:
                    continue  # stale projection
                self.now = max(self.now, t)
                self._finish(flow)
            else:
                self.now = max(self.now, t)
                payload(self.now)
        return self.now

    # -------------------------------------------------------------- internal
    def _push(self, t: float, kind: str, payload, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload, version))

    def _settle(self, flow: Flow) -> None:
        if flow.rate > 0 and not math.isinf(flow.rate):
            flow.remaining -= flow.rate * (self.now - flow.t_last)
        elif math.isinf(flow.rate):
            flow.remaining = 0.0
        flow.t_last = self.now

    def _component(self, links: Iterable[int]) -> list[Flow]:
        seen_links = set()
        seen_flows: dict[int, Flow] = {}
        stack = list(links)
        while stack:
            link = stack.pop()
            if link in seen_links:
                continue
            seen_links.add(link)
            for fid in self._on_link.get(link, ()):
                if fid not in seen_flows:
                    f = self._flows[fid]
                    seen_flows[fid] = f
                    stack.extend(f.links)
        return list(seen_flows.values())

    def _fair_shares(self, links: Iterable[int]) -> tuple[list[Flow], dict[int, float]]:
        """The flows on ``links`` and their rates: the least of capacity / flows over the
        links each crosses (and its own cap)."""
        seen: dict[int, Flow] = {}
        for link in links:
            for fid in self._on_link.get(link, ()):
                seen.setdefault(fid, self._flows[fid])
        rates = {}
        for f in seen.values():
            r = f.cap
            for link in f.links:
                share = self.capacity[link] / len(self._on_link[link])
                if share < r:
                    r = share
            rates[f.id] = r
        return list(seen.values()), rates

    def _reallocate(self, links: Iterable[int]) -> None:
        if self.sharing == FAIR_SHARE:
            flows, rates = self._fair_shares(links)
        else:
            flows = self._component(links)
            rates = max_min_rates(flows, self.capacity) if flows else {}
        for f in flows:
            if rates[f.id] == f.rate and f.version:
                continue  # same rate: its projected end still holds
            self._settle(f)  # bytes moved at the old rate until now
            f.rate = rates[f.id]
            f.version += 1
            eta = self.now if math.isinf(f.rate) else (
                self.now + max(0.0, f.remaining) / f.rate if f.rate > 0 else math.inf)
            if not math.isinf(eta):
                self._push(eta, "flow", f.id, f.version)

    def _finish(self, flow: Flow) -> None:
        del self._flows[flow.id]
        for link in flow.links:
            users = self._on_link[link]
            users.discard(flow.id)
            self.bytes_on[link] = self.bytes_on.get(link, 0.0) + flow.nbytes
            if not users:
                self.busy_time[link] = self.busy_time.get(link, 0.0) + self.now - self._busy_since.pop(link)
        self._dirty.update(flow.links)
        flow.on_done(self.now)
