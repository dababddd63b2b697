"""``--schedule auto``: every family simulated, the fastest that fits the memory cap picked,
the ranking printed; errors name the cap."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.cli import main
from alpa_comm.errors import InvalidOptionError
from alpa_comm.pipeline import Costs, Schedule, auto_schedule, memory, simulate_schedule, validate


def _rank(S, M, costs, cap=None, virtual=True):
    cands = auto_schedule.candidates(S, M, costs, virtual=virtual)
    return auto_schedule.rank(cands, S, M, lambda s: simulate_schedule(s, costs).iteration_time, memory_cap=cap)


@settings(max_examples=12, deadline=None)
@given(S=st.integers(2, 5), per=st.integers(1, 4), f=st.floats(0.2, 2), b=st.floats(0.4, 4), comm=st.floats(0, 2),
       cap_share=st.floats(0.3, 1.2))
def test_the_pick_is_the_fastest_that_fits_and_every_candidate_is_valid(S, per, f, b, comm, cap_share):
    M = S * per
    costs = Costs(t_fwd=f, t_bwd=b, t_comm=comm)
    peaks = [r.peak_activations for r in _rank(S, M, costs)]
    cap = cap_share * max(peaks)
    ranked = _rank(S, M, costs, cap)
    for r in ranked:
        validate(r.schedule)
        assert r.peak_activations == max(m.peak_activations for m in memory(r.schedule))
        assert r.fits == (r.peak_activations <= cap + 1e-9)
    if not any(r.fits for r in ranked):
        with pytest.raises(InvalidOptionError, match="no schedule fits the memory cap"):
            auto_schedule.choose(ranked)
        return
    pick = auto_schedule.choose(ranked)
    assert pick.fits
    fastest = min(r.predicted_s for r in ranked if r.fits)
    assert pick.predicted_s <= fastest * (1 + auto_schedule.TIE) + 1e-12
    # a tie goes to the lower peak
    tied = [r for r in ranked if r.fits and r.predicted_s <= fastest * (1 + auto_schedule.TIE)]
    assert pick.peak_activations == min(r.peak_activations for r in tied)


def test_free_transfers_pick_a_split_schedule_and_slow_ones_the_eager_one():
    """The measured regimes of docs/schedules.md: ZB-H1-like split schedules win when
    transfers are free, eager-1F1B (with a delay) when a transfer is half a forward or more."""
    S, M = 4, 16
    free = auto_schedule.choose(_rank(S, M, Costs(1.0, 2.0, 0.0), virtual=False))
    assert free.schedule.split_backward
    slow = auto_schedule.choose(_rank(S, M, Costs(1.0, 2.0, 1.0), virtual=False))
    assert slow.candidate.kind == "eager-1f1b"
    one_chunk = {r.candidate.kind for r in _rank(S, M, Costs(1.0, 2.0, 1.0), virtual=False)}
    assert one_chunk == {"gpipe", "1f1b", "eager-1f1b", "zb-h1"}


def test_virtual_candidates_only_where_the_microbatches_allow():
    kinds = {c.kind for c in auto_schedule.candidates(4, 6, Costs(), virtual=True)}
    assert "dualpipev" not in kinds and "interleaved-1f1b" not in kinds and "zb-v" in kinds
    kinds = {c.kind for c in auto_schedule.candidates(4, 8, Costs(), virtual=True)}
    assert {"dualpipev", "interleaved-1f1b", "zb-v"} <= kinds


def test_a_bad_cap_is_named():
    with pytest.raises(InvalidOptionError, match="memory cap must be a positive number.*-1"):
        _rank(2, 4, Costs(), cap=-1)


def test_cli_prints_the_ranking_and_draws_the_pick(capsys):
    assert main(["schedule", "--schedule", "auto", "--stages", "4", "--microbatches", "8", "--t-comm", "1"]) == 0
    out = capsys.readouterr().out
    assert "--schedule auto:" in out and "picked " in out and "<-" in out and "iteration time" in out
    assert main(["schedule", "--schedule", "auto", "--memory-cap", "0.01"]) == 2
    assert "no schedule fits the memory cap" in capsys.readouterr().err
    assert main(["schedule", "--schedule", "1f1b", "--memory-cap", "2"]) == 2
    assert "--memory-cap does nothing without --schedule auto" in capsys.readouterr().err
    assert main(["schedule", "--schedule", "auto", "--split-backward"]) == 2
    assert main(["schedule", "--schedule", "zb-v", "--stages", "4", "--microbatches", "8"]) == 0
    assert "placement" in capsys.readouterr().out
    # --format json: stdout is the picked schedule alone (the ranking goes to stderr)
    assert main(["schedule", "--schedule", "auto", "--stages", "3", "--microbatches", "6", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert Schedule.from_json(captured.out).num_stages == 3 and "picked " in captured.err


@settings(max_examples=25, deadline=None)
@given(S=st.integers(2, 4), per=st.integers(1, 3), comm=st.floats(0, 2), margin=st.floats(0, 1),
       noise=st.lists(st.floats(0.7, 1.3), min_size=12, max_size=12), cap_share=st.floats(0.3, 1.2))
def test_the_trial_measures_the_finalists_and_keeps_the_measured_fastest(S, per, comm, margin, noise, cap_share):
    """Finalists: every candidate that fits, predicted within the margin of the fastest
    that fits, and none else; the pick after a trial is the measured fastest of them (a
    tie to the lower peak), whatever the predicted order was."""
    M = S * per
    costs = Costs(1.0, 2.0, comm)
    ranked = _rank(S, M, costs)
    ranked = _rank(S, M, costs, cap_share * max(r.peak_activations for r in ranked))
    final = auto_schedule.finalists(ranked, margin)
    fit = [r for r in ranked if r.fits]
    if not fit:
        assert final == []
        return
    best = min(r.predicted_s for r in fit)
    within = best * (1 + max(margin, auto_schedule.TIE)) + 1e-12  # a margin below TIE is taken as TIE
    assert {id(r) for r in final} == {id(r) for r in fit if r.predicted_s <= within}
    assert final[0] is auto_schedule.choose(ranked)  # the predicted pick is always measured
    measured = {r.candidate.label: r.predicted_s * noise[k % len(noise)] for k, r in enumerate(final)}
    pick = auto_schedule.choose_measured(ranked, measured)
    fastest = min(measured.values())
    assert pick in final and measured[pick.candidate.label] <= fastest * (1 + auto_schedule.TIE)
    tied = [r for r in final if measured[r.candidate.label] <= fastest * (1 + auto_schedule.TIE)]
    assert pick.peak_activations == min(r.peak_activations for r in tied)


def test_a_trial_without_measurements_keeps_the_predicted_pick_and_a_bad_margin_is_named():
    ranked = _rank(4, 8, Costs(1.0, 2.0, 0.5))
    assert auto_schedule.choose_measured(ranked, {}) is auto_schedule.choose(ranked)
    for bad in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(InvalidOptionError, match="trial margin must be a number >= 0"):
            auto_schedule.finalists(ranked, bad)


def test_the_ranking_table_shows_what_the_trial_measured():
    ranked = _rank(4, 8, Costs(1.0, 2.0, 0.5))
    second = ranked[1]
    measured = {ranked[0].candidate.label: (9.0, "calibration"), second.candidate.label: (8.0, "trial")}
    pick = auto_schedule.choose_measured(ranked, {k: v[0] for k, v in measured.items()})
    assert pick is second
    rows = auto_schedule.table_rows(ranked, measured, pick)
    assert len(rows[0]) == len(auto_schedule.HEADERS) + len(auto_schedule.MEASURED_HEADERS)
    assert rows[1][-3:] == ["8", "trial", "<-"] and rows[0][-3:] == ["9", "calibration", ""]
    assert rows[2][-3:-1] == ["-", "-"]


def test_a_zero_margin_still_measures_the_predicted_pick_and_its_ties():
    """``rank`` ties times within ``TIE`` and puts the lower peak first, so the predicted
    pick can be slower than the fastest prediction by less than ``TIE``: a margin of 0
    must still keep it (regression: it once kept only the fastest prediction)."""
    S, M = 4, 8
    ranked = _rank(S, M, Costs(1.0, 2.0, 0.01))
    final = auto_schedule.finalists(ranked, 0)
    assert final[0] is auto_schedule.choose(ranked)
    fastest = min(r.predicted_s for r in ranked if r.fits)
    assert all(r.predicted_s <= fastest * (1 + auto_schedule.TIE) + 1e-12 for r in final)


def test_contenders_keep_what_the_noise_cannot_separate_and_let_go_what_it_can():
    # two steps each, spread about 1 %: 5 % behind is separated, 0.5 % behind is not
    steps = {"a": [10.0, 10.1], "b": [10.05, 10.1], "c": [10.5, 10.6]}
    assert auto_schedule.contenders(steps) == ["a", "b"]
    # the same medians with a 12 % spread: nothing is separated
    noisy = {"a": [9.4, 10.6], "b": [9.5, 10.7], "c": [9.9, 11.1]}
    assert auto_schedule.contenders(noisy) == ["a", "b", "c"]
    # one step each: no spread measured, so only the leader stays; nothing measured: nothing
    assert auto_schedule.contenders({"a": [10.0], "b": [10.01]}) == ["a"]
    assert auto_schedule.contenders({}) == [] and auto_schedule.contenders({"a": []}) == []
    # one-step finalists next to measured spread: judged with the pooled noise
    assert auto_schedule.contenders({"a": [10.0, 11.0], "b": [10.2], "c": [13.0]}) == ["b", "a"]  # b leads: 10.2 < 10.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(1.0, 20.0), min_size=1, max_size=6), min_size=1, max_size=5),
       st.floats(1.01, 3.0))
def test_contenders_are_led_by_the_lowest_median_and_more_steps_never_hide_a_gap(groups, factor):
    from statistics import median
    steps = {f"s{k}": g for k, g in enumerate(groups)}
    out = auto_schedule.contenders(steps)
    assert out and out[0] == min(steps, key=lambda k: median(steps[k]))
    assert set(out) <= set(steps) and len(set(out)) == len(out)
    meds = [median(steps[k]) for k in out]
    assert meds == sorted(meds)
    # a finalist whose every step is the leader's scaled by ``factor`` (same relative spread)
    # can only be separated further as the steps grow more numerous
    lead = out[0]
    behind = {lead: steps[lead], "slow": [x * factor for x in steps[lead]]}
    more = {lead: steps[lead] * 3, "slow": [x * factor for x in steps[lead]] * 3}
    if "slow" not in auto_schedule.contenders(behind):
        assert "slow" not in auto_schedule.contenders(more)
