import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import InvalidOptionError, plan_resharding
from alpa_comm.resharding import loadbalance as lb
from alpa_comm.resharding.resources import nic_receive as rx, nic_send as tx
from alpa_comm.resharding.strategies import Candidate, Job
from alpa_comm.suites import SUITE_DEVICES_PER_HOST, SUITE_HOSTS, n_to_m, one_to_m
from alpa_comm import ClusterSpec


@st.composite
def small_instances(draw):
    """Up to 7 jobs; each has 1-2 candidate sender hosts among 3 and 1-2 receiver hosts among 3."""
    return [draw_job(draw, senders=(1, 2), base=(1, 5), spread=1) for _ in range(draw(st.integers(1, 7)))]


def draw_job(draw, senders: tuple[int, int], base: tuple[int, int], spread: int) -> Job:
    """One broadcast job from ``senders`` (min, max count) of hosts 0-2 to one or two of
    hosts 3-5, its duration in ``base`` and each candidate's up to ``spread`` longer."""
    receivers = draw(st.lists(st.integers(3, 5), min_size=1, max_size=2, unique=True))
    hosts = draw(st.lists(st.integers(0, 2), min_size=senders[0], max_size=senders[1], unique=True))
    length = draw(st.integers(*base))
    cands = tuple(Candidate(s, (tx(s),) + tuple(rx(r) for r in receivers), float(length + draw(st.integers(0, spread))))
                  for s in sorted(hosts))
    return Job(0, "broadcast", tuple(receivers), length, (), cands)


def brute_force(jobs):
    best = float("inf")
    for perm in itertools.permutations(range(len(jobs))):
        for choice in itertools.product(*(range(len(jobs[j].candidates)) for j in perm)):
            best = min(best, lb.evaluate(jobs, list(zip(perm, choice)))[2])
    return best


@settings(max_examples=60, deadline=None)
@given(small_instances())
def test_dfs_finds_the_brute_force_optimum(jobs):
    if len(jobs) > 6:
        jobs = jobs[:6]  # keep brute force fast; 7-job instances are covered below
    seq, complete = lb.depth_first_search(jobs, budget_s=5.0)
    assert complete
    assert lb.evaluate(jobs, seq)[2] == pytest.approx(brute_force(jobs))


def test_dfs_on_seven_jobs():
    rng = random.Random(7)
    for _ in range(3):
        jobs = []
        for _ in range(7):
            s = rng.sample(range(3), rng.randint(1, 2))
            r = rng.randint(3, 5)
            d = float(rng.randint(1, 4))
            jobs.append(Job(0, "send_recv", (r,), 1, (), tuple(Candidate(h, (tx(h), rx(r)), d) for h in sorted(s))))
        seq, complete = lb.depth_first_search(jobs, budget_s=10.0)
        assert complete
        assert lb.evaluate(jobs, seq)[2] == pytest.approx(brute_force(jobs))


def test_dfs_returns_a_valid_plan_when_out_of_budget():
    jobs = [Job(0, "send_recv", (3,), 1, (), (Candidate(0, (tx(0), rx(3)), 1.0), Candidate(1, (tx(1), rx(3)), 1.0)))
            for _ in range(40)]
    seq, complete = lb.depth_first_search(jobs, budget_s=0.0)
    assert sorted(j for j, _ in seq) == list(range(40))


class _TickingClock:
    """``time.monotonic`` that advances one second a call. The search reads its clock
    once at the start and then every 256 nodes, so a budget of k seconds cuts it off
    after the same nodes on every machine."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        self.now += 1.0
        return self.now


@st.composite
def searched_instances(draw):
    """10-13 jobs, each sendable from two or three of 3 hosts to one or two of 3 receiving
    hosts at durations that differ by candidate: large enough that a few hundred nodes
    do not always finish the search."""
    return [draw_job(draw, senders=(2, 3), base=(2, 9), spread=2) for _ in range(draw(st.integers(10, 13)))]


@settings(max_examples=40, deadline=None)
@given(searched_instances(), st.integers(0, 6))
def test_dfs_cut_off_anywhere_returns_a_whole_schedule_no_worse_than_greedy(jobs, checks):
    """Wherever the budget stops the search, it hands back every job once on one of its
    candidates and never worse than greedy; a search that finished under a budget
    answers exactly as one with all the time it needs."""
    from unittest import mock

    with mock.patch.object(lb, "time", _TickingClock()):
        seq, complete = lb.depth_first_search(jobs, budget_s=float(checks))
    assert sorted(j for j, _ in seq) == list(range(len(jobs)))
    assert all(0 <= c < len(jobs[j].candidates) for j, c in seq)
    assert lb.evaluate(jobs, seq)[2] <= lb.evaluate(jobs, lb.randomized_greedy(jobs))[2]
    if complete:
        assert lb.depth_first_search(jobs, budget_s=60.0) == (seq, True)


CLUSTER = ClusterSpec(num_hosts=SUITE_HOSTS, devices_per_host=SUITE_DEVICES_PER_HOST)


@pytest.mark.parametrize("case", n_to_m(16) + one_to_m(16 << 20), ids=lambda c: f"{c.suite}-{c.name}")
@pytest.mark.parametrize("strategy", ["broadcast", "send_recv", "local_allgather"])
def test_greedy_and_size_never_worse_than_naive(case, strategy):
    times = {}
    for mode in ("naive", "size", "greedy", "dfs"):
        times[mode] = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh,
                                      case.dst_spec, cluster=CLUSTER, strategy=strategy, loadbalance=mode,
                                      dfs_budget_s=0.2).predicted_seconds
    assert times["greedy"] <= times["naive"] * (1 + 1e-12)
    assert times["size"] <= times["naive"] * (1 + 1e-12)
    assert times["dfs"] <= times["greedy"] * (1 + 1e-12)


def test_greedy_is_seeded():
    case = n_to_m(16)[3]
    a, b = (plan_resharding(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                            cluster=CLUSTER, loadbalance="greedy", seed=s).to_json() for s in (3, 3))
    assert a == b


def test_unknown_mode():
    with pytest.raises(InvalidOptionError, match="'fastest'"):
        lb.balance([], "fastest")
