"""Trainer checkpoints (``--checkpoint-dir``, ``--checkpoint-every``, ``--resume``): a run
stopped and resumed gives exactly (bit for bit) the losses and parameters of an
uninterrupted one; a half-written step is ignored; bad requests are named."""
import contextlib
import json

import numpy as np
import pytest

from conftest import emulation_marks

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

from alpa_comm.errors import InvalidOptionError, UsageError  # noqa: E402
from alpa_comm.train.trainer import TrainConfig, train  # noqa: E402

KW = dict(model="gpt", stages=2, layers=2, width=16, heads=2, seq=8, microbatches=2, cluster="inprocess",
          data="corpus")


def _params(tmp, step):
    """The in-process part's parameters at ``step``, as NumPy leaves."""
    from alpa_comm.train.checkpoint import INPROCESS, orbax
    ocp = orbax()
    with ocp.CheckpointManager(tmp / INPROCESS) as m:
        got = m.restore(step)
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(got["params"])]


def test_inprocess_resume_is_bit_exact_and_ignores_a_half_written_step(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = train(TrainConfig(steps=7, checkpoint_dir=str(ref_dir), checkpoint_every=100, **KW), log=None)
    first = train(TrainConfig(steps=5, checkpoint_dir=str(run_dir), checkpoint_every=2, **KW), log=None)
    assert first.losses == ref.losses[:5]
    assert sorted(p.name for p in (run_dir / "meta").iterdir()) == ["4.json", "5.json"]  # the last 2 kept
    (run_dir / "meta" / "5.json").unlink()  # step 5 half-written: its metadata never came
    resumed = train(TrainConfig(steps=7, checkpoint_dir=str(run_dir), resume=True, **KW), log=None)
    assert resumed.start_step == 4 and len(resumed.step_seconds) == 3
    assert resumed.losses == ref.losses  # bit for bit: the same floats
    for a, b in zip(_params(run_dir, 7), _params(ref_dir, 7)):
        assert np.array_equal(a, b)
    meta = json.loads((run_dir / "meta" / "7.json").read_text())
    assert meta["step"] == 7 and meta["data"]["steps"] == 7


def test_refusals_name_the_value(tmp_path):
    with pytest.raises(InvalidOptionError, match="--resume needs --checkpoint-dir"):
        TrainConfig(resume=True, **KW)
    with pytest.raises(InvalidOptionError, match="--checkpoint-every needs --checkpoint-dir"):
        TrainConfig(checkpoint_every=3, **KW)
    with pytest.raises(InvalidOptionError, match="--checkpoint-every must be a positive integer, got 0"):
        TrainConfig(checkpoint_dir=str(tmp_path), checkpoint_every=0, **KW)
    with pytest.raises(UsageError, match="--resume: no complete checkpoint in"):
        train(TrainConfig(steps=2, checkpoint_dir=str(tmp_path / "empty"), resume=True, **KW), log=None)
    d = tmp_path / "ck"
    train(TrainConfig(steps=2, checkpoint_dir=str(d), **KW), log=None)
    with pytest.raises(UsageError, match="holds checkpoints up to step 2: add --resume"):
        train(TrainConfig(steps=3, checkpoint_dir=str(d), **KW), log=None)
    with pytest.raises(InvalidOptionError, match="width: checkpoint 16, this run 32"):
        train(TrainConfig(steps=3, checkpoint_dir=str(d), resume=True, **{**KW, "width": 32}), log=None)
    with pytest.raises(InvalidOptionError, match="lr: checkpoint 0.003, this run 0.01"):
        train(TrainConfig(steps=3, checkpoint_dir=str(d), resume=True, lr=0.01, **KW), log=None)
    with pytest.raises(InvalidOptionError, match="at step 2; --steps 2 .* leaves nothing to train"):
        train(TrainConfig(steps=2, checkpoint_dir=str(d), resume=True, **KW), log=None)


def test_cli_options(tmp_path, capsys):
    from alpa_comm.cli import main
    args = ["train", "--model", "gpt", "--stages", "2", "--layers", "2", "--width", "16", "--heads", "2", "--seq",
            "8", "--microbatches", "2", "--cluster", "inprocess", "--checkpoint-dir", str(tmp_path)]
    assert main(args + ["--steps", "3", "--checkpoint-every", "2"]) == 0
    assert "checkpoint: step 2 complete" in capsys.readouterr().err
    assert main(args + ["--steps", "4", "--resume"]) == 0
    captured = capsys.readouterr()
    assert "resumed from" in captured.err and "(resumed at step 3)" in captured.out
    assert main(args + ["--steps", "5", "--checkpoint-every", "0"]) == 2
    assert "argument --checkpoint-every: must be >= 1, got '0'" in capsys.readouterr().err
    assert main(["train", "--cluster", "inprocess", "--steps", "1", "--resume"]) == 2
    assert "--resume needs --checkpoint-dir" in capsys.readouterr().err


@pytest.mark.xdist_group("local-ray")
def test_local_ray_resume_is_bit_exact(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    kw = {**KW, "cluster": "local", "microbatch_size": 4, "timeout": 30}
    ref = train(TrainConfig(steps=5, **kw), log=None)
    train(TrainConfig(steps=3, checkpoint_dir=str(tmp_path), checkpoint_every=2, **kw), log=None)
    resumed = train(TrainConfig(steps=5, checkpoint_dir=str(tmp_path), resume=True, **kw), log=None)
    assert resumed.start_step == 3 and resumed.losses == ref.losses


def _part_leaves(root, part, step):
    """Part ``part``'s parameters at ``step`` (any part: ``inprocess``, ``stage_<s>``), as NumPy leaves."""
    from alpa_comm.train.checkpoint import orbax
    with orbax().CheckpointManager(root / part) as m:
        got = m.restore(step)
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(got["params"])]


@pytest.mark.parametrize("seed", [pytest.param(0, marks=emulation_marks())])  # root, slow, its xdist group
def test_emulated_host_loss_then_resume_is_bit_exact(tmp_path, monkeypatch, seed):
    """A run on the emulated cluster (2 hosts, 400 Mbit/s, 10 steps, a checkpoint every 2)
    loses a stage's host at a seeded step: its worker process is SIGKILLed during the step
    (``CommunicationError`` naming the host, the cluster torn down, a checkpoint possibly
    half-written). ``--resume`` on a fresh cluster goes on from the latest complete
    checkpoint, and its losses and final parameters equal an uninterrupted run's bit for bit.

    In this file, not beside ``test_train_emulated``'s module-wide cluster: a killed worker
    leaves a cluster unusable (``Cluster.broken``) and the emulated cluster's names are
    machine-wide, so the lost run needs a cluster of its own while no other is up."""
    import os
    import random
    import signal
    import threading

    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    from alpa_comm.runtime.backend import CommunicationError
    from alpa_comm.runtime.emulated import netns
    from alpa_comm.train import trainer
    from alpa_comm.train.checkpoint import stage_part
    from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster

    rng = random.Random(seed)
    steps, every = 10, 2
    # from step 5: a writer finishes step 2's save before it starts step 4's, so step 2 is complete by then
    kill_step, victim, delay = rng.randint(2 * every + 1, steps - 2), rng.randrange(2), rng.uniform(0.0, 0.1)
    why = f"seed {seed}: stage {victim}'s worker killed {delay * 1e3:.0f} ms into step {kill_step}"
    kw = {**KW, "cluster": "emulated", "nic": "400mbit", "devices_per_host": 1, "microbatch_size": 4,
          "timeout": 10, "steps": steps}
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    real_step = DistributedPipeline.step
    seen = {"steps": 0, "pid": None}

    def losing_a_host(pipe, microbatches):
        seen["steps"] += 1
        if seen["steps"] == kill_step:
            seen["pid"] = ray.get(pipe.cluster.workers[victim].pid.remote())
            threading.Timer(delay, os.kill, (seen["pid"], signal.SIGKILL)).start()
        return real_step(pipe, microbatches)

    with monkeypatch.context() as patched:
        patched.setattr(DistributedPipeline, "step", losing_a_host)
        with pytest.raises(CommunicationError, match=f"host {victim}"):
            train(TrainConfig(checkpoint_dir=str(run_dir), checkpoint_every=every, **kw), log=None)
    assert kill_step <= seen["steps"] <= kill_step + 1, why  # lost in that step or the next
    assert not netns.existing_namespaces() and not netns._alive(seen["pid"]), why
    complete = sorted(int(p.stem) for p in (run_dir / "meta").glob("*.json"))
    assert complete and every <= complete[-1] < seen["steps"], (why, complete)

    with PipelineCluster.emulated(2, 1, nic="400mbit", timeout=10, log=None) as cluster:  # the restart
        monkeypatch.setattr(trainer, "open_cluster", lambda cfg, log=None: contextlib.nullcontext(cluster))
        resumed = train(TrainConfig(checkpoint_dir=str(run_dir), resume=True, **kw), log=None)
        ref = train(TrainConfig(checkpoint_dir=str(ref_dir), checkpoint_every=100, **kw), log=None)
    assert not netns.existing_namespaces()
    assert resumed.start_step == complete[-1], why
    assert len(resumed.step_seconds) == steps - complete[-1]
    assert resumed.losses == ref.losses, why  # bit for bit: the same floats
    for s in range(2):
        for a, b in zip(_part_leaves(run_dir, stage_part(s), steps), _part_leaves(ref_dir, stage_part(s), steps),
                        strict=True):
            assert np.array_equal(a, b), (why, f"stage {s}")
