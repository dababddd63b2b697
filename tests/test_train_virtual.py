"""Schedules over virtual stages (several model chunks per stage: interleaved 1F1B in a
loop, ZB-V and DualPipeV in a V) run in one process and compute exactly the
single-device loss and gradients, for GPT and the U-Transformer (whose skips cross
stages in a loop and stay inside a stage in a V). The model has one model stage per
chunk: ``build_model(name, S * C)``."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from alpa_comm.models import build_model  # noqa: E402
from alpa_comm.pipeline import Schedule, ScheduleError, generate, memory, validate  # noqa: E402
from alpa_comm.pipeline.edges import with_skips  # noqa: E402
from alpa_comm.pipeline.ir import Action  # noqa: E402
from alpa_comm.train.local_pipeline import reference_step, run_schedule  # noqa: E402

VOCAB, SEQ = 32, 8


def microbatches(M, b=2, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(M):
        t = rng.integers(0, VOCAB, (b, SEQ + 1))
        out.append({"tokens": jnp.asarray(t[:, :-1], jnp.int32), "targets": jnp.asarray(t[:, 1:], jnp.int32)})
    return out


def tiny(name, V):
    """One layer per model stage. The U-Transformer's 2L = V layers (V = 2S is even) then
    send layer v's output to layer V - 1 - v: a skip from model stage v to V - 1 - v
    (the middle one rides the adjacent edge)."""
    return build_model(name, V, layers=V, d=16, heads=2, seq=SEQ, vocab=VOCAB)


def schedule(kind, S, M):
    return generate(kind, S, M, chunks=2) if kind == "interleaved-1f1b" else generate(kind, S, M)


KINDS = ("interleaved-1f1b", "zb-v", "dualpipev")


@pytest.mark.parametrize("name,S", [("gpt", 3), ("utransformer", 2)])
def test_virtual_schedules_match_the_single_device_step(name, S):
    """Each case compiles 2S model stages once (the cost of this file) and runs every
    virtual schedule on them. The U-Transformer on 2 stages has one skip, 0 -> 3: in the
    loop it crosses from stage 0 to stage 1 beside the adjacent transfer 0 -> 1 (same
    stages, same microbatch, another boundary); in the V it stays on stage 0."""
    M = 2 * S  # a multiple of S (interleaved) and >= 2S (DualPipeV)
    model, mbs = tiny(name, 2 * S), microbatches(M)
    ref_loss, ref_grads = reference_step(model, mbs)
    for kind in KINDS:
        sched = with_skips(schedule(kind, S, M), model.skips)
        validate(sched)
        assert Schedule.from_text(sched.to_text(), sched.name) == sched == Schedule.from_json(sched.to_json())
        run = run_schedule(model, sched, mbs)
        assert run.loss == pytest.approx(float(ref_loss), rel=1e-5), kind
        assert len(run.grads) == len(ref_grads) == 2 * S
        for g, r in zip(run.grads, ref_grads):
            for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(r)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7, err_msg=kind)
        # live (microbatch, chunk) states over both chunks of a stage: the memory model
        # counting a microbatch until its BW, in chunk units
        assert run.peak_live_activations == [round(2 * m.peak_activations) for m in memory(sched, 1.0)], kind


def test_skips_cross_stages_in_a_loop_and_stay_inside_a_stage_in_a_v():
    """U-Transformer skips with one layer per model stage (``tiny``): v -> 2S - 1 - v."""
    S, M = 3, 6
    skips = [(0, 5), (1, 4)]  # tiny("utransformer", 6).skips, without building it
    loop = with_skips(schedule("interleaved-1f1b", S, M), skips)
    # 0 -> 5 joins stage 0's chunk 0 and stage 2's chunk 1; 1 -> 4 are both on stage 1
    assert "SEND_F0@2.1" in loop.to_text() and "RECV_F0.1@0" in loop.to_text()
    assert not any(a.peer is not None for a in loop.stages[1])
    v = schedule("dualpipev", S, M)
    assert with_skips(v, skips) == v  # k and 2S - 1 - k share a stage
    # on 2 stages model stage 0 sends stage 1 both its neighbour's input (model stage 1)
    # and its skip (model stage 3): two transfers, one microbatch, one pair of stages
    two = with_skips(schedule("interleaved-1f1b", 2, 4), [(0, 3)])
    validate(two)
    assert two.stages[0][:3] == tuple(Action.parse(t) for t in ("F0", "SEND_F0@1.1", "SEND_F0"))
    assert two.transfer_key(0, two.stages[0][1]) != two.transfer_key(0, two.stages[0][2])
    # the peer's chunk says which model stage a skip joins: written wrong, nothing matches
    wrong = Schedule(tuple(tuple(Action(a.kind, a.mb, a.peer, a.chunk) for a in s) for s in two.stages), two.name)
    with pytest.raises(ScheduleError, match=r"SEND_F0@1\): no matching RECV_F0 on stage 1"):
        validate(wrong)


def test_sizes_and_local_hand_offs_are_named():
    M, model = 4, tiny("gpt", 2)
    with pytest.raises(ScheduleError, match="2 stages x 2 chunks = 4 model stages, the model 2"):
        run_schedule(model, generate("zb-v", 2, M), microbatches(M))
    with pytest.raises(ScheduleError, match="the schedule has 3 stages, the model 2"):
        run_schedule(model, generate("1f1b", 3, M), microbatches(M))
    turn = "placement: v\nstage 0: "
    with pytest.raises(ScheduleError, match=r"F0.1 \(model stage 1\) runs before F0 \(model stage 0\)"):
        run_schedule(model, Schedule.from_text(turn + "F0.1 F0 B0.1 B0"), microbatches(1))
    with pytest.raises(ScheduleError, match="B0 .model stage 0. runs before the backward of microbatch 0 of model "
                                            "stage 1"):  # caught before anything is compiled
        run_schedule(model, Schedule.from_text(turn + "B0 F0 F0.1 B0.1"), microbatches(1))
