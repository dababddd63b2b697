"""Virtual stages (several model chunks per stage) in the schedule IR, the validator, the
simulator and the memory model, and interleaved 1F1B over them: its bubble with free
transfers is (S - 1)(t_f + t_b) / C, as Narayanan et al. (SC'21) derive."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.errors import InvalidOptionError
from alpa_comm.pipeline import Costs, Schedule, ScheduleError, generate, memory, simulate_schedule, validate
from alpa_comm.pipeline.ir import Action


@st.composite
def interleaved(draw):
    S = draw(st.integers(1, 6))
    C = draw(st.integers(2, 4))
    M = S * draw(st.integers(1, 4))
    return S, C, M


@settings(max_examples=30, deadline=None)
@given(interleaved(), st.floats(0.1, 5.0), st.floats(0.1, 5.0))
def test_interleaved_1f1b_bubble_is_the_fill_and_drain_over_c(shape, t_f, t_b):
    S, C, M = shape
    sched = generate("interleaved-1f1b", S, M, chunks=C)
    validate(sched)
    res = simulate_schedule(sched, Costs(t_fwd=t_f, t_bwd=t_b), signal=True)
    assert res.iteration_time == pytest.approx(M * (t_f + t_b) + (S - 1) * (t_f + t_b) / C, rel=1e-9)
    one = simulate_schedule(generate("1f1b", S, M), Costs(t_fwd=t_f, t_bwd=t_b), signal=True)
    assert res.iteration_time <= one.iteration_time + 1e-9


@settings(max_examples=40, deadline=None)
@given(interleaved())
def test_interleaved_memory_is_its_warm_up_in_chunk_units(shape):
    """Stage i holds its warm-up forwards plus one, each 1/C of a stage's activations."""
    S, C, M = shape
    mem = memory(generate("interleaved-1f1b", S, M, chunks=C))
    for i, m in enumerate(mem):
        warm = min((S - i - 1) * 2 + (C - 1) * S, M * C)
        assert m.peak_activations == pytest.approx(min(warm + 1, M * C) / C)


@settings(max_examples=40, deadline=None)
@given(interleaved(), st.integers(0, 3), st.floats(0.0, 2.0))
def test_split_and_delayed_interleaved_schedules_run_with_transfers(shape, delay, t_comm):
    S, C, M = shape
    sched = generate("interleaved-1f1b", S, M, chunks=C, split_backward=True, delay_wgrad=delay)
    validate(sched)
    res = simulate_schedule(sched, Costs(t_fwd=1.0, t_bwd=2.0, t_comm=t_comm), shared_nic=True)
    assert res.iteration_time >= M * 3.0 - 1e-9
    # every model-stage boundary on different stages carries each microbatch both ways
    boundaries = sum(1 for v in range(S * C - 1) if sched.place(v)[0] != sched.place(v + 1)[0])
    assert len(res.transfers) == 2 * M * boundaries
    assert {e.chunk for e in res.events} == set(range(C))


def test_text_and_json_keep_chunks_and_placement():
    sched = generate("interleaved-1f1b", 2, 4, chunks=2, split_backward=True)
    assert Schedule.from_text(sched.to_text()).stages == sched.stages
    assert Schedule.from_json(sched.to_json()).stages == sched.stages
    assert Action.parse("send_f3.1@2") == Action("SEND_F", 3, 2, 1) and str(Action("BW", 3, chunk=1)) == "BW3.1"
    v = Schedule.from_text("placement: v\nstage 0: F0 F0.1 B0.1 B0\n")
    assert v.placement == "v" and v.num_chunks == 2 and v.virtual_stage(0, 1) == 1
    validate(v)  # one stage holding both halves of a V: the turn is local
    assert Schedule.from_text(v.to_text()) == v and Schedule.from_json(v.to_json()).placement == "v"


def test_bad_virtual_schedules_are_named():
    with pytest.raises(InvalidOptionError, match="needs chunks >= 2"):
        generate("interleaved-1f1b", 2, 4)
    with pytest.raises(InvalidOptionError, match="6 microbatches is not a multiple of 4"):
        generate("interleaved-1f1b", 4, 6, chunks=2)
    with pytest.raises(InvalidOptionError, match="1f1b has one model chunk per stage"):
        generate("1f1b", 2, 4, chunks=2)
    with pytest.raises(ScheduleError, match="F0.1 before F0"):
        validate(Schedule.from_text("placement: v\nstage 0: F0.1 F0 B0.1 B0\n"))
    with pytest.raises(ScheduleError, match="microbatch 0 chunk 0 before chunk 1's"):
        validate(Schedule.from_text("placement: v\nstage 0: F0 F0.1 B0 B0.1\n"))
    with pytest.raises(ScheduleError, match="forward F1.1 is missing"):
        validate(Schedule.from_text("stage 0: F0 F1 F0.1 B0.1 B0 B1.1 B1\n"))
    with pytest.raises(ScheduleError, match="unknown placement 'w'"):
        Schedule((), placement="w")


def test_the_distributed_trainer_names_a_stage_count_that_is_not_the_schedules():
    """The distributed trainer runs virtual stages (``tests/test_train_emulated.py``):
    ``num_stages`` counts stages (meshes), the model gets one stage per chunk; a count
    that is not the schedule's is named before the cluster is touched."""
    pytest.importorskip("jax")
    from types import SimpleNamespace

    from alpa_comm.train.distributed import DistributedPipeline

    cluster = SimpleNamespace(spec=SimpleNamespace(num_hosts=4, devices_per_host=1))
    with pytest.raises(ScheduleError, match="the schedule has 2 stages x 2 chunks, the pipeline 4 stages: "
                                            r"num_stages counts stages \(meshes\), the model gets one model stage "
                                            r"per chunk \(4\)"):
        DistributedPipeline(cluster, "gpt", 4, generate("interleaved-1f1b", 2, 2, chunks=2), microbatch_size=2)