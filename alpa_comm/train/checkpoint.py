"""Trainer checkpoints: ``alpa-comm train --checkpoint-dir DIR --checkpoint-every N --resume``.

A run's state lives where it is trained: each stage mesh's parameters and optimizer
state on the host worker that holds them (in-process: in the trainer itself), the step
count, the data position and the losses so far in the driver. So each holder writes its
own part and nothing crosses the network to be saved:

    DIR/stage_0/<step>/...    stage 0's parameters and optimizer state (Orbax, one
    DIR/stage_1/<step>/...    CheckpointManager per stage mesh, written by replica 0)
    DIR/inprocess/<step>/...  the same for every stage, with --cluster inprocess
    DIR/meta/<step>.json      the driver's part, written last: step, data position,
                              losses, and the configuration a resume must match

A stage part is written asynchronously (Orbax copies the arrays off the device, then
writes them in a background thread while training goes on); a writer has one save in
flight at most, waiting for the previous one before it starts the next. The driver
writes a step's ``meta/<step>.json`` only once every stage reports that step's part
finished, so a step is *complete* when its metadata exists (and every part it names):
``--resume`` takes the latest complete step and ignores anything half-written, such as
the parts of a step a killed run was still writing. The last ``KEEP`` complete steps
are kept; older parts are removed by their writers, older metadata by the driver,
never the latest complete step before a newer one is complete.

On a cluster DIR must be one directory every host sees (a shared filesystem): each
stage writes its own part there and every data-parallel replica restores from it.

Orbax (``orbax-checkpoint``, extras ``jax`` and ``train``) is imported only when a
checkpoint option is given; without one a run neither imports nor needs it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .._extras import require
from ..errors import InvalidOptionError, UsageError

KEEP = 2
"""Complete checkpoints kept in DIR (older ones are removed as newer ones complete)."""
DEFAULT_EVERY = 10
"""``--checkpoint-every`` when ``--checkpoint-dir`` is given alone."""
FORMAT = 1
META = "meta"
INPROCESS = "inprocess"
MATCHED = ("model", "stages", "dp", "layers", "width", "heads", "seq", "microbatches", "microbatch_size",
           "optimizer", "lr", "seed", "data")
"""TrainConfig fields a resumed run must share with its checkpoint: each changes the
parameters' shapes, the numbers or the batches. The schedule (name and actions), where
it runs (in-process or on host workers) and, on host workers, ``devices_per_host`` (how
a microbatch splits over a host's devices) are matched too. The rest (strategy,
transport, cluster, NIC, timeouts, ``--steps``) may change between runs."""


def orbax(extra: str = "jax"):
    """``orbax.checkpoint``, or ``MissingExtraError`` naming ``extra``."""
    return require("orbax.checkpoint", extra=extra)


def stage_part(stage: int) -> str:
    """The directory, under DIR, of stage mesh ``stage``'s part."""
    return f"stage_{stage}"


def state_tree(params: dict, opt_state: dict) -> dict:
    """What a stage part holds: parameters and optimizer state by model stage (string
    keys: Orbax names the arrays by their path)."""
    return {"params": {str(v): p for v, p in params.items()}, "opt_state": {str(v): s for v, s in opt_state.items()}}


class PartWriter:
    """One part's checkpoints: an Orbax ``CheckpointManager`` over ``DIR/<part>`` saving
    asynchronously, one save in flight at most. Kept by the process that holds the state
    (a stage's host worker, or the in-process trainer)."""

    def __init__(self, root: str | Path):
        ocp = orbax()
        self.root = Path(root)
        self.manager = ocp.CheckpointManager(self.root, options=ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=True, cleanup_tmp_directories=True))
        self.pending: int | None = None
        self.done: int | None = None

    def save(self, step: int, tree, keep) -> int | None:
        """Wait for the previous save, remove every step not in ``keep`` (the driver's complete
        steps it keeps and the one it awaits; also the parts a killed run left behind), then
        start saving ``tree`` as ``step`` and return at once. Returns the latest step whose
        save has finished."""
        ocp = orbax()
        self.wait()
        keep = set(keep) | {step}
        for old in self.manager.all_steps(read=True):
            if old not in keep:
                self.manager.delete(old)
        self.manager.save(step, args=ocp.args.StandardSave(tree), force=True)
        self.pending = step
        return self.done

    def finished(self) -> int | None:
        """The latest step whose save has finished, without waiting (a failed write raises)."""
        if self.pending is not None and not self.manager.is_saving_in_progress():
            self.manager.check_for_errors()
            self.done, self.pending = self.pending, None
        return self.done

    def wait(self) -> int | None:
        """Wait for the save in flight; the latest step saved."""
        self.manager.wait_until_finished()
        if self.pending is not None:
            self.done, self.pending = self.pending, None
        return self.done

    def prune(self, keep) -> None:
        """Remove every saved step not in ``keep`` (at the end of a run)."""
        self.wait()
        for old in self.manager.all_steps(read=True):
            if old not in set(keep):
                self.manager.delete(old)

    def close(self) -> None:
        self.wait()
        self.manager.close()


def restore_part(root: str | Path, step: int, target):
    """``step``'s tree from the part at ``root``, restored into ``target``'s structure,
    shapes, dtypes and shardings (the state a fresh set-up built; a part whose arrays do
    not fit it is refused by Orbax)."""
    ocp = orbax()
    manager = ocp.CheckpointManager(Path(root), options=ocp.CheckpointManagerOptions(create=False))
    try:
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    finally:
        manager.close()


def run_config(cfg, schedule) -> dict:
    """The values of ``cfg`` and its schedule that a resumed run must share (``MATCHED``)."""
    out = {name: getattr(cfg, name) for name in MATCHED}
    out["runner"] = "inprocess" if cfg.cluster == "inprocess" else "host workers"
    if cfg.cluster != "inprocess":
        out["devices_per_host"] = cfg.devices_per_host
    out["schedule"] = schedule.name
    out["schedule_actions"] = schedule.to_text()
    return out


def check_options(cfg) -> None:
    """``TrainConfig``'s checkpoint options, each bad value named."""
    from ..validation import positive_int  # noqa: PLC0415

    if cfg.checkpoint_dir is None:
        for name, unset in (("checkpoint_every", None), ("resume", False)):
            if getattr(cfg, name) != unset:
                raise InvalidOptionError(f"--{name.replace('_', '-')} needs --checkpoint-dir DIR (where the "
                                         f"checkpoints are)")
        return
    if not isinstance(cfg.checkpoint_dir, (str, os.PathLike)) or not str(cfg.checkpoint_dir):
        raise InvalidOptionError(f"--checkpoint-dir must be a directory path, got {cfg.checkpoint_dir!r}")
    if Path(cfg.checkpoint_dir).exists() and not Path(cfg.checkpoint_dir).is_dir():
        raise InvalidOptionError(f"--checkpoint-dir {cfg.checkpoint_dir}: exists and is not a directory")
    if cfg.checkpoint_every is not None:
        positive_int(cfg.checkpoint_every, "--checkpoint-every")
    if cfg.resume and cfg.schedule == "auto":
        raise InvalidOptionError("--resume continues the schedule its checkpoint was trained with: name it "
                                 "(--schedule NAME; the error names the checkpoint's) instead of --schedule auto")


class Checkpoints:
    """The driver's side: which parts a step has, when a step is due, the metadata
    written once every part is saved, and what a resumed run starts from.

    ``parts``: the directories under DIR that make a step (one per stage mesh, or
    ``INPROCESS``). After ``open``, ``start`` is the step the run goes on from (0 for a
    fresh run) and ``restored`` that step's metadata (None for a fresh run)."""

    def __init__(self, cfg, schedule, parts: list[str]):
        self.dir = Path(cfg.checkpoint_dir)
        self.every = cfg.checkpoint_every or DEFAULT_EVERY
        self.total = cfg.steps
        self.parts = list(parts)
        self.config = run_config(cfg, schedule)
        self.pending: dict | None = None  # the metadata of the step being written, until every part is
        self.start, self.restored = 0, None
        complete = self.complete_steps()
        if cfg.resume:
            if not complete:
                raise UsageError(f"--resume: no complete checkpoint in {self.dir} (a step is complete once "
                                 f"{META}/<step>.json is written, after every stage's part)")
            meta = self.read(complete[-1])
            self._check_config(meta)
            if meta["step"] >= cfg.steps:
                raise InvalidOptionError(f"--resume: the latest complete checkpoint in {self.dir} is at step "
                                         f"{meta['step']}; --steps {cfg.steps} (the total) leaves nothing to "
                                         f"train: give more")
            self.start, self.restored = meta["step"], meta
        elif complete:
            raise UsageError(f"--checkpoint-dir {self.dir} holds checkpoints up to step {complete[-1]}: add "
                             f"--resume to go on from there, or give an empty directory")

    # ---------------------------------------------------------------- on disk
    def meta_path(self, step: int) -> Path:
        return self.dir / META / f"{step}.json"

    def complete_steps(self) -> list[int]:
        """Steps whose metadata is written and whose every part exists, ascending."""
        folder = self.dir / META
        if not folder.is_dir():
            return []
        steps = sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())
        return [s for s in steps if all((self.dir / part / str(s)).is_dir() for part in self.parts)]

    def read(self, step: int) -> dict:
        return json.loads(self.meta_path(step).read_text())

    def _check_config(self, meta: dict) -> None:
        saved = meta.get("config", {})
        for key in sorted(set(saved) | set(self.config)):
            if saved.get(key) != self.config.get(key):
                if key == "schedule_actions":
                    what = f"the schedule's actions differ (schedule {self.config['schedule']!r})"
                else:
                    what = f"{key}: checkpoint {saved.get(key)!r}, this run {self.config.get(key)!r}"
                raise InvalidOptionError(f"--resume: the checkpoint in {self.dir} at step {meta['step']} was "
                                         f"trained with other settings: {what}")

    # ---------------------------------------------------------------- while training
    def due(self, step: int) -> bool:
        """Whether ``step`` (1-based, counted over the whole run) is saved: every ``every``
        steps and the last."""
        return step % self.every == 0 or step == self.total

    def keep(self) -> list[int]:
        """The steps a writer must keep when it starts its next save: the last ``KEEP``
        complete ones and the one whose metadata waits for its parts."""
        kept = self.complete_steps()[-KEEP:]
        return kept + ([self.pending["step"]] if self.pending else [])

    def saving(self, step: int, data_state: dict, losses: list[float]) -> None:
        """``step``'s parts are being written: its metadata waits until they all are."""
        self.pending = {"format": FORMAT, "step": step, "config": self.config, "data": data_state,
                        "losses": [float(x) for x in losses]}

    def report(self, done: list) -> int | None:
        """Every writer's latest finished step (None: none yet); writes the pending step's
        metadata when all of them have it, then removes metadata beyond the last ``KEEP``.
        Returns the step just made complete, or None."""
        if self.pending is None or any(d is None or d < self.pending["step"] for d in done):
            return None
        meta, self.pending = self.pending, None
        path = self.meta_path(meta["step"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)  # atomic: a reader sees all of it or none
        for old in self.complete_steps()[:-KEEP]:
            self.meta_path(old).unlink()
        return meta["step"]

    def losses(self) -> list[float]:
        """The losses of the steps before ``start`` (a resumed run's first part of the curve)."""
        return list(self.restored["losses"]) if self.restored else []

    def data_state(self) -> dict | None:
        return self.restored["data"] if self.restored else None
