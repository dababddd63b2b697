"""ZB-V and DualPipeV: two model chunks per stage placed in a V (chunk 0 of stage i is model
stage i, chunk 1 is 2S - 1 - i). With free transfers and per-chunk times F, BI and W
(B = BI + W for a whole backward), busy = 2M(F + BI + W) per stage:

* ZB-V (Qi et al., arXiv:2401.10241 section 6), F = BI = W = t and M >= 2S - 1: every
  stage runs without a gap from its first action to its last (the paper's zero bubble),
  so the iteration is busy + (S - 1)t, the fill no schedule avoids (the last stage's
  first forward cannot start earlier); peak memory is 1F1B's, S on every stage.
* DualPipeV (deepseek-ai/DualPipe, ``dualpipev.py``) with F >= BI: the iteration is
  busy + (S - 1) max(F, F + BI - W, 2F - BI - W, 2F - 2W). Each term is one chain of
  work: the last stage from (S - 1)F on, without a gap until the chain leaves it, the
  hops back to stage 0, then the rest of stage 0's work. The chain leaves with the last
  chunk-1 forward (S - 1 hops of F: 2F - BI - W); with that forward and, from stage 0,
  the last microbatch's input gradient out to the turn and back (2F - 2W); with the
  last chunk-0 input gradient (S - 1 hops of BI: F + BI - W); or with the main step's
  last full chunk-0 backward (S - 1 hops of B: F). Where BI > F other chains appear.
  The README's (PP/2 - 1)(F&B + B - 3W) counts each overlapped pair as one step; run as
  F then B, with every transfer next to its own action, a hop costs less (at equal
  times the README gives 2(S - 1)t with F&B = F + B, this (S - 1)t). Peak memory is the
  README's PP + 1 chunk-microbatches (PP = 2S model stages): S + 1/2 whole-stage units.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.errors import InvalidOptionError
from alpa_comm.pipeline import (V_SCHEDULES, Costs, Schedule, generate, memory, simulate_schedule,
                                validate)


@st.composite
def v_shapes(draw, kind=None, extra=8):
    """(kind, S, M) with M from the kind's least up to ``extra`` more than 2S."""
    kind = kind or draw(st.sampled_from(sorted(V_SCHEDULES)))
    S = draw(st.integers(1, 6))
    least = V_SCHEDULES[kind].min_microbatches(S)
    return kind, S, draw(st.integers(least, max(least, 2 * S) + extra))


def chunk_costs(F: float, BI: float, W: float) -> Costs:
    """Per-chunk times as the simulator's per-stage ones: each of a stage's two chunks costs half."""
    return Costs(t_fwd=2 * F, t_bwd=2 * (BI + W), t_bi=2 * BI, t_bw=2 * W)


@settings(max_examples=60, deadline=None)
@given(v_shapes())
def test_every_microbatch_and_chunk_runs_each_pass_once(shape):
    kind, S, M = shape
    sched = generate(kind, S, M)
    validate(sched)
    assert sched.placement == "v" and sched.num_chunks == 2 and sched.name == kind
    for i, acts in enumerate(sched.stages):
        counts = {}
        for a in acts:
            if a.is_compute:
                counts[(a.kind.value, a.mb, a.chunk)] = counts.get((a.kind.value, a.mb, a.chunk), 0) + 1
        for m in range(M):
            for c in (0, 1):
                got = {k: counts.get((k, m, c), 0) for k in ("F", "B", "BI", "BW")}
                split = {"F": 1, "B": 0, "BI": 1, "BW": 1}
                # ZB-V splits every backward; DualPipeV keeps the main step's whole
                assert got == split or (kind == "dualpipev" and got == {"F": 1, "B": 1, "BI": 0, "BW": 0}), \
                    (i, m, c, got)
    # every model-stage boundary but the turn crosses stages, once each way per microbatch
    res = simulate_schedule(sched, Costs(t_comm=0.5))
    assert len(res.transfers) == 2 * M * (2 * S - 2)
    assert all(t.src != t.dst for t in res.transfers)


full_zbv = st.integers(1, 6).flatmap(lambda S: st.tuples(st.just(S), st.integers(2 * S - 1, 2 * S + 8)))
"""(S, M) where ZB-V's warm-up is full: M >= 2S - 1."""


@settings(max_examples=40, deadline=None)
@given(full_zbv, st.floats(0.1, 5.0))
def test_zbv_is_zero_bubble_at_equal_times(shape, t):
    S, M = shape
    res = simulate_schedule(generate("zb-v", S, M), chunk_costs(t, t, t), signal=True)
    busy = 2 * M * 3 * t
    for i in range(S):
        ev = [e for e in res.events if e.stage == i]
        assert max(e.end for e in ev) - min(e.start for e in ev) == pytest.approx(busy, rel=1e-9), i
    assert res.iteration_time == pytest.approx(busy + (S - 1) * t, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(v_shapes("zb-v"), st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_zbv_peak_memory_is_1f1bs(shape, wgrad_fraction):
    """Whatever share of a microbatch's activations its weight gradient keeps: no stage
    holds more than 1F1B's first stage, min(M, S), and from M >= 2S - 1 on every stage
    holds exactly S (2S chunk-microbatches of 1/2 each)."""
    _, S, M = shape
    peaks = [m.peak_activations for m in memory(generate("zb-v", S, M), wgrad_fraction)]
    one = max(m.peak_activations for m in memory(generate("1f1b", S, M), wgrad_fraction))
    assert max(peaks) == one == min(M, S)
    if M >= 2 * S - 1:
        assert peaks == [S] * S


@st.composite
def forward_at_least_input_grad(draw):
    """Per-chunk (F, BI, W) with F >= BI, where DualPipeV's bubble has the closed form."""
    a, b = draw(st.floats(0.1, 5.0)), draw(st.floats(0.1, 5.0))
    return max(a, b), min(a, b), draw(st.floats(0.1, 5.0))


@settings(max_examples=80, deadline=None)
@given(v_shapes("dualpipev"), forward_at_least_input_grad())
def test_dualpipev_bubble_is_its_longest_chain_back_from_the_turn(shape, times):
    _, S, M = shape
    F, BI, W = times
    res = simulate_schedule(generate("dualpipev", S, M), chunk_costs(F, BI, W), signal=True)
    per_hop = max(F, F + BI - W, 2 * F - BI - W, 2 * F - 2 * W)
    assert res.iteration_time == pytest.approx(2 * M * (F + BI + W) + (S - 1) * per_hop, rel=1e-9)


@pytest.mark.parametrize("S", [1, 2, 3, 4, 5, 6])
def test_dualpipev_at_equal_times_against_the_readme(S):
    """F = BI = W = 1 (B = 2): the bubble here is S - 1, the fill alone; the README's
    (S - 1)(F&B + B - 3W) with F&B = F + B is twice that (see the module docstring)."""
    M = 2 * S + 3
    res = simulate_schedule(generate("dualpipev", S, M), chunk_costs(1, 1, 1), signal=True)
    bubble = res.iteration_time - 2 * M * 3
    assert bubble == pytest.approx(S - 1)
    F, B, W = 1, 2, 1
    assert (S - 1) * ((F + B) + B - 3 * W) == pytest.approx(2 * bubble)


@settings(max_examples=40, deadline=None)
@given(v_shapes("dualpipev"), st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_dualpipev_peak_memory_is_pp_plus_one_chunks(shape, wgrad_fraction):
    _, S, M = shape
    assert [m.peak_activations for m in memory(generate("dualpipev", S, M), wgrad_fraction)] == [S + 0.5] * S


@pytest.mark.parametrize("kind", sorted(V_SCHEDULES))
def test_text_and_json_keep_the_v(kind):
    sched = generate(kind, 3, 6)
    text = sched.to_text()
    assert text.startswith("placement: v\n") and "F0.1" in text
    assert Schedule.from_text(text, kind) == sched
    back = Schedule.from_json(sched.to_json())
    assert back == sched and back.placement == "v"
    assert "SEND_F" not in " ".join(str(a) for a in sched.stages[2] if a.chunk == 0)  # the turn stays on stage 2


def test_v_options_are_named():
    assert sorted(V_SCHEDULES) == ["dualpipev", "zb-v"]
    assert generate("zb-v", 2, 4, chunks=2) == generate("zb-v", 2, 4, split_backward=True) == generate("zb-v", 2, 4)
    with pytest.raises(InvalidOptionError, match="dualpipev needs at least 6 microbatches on 3 stages, got 5"):
        generate("dualpipev", 3, 5)
    with pytest.raises(InvalidOptionError, match=r"zb-v holds two model chunks per stage \(in a V\); chunks=3"):
        generate("zb-v", 2, 4, chunks=3)
    with pytest.raises(InvalidOptionError, match="dualpipev places its own weight gradients"):
        generate("dualpipev", 2, 4, delay_wgrad=1)
    with pytest.raises(InvalidOptionError, match="number of stages must be a positive integer, got 0"):
        generate("zb-v", 0, 4)
    with pytest.raises(InvalidOptionError, match="interleaved-1f1b needs chunks >= 2"):
        generate("interleaved-1f1b", 2, 4)
    assert generate("1f1b", 2, 4, chunks=1) == generate("1f1b", 2, 4)
