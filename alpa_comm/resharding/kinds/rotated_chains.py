"""``rotated_chains``: many slices to the same receiving hosts, every NIC busy at once.

When A receiving hosts all need many slices (a sharded layout to replicated
copies: RL weight sync, an all-gather-like change, a checkpoint broadcast), one
chain per slice (``broadcast``) runs chains that share hosts one after another
and pays an (A-1)-hop fill per slice, so at hundreds of hosts most NICs idle.
Here the slices of one group (same receiving hosts) form one transfer:

1. **scatter**: each slice's sender sends it once, to its *entry* host — the
   slices in order, split into A contiguous runs of about equal bytes, one run
   per receiving host;
2. **ring**: the receiving hosts run a ring all-gather of the runs: A chains,
   each starting at its own host (rotated), forwarded A-1 hops, all at once.

Every receiving host takes in the group's bytes once (minus its own run) while
sending as much, which is the bandwidth bound for this pattern; the cost of the
fill is one run per step, not one slice per hop. Each byte crosses into a host
once and fans out to that host's devices by memory copies.

Consecutive slices from one sender to one entry host travel as one scatter
message. A group has at most ``MAX_SCATTER_MESSAGES`` scatter messages and
``MAX_RING_HOSTS`` hosts (each transfer has 1024 tags: scatter tags below the
executor's ring tags); larger sets are split into several groups, and rings wider than that fall back to
``broadcast``. A single receiving host is no ring; from two on, a group whose ring
the cost model finds slower than its chains in a row (few sending hosts make the
scatter the long pole) goes as chains (``broadcast``). Two hosts count: 128 hosts'
slices to two receivers as chains run one after another on the receivers' NICs, each
paying its fill, where the two-host ring (half the slices into each, then one swap)
takes each byte in once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Sequence

import numpy as np

from ...topology import ClusterSpec
from .. import cost_model
from ..resources import nic_receive, nic_send
from .base import Candidate, TransferKind, group_by_host, receiving_hosts, ring_links
from .broadcast import Broadcast

_NBYTES, _SENDER, _TASK = attrgetter("nbytes"), attrgetter("sender"), attrgetter("task")
_CANDIDATES, _RECEIVERS, _KIND = attrgetter("candidates"), attrgetter("receivers"), attrgetter("kind")
_LAYOUTS: dict = {}
_LAYOUTS_KEPT = 16
"""``_layout``'s memo: (parts, receivers, host_of, layout) by the ids of the first two
(the entry holds them, so the ids are not reused while it is kept)."""

MAX_SCATTER_MESSAGES = 512
MAX_RING_HOSTS = 512
MIN_RING_HOSTS = 2
"""A ring needs two hosts; whether it beats the chains is the cost model's call
(``combine``)."""


_VECTOR_MIN = 64
"""From this many parts on, ``entry_hosts``, ``scatter_messages`` and ``runs`` pass over
them with NumPy (a ring of a weight sync carries hundreds of thousands of slices); below
it, plain Python is faster. Both give the same answer."""


def _entry_positions(part_bytes: Sequence[int], a: int) -> np.ndarray | None:
    """The ring position (0 .. a-1) each part enters at, as ``entry_hosts`` defines it, or
    None where the byte counts are too large for exact int64 arithmetic."""
    sizes = np.asarray(part_bytes, dtype=np.int64)
    total = int(sizes.sum())
    if not total:
        return np.zeros(len(sizes), dtype=np.int64)
    if total * a >= 1 << 62:
        return None
    acc = np.cumsum(sizes) - sizes
    return np.minimum(a - 1, acc * a // total)


_PLANS: dict = {}


def _scatter_plan(part_bytes: Sequence[int], sender_hosts: Sequence[int], ring: Sequence[int]):
    """(scatter messages, bytes of each, runs) of a ring's parts, with one pass of NumPy
    over them (None where the parts are few or too large for int64); the last few are
    kept by the ids of the lists given (the entry holds them)."""
    if len(part_bytes) < _VECTOR_MIN:
        return None
    key = (id(part_bytes), id(sender_hosts), tuple(ring))
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is part_bytes and hit[1] is sender_hosts:
        return hit[2]
    plan = _scatter_plan_afresh(part_bytes, sender_hosts, ring)
    if plan is None:
        return None
    if len(_PLANS) >= _LAYOUTS_KEPT:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = (part_bytes, sender_hosts, plan)
    return plan


def _scatter_plan_afresh(part_bytes: Sequence[int], sender_hosts: Sequence[int] | None, ring: Sequence[int]):
    """``_scatter_plan``'s work, kept nowhere (``sender_hosts`` None: the runs only)."""
    k = _entry_positions(part_bytes, len(ring))
    if k is None:
        return None
    n, a = len(k), len(ring)
    prefix = np.concatenate([[0], np.cumsum(np.asarray(part_bytes, dtype=np.int64))])
    lo = np.searchsorted(k, np.arange(a), "left")  # entry positions never decrease: runs are contiguous
    hi = np.searchsorted(k, np.arange(a), "right")
    starts, ends = prefix[lo].tolist(), prefix[hi].tolist()
    blocks = {h: ((s, e) if b > l else (0, 0)) for h, s, e, l, b in zip(ring, starts, ends, lo.tolist(), hi.tolist())}
    if sender_hosts is None:
        return None, None, blocks
    entries = np.asarray(ring, dtype=np.int64)[k]
    senders = np.asarray(sender_hosts, dtype=np.int64)
    change = np.ones(n, dtype=bool)
    change[1:] = (senders[1:] != senders[:-1]) | (entries[1:] != entries[:-1])
    first = np.flatnonzero(change)
    end = np.append(first[1:], n)
    messages = list(zip(senders[first].tolist(), entries[first].tolist(), first.tolist(), end.tolist()))
    return messages, (prefix[end] - prefix[first]).tolist(), blocks


def _ring_steps_seconds(blocks: dict, ring: Sequence[int], cluster) -> float:
    """The A-1 ring steps after the scatter, each as long as the largest run (``blocks``:
    host -> byte range) over the slowest ring link."""
    a = len(ring)
    if a == 1:
        return 0.0
    largest = max(e - s for s, e in blocks.values())
    slowest = min(cluster.link_rate(h, ring[(i + 1) % a]) for i, h in enumerate(ring))
    return (a - 1) * cost_model.p2p_time(largest, slowest, cluster.latency_s)


def entry_hosts(part_bytes: Sequence[int], ring: Sequence[int]) -> list[int]:
    """The ring host each part enters at: parts in order, split into ``len(ring)``
    contiguous runs of about equal bytes (so every host's run is one flat block)."""
    if len(part_bytes) >= _VECTOR_MIN:
        k = _entry_positions(part_bytes, len(ring))
        if k is not None:
            return np.asarray(ring, dtype=np.int64)[k].tolist()
    total, a, acc, out = sum(part_bytes), len(ring), 0, []
    for n in part_bytes:
        out.append(ring[min(a - 1, acc * a // total) if total else 0])
        acc += n
    return out


def scatter_messages(part_bytes: Sequence[int], sender_hosts: Sequence[int], ring: Sequence[int]
                     ) -> list[tuple[int, int, int, int]]:
    """(sender host, entry host, first part, end part) of every scatter message:
    consecutive parts with the same sender and entry host travel together."""
    plan = _scatter_plan(part_bytes, sender_hosts, ring)
    if plan is not None:
        return list(plan[0])
    out: list[list[int]] = []
    for j, (s, e) in enumerate(zip(sender_hosts, entry_hosts(part_bytes, ring))):
        if out and out[-1][0] == s and out[-1][1] == e:
            out[-1][3] = j + 1
        else:
            out.append([s, e, j, j + 1])
    return [tuple(m) for m in out]


def runs(part_bytes: Sequence[int], ring: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Byte range [start, end) of each ring host's run in the transfer's flat buffer."""
    if len(part_bytes) >= _VECTOR_MIN:
        plan = _scatter_plan_afresh(part_bytes, None, ring)  # runs do not depend on senders
        if plan is not None:
            return dict(plan[2])
    entries = entry_hosts(part_bytes, ring)
    out = {h: (0, 0) for h in ring}
    pos = 0
    for n, h in zip(part_bytes, entries):
        start = out[h][0] if out[h][1] > out[h][0] else pos
        out[h] = (start, pos + n)
        pos += n
    return out


def scatter_latency(messages: Sequence[tuple[int, int, int, int]], lat: float) -> float:
    """A NIC side takes one message at a time: the scatter pays the latency of the most
    messages any host sends or receives (at least one when anything crosses)."""
    if not messages:
        return 0.0
    count: dict[tuple[int, int], int] = {}
    for s, e, _, _ in messages:
        count[(0, s)] = count.get((0, s), 0) + 1
        count[(1, e)] = count.get((1, e), 0) + 1
    return lat * max(count.values())


def _side_bytes(messages, part_bytes: Sequence[int], side: int) -> dict[int, float]:
    """Bytes each sending (side 0) or entry (side 1) host moves in the scatter."""
    out: dict[int, float] = {}
    prefix = _prefix(part_bytes) if len(messages) > 1 and len(part_bytes) >= _VECTOR_MIN else None
    for m in messages:
        n = prefix[m[3]] - prefix[m[2]] if prefix is not None else sum(part_bytes[m[2]:m[3]])
        out[m[side]] = out.get(m[side], 0.0) + n
    return out


def _prefix(part_bytes: Sequence[int]) -> list[int]:
    """Byte offsets of the parts in their flat buffer (and its end)."""
    return np.concatenate([[0], np.cumsum(np.asarray(part_bytes, dtype=np.int64))]).tolist()


WINDOW = 2
"""Long transfers a host keeps in flight on one NIC (``admission.MAX_PER_RESOURCE``, which
imports the kinds and so cannot be imported here; a test keeps the two equal)."""
ORDER_MAX_RINGS = 128
"""``admission_order`` reorders at most this many rings (beyond, the order stays)."""
FIRST_TRIES = 8
"""Rings ``admission_order`` tries to open with."""


def group_phases(part_bytes: Sequence[int], sender_hosts: Sequence[int], ring: Sequence[int], cluster
                 ) -> tuple[tuple[float, dict[int, float]], ...]:
    """A group's ring as (seconds, busy) of its scatter and of its ring steps, ``busy``
    the seconds each NIC side (``resources`` key) is busy in that phase: the scatter's
    bytes at each NIC's rate; the steps' bytes on both sides of every ring host (their
    latencies hold no NIC). The seconds add up to ``group_seconds``."""
    plan = _scatter_plan(part_bytes, sender_hosts, ring)
    if plan is not None:
        messages, nbytes, blocks = plan
    else:
        prefix = _prefix(part_bytes)
        messages = scatter_messages(part_bytes, sender_hosts, ring)
        nbytes = [prefix[b] - prefix[a] for _, _, a, b in messages]
        blocks = runs(part_bytes, ring)
    busy: dict[int, float] = {}
    crossing = []
    for m, n in zip(messages, nbytes):
        if m[0] != m[1]:
            crossing.append(m)
            busy[nic_send(m[0])] = busy.get(nic_send(m[0]), 0.0) + n / cluster.send_rate(m[0])
            busy[nic_receive(m[1])] = busy.get(nic_receive(m[1]), 0.0) + n / cluster.recv_rate(m[1])
    scatter = scatter_latency(crossing, cluster.latency_s) + max(busy.values(), default=0.0)
    steps = _ring_steps_seconds(blocks, ring, cluster)
    wire = max(0.0, steps - (len(ring) - 1) * cluster.latency_s)  # the steps' latencies hold no NIC
    return (scatter, busy), (steps, {r: wire for h in ring for r in (nic_send(h), nic_receive(h))} if steps else {})


def admission_order(phases: Sequence[Sequence[tuple[float, dict]]], window: int = WINDOW) -> list[int]:
    """An order for rings (``phases``: each one's ``group_phases``) that hosts admit
    ``window`` at a time on every NIC they hold, in that order.

    The rings of a weight sync share their sending hosts' NICs (every source host holds a
    slice of every ring), so the window there decides which rings overlap: a short ring
    admitted beside a long one it shares receiving hosts with runs at half speed and keeps
    its place in the window that long, while a ring on other receiving hosts waits
    behind it. Here the rings are played at ring level, phase by phase (a phase's share of
    a NIC is its busy seconds there over its seconds; phases whose shares of a NIC sum
    above one slow down alike; a ring holds its window through both phases), and the
    order is built as the windows free up: first the rings that run at full speed beside
    those in flight, among them the one on the most remaining work (its busiest NIC's
    seconds still to come: the critical path), then the longest. Which ring to open with
    is tried (up to ``FIRST_TRIES`` unlike ones, longest first): the one that leaves a
    partner on other hosts may be shorter than one that overlaps them all. The order
    given is kept unless a built one ends earlier in that play."""
    n = len(phases)
    if n <= window or n > ORDER_MAX_RINGS:
        return list(range(n))
    best, order = _play(phases, window, list(range(n)))
    best *= 1 - 1e-9
    seconds = [sum(d for d, _ in ph) for ph in phases]
    kinds: dict = {}  # rings alike (same phases) open alike: one try each
    for i in sorted(range(n), key=lambda i: (-seconds[i], i)):
        kinds.setdefault(tuple((d, tuple(sorted(bs.items()))) for d, bs in phases[i]), i)
    for first in list(kinds.values())[:FIRST_TRIES]:
        span, built = _play(phases, window, None, first)
        if span < best:
            best, order = span, built
    return order


def _play(phases: Sequence[Sequence[tuple[float, dict]]], window: int, order: list[int] | None,
          first: int | None = None) -> tuple[float, list[int]]:
    """(makespan, admission order) of ``admission_order``'s ring-level play: in ``order``
    (head of line on every NIC), or, with None, opening with ring ``first`` and choosing
    each next ring as it describes."""
    n = len(phases)
    ph = [[(d, {r: (min(1.0, b / d) if d > 0 else 0.0) for r, b in bs.items()}, bs) for d, bs in p if d > 0]
          for p in phases]
    seconds = [sum(d for d, _, _ in p) for p in ph]
    nics = [set().union(*(bs for _, _, bs in p)) if p else set() for p in ph]
    stage = [0] * n  # each ring's phase
    left = [p[0][0] if p else 0.0 for p in ph]  # seconds left in it (at full speed)
    count: dict[int, int] = {}
    demand: dict[int, float] = {}
    todo: dict[int, float] = {}  # NIC -> busy seconds of the rings not yet done
    for p in ph:
        for _, _, bs in p:
            for r, b in bs.items():
                todo[r] = todo.get(r, 0.0) + b
    queue: dict[int, list[int]] = {}  # fixed order: NIC -> its rings still to admit, in order
    if order is not None:
        for i in order:
            for r in nics[i]:
                queue.setdefault(r, []).append(i)
    waiting = list(order) if order is not None else list(range(n))
    flight: list[int] = []
    admitted: list[int] = []
    now = 0.0

    def shares(i: int) -> dict:
        return ph[i][stage[i]][1] if stage[i] < len(ph[i]) else {}

    main = [max(p, key=lambda q: q[0])[1] if p else {} for p in ph]  # the shares of each ring's longest phase
    held: dict[int, float] = {}  # NIC -> the main shares of the rings in flight

    def speed_with(i: int) -> float:
        """How fast ring ``i``'s longest phase would run beside the longest phases of
        those in flight (a scatter is short: its overlap passes)."""
        worst = max((held.get(r, 0.0) + f for r, f in main[i].items()), default=0.0)
        return 1.0 if worst <= 1.0 else 1.0 / worst

    def fits(i: int) -> bool:
        return all(count.get(r, 0) < window for r in nics[i])

    def enter(i: int, sign: float) -> None:
        for r, f in shares(i).items():
            demand[r] = demand.get(r, 0.0) + sign * f

    while waiting or flight:
        while waiting:
            if order is not None:
                ready = [i for i in waiting if fits(i) and all(queue[r][0] == i for r in nics[i])]
                pick = ready[0] if ready else None
            elif first is not None and not admitted:
                pick = first
            else:
                ready = [i for i in waiting if fits(i)]
                top = max((todo[r] for i in ready for r in nics[i]), default=0.0) or 1.0
                pick = min(ready, default=None, key=lambda i: (
                    -round(speed_with(i), 6), -round(max((todo[r] for r in nics[i]), default=0.0) / top, 6),
                    -seconds[i], i))
            if pick is None:
                break
            waiting.remove(pick)
            admitted.append(pick)
            for r, f in main[pick].items():
                held[r] = held.get(r, 0.0) + f
            for r in nics[pick]:
                count[r] = count.get(r, 0) + 1
                if order is not None:
                    queue[r].pop(0)
            if ph[pick]:
                flight.append(pick)
                enter(pick, 1.0)
            else:
                for r in nics[pick]:
                    count[r] -= 1
        if not flight:
            continue
        speeds = {i: 1.0 / max(1.0, max((demand[r] for r in shares(i)), default=0.0)) for i in flight}
        dt = min(left[i] / speeds[i] for i in flight)
        now += dt
        still = []
        for i in flight:
            d, _, bs = ph[i][stage[i]]
            done = min(left[i], dt * speeds[i])
            for r, b in bs.items():
                todo[r] -= b * done / d
            left[i] -= done
            if left[i] > 1e-12 * max(1.0, d):
                still.append(i)
                continue
            enter(i, -1.0)
            stage[i] += 1
            if stage[i] < len(ph[i]):
                left[i] = ph[i][stage[i]][0]
                enter(i, 1.0)
                still.append(i)
                continue
            for r in nics[i]:
                count[r] -= 1
            for r, f in main[i].items():
                held[r] -= f
        flight = still
    return now, admitted


def _classes(objs: list) -> tuple[np.ndarray, np.ndarray]:
    """(the first index of each distinct object, every element's class) by identity: the
    jobs of leaves with one layout are the same objects, so what depends only on a job is
    read once a class (classes numbered by the objects' ids)."""
    n = len(objs)
    ids = np.fromiter(map(id, objs), dtype=np.uint64, count=n)
    distinct = np.unique(ids)
    cls = np.searchsorted(distinct, ids).astype(np.int64, copy=False)
    first = np.empty(len(distinct), dtype=np.int64)
    first[cls[::-1]] = np.arange(n - 1, -1, -1)  # a repeated index keeps the last value assigned: the smallest
    return first, cls


def _by_sender_leaf_task(senders: np.ndarray, leaf: np.ndarray, task: np.ndarray) -> np.ndarray:
    """The stable order of slices by (sender, leaf, task). Slices mostly come in (leaf,
    task) order already: then a stable sort by sender alone gives it (a radix sort where
    hosts fit 16 bits)."""
    n = len(senders)
    if n > 1 and leaf.min() >= 0 and task.min() >= 0 and senders.min() >= 0:
        step = int(task.max()) + 1
        if int(leaf.max()) < (1 << 62) // step:
            key = leaf * step + task
            if (key[1:] >= key[:-1]).all():
                narrow = senders.astype(np.int16) if int(senders.max()) < 1 << 15 else senders
                return np.argsort(narrow, kind="stable")
    return np.lexsort((np.arange(n), task, leaf, senders))


@dataclass
class _Regrouping:
    """The jobs ``RotatedChains.combine`` hands back, built group by group, with what it
    looks up on the way: a plan's jobs repeat receiver sets, and (bytes, sender,
    receivers) triples, by the thousand, so both are memoized here."""

    jobs: list  # the jobs given to ``combine``
    job_leaf: list
    cluster: object
    new_jobs: list
    new_leaf: list
    new_members: dict
    load: dict = field(default_factory=dict)  # bytes each source host sends so far
    chain: Broadcast = field(default_factory=Broadcast)  # the alternative: one chain per slice
    _groups: dict = field(default_factory=dict)  # receivers -> devices by host
    _chains: dict = field(default_factory=dict)  # (nbytes, host, receivers) -> chain candidate
    _seconds: dict = field(default_factory=dict)  # (id(job), host) -> its chain's duration
    phases: dict = field(default_factory=dict)  # new job index of each ring -> its ``group_phases``
    cls: np.ndarray | None = None  # ``index``: each job's class, and by class:
    reps: list = field(default_factory=list)  # one job
    nbytes_c: np.ndarray | None = None  # its bytes
    task_c: np.ndarray | None = None  # its task
    ncand_c: np.ndarray | None = None  # its candidates' count
    host0_c: np.ndarray | None = None  # its first candidate's host
    leaf: np.ndarray | None = None  # each job's leaf

    @classmethod
    def keeping(cls, keep: list[int], jobs, job_leaf, members, cluster) -> "_Regrouping":
        """Start from the jobs ``keep`` names (other kinds'), renumbered in order."""
        new_index = {i: k for k, i in enumerate(keep)}
        return cls(jobs, job_leaf, cluster, [jobs[i] for i in keep], [job_leaf[i] for i in keep],
                   {new_index[i]: m for i, m in members.items() if i in new_index})

    def hosts_of(self, receivers: tuple) -> dict:
        g = self._groups.get(receivers)
        if g is None:
            g = self._groups[receivers] = group_by_host(receivers, self.cluster)
        return g

    def chain_candidate(self, nbytes: int, host: int, receivers: tuple) -> Candidate:
        key = (nbytes, host, receivers)
        c = self._chains.get(key)
        if c is None:
            c = self._chains[key] = self.chain.candidate(nbytes, nbytes, host, self.hosts_of(receivers),
                                                         self.cluster, None)
        return c

    def chain_seconds_of(self, jobs: list, hosts: list) -> dict:
        """(id(job), host) -> ``chain_candidate(job.nbytes, host, job.receivers).duration``
        for every pair of ``jobs`` and ``hosts``, each computed once (the jobs of leaves
        with one layout are the same objects)."""
        memo = self._seconds
        new = set(zip(map(id, jobs), hosts)) - memo.keys()
        if new:
            by_id = dict(zip(map(id, jobs), jobs))
            for key in new:
                job = by_id[key[0]]
                memo[key] = self.chain_candidate(job.nbytes, key[1], job.receivers).duration
        return memo

    def index(self, first: np.ndarray, cls: np.ndarray) -> None:
        """What the groups read of each job, by class (``_classes``: the jobs of leaves
        with one layout are the same objects, so a class is one object): its bytes, task,
        candidates and first candidate's host; and every job's leaf, as arrays."""
        self.cls = cls
        self.reps = reps = [self.jobs[i] for i in first.tolist()]
        n = len(reps)
        self.nbytes_c = np.fromiter(map(_NBYTES, reps), dtype=np.int64, count=n)
        self.task_c = np.fromiter(map(_TASK, reps), dtype=np.int64, count=n)
        cands = list(map(_CANDIDATES, reps))
        self.ncand_c = np.fromiter(map(len, cands), dtype=np.int64, count=n)
        self.host0_c = np.fromiter((c[0].host if c else -1 for c in cands), dtype=np.int64, count=n)
        self.leaf = np.fromiter(self.job_leaf, dtype=np.int64, count=len(self.job_leaf))

    def present(self, idx: np.ndarray) -> list[int]:
        """The classes of the jobs ``idx``, ascending."""
        return np.flatnonzero(np.bincount(self.cls[idx], minlength=len(self.reps))).tolist()

    def choose_senders(self, idx: np.ndarray) -> np.ndarray:
        """Each slice's sender host (aligned with ``idx``): largest slices first, each to
        the host holding it that sends the fewest bytes so far (LPT; ``load`` carries over
        between groups)."""
        load = self.load
        c = self.cls[idx]
        hosts = self.host0_c[c]
        nb = self.nbytes_c[c]
        if (self.ncand_c[self.present(idx)] == 1).all():  # no choice to make
            self._add_load(hosts, nb)  # integer byte counts: any order sums alike
            return hosts
        order = np.argsort(-nb, kind="stable")  # largest first, ties in ``idx`` order
        multi_at = np.flatnonzero(self.ncand_c[c][order] > 1).tolist()  # positions in ``order`` with a choice
        reps = self.reps
        if len(multi_at) * 64 > len(order):  # choices everywhere: one pass in plain Python
            hl, nl, cl = hosts.tolist(), nb.tolist(), c.tolist()
            for k in order.tolist():
                cs = reps[cl[k]].candidates
                host = cs[0].host if len(cs) == 1 else min((x.host for x in cs), key=lambda h: (load.get(h, 0.0), h))
                hl[k] = host
                load[host] = load.get(host, 0.0) + nl[k]
            return np.asarray(hl, dtype=np.int64)
        # A few choices among many fixed senders: the fixed ones between two choices are
        # added up at once (integer byte counts: any order sums alike).
        done = 0
        for p in multi_at:
            k = int(order[p])
            ks = order[done:p]
            self._add_load(hosts[ks], nb[ks])
            host = min((x.host for x in reps[int(c[k])].candidates), key=lambda h: (load.get(h, 0.0), h))
            hosts[k] = host
            load[host] = load.get(host, 0.0) + int(nb[k])
            done = p + 1
        ks = order[done:]
        self._add_load(hosts[ks], nb[ks])
        return hosts

    def _add_load(self, hosts: np.ndarray, nbytes: np.ndarray) -> None:
        """Add each slice's bytes to its host's ``load`` (per host sums of whole bytes, exact
        in float64 below 2**53, as adding them one by one is)."""
        if not len(hosts):
            return
        sums = np.bincount(hosts, weights=nbytes.astype(np.float64))
        load = self.load
        for h in np.flatnonzero(sums).tolist():
            load[h] = load.get(h, 0.0) + float(sums[h])

    def chains_seconds(self, idx: np.ndarray, hosts: np.ndarray) -> float:
        """The sum, in ``idx`` order, of ``chain_candidate(job.nbytes, host,
        job.receivers).duration`` over its jobs and sender ``hosts``, each distinct (job,
        host) pair computed once."""
        if len(idx) < _VECTOR_MIN:
            jobs, hl = list(map(self.jobs.__getitem__, idx.tolist())), hosts.tolist()
            memo = self.chain_seconds_of(jobs, hl)
            return sum(map(memo.__getitem__, zip(map(id, jobs), hl)))
        c = self.cls[idx]
        reps, nbytes = self.reps, self.nbytes_c
        if (hosts == self.host0_c[c]).all():  # the host follows from the job: one pair a class
            table = np.zeros(len(reps), dtype=np.float64)
            for k in self.present(idx):
                table[k] = self.chain_candidate(int(nbytes[k]), int(self.host0_c[k]), reps[k].receivers).duration
            return sum(table[c].tolist())
        span = int(hosts.max()) + 1
        pairs, inverse = np.unique(c * span + hosts, return_inverse=True)
        seconds = np.array([self.chain_candidate(int(nbytes[k // span]), k % span, reps[k // span].receivers).duration
                            for k in pairs.tolist()], dtype=np.float64)
        return sum(seconds[inverse.reshape(-1)].tolist())
    def order_rings(self) -> None:
        """The ring jobs, in the places they hold among the jobs, in ``admission_order``
        (the load balancer keeps the order of jobs its model finds equal, and rings that
        share NICs are equal there: it plays one transfer at a time)."""
        at = sorted(self.phases)
        order = admission_order([self.phases[k] for k in at])
        if order == list(range(len(at))):
            return
        moved = [(self.new_jobs[at[o]], self.new_members[at[o]], self.phases[at[o]]) for o in order]
        for k, (j, m, p) in zip(at, moved):
            self.new_jobs[k], self.new_members[k], self.phases[k] = j, m, p

    def keep(self, idx: list[int]) -> None:
        self.new_jobs += [self.jobs[i] for i in idx]
        self.new_leaf += [self.job_leaf[i] for i in idx]

    def as_chains(self, idx: list[int]) -> None:
        """The slices ``idx`` as one chain each (``broadcast``)."""
        for i in idx:
            j = self.jobs[i]
            cands = tuple(self.chain_candidate(j.nbytes, c.host, j.receivers) for c in j.candidates)
            self.new_jobs.append(j._replace(kind=self.chain.name, candidates=cands))
            self.new_leaf.append(self.job_leaf[i])

    def add_group(self, job, parts: list, phases: tuple) -> None:
        """A group job carrying ``parts`` ((job, leaf, sender host) of each slice), its
        ring's ``group_phases`` beside it."""
        self.phases[len(self.new_jobs)] = phases
        self.new_members[len(self.new_jobs)] = parts
        self.new_jobs.append(job)
        self.new_leaf.append(-1)


class RotatedChains(TransferKind):
    name = "rotated_chains"
    receives_into_scratch = True
    order = 45
    auto_min_hosts = MIN_RING_HOSTS
    groups_jobs = True

    # ------------------------------------------------------------- planning
    def resources(self, sender_host, receiver_hosts):
        """One slice alone: its sender and the ring (``group_resources`` for a group)."""
        return self.group_resources([sender_host], list(receiver_hosts))

    def transfer_resources(self, t, cluster):
        ring, _, senders = self._layout(t, cluster.host_of)
        return self.group_resources(senders, ring)

    @staticmethod
    def group_resources(sender_hosts: Sequence[int], ring: Sequence[int]) -> tuple[int, ...]:
        if isinstance(sender_hosts, np.ndarray):  # consecutive repeats dropped: first appearances keep their order
            keep = np.ones(len(sender_hosts), dtype=bool)
            keep[1:] = sender_hosts[1:] != sender_hosts[:-1]
            sender_hosts = sender_hosts[keep].tolist()
        senders = tuple(nic_send(s) for s in dict.fromkeys(sender_hosts) if s not in ring)
        return senders + tuple(r for h in ring for r in (nic_send(h), nic_receive(h)))

    def duration(self, nbytes, num_elements, sender_host, groups, cluster, chunks):
        return self.group_seconds([nbytes], [sender_host], list(groups), cluster), 1

    @staticmethod
    def group_seconds(part_bytes: Sequence[int], sender_hosts: Sequence[int], ring: Sequence[int], cluster) -> float:
        """Scatter (the busiest NIC side) plus A-1 ring steps, each as long as the
        largest run over the slowest ring link."""
        lat = cluster.latency_s
        plan = _scatter_plan(part_bytes, sender_hosts, ring)
        if plan is not None:
            return RotatedChains._planned_seconds(plan, ring, cluster)
        messages = [m for m in scatter_messages(part_bytes, sender_hosts, ring) if m[0] != m[1]]
        scatter = scatter_latency(messages, lat) + max(
            [b / cluster.send_rate(h) for h, b in _side_bytes(messages, part_bytes, 0).items()]
            + [b / cluster.recv_rate(h) for h, b in _side_bytes(messages, part_bytes, 1).items()] + [0.0])
        return scatter + _ring_steps_seconds(runs(part_bytes, ring), ring, cluster)

    @staticmethod
    def _planned_seconds(plan, ring: Sequence[int], cluster) -> float:
        """``group_seconds`` from a ``_scatter_plan``: the same sums, from its prefix sums."""
        lat = cluster.latency_s
        messages, nbytes, blocks = plan
        sent: dict[int, float] = {}
        taken: dict[int, float] = {}
        crossing = []
        for m, n in zip(messages, nbytes):
            if m[0] != m[1]:
                crossing.append(m)
                sent[m[0]] = sent.get(m[0], 0.0) + n
                taken[m[1]] = taken.get(m[1], 0.0) + n
        scatter = scatter_latency(crossing, lat) + max(
            [b / cluster.send_rate(h) for h, b in sent.items()]
            + [b / cluster.recv_rate(h) for h, b in taken.items()] + [0.0])
        return scatter + _ring_steps_seconds(blocks, ring, cluster)

    def closed_form(self, t, hosts, devices, chunks=1):
        """A slices (one entering at each of the A hosts), each one NIC copy t: the
        scatter t, then A-1 ring steps of t — A·t for A slices, t per slice."""
        return t + (hosts - 1) * t

    def combine(self, jobs, job_leaf, members, cluster):
        """Group this kind's jobs by their receiving hosts into ring transfers; choose
        each slice's sender host (least bytes so far among the hosts holding it). Where
        the cost model says one chain per slice is faster, the slices go as chains.
        Other kinds' jobs are kept, first and in their order."""
        first, cls = _classes(jobs)  # each class's first job is its smallest index
        reps = [jobs[i] for i in first.tolist()]
        is_mine = np.fromiter(map(self.name.__eq__, map(_KIND, reps)), dtype=bool, count=len(reps))
        mask = is_mine[cls]
        keep = np.flatnonzero(~mask).tolist()
        out = _Regrouping.keeping(keep, jobs, job_leaf, members, cluster)
        out.index(first, cls)
        groups: dict[tuple[int, ...], np.ndarray] = {}
        mine = np.flatnonzero(mask)
        if len(mine):
            # Rings by first appearance (receivers with one ring share it): a class's jobs
            # are all this kind or none, so its first job is its first among ``mine``.
            ring_ids: dict[tuple, int] = {}
            ring_of = np.full(len(reps), -1, dtype=np.int64)
            mine_cls = np.flatnonzero(is_mine)
            for k in mine_cls[np.argsort(first[mine_cls], kind="stable")].tolist():
                ring_of[k] = ring_ids.setdefault(tuple(out.hosts_of(reps[k].receivers)), len(ring_ids))
            per_job = ring_of[cls[mine]]
            order = np.argsort(per_job.astype(np.int16) if len(ring_ids) < 1 << 15 else per_job, kind="stable")
            bounds = np.searchsorted(per_job[order], np.arange(len(ring_ids) + 1)).tolist()
            members_of = mine[order]
            for ring, r in ring_ids.items():
                groups[ring] = members_of[bounds[r]:bounds[r + 1]]
        for ring, idx in self._fold_holders(groups, out).items():
            self._combine_group(out, ring, idx)
        out.order_rings()
        return out.new_jobs, out.new_leaf, out.new_members

    def _combine_group(self, out: "_Regrouping", ring: tuple[int, ...], idx: np.ndarray) -> None:
        """One group's slices (same receiving hosts): too few hosts for a ring, kept as
        they are; too many for the ring's tags, as chains; otherwise each slice gets its
        sender host, the slices go in tag-sized parts, and each part as a ring or as
        chains, whichever the cost model finds faster."""
        if len(ring) < MIN_RING_HOSTS:
            out.keep(idx.tolist())
            return
        if len(ring) > MAX_RING_HOSTS:
            out.as_chains(idx.tolist())
            return
        senders = out.choose_senders(idx)
        c = out.cls[idx]
        order = _by_sender_leaf_task(senders, out.leaf[idx], out.task_c[c])
        idx, senders = idx[order], senders[order]  # by (sender, leaf, task), stable
        sizes = out.nbytes_c[out.cls[idx]]
        for a, b, part_bytes, part_hosts in self._fit_ranges(sizes, senders, list(ring)):
            self._ring_or_chains(out, idx[a:b], part_bytes, part_hosts, ring)

    def _ring_or_chains(self, out: "_Regrouping", idx: np.ndarray, sizes, hosts, ring: tuple[int, ...]) -> None:
        """The slices ``idx`` (``sizes`` bytes each, from sender ``hosts``: arrays, or lists
        where they are few) as one ring job, unless their chains in a row are as fast."""
        cluster = out.cluster
        seconds = self.group_seconds(sizes, hosts, list(ring), cluster)
        # Chains that share hosts run one after another: a ring pays only when it
        # beats them all in a row (few sending hosts make its scatter the long pole).
        # Every chain pays the message latency at least once a hop (``cost_model.chain_time``),
        # so where the slices' latencies alone pass the ring's time (0.1 % spare for the
        # rounding of a long sum), the chains lose without being costed.
        harr = np.asarray(hosts, dtype=np.int64)
        if len(idx) * cluster.latency_s * 0.999 <= seconds and out.chains_seconds(idx, harr) <= seconds:
            out.as_chains(idx.tolist())
            return
        recvs = [out.reps[k].receivers for k in out.present(idx)]
        unique = set(dict(zip(map(id, recvs), recvs)).values())  # often one receiver set for the group
        receivers = (next(iter(unique)) if len(unique) == 1 else
                     tuple(sorted({r for rs in unique for r in rs}, key=lambda d: (cluster.host_of(d), d))))
        cand = Candidate(int(harr[0]), self.group_resources(harr, list(ring)), seconds)
        host_list = harr.tolist()
        nbytes = int(np.asarray(sizes, dtype=np.int64).sum()) if len(host_list) >= _VECTOR_MIN else sum(sizes)
        ids = idx.tolist()
        out.add_group(out.jobs[ids[0]]._replace(task=-2, receivers=receivers, nbytes=nbytes, index=(),
                                                candidates=(cand,)),
                      list(zip(map(out.jobs.__getitem__, ids), out.leaf[idx].tolist(), host_list)),
                      group_phases(sizes, hosts, list(ring), cluster))

    @staticmethod
    def _fold_holders(groups: dict[tuple, np.ndarray], out: "_Regrouping") -> dict[tuple, np.ndarray]:
        """A slice held by a host that is itself a destination (source and destination
        meshes overlap) needs the ring less that host: alone, the slices of each holder
        make a ring of their own, small ones latency-bound, and such rings share every NIC
        so they run one after another. So the holder joins the slice's ring: slices whose
        receiving hosts plus holder are the same set travel as one ring, the holder's
        bytes enter there once and go round with the rest (the holder gets its own slice
        back, a small waste the cost model charges); each part still delivers only to its
        own receivers."""
        wanted = {h for ring in groups for h in ring}  # hosts that receive something here
        pieces: dict[tuple, list] = {}
        for ring, idx in groups.items():
            members = frozenset(ring)
            present = out.present(idx)
            key_of = {}  # class -> its ring (a class is one job, its candidates one tuple)
            for k in present:
                cs = out.reps[k].candidates
                holder = min((c.host for c in cs if c.host in wanted and c.host not in members), default=None)
                key_of[k] = ring if holder is None else tuple(sorted(members | {holder}))
            keys = list(dict.fromkeys(key_of.values()))
            if len(keys) == 1:
                pieces.setdefault(keys[0], []).append(idx)
                continue
            number = np.zeros(len(out.reps), dtype=np.int64)
            for k, key in key_of.items():
                number[k] = keys.index(key)
            of = number[out.cls[idx]]
            firsts = sorted((int(np.argmax(of == n)), n) for n in range(len(keys)))  # keys by first slice
            for _, n in firsts:
                pieces.setdefault(keys[n], []).append(idx[of == n])
        return {key: (ps[0] if len(ps) == 1 else np.concatenate(ps)) for key, ps in pieces.items()}

    @staticmethod
    def _fit_ranges(sizes: np.ndarray, senders: np.ndarray, ring: list[int]) -> list[tuple]:
        """(start, end, bytes, sender hosts) of consecutive runs of the slices, each of at
        most ``MAX_SCATTER_MESSAGES`` scatter messages (``_fit_tags`` over arrays); a
        run's bytes and hosts are the objects its scatter plan is kept by (lists where
        they are few)."""
        def run(a: int, b: int) -> tuple:
            part_bytes, part_hosts = sizes[a:b], senders[a:b]
            if b - a < _VECTOR_MIN or _scatter_plan(part_bytes, part_hosts, ring) is None:
                part_bytes, part_hosts = part_bytes.tolist(), part_hosts.tolist()
            return a, b, part_bytes, part_hosts
        out, todo = [], [run(0, len(sizes))]
        while todo:
            part = todo.pop(0)
            a, b = part[0], part[1]
            if b - a > 1 and len(scatter_messages(part[2], part[3], ring)) > MAX_SCATTER_MESSAGES:
                half = (b - a) // 2
                todo[:0] = [run(a, a + half), run(a + half, b)]
            else:
                out.append(part)
        return out

    @staticmethod
    def _fit_tags(idx: list[int], jobs, senders: dict, ring: list[int]) -> list[list[int]]:
        """``idx`` split into groups of at most ``MAX_SCATTER_MESSAGES`` scatter messages."""
        def count(part):
            return len(scatter_messages([jobs[i].nbytes for i in part], [senders[i] for i in part], ring))
        out, todo = [], [idx]
        while todo:
            part = todo.pop(0)
            if len(part) > 1 and count(part) > MAX_SCATTER_MESSAGES:
                half = len(part) // 2
                todo[:0] = [part[:half], part[half:]]
            else:
                out.append(part)
        return out

    # ----------------------------------------------------------- simulation
    @staticmethod
    def _layout(t, host_of):
        """(ring, part sizes, part sender hosts) of ``t``; the last few transfers' are kept
        (the estimate, the simulator and the executor each read them more than once, and a
        ring carries hundreds of thousands of parts)."""
        key = (id(t.parts), id(t.receivers))
        hit = _LAYOUTS.get(key)
        if hit is not None and hit[0] is t.parts and hit[1] is t.receivers and hit[2] == host_of:
            return hit[3]
        ring = receiving_hosts(t, host_of)
        if not t.parts:
            return ring, [t.nbytes], [host_of(t.sender)]
        parts, n = t.parts, len(t.parts)
        cluster = getattr(host_of, "__self__", None)
        layout = None
        if n >= _VECTOR_MIN and isinstance(cluster, ClusterSpec) and \
                getattr(host_of, "__func__", None) is ClusterSpec.host_of:
            # Many parts: arrays, which the scatter plan reads as they are.
            sizes = np.fromiter(map(_NBYTES, parts), dtype=np.int64, count=n)
            if int(sizes.sum()) * len(ring) < 1 << 62:  # as ``_entry_positions`` needs: exact int64 arithmetic
                senders = np.fromiter(map(_SENDER, parts), dtype=np.int64, count=n) // cluster.devices_per_host
                layout = (ring, sizes, senders)
        if layout is None:
            layout = (ring, list(map(_NBYTES, parts)), list(map(host_of, map(_SENDER, parts))))
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = (t.parts, t.receivers, host_of, layout)
        return layout

    def host_flows(self, t, cluster):
        ring, sizes, senders = self._layout(t, cluster.host_of)
        plan = _scatter_plan(sizes, senders, ring)
        if plan is not None:
            flows = [(m[0], m[1], n) for m, n in zip(plan[0], plan[1]) if m[0] != m[1]]
            blocks = plan[2]
        else:
            prefix = _prefix(sizes)
            flows = [(s, e, prefix[b] - prefix[a]) for s, e, a, b in scatter_messages(sizes, senders, ring) if s != e]
            blocks = runs(sizes, ring)
        total = int(sizes.sum()) if isinstance(sizes, np.ndarray) else sum(sizes)
        a = len(ring)
        for i, h in enumerate(ring if a > 1 else []):
            nxt = ring[(i + 1) % a]
            flows.append((h, nxt, total - (blocks[nxt][1] - blocks[nxt][0])))
        return flows

    def phases(self, t, cluster):
        ring, sizes, senders = self._layout(t, cluster.host_of)
        lat = cluster.latency_s
        plan = _scatter_plan(sizes, senders, ring)
        if plan is not None:
            crossing = [(m, n) for m, n in zip(plan[0], plan[1]) if m[0] != m[1]]
            messages = [m for m, _ in crossing]
            scatter = [(n, (nic_send(m[0]), nic_receive(m[1]))) for m, n in crossing]
            blocks = plan[2]
        else:
            messages = [m for m in scatter_messages(sizes, senders, ring) if m[0] != m[1]]
            prefix = _prefix(sizes)
            scatter = [(prefix[b] - prefix[a], (nic_send(s), nic_receive(e))) for s, e, a, b in messages]
            blocks = runs(sizes, ring)
        out = [(scatter_latency(messages, lat), scatter)]
        a = len(ring)
        if a > 1:
            # A-1 store-and-forward steps, each as long as the largest run: one flow of
            # x largest run over every ring link (exact when the runs are equal).
            largest = max(e - s for s, e in blocks.values())
            groups = {h: [d for d in t.receivers if cluster.host_of(d) == h] for h in ring}
            out.append(((a - 1) * lat, [((a - 1) * largest, ring_links(groups))]))
        return out

    # ------------------------------------------------------------- execution
    def run(self, ex, t, tag0):
        ring, sizes, senders = self._layout(t, ex.host_of)
        parts = t.parts or ()
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        messages = scatter_messages(sizes, senders, ring)

        def payload(a: int, b: int) -> np.ndarray:
            if not parts:
                return ex.source(t)
            pieces = [ex.slice_bytes(parts[j].sender, parts[j].index, parts[j].leaf) for j in range(a, b)]
            return pieces[0] if len(pieces) == 1 else ex.concat(pieces)

        sends = [ex.isend(payload(a, b), e, tag0 + m) for m, (s, e, a, b) in enumerate(messages)
                 if s == ex.host and e != ex.host]
        if ex.host not in ring:
            ex.wait(sends)
            return
        flat = ex.empty_bytes(int(offsets[-1]))
        recvs = []
        for m, (s, e, a, b) in enumerate(messages):
            if e != ex.host:
                continue
            segment = flat[offsets[a]:offsets[b]]
            if s == ex.host:
                segment[...] = payload(a, b)
            else:
                recvs.append(ex.irecv(segment, s, tag0 + m))
        ex.wait(recvs)
        ex.wait(sends)
        ex.ring_allgather({h: flat[s:e] for h, (s, e) in runs(sizes, ring).items()}, ring, tag0)
        ex.deliver(t, flat)
