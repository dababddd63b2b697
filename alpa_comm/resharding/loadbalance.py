"""Host-level load balancing and ordering of jobs (paper, section 3.2).

A schedule is a sequence of (job, candidate) pairs. Each job starts at the
earliest time all resources of its chosen candidate are free (the per-host
order is the order of the sequence) and its dependencies are done; the goal is
the smallest makespan, max_i(S_i + T_i).

Modes (``BALANCERS`` maps each to its function):

``naive``   lowest-index sender host, jobs in task order (the paper's baseline).
``loads``   Alpa's "normal" mode: jobs in task order, each to the source host
            that has sent the fewest bytes so far.
``size``    LPT: longest job first, to the sender host with the least work.
``greedy``  the paper's randomized greedy: repeatedly start the waiting job
            (and sender) that can start earliest, i.e. a maximal set of
            non-conflicting jobs at each moment; several seeded random
            priorities are tried and the best schedule (naive, size and LPT list
            scheduling included) wins. Deterministic for a seed.
``dfs``     depth-first search over job order and sender choice with
            lower-bound pruning under a time budget; starts from the greedy
            schedule, so it always returns a valid plan no worse than greedy.
``auto``    dfs for small instances, greedy otherwise.
"""
from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from ..validation import one_of
from .strategies import Job

LOADBALANCE_MODES = ("naive", "loads", "size", "greedy", "dfs", "auto")
AUTO_DFS_MAX_JOBS = 12
DEFAULT_DFS_BUDGET_S = 0.5

Assignment = List[Tuple[int, int]]  # typing forms: aliases run on Python 3.8
"""(job index, chosen candidate index) pairs in the order the jobs run."""


@dataclass(frozen=True)
class JobOrder:
    """Chosen candidates, sequence, per-job start times and the makespan (what load
    balancing decided; not to be confused with a pipeline ``Schedule``)."""

    sequence: tuple[tuple[int, int], ...]
    starts: dict[int, float]
    finishes: dict[int, float]
    makespan: float
    mode: str  # the mode that produced it (auto resolves to dfs or greedy)
    complete: bool = True  # False when dfs ran out of budget before proving optimality


def evaluate(jobs: Sequence[Job], seq: Sequence[tuple[int, int]]):
    """Start and finish time of every job of ``seq``; returns (starts, finishes, makespan)."""
    free: dict[int, float] = {}
    starts: dict[int, float] = {}
    finishes: dict[int, float] = {}
    for j, c in seq:
        cand = jobs[j].candidates[c]
        s = 0.0
        for r in cand.resources:
            f = free.get(r, 0.0)
            if f > s:
                s = f
        for d in jobs[j].deps:
            if finishes[d] > s:
                s = finishes[d]
        e = s + cand.duration
        for r in cand.resources:
            free[r] = e
        starts[j], finishes[j] = s, e
    return starts, finishes, max(finishes.values(), default=0.0)


def _split(jobs: Sequence[Job]) -> tuple[list[int], list[int]]:
    free = [i for i, j in enumerate(jobs) if not j.deps]
    dependent = [i for i, j in enumerate(jobs) if j.deps]
    return free, dependent


def _tail(jobs, dependent):
    return [(j, 0) for j in dependent]


def lowest_sender_in_task_order(jobs: Sequence[Job]) -> Assignment:
    """Candidates are listed by ascending sender host, so index 0 is the lowest."""
    free, dep = _split(jobs)
    return [(j, 0) for j in free] + _tail(jobs, dep)


def fewest_bytes_sender_in_task_order(jobs: Sequence[Job]) -> Assignment:
    free, dep = _split(jobs)
    sent: dict[int, int] = {}
    seq = []
    for j in free:
        job = jobs[j]
        c = min(range(len(job.candidates)), key=lambda k: (sent.get(job.candidates[k].host, 0),
                                                           job.candidates[k].host))
        sent[job.candidates[c].host] = sent.get(job.candidates[c].host, 0) + job.nbytes
        seq.append((j, c))
    return seq + _tail(jobs, dep)


def _min_duration(job: Job) -> float:
    return min(c.duration for c in job.candidates)


def longest_job_first(jobs: Sequence[Job]) -> Assignment:
    free, dep = _split(jobs)
    order = sorted(free, key=lambda j: -_min_duration(jobs[j]))
    work: dict[int, float] = {}
    seq = []
    for j in order:
        job = jobs[j]
        c = min(range(len(job.candidates)),
                key=lambda k: (work.get(job.candidates[k].host, 0.0) + job.candidates[k].duration,
                               job.candidates[k].host))
        cand = job.candidates[c]
        work[cand.host] = work.get(cand.host, 0.0) + cand.duration
        seq.append((j, c))
    return seq + _tail(jobs, dep)


def _list_schedule(jobs: Sequence[Job], order: Sequence[int]) -> Assignment:
    """Place jobs in ``order``, each on the candidate that finishes it earliest."""
    free: dict[int, float] = {}
    seq = []
    for j in order:
        job = jobs[j]
        best_c, best_end = 0, float("inf")
        for c, cand in enumerate(job.candidates):
            s = 0.0
            for r in cand.resources:
                f = free.get(r, 0.0)
                if f > s:
                    s = f
            e = s + cand.duration
            if e < best_end:
                best_c, best_end = c, e
        for r in job.candidates[best_c].resources:
            free[r] = best_end
        seq.append((j, best_c))
    return seq


def _signature(job: Job) -> tuple:
    """Jobs with equal candidates (hosts, resources, durations) are interchangeable."""
    return job.candidates


def _nondelay_schedule(jobs: Sequence[Job], free_jobs: Sequence[int], rank: dict[int, float],
                       rng: random.Random | None = None) -> Assignment:
    """The paper's randomized greedy as an event-driven simulation: whenever
    resources free up, start waiting jobs (any candidate sender) whose resources
    are all free, best ``rank`` first, so every moment runs a maximal set of
    non-conflicting jobs.

    Only jobs that use a just-freed resource can have become startable, and a
    freed resource stops being scanned as soon as a job takes it again; each
    resource serves its partners round robin, so no partner starves until the
    end. With identical jobs grouped into classes this stays near-linear for
    25,000 jobs.
    ``rng`` shuffles the order in which simultaneously freed resources are
    served (the randomization of the paper's algorithm).
    """
    sim = _NonDelay.of(jobs, free_jobs, rank)
    for ci, c, res, dur in sim.options:  # time 0: everything is free
        if sim.pos[ci] < sim.sizes[ci] and sim.busy.isdisjoint(res):
            sim.start(ci, c, res, dur)
    while sim.events:
        now, freed = sim.release()
        if rng is not None:
            rng.shuffle(freed)
        for r in freed:
            if r not in sim.busy:
                sim.serve(r, now)
    return sim.seq


@dataclass
class _NonDelay:
    """The state of one ``_nondelay_schedule`` simulation: job classes and their
    options, which resources are busy until when, and where each resource's round
    robin stands."""

    members: list  # classes of identical jobs (``_signature``), best rank first, each best rank first
    options: list  # (class, candidate, resources, duration), best class first
    users: dict  # resource -> the options that use it
    pos: list  # per class: its next unplaced member
    sizes: list  # per class: its number of members
    busy: set = field(default_factory=set)  # resources a started job holds now
    events: list = field(default_factory=list)  # heap of (end, start number, resources)
    seq: list = field(default_factory=list)  # the assignment so far, in start order
    ptr: dict = field(default_factory=dict)  # resource -> where its round robin resumes

    @classmethod
    def of(cls, jobs: Sequence[Job], free_jobs: Sequence[int], rank: dict[int, float]) -> "_NonDelay":
        classes: dict[tuple, list[int]] = {}
        for j in sorted(free_jobs, key=lambda j: rank[j]):
            classes.setdefault(_signature(jobs[j]), []).append(j)
        members = list(classes.values())
        options = [(ci, c, cand.resources, cand.duration)
                   for ci, ms in enumerate(members) for c, cand in enumerate(jobs[ms[0]].candidates)]
        users: dict[int, list[int]] = {}
        for o, (_, _, res, _) in enumerate(options):
            for r in res:
                users.setdefault(r, []).append(o)
        return cls(members, options, users, [0] * len(members), [len(ms) for ms in members])

    def start(self, ci: int, c: int, res: tuple, end: float) -> None:
        """Start class ``ci``'s next member on candidate ``c``, holding ``res`` until ``end``."""
        self.seq.append((self.members[ci][self.pos[ci]], c))
        self.pos[ci] += 1
        self.busy.update(res)
        heapq.heappush(self.events, (end, len(self.seq), res))

    def release(self) -> tuple[float, list[int]]:
        """(now, resources freed): every job that ends at the earliest end time ends."""
        events, busy = self.events, self.busy
        now = events[0][0]
        freed: list[int] = []
        while events and events[0][0] <= now:
            res = heapq.heappop(events)[2]
            busy.difference_update(res)
            freed.extend(res)
        return now, freed

    def serve(self, r: int, now: float) -> None:
        """Start the first waiting partner of free resource ``r`` whose resources are all
        free, scanning round robin from where ``r`` last stopped; compact ``r``'s list
        once most of its partners have no members left."""
        options, pos, sizes, busy = self.options, self.pos, self.sizes, self.busy
        lst = self.users[r]
        n = len(lst)
        p = self.ptr.get(r, 0)
        dead = 0
        for step in range(n):
            k = (p + step) % n
            ci, c, res, dur = options[lst[k]]
            if pos[ci] == sizes[ci]:
                dead += 1
                continue
            if busy.isdisjoint(res):
                self.start(ci, c, res, now + dur)
                self.ptr[r] = k + 1  # round robin: next time start after this partner
                break
        if dead * 2 > n:  # mostly exhausted: compact
            self.users[r] = [o for o in lst if pos[options[o][0]] < sizes[options[o][0]]]
            self.ptr[r] = 0


def randomized_greedy(jobs: Sequence[Job], seed: int = 0, tries: int | None = None) -> Assignment:
    return _greedy(jobs, seed, tries)[0]


def _greedy(jobs: Sequence[Job], seed: int = 0, tries: int | None = None):
    """(best sequence, its evaluation)."""
    free, dep = _split(jobs)
    tail = _tail(jobs, dep)
    if tries is None:
        # Each try costs about the total number of (job, resource) pairs.
        work = sum(len(jobs[j].candidates[0].resources) * len(jobs[j].candidates) for j in free)
        tries = max(2, min(16, 80_000 // max(1, work)))
    rng = random.Random(seed)
    lpt = sorted(free, key=lambda j: -_min_duration(jobs[j]))
    options = [lowest_sender_in_task_order(jobs),
               _nondelay_schedule(jobs, free, {j: i for i, j in enumerate(lpt)}) + tail]
    if tries > 2:  # cheap extra starting points where time allows
        options += [longest_job_first(jobs), _list_schedule(jobs, lpt) + tail]
    for _ in range(tries - 2):
        # Random priorities: the paper's random task orders, biased to big jobs first.
        keys = {j: -_min_duration(jobs[j]) * rng.uniform(0.5, 1.5) for j in free}
        options.append(_nondelay_schedule(jobs, free, keys, rng) + tail)
    best = None
    for seq in options:
        ev = evaluate(jobs, seq)
        if best is None or ev[2] < best[1][2]:
            best = (seq, ev)
    return best


def depth_first_search(jobs: Sequence[Job], budget_s: float = DEFAULT_DFS_BUDGET_S, seed: int = 0
        ) -> tuple[Assignment, bool]:
    """Exact search (within ``budget_s``) starting from greedy's schedule.

    Returns (sequence, complete) where ``complete`` says the search finished,
    i.e. the schedule is optimal for this model.
    """
    free_jobs, dep = _split(jobs)
    tail = _tail(jobs, dep)
    best_seq = randomized_greedy(jobs, seed=seed)
    best = evaluate(jobs, best_seq)[2]
    # Dependent jobs run after everything else; only the free jobs are searched,
    # against the free-jobs-only makespan of the incumbent.
    if dep:
        best_free = evaluate(jobs, [p for p in best_seq if p[0] not in set(dep)])[2]
    else:
        best_free = best
    search = _Search.of(jobs, free_jobs, best_free, budget_s)
    search.visit(0.0, frozenset(), -1)
    if search.seq is not None:
        return search.seq + tail, not search.timed_out
    return best_seq, not search.timed_out


_EPS = 1e-15
"""A placement must beat the incumbent by more than this to be explored."""


@dataclass
class _Search:
    """The state of ``depth_first_search`` over the free jobs' order and sender choice:
    resource ids, each job's candidates on them, the lower bounds it prunes by, the
    incumbent, and the path being explored (placed and undone in place)."""

    cands: dict  # job -> [(candidate index, resource ids, duration)], shortest first
    mandatory: dict  # job -> (resource ids every candidate of it uses, its shortest duration)
    remaining: list  # per resource id: the mandatory load of the jobs not placed yet
    classes: list  # identical (interchangeable) jobs, longest first
    placed: list  # per class: how many of its members the path has placed
    res_free: list  # per resource id: when the path's last job there ends
    deadline: float  # ``time.monotonic()`` past which the search stops
    best: float  # the incumbent's makespan
    to_place: int  # the number of free jobs
    seq: list | None = None  # the best complete path found, if it beat the incumbent
    path: list = field(default_factory=list)
    nodes: int = 0
    timed_out: bool = False

    @classmethod
    def of(cls, jobs: Sequence[Job], free_jobs: list[int], best: float, budget_s: float) -> "_Search":
        keys = sorted({r for j in free_jobs for c in jobs[j].candidates for r in c.resources})
        rid = {r: i for i, r in enumerate(keys)}
        cands = {j: [(c, [rid[r] for r in cand.resources], cand.duration)
                     for c, cand in sorted(enumerate(jobs[j].candidates), key=lambda x: x[1].duration)]
                 for j in free_jobs}
        # Resources every candidate of a job uses: a lower bound on remaining load there.
        mandatory = {j: (set.intersection(*(set(r) for _, r, _ in cands[j])), min(d for _, _, d in cands[j]))
                     for j in free_jobs}
        remaining = [0.0] * len(keys)
        for j in free_jobs:
            for r in mandatory[j][0]:
                remaining[r] += mandatory[j][1]
        # Identical jobs are interchangeable: only the first unplaced one of a class may go next.
        sig = {j: tuple((jobs[j].candidates[c].host, tuple(jobs[j].candidates[c].resources),
                         jobs[j].candidates[c].duration) for c in range(len(jobs[j].candidates)))
               for j in free_jobs}
        classes: dict[tuple, list[int]] = {}
        for j in sorted(free_jobs, key=lambda j: -_min_duration(jobs[j])):
            classes.setdefault(sig[j], []).append(j)
        return cls(cands, mandatory, remaining, list(classes.values()), [0] * len(classes), [0.0] * len(keys),
                   time.monotonic() + budget_s, best, len(free_jobs))

    def bound(self, makespan: float) -> float:
        """A lower bound on any completion of the path: the makespan so far, and on every
        resource when it frees up plus the mandatory load still to come there."""
        b = makespan
        for v0, v1 in zip(self.res_free, self.remaining):
            v = v0 + v1
            if v > b:
                b = v
        return b

    def visit(self, makespan: float, last_res: frozenset, last_class: int) -> None:
        """Extend the path by every placement that can still beat the incumbent.

        One recursive step kept whole: placing a candidate, recursing and undoing it
        read best side by side, and a helper per placement would double the recursion
        depth of a search over hundreds of jobs."""
        self.nodes += 1
        if self.nodes & 255 == 0 and time.monotonic() > self.deadline:
            self.timed_out = True
        if self.timed_out:
            return
        path, res_free, remaining, placed = self.path, self.res_free, self.remaining, self.placed
        if len(path) == self.to_place:
            if makespan < self.best - _EPS:
                self.best, self.seq = makespan, list(path)
            return
        for ci, members in enumerate(self.classes):
            k = placed[ci]
            if k == len(members):
                continue
            j = members[k]
            must, least = self.mandatory[j]
            for c, res, dur in self.cands[j]:
                # Partial-order reduction: adjacent placements on disjoint resources
                # commute; explore them in class order only.
                if ci < last_class and last_res.isdisjoint(res):
                    continue
                s = max((res_free[r] for r in res), default=0.0)
                e = s + dur
                new_ms = max(makespan, e)
                if new_ms >= self.best - _EPS:
                    continue
                saved = [res_free[r] for r in res]
                for r in res:
                    res_free[r] = e
                for r in must:
                    remaining[r] -= least
                if self.bound(new_ms) < self.best - _EPS:
                    placed[ci] += 1
                    path.append((j, c))
                    self.visit(new_ms, frozenset(res), ci)
                    path.pop()
                    placed[ci] -= 1
                for r in must:
                    remaining[r] += least
                for r, v in zip(res, saved):
                    res_free[r] = v
                if self.timed_out:
                    return


def _by_greedy(jobs, seed, budget):
    seq, evaluation = _greedy(jobs, seed=seed)
    return seq, True, evaluation  # greedy already evaluated its pick: no second pass


BALANCERS = {
    "naive": lambda jobs, seed, budget: (lowest_sender_in_task_order(jobs), True, None),
    "loads": lambda jobs, seed, budget: (fewest_bytes_sender_in_task_order(jobs), True, None),
    "size": lambda jobs, seed, budget: (longest_job_first(jobs), True, None),
    "greedy": _by_greedy,
    "dfs": lambda jobs, seed, budget: (*depth_first_search(jobs, budget_s=budget, seed=seed), None),
}
"""Each load-balancing mode: (jobs, seed, dfs budget) -> (assignment, search complete,
its (starts, finishes, makespan) when already computed)."""


def balance(jobs: Sequence[Job], mode: str, *, seed: int = 0, dfs_budget_s: float = DEFAULT_DFS_BUDGET_S
            ) -> JobOrder:
    """Choose a sender candidate and an order for every job with ``mode``."""
    one_of(mode, LOADBALANCE_MODES, "loadbalance mode")
    if mode == "auto":
        mode = "dfs" if len(_split(jobs)[0]) <= AUTO_DFS_MAX_JOBS else "greedy"
    seq, complete, evaluation = BALANCERS[mode](jobs, seed, dfs_budget_s)
    starts, finishes, makespan = evaluation or evaluate(jobs, seq)
    return JobOrder(tuple(seq), starts, finishes, makespan, mode, complete)
