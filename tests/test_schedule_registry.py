"""One schedule registry (``pipeline.SCHEDULE_KINDS``) and one lowering pass: every
family's generated order kept (against the digests of ``tests/schedule_golden.py``),
every family valid at random sizes, and every name selectable wherever a schedule is
named (``alpa-comm schedule`` and ``alpa-comm train``, in-process and on host workers)."""
import contextlib
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm.cli import build_parser, main
from alpa_comm.errors import InvalidOptionError
from alpa_comm.pipeline import (SCHEDULE_KINDS, SCHEDULE_NAMES, SCHEDULES, V_SCHEDULES, VIRTUAL_SCHEDULES, Schedule,
                                chunks_for, generate, schedule_kind, validate)
from schedule_golden import GOLDEN, digests


def test_generated_orders_are_unchanged():
    """Every family, variant and size of the grid generates the order (or the refusal) it
    generated when the digests were written: a refactor of the generators changes none."""
    want = json.loads(GOLDEN.read_text())
    got = digests()
    assert sorted(got) == sorted(want)
    changed = sorted(k for k in want if got[k] != want[k])
    assert not changed, f"{len(changed)} generated orders changed, e.g. {changed[:5]}"


@st.composite
def registered_schedules(draw):
    """A registered family with sizes it runs at (its fewest microbatches, its groups)."""
    kind = draw(st.sampled_from(SCHEDULE_NAMES))
    family = schedule_kind(kind)
    S = draw(st.integers(1, 8))
    M = max(draw(st.integers(1, 32)), family.min_microbatches(S))
    if family.microbatch_groups:
        M = S * -(-M // S)
    return kind, S, M, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(registered_schedules())
def test_every_registered_schedule_validates(case):
    """Every family of the one registry, lowered by the one pass, at random sizes (with
    the backward split where the caller places the weight gradients), is valid and keeps
    its placement through the text and JSON forms."""
    kind, S, M, split = case
    family = schedule_kind(kind)
    sched = generate(kind, S, M, split_backward=split, chunks=chunks_for(kind))
    validate(sched)
    assert sched.placement == family.placement and sched.num_microbatches == M
    assert sched.num_chunks == (family.chunks or 2)
    assert sched.split_backward == (family.own_wgrad or split)
    assert Schedule.from_text(sched.to_text(), sched.name) == sched
    assert Schedule.from_json(sched.to_json()) == sched


def test_one_registry_and_its_views():
    """Every other name is a view of ``SCHEDULE_KINDS``; every family is named once."""
    assert SCHEDULE_NAMES == tuple(SCHEDULE_KINDS)
    assert set(SCHEDULE_NAMES) == {"gpipe", "1f1b", "eager-1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipev"}
    assert set(SCHEDULES) | set(VIRTUAL_SCHEDULES) | set(V_SCHEDULES) == set(SCHEDULE_NAMES)
    assert all(SCHEDULE_KINDS[k] is f for k, f in {**VIRTUAL_SCHEDULES, **V_SCHEDULES}.items())
    with pytest.raises(InvalidOptionError, match="unknown schedule 'zb-x'; choose one of gpipe, .*dualpipev"):
        generate("zb-x", 2, 4)


@pytest.mark.parametrize("command", ["schedule", "train"])
def test_every_registered_name_is_a_choice_of_every_schedule_option(command):
    """The CLI's ``--schedule`` choices come from the registry: every name parses, in
    ``schedule`` and ``train`` alike, with ``--model-chunks``."""
    parser = build_parser()
    for kind in SCHEDULE_NAMES + ("auto",):
        assert parser.parse_args([command, "--schedule", kind]).schedule == kind
    assert parser.parse_args([command, "--schedule", "interleaved-1f1b", "--model-chunks", "3"]).model_chunks == 3


TINY = ["--stages", "2", "--layers", "4", "--width", "8", "--heads", "2", "--seq", "4", "--microbatches", "4",
        "--microbatch-size", "2", "--steps", "1", "--data", "synthetic"]
"""test_docs_commands.CI_SIZED's train size, with a layer for each of the 2 x 2 model
stages a virtual schedule cuts the model into."""


@pytest.mark.parametrize("kind", SCHEDULE_NAMES)
def test_train_inprocess_runs_every_registered_schedule(kind, capsys):
    """``alpa-comm train --schedule S --cluster inprocess`` runs every family (virtual ones
    on the model cut into one stage per chunk), each to the same first loss: the model's,
    however it is cut."""
    assert main(["train", "--cluster", "inprocess", "--schedule", kind] + TINY) == 0
    out = capsys.readouterr().out
    assert f"2 stages x dp 1, {kind}" in out and "loss 5.5452 -> 5.5452 over 1 steps" in out


SMALL_MODEL = ["--width", "8", "--heads", "2", "--seq", "4", "--microbatch-size", "2", "--steps", "1",
               "--data", "synthetic"]
"""A small model whose layers and microbatches are left to their defaults."""


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("kind", SCHEDULE_NAMES)
def test_a_schedule_named_alone_runs_with_the_default_layers_and_microbatches(kind, stages, capsys):
    """``--schedule S`` without ``--layers``/``--microbatches`` runs every family: the
    defaults rise to a layer per model stage and to the family's fewest microbatches
    (DualPipeV: 2S), where those exceed 4."""
    assert main(["train", "--cluster", "inprocess", "--schedule", kind, "--stages", str(stages)] + SMALL_MODEL) == 0
    assert f"{stages} stages x dp 1, {kind}" in capsys.readouterr().out


def test_values_given_are_checked_not_raised(capsys):
    """Only the defaults adapt: a count the user gives is kept, and refused by name
    where the schedule cannot run it."""
    from alpa_comm.train.trainer import TrainConfig

    cfg = TrainConfig(cluster="inprocess", schedule="1f1b", stages=4, layers=6, microbatches=5)
    assert (cfg.layers, cfg.microbatches) == (6, 5)
    assert (TrainConfig(schedule="zb-v", stages=4).layers, TrainConfig(schedule="dualpipev", stages=4).microbatches) \
        == (8, 8)
    assert main(["train", "--cluster", "inprocess", "--schedule", "dualpipev", "--microbatches", "4"]
                + SMALL_MODEL) == 2
    assert "dualpipev needs at least 8 microbatches on 4 stages, got 4" in capsys.readouterr().err


def test_train_on_a_cluster_runs_a_virtual_schedule_on_the_model_cut_per_chunk(monkeypatch):
    """On host workers (``--cluster local`` etc.) the named family is what the pipeline
    runs: its stages, chunks and placement, with the skips of the model cut into one stage
    per chunk (the U-Transformer's skip 0 -> 3 crosses a link in a loop)."""
    from alpa_comm.pipeline.edges import check_transfers, model_edges, model_stage_meshes, split_edges
    from alpa_comm.train import distributed, trainer

    built = []

    class FakePipeline:
        def __init__(self, cluster, model, stages, schedule, **kw):
            built.append((stages, schedule))

        def step(self, batch):
            return SimpleNamespace(loss=1.0, seconds=0.01, per_host=[])

    monkeypatch.setattr(distributed, "DistributedPipeline", FakePipeline)
    monkeypatch.setattr(trainer, "open_cluster", lambda cfg, log=None: contextlib.nullcontext(None))
    for kind, chunks in (("interleaved-1f1b", 3), ("zb-v", None), ("dualpipev", None)):
        cfg = trainer.TrainConfig(model="utransformer", stages=2, layers=6, width=8, heads=2, seq=4,
                                  microbatches=4, microbatch_size=2, schedule=kind, model_chunks=chunks,
                                  cluster="local", data="synthetic", steps=1)
        trainer.train(cfg, log=None)
        stages, sched = built[-1]
        family = schedule_kind(kind)
        assert stages == 2 and sched.name.startswith(kind) and sched.placement == family.placement
        assert sched.num_chunks == (chunks or 2) == cfg.model_stages // 2
        model = distributed.abstract_model("utransformer", sched.num_virtual_stages, cfg.model_kwargs())
        check_transfers(sched, split_edges(model_edges(model.consumes), model_stage_meshes(sched))[0])


@pytest.mark.parametrize("options,message", [
    ({"schedule": "zb-x"}, "unknown schedule 'zb-x'"),
    ({"schedule": "1f1b", "model_chunks": 3}, "--model-chunks applies to interleaved-1f1b only, not 1f1b"),
    ({"schedule": "zb-v", "model_chunks": 3}, "zb-v holds 2 model chunks per stage of its own"),
    ({"schedule": "dualpipev", "delay_wgrad": 1}, "dualpipev places its own weight gradients"),
    ({"schedule": "interleaved-1f1b", "delay_wgrad": "auto"}, "--delay-wgrad auto is not available"),
    ({"schedule": "auto", "model_chunks": 2}, "--schedule auto chooses the chunks itself"),
])
def test_train_options_a_family_does_not_take_are_named(options, message):
    from alpa_comm.train.trainer import TrainConfig

    with pytest.raises(InvalidOptionError, match=message):
        TrainConfig(cluster="inprocess", **options)


def test_a_model_too_small_for_the_chunks_is_named():
    from alpa_comm.train.trainer import TrainConfig, train

    with pytest.raises(InvalidOptionError, match="--schedule zb-v runs 2 stages x 2 chunks = 4 model stages: "
                                                 "2 layers cannot fill 4 stages"):
        train(TrainConfig(cluster="inprocess", schedule="zb-v", stages=2, layers=2, steps=1), log=None)


def test_the_validators_error_draws_the_grid_with_the_failing_step_marked():
    """The message stays one line (the CLI prints it); the error's ``grid`` draws every
    stage around the failing action(s), marked, as torch.distributed.pipelining's
    validator does; a deadlock marks every blocked action."""
    from alpa_comm.pipeline import ScheduleError

    sched = generate("1f1b", 4, 8)
    stages = [list(s) for s in sched.stages]
    dropped = stages[2].pop(20)
    assert str(dropped) == "SEND_B2"
    with pytest.raises(ScheduleError, match="stage 2: SEND_B2 is missing") as e:
        validate(Schedule(tuple(map(tuple, stages))))
    assert "\n" not in str(e.value)
    rows = e.value.grid.splitlines()
    assert len(rows) == 5 and rows[0].split("|")[1].split()[:2] == ["...", "15"]  # 4 actions either side
    assert rows[3].startswith("  stage 2") and ">B2<" in rows[3] and rows[3].count(">") == 1
    assert e.value.__notes__ == [e.value.grid]
    crossed = ("stage 0: F0 SEND_F0 RECV_B0 B0 F1 SEND_F1 RECV_B1 B1\n"
               "stage 1: RECV_F1 F1 B1 SEND_B1 RECV_F0 F0 B0 SEND_B0\n")
    with pytest.raises(ScheduleError, match="deadlocks") as e:
        validate(Schedule.from_text(crossed))
    assert ">RECV_B0<" in e.value.grid.splitlines()[1] and ">RECV_F1<" in e.value.grid.splitlines()[2]
