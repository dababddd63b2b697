"""Pipeline schedules: generators, validator, memory model, simulator, weight delaying."""
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm.cli import main
from alpa_comm.pipeline import (SCHEDULES, Action, Costs, Schedule, ScheduleError, auto_delay_schedule, generate,
                                memory, simulate_schedule, validate)
from alpa_comm.pipeline import schedule_kind
from alpa_comm.pipeline.compare import comm_limit, signal_bound

S_M = st.tuples(st.integers(1, 8), st.integers(1, 32))


@settings(max_examples=80, deadline=None)
@given(S_M, st.sampled_from(SCHEDULES), st.booleans(), st.integers(0, 3))
def test_every_generated_schedule_validates(sm, kind, split, delay):
    S, M = sm
    own = schedule_kind(kind).wgrad_lag is not None  # places its own weight gradients
    sched = generate(kind, S, M, split_backward=split, delay_wgrad=delay if split and not own else None)
    validate(sched)
    assert Schedule.from_text(sched.to_text()) == Schedule(sched.stages)
    assert Schedule.from_json(sched.to_json()).stages == sched.stages


@settings(max_examples=80, deadline=None)
@given(S_M)
def test_memory_claims(sm):
    S, M = sm
    one = memory(generate("1f1b", S, M))
    eager = memory(generate("eager-1f1b", S, M))
    for i in range(S):
        assert one[i].peak_activations == min(M, S - i)
        assert eager[i].peak_activations - one[i].peak_activations <= S  # the paper's bound


@settings(max_examples=80, deadline=None)
@given(S_M)
def test_zb_h1_keeps_1f1b_peak_memory(sm):
    """ZB-H1's claim: the same peak activation memory as 1F1B (stage i holds at most S - i
    activations plus i weight-gradient states; stage 0's S is the peak of both)."""
    S, M = sm
    zb, one = memory(generate("zb-h1", S, M)), memory(generate("1f1b", S, M))
    assert max(m.peak_activations for m in zb) == max(m.peak_activations for m in one) == min(M, S)
    assert all(m.peak_pending_wgrad <= min(i + 1, M) for i, m in enumerate(zb))  # i late, one in hand


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8).flatmap(lambda S: st.tuples(st.just(S), st.integers(S, 32))),
       st.floats(0.2, 2.0), st.floats(0.2, 2.0), st.floats(0.05, 1.0))
def test_zb_h1_bubble_is_the_papers(sm, tf, tbi, share):
    """Without transfer time and with W no longer than F or B (the paper's setting), ZB-H1's
    bubble is (S - 1)(T_F + T_B - T_W), 1F1B's (S - 1)(T_F + T_B + T_W)."""
    S, M = sm
    tbw = share * min(tf, tbi)
    costs = Costs(t_fwd=tf, t_bwd=tbi + tbw, t_bi=tbi, t_bw=tbw, t_comm=0.0)
    zb = simulate_schedule(generate("zb-h1", S, M), costs).iteration_time
    one = simulate_schedule(generate("1f1b", S, M), costs).iteration_time
    assert zb == pytest.approx(M * (tf + tbi + tbw) + (S - 1) * (tf + tbi - tbw))
    assert one == pytest.approx((M + S - 1) * (tf + tbi + tbw))


def test_eager_1f1b_wins_over_zb_h1_only_where_transfers_matter():
    """Eager-1F1B trades memory for overlap: with free transfers ZB-H1 is faster (it fills
    the cool-down with weight gradients); with transfers as long as a forward eager-1F1B is."""
    S, M = 4, 8
    free, slow = Costs(t_fwd=1, t_bwd=2, t_comm=0.0), Costs(t_fwd=1, t_bwd=2, t_comm=1.0)
    t = {(k, c): simulate_schedule(generate(k, S, M), costs).iteration_time
         for k in ("zb-h1", "eager-1f1b") for c, costs in (("free", free), ("slow", slow))}
    assert t[("zb-h1", "free")] < t[("eager-1f1b", "free")]
    assert t[("eager-1f1b", "slow")] < t[("zb-h1", "slow")]
    with pytest.raises(Exception, match="places its own weight gradients"):
        generate("zb-h1", S, M, split_backward=True, delay_wgrad=1)


@settings(max_examples=60, deadline=None)
@given(S_M, st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_without_transfer_time_1f1b_and_eager_take_equally_long(sm, tf, tb):
    S, M = sm
    costs = Costs(t_fwd=tf, t_bwd=tb, t_comm=0.0)
    a = simulate_schedule(generate("1f1b", S, M), costs).iteration_time
    b = simulate_schedule(generate("eager-1f1b", S, M), costs).iteration_time
    assert a == pytest.approx(b)
    assert a == pytest.approx((M + S - 1) * (tf + tb))


@settings(max_examples=20, deadline=None)
@given(S_M, st.sampled_from(SCHEDULES), st.floats(0.0, 2.0))
def test_no_schedule_beats_the_comm_limit(sm, kind, tc):
    S, M = sm
    costs = Costs(1.0, 2.0, tc)
    for split in (False, True):
        t = simulate_schedule(generate(kind, S, M, split_backward=split), costs).iteration_time
        assert t >= comm_limit(S, M, costs) - 1e-9
        assert t >= signal_bound(S, M, costs) - 1e-9


def test_benchmark_setting_from_the_issue():
    S, M, costs = 4, 16, Costs(t_fwd=1, t_bwd=2, t_comm=0.5)
    bound = signal_bound(S, M, costs, kinds=("gpipe", "1f1b", "eager-1f1b"))  # the claim predates ZB-H1
    assert signal_bound(S, M, costs) == 51  # ZB-H1 without transfers: bubble (S-1)(T_F + T_B - T_W)
    eager, report = auto_delay_schedule("eager-1f1b", S, M, costs)
    assert bound / simulate_schedule(eager, costs).iteration_time >= 0.93
    assert bound / simulate_schedule(generate("1f1b", S, M), costs).iteration_time <= 0.85
    assert len(report["delays"]) == S


def test_auto_delay_is_least_and_helps_when_it_can():
    S, M, costs = 4, 16, Costs(t_fwd=1, t_bwd=2, t_comm=1.5)
    sched, report = auto_delay_schedule("1f1b", S, M, costs)
    assert report["iteration_time"] <= report["iteration_time_undelayed"]
    assert report["delays"][0] >= 1  # the first stage waits for gradients: delaying BW fills it
    validate(sched)
    # one step less delay on any stage is not as fast
    for i, d in enumerate(report["delays"]):
        if d:
            less = report["delays"][:i] + [d - 1] + report["delays"][i + 1:]
            t = simulate_schedule(generate("1f1b", S, M, split_backward=True, delay_wgrad=less), costs).iteration_time
            assert t > report["iteration_time"]


def test_transfers_overlap_only_where_the_schedule_allows():
    costs = Costs(t_fwd=1, t_bwd=2, t_comm=1.0)
    two = Schedule.from_text("stage 0: F0 SEND_F0 RECV_B0 B0\nstage 1: RECV_F0 F0 B0 SEND_B0\n")
    r = simulate_schedule(two, costs)
    assert r.iteration_time == pytest.approx(1 + 1 + 1 + 2 + 1 + 2)  # nothing to overlap with
    assert simulate_schedule(two, costs, signal=True).iteration_time == pytest.approx(6)


@pytest.mark.parametrize("text,fragment", [
    ("stage 0: F0 SEND_F0 B0\nstage 1: RECV_F0 F0 B0 SEND_B0\n", "RECV_B0 is missing"),
    ("stage 0: F0 B0\n", "F0"),  # fine: a single stage
    ("stage 0: B0 F0\n", "before its forward"),
    ("stage 0: F0 BW0 BI0\n", "BW0 before BI0"),
    ("stage 0: F0 F0 B0\n", "appears twice"),
    ("stage 0: F0 SEND_F0 RECV_B0 B0\nstage 1: F0 B0 SEND_B0\n", "stage 1: RECV_F0 is missing"),
    ("stage 0: F0 SEND_F0 RECV_B0 B0\nstage 1: RECV_F0 F0 B0\n", "stage 1: SEND_B0 is missing"),
    ("stage 0: F0 SEND_F0@1 B0\nstage 1: F0 B0\n", "no matching RECV_F0 on stage 1"),
    ("stage 0: F0 B0\nstage 1: RECV_F0@0 F0 B0\n", "no matching SEND_F0 on stage 0"),
    ("stage 0: F0 F1 B1\n", "backward B0 is missing"),
    ("stage 0: F0 X1\n", "cannot parse action 'X1'"),
    ("stage 1: F0 B0\n", "numbered 0..0"),
])
def test_validator_points_at_the_offending_action(text, fragment):
    if fragment == "F0":
        validate(Schedule.from_text(text))
        return
    with pytest.raises(ScheduleError, match=fragment):
        validate(Schedule.from_text(text))


def test_deadlock_is_reported_with_the_blocked_actions():
    text = ("stage 0: RECV_B0 F0 SEND_F0 B0\n"
            "stage 1: RECV_F0 F0 B0 SEND_B0\n")
    with pytest.raises(ScheduleError, match="RECV_B0 .*must come before|deadlock"):
        validate(Schedule.from_text(text))
    crossed = ("stage 0: F0 SEND_F0 RECV_B0 B0 F1 SEND_F1 RECV_B1 B1\n"
               "stage 1: RECV_F1 F1 B1 SEND_B1 RECV_F0 F0 B0 SEND_B0\n")
    with pytest.raises(ScheduleError, match="deadlocks: stage 0 at action 2 \\(RECV_B0\\); "
                                            "stage 1 at action 0 \\(RECV_F1\\)"):
        validate(Schedule.from_text(crossed))


def test_explicit_peer_for_skip_connections():
    text = ("stage 0: F0 SEND_F0 SEND_F0@2 RECV_B0 B0\n"
            "stage 1: RECV_F0 F0 SEND_F0 RECV_B0 B0 SEND_B0\n"
            "stage 2: RECV_F0 RECV_F0@0 F0 B0 SEND_B0\n")
    sched = Schedule.from_text(text)
    assert sched.peer(0, Action.parse("SEND_F0@2")) == 2
    res = simulate_schedule(sched, Costs(t_comm=0.5))
    assert {(t.src, t.dst) for t in res.transfers} == {(0, 1), (0, 2), (1, 2), (2, 1), (1, 0)}


def test_bad_generator_options():
    from alpa_comm import InvalidOptionError
    with pytest.raises(InvalidOptionError, match="'zigzag'"):
        generate("zigzag", 2, 2)
    with pytest.raises(InvalidOptionError, match="split_backward"):
        generate("1f1b", 2, 2, delay_wgrad=1)
    with pytest.raises(InvalidOptionError, match="stages"):
        generate("1f1b", 0, 2)


def test_cli_schedule_text_round_trip(tmp_path, capsys):
    assert main(["schedule", "--stages", "3", "--microbatches", "4", "--schedule", "eager-1f1b",
                 "--split-backward", "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("stage 0: F0 SEND_F0 F1")
    f = tmp_path / "s.txt"
    f.write_text(text)
    png, trace = tmp_path / "s.png", tmp_path / "s.json"
    assert main(["schedule", "--from-file", str(f), "--png", str(png), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "iteration time" in out and "stage 2 |" in out
    assert png.exists() and trace.exists()


def test_cli_schedule_compare_and_errors(tmp_path, capsys):
    assert main(["schedule", "--stages", "4", "--microbatches", "16", "--compare", "--png",
                 str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "eager-1f1b + split + auto delay" in out and "0.718" in out and "| zb-h1 " in out
    bad = tmp_path / "bad.txt"
    bad.write_text("stage 0: F0 B0 B0\n")
    assert main(["schedule", "--from-file", str(bad)]) == 2
    assert "appears twice" in capsys.readouterr().err


def test_auto_backward_keeps_the_backward_whole_unless_a_delay_helps():
    from alpa_comm.pipeline import auto_backward
    from alpa_comm.pipeline.weight_delay import auto_delay
    free = Costs(t_fwd=1, t_bwd=2, t_comm=0.0)
    assert not any(auto_delay("eager-1f1b", 4, 8, free)) and auto_backward("eager-1f1b", 4, 8, free) is None
    slow = Costs(t_fwd=1, t_bwd=2, t_comm=1.5)
    delays = auto_backward("1f1b", 4, 16, slow)
    assert delays == auto_delay("1f1b", 4, 16, slow) and any(delays)


def test_the_trainer_runs_b_whole_when_auto_chooses_no_delay():
    from alpa_comm.models import build_model
    from alpa_comm.train.trainer import TrainConfig, build_schedule
    cfg = TrainConfig(model="gpt", stages=2, microbatches=4, schedule="eager-1f1b", delay_wgrad="auto")
    sched = build_schedule(cfg, build_model("gpt", 2, layers=2, d=16, heads=2, seq=8), Costs(1, 2, 0.0))
    assert {a.kind.name for s in sched.stages for a in s if a.is_compute} == {"F", "B"}
