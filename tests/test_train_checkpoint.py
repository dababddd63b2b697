"""Trainer checkpoints (``--checkpoint-dir``, ``--checkpoint-every``, ``--resume``): a run
stopped and resumed gives exactly (bit for bit) the losses and parameters of an
uninterrupted one; a half-written step is ignored; bad requests are named."""
import json

import numpy as np
import pytest

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
