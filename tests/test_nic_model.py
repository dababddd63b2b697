"""The simulator's link model: on free links (the paper's model) each directed stage pair
carries its transfers one after another; over shared NICs (the trainer's runtime) every
transfer in flight shares its sender's and its receiver's NIC max-min fairly; every edge
may carry its own measured time (``Costs.t_edge``)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.pipeline import Costs, ScheduleError, generate, simulate_schedule
from alpa_comm.pipeline.edges import with_skips
from alpa_comm.pipeline.simulate import _Links


def test_a_skip_edge_and_its_neighbour_edge_share_the_nic_and_neither_waits():
    s = with_skips(generate("gpipe", 4, 1), [(0, 3)])  # stage 0 sends to stage 1 and, over the skip, to 3
    costs = Costs(1.0, 2.0, 0.5)
    free = simulate_schedule(s, costs)
    shared = simulate_schedule(s, costs, shared_nic=True)
    first = {(t.src, t.dst): t for t in shared.transfers if t.kind == "F" and t.src == 0}
    assert first[(0, 1)].start == first[(0, 3)].start == 1.0  # both leave when F0 ends
    assert [t.end - t.start for t in first.values()] == [pytest.approx(1.0)] * 2  # each at half speed
    assert all(t.end - t.start == pytest.approx(0.5) for t in free.transfers)
    assert shared.iteration_time >= free.iteration_time


def test_a_free_link_carries_its_transfers_in_order_a_shared_nic_all_at_once():
    s = generate("gpipe", 2, 3)
    costs = Costs(t_fwd=0.0, t_bwd=0.0, t_comm=1.0)
    fwd = sorted((t.start, t.end) for t in simulate_schedule(s, costs).transfers if t.kind == "F")
    assert fwd == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    fwd = sorted((t.start, t.end) for t in simulate_schedule(s, costs, shared_nic=True).transfers if t.kind == "F")
    assert fwd == [(0.0, pytest.approx(3.0))] * 3  # three threads, their chunks interleaved on one wire


def test_rates_are_max_min_fair():
    """in-NIC of 3 carries three flows (1/3 each); the out-NIC of 0 gives its rest to 0->1."""
    links = _Links(shared_nic=True)
    pairs = [(0, 1), (0, 3), (2, 3), (1, 3)]
    for key, (src, dst) in enumerate(pairs):
        links.send(key, 1.0, src, dst, "F", 0)
    rate = {ch[:2]: q[0].rate for ch, q in links.queues.items()}
    assert rate == {(0, 1): pytest.approx(2 / 3), (0, 3): pytest.approx(1 / 3),
                    (2, 3): pytest.approx(1 / 3), (1, 3): pytest.approx(1 / 3)}
    t, channel = links.next_completion()
    assert channel[:2] == (0, 1) and t == pytest.approx(1.5)
    key, done = links.complete(channel)  # 0->3 has the out-NIC of 0 to itself, but in-NIC 3 holds it at 1/3
    assert key == 0 and (done.start, done.end) == (0.0, pytest.approx(1.5))
    assert {ch[:2]: q[0].rate for ch, q in links.queues.items()}[(0, 3)] == pytest.approx(1 / 3)


def test_a_transfer_sent_twice_is_an_error_not_a_silent_merge():
    from alpa_comm.pipeline import Schedule
    s = Schedule.from_text("stage 0: F0 SEND_F0 SEND_F0\nstage 1: RECV_F0 F0\n")
    with pytest.raises(ScheduleError, match="twice"):
        simulate_schedule(s, Costs())


def test_each_edge_takes_its_own_time_where_the_schedule_cuts_the_model_as_measured():
    s = with_skips(generate("gpipe", 4, 1), [(0, 3)])
    costs = Costs(1.0, 2.0, 0.5, t_edge={"F:0->3": 2.0, "F:0->1": 0.25}, edge_model_stages=4)
    got = {(t.src, t.dst, t.kind): t.end - t.start for t in simulate_schedule(s, costs).transfers}
    assert got[(0, 3, "F")] == pytest.approx(2.0) and got[(0, 1, "F")] == pytest.approx(0.25)
    assert got[(1, 2, "F")] == pytest.approx(0.5)  # not named: its sender's t_comm
    other_cut = Costs(1.0, 2.0, 0.5, t_edge={"F:0->3": 2.0}, edge_model_stages=8)
    assert all(t.end - t.start == pytest.approx(0.5) for t in simulate_schedule(s, other_cut).transfers)
    with pytest.raises(ScheduleError, match="F:0->3"):
        Costs(t_edge={"F:0->3": -1.0})


def _union(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "eager-1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipev"]),
       st.integers(2, 4), st.integers(1, 3), st.booleans(),
       st.lists(st.floats(0.1, 2.0), min_size=4, max_size=4), st.lists(st.floats(0.0, 2.0), min_size=4, max_size=4))
def test_a_shared_nic_carries_no_more_than_its_rate_and_never_speeds_a_step_up(kind, S, per, skip, f, comm):
    M = 2 * per * S if kind in ("interleaved-1f1b", "dualpipev") else per + 1
    s = generate(kind, S, M, split_backward=kind in ("eager-1f1b", "zb-h1", "zb-v", "dualpipev"),
                 chunks=2 if kind == "interleaved-1f1b" else None)
    if skip and not s.virtual and S >= 3:
        s = with_skips(s, [(0, S - 1)])
    costs = Costs(t_fwd=f[:S], t_comm=comm[:S])
    own = simulate_schedule(s, costs)
    shared = simulate_schedule(s, costs, shared_nic=True)
    c = costs.resolve(S)
    for t in own.transfers:  # a link of its own carries each transfer at its time alone, to the bit
        assert t.end - t.start == pytest.approx(c["comm" if t.kind == "F" else "comm_b"][t.src], abs=1e-12)
    for t in shared.transfers:  # no transfer goes faster than alone on an idle link
        assert t.end - t.start >= c["comm" if t.kind == "F" else "comm_b"][t.src] - 1e-9
    for host in range(S):  # a NIC is busy at least as long as its transfers take alone, one after another
        for side in ("src", "dst"):
            mine = [t for t in shared.transfers if getattr(t, side) == host]
            work = sum(c["comm" if t.kind == "F" else "comm_b"][t.src] for t in mine)
            assert _union([(t.start, t.end) for t in mine]) >= work - 1e-6
    signal = simulate_schedule(s, costs, signal=True)
    assert signal.iteration_time <= own.iteration_time + 1e-9 <= shared.iteration_time + 2e-9
