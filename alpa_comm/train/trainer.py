"""``alpa-comm train``: a model, a schedule, a strategy and a cluster, trained for
N steps with progress, a loss curve and a Chrome trace of the real execution.

``cluster="inprocess"`` runs every stage in this process (``local_pipeline``);
``local``, ``emulated`` and ``ray://ADDR`` run one stage replica per host worker
(``distributed``). Both apply the same optax optimizer, so a run's losses do not
depend on where it ran.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._extras import require
from ..errors import InvalidArgumentError, InvalidOptionError
from ..pipeline import Costs, chunks_for, generate, schedule_kind, validate
from ..pipeline.edges import with_skips
from ..pipeline.ir import Schedule
from ..pipeline.weight_delay import auto_backward
from ..validation import positive_int
from .data import DataStream, batches, stdlib_corpus, synthetic

# Relative costs for --delay-wgrad auto before anything is measured: backward twice
# the forward, a transfer half of it (the regime where delaying pays; see docs/schedules.md).
DEFAULT_COSTS = Costs(1.0, 2.0, 0.5)
AUTO = "auto"
TRAINER_MODULES = ("jax", "optax")
"""What the trainer itself imports beyond the base install (the runtime requires its own,
ray and torch, where it uses them); ``train`` requires both before any work starts."""
CALIBRATION = ("eager-1f1b", 3)
"""``--schedule auto`` first runs this family twice, with its backward split (BI and BW
timed apart) and whole (B timed as the one-chunk whole-backward families run it: an
action's time depends on how busy the run keeps its host), each for this many timed
steps after one warm-up, on the cluster and strategy of the run."""
VIRTUAL_CALIBRATION = (("interleaved-1f1b", False, 2), ("zb-v", True, None))
"""Where the virtual-stage schedules are candidates, ``calibrate`` also runs these
(family, backward split, chunks): the model cut into two stages per stage, loop-placed
with its backward whole and V-placed with it split. A chunk's action is not half a
stage's: each action has a fixed cost (dispatch, hand-offs, its transfers' CPU), so
halving a one-chunk measurement predicts a two-chunk schedule too fast."""


@dataclass
class Calibration:
    """What ``calibrate`` measured: simulator costs, a predictor of any schedule's
    iteration time over the measured durations and edge times, and the share of a
    microbatch's activation state the weight half keeps after ``BI`` (the largest stage's)."""

    costs: Costs
    predict: object
    wgrad_fraction: float = 0.5
    runs: list = field(default_factory=list)  # calibrate's runs (``on_run``'s dicts): the trial reuses their times


DEFAULT_LAYERS = 4
DEFAULT_MICROBATCHES = 4


@dataclass
class TrainConfig:
    model: str = "gpt"
    stages: int = 4
    layers: int | None = None  # None: DEFAULT_LAYERS, or one per model stage where the schedule runs more
    width: int = 64
    heads: int = 4
    seq: int = 32
    microbatches: int | None = None  # None: DEFAULT_MICROBATCHES, or the fewest the schedule runs if more
    microbatch_size: int = 4
    schedule: str = "eager-1f1b"  # any of pipeline.SCHEDULE_NAMES, or "auto": the fastest that fits ``memory_cap``
    model_chunks: int | None = None  # chunks per stage for a family whose chunks are the caller's (default 2)
    memory_cap: float | None = None  # --schedule auto: most live activations per stage (whole-stage microbatches)
    trial_margin: float | None = None  # --schedule auto: measure those predicted within this (None: TRIAL_MARGIN)
    split_backward: bool = False
    delay_wgrad: object = None  # None, "auto", an int or one per stage
    strategy: str = "broadcast"
    transport: str = "gloo"     # what host workers move transfers over (``runtime.worker.TRANSPORTS``)
    dp: int = 1
    cluster: str = "local"      # inprocess | local | emulated | ray://ADDR
    devices_per_host: int = 2
    nic: str = "400mbit"
    host_cpus: float | None = None  # emulated: CPU cores per host (None: uncapped)
    steps: int = 50
    optimizer: str = "adam"
    lr: float = 3e-3
    seed: int = 0
    data: str = "corpus"        # corpus | synthetic
    timeout: float = 60.0
    trace: str | None = None
    out: str | None = None
    checkpoint_dir: str | None = None  # save here (``checkpoint``); None: no checkpoints
    checkpoint_every: int | None = None  # steps between checkpoints (None: checkpoint.DEFAULT_EVERY)
    resume: bool = False  # go on from the latest complete checkpoint in checkpoint_dir, to ``steps`` in all

    def __post_init__(self):
        """Every value checked here, so an API user and the CLI get the same one-line error
        before any process starts (not NaN losses or a crash after training)."""
        import math  # noqa: PLC0415

        positive_int(self.stages, "--stages")
        self._check_schedule()
        self._fill_schedule_defaults()
        for name in ("stages", "layers", "width", "heads", "seq", "microbatches", "microbatch_size", "dp", "steps",
                     "devices_per_host"):
            positive_int(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.width % self.heads:
            raise InvalidOptionError(f"--width {self.width} is not divisible by --heads {self.heads}")
        if self.model == "utransformer" and self.layers < 2:
            raise InvalidOptionError(f"--layers must be >= 2 for the U-Transformer (L = layers/2), got {self.layers}")
        for name in ("lr", "timeout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidOptionError(f"--{name} must be a positive finite number, got {v!r}")
        if self.host_cpus is not None:
            from ..errors import AlpaCommError  # noqa: PLC0415
            from ..runtime.emulated.netns import check_cpu_cores  # noqa: PLC0415
            try:
                check_cpu_cores(self.host_cpus)
            except AlpaCommError as e:
                raise InvalidOptionError(f"--host-cpus: {e}") from None
        from ..pipeline.auto_schedule import check_memory_cap, check_trial_margin  # noqa: PLC0415

        check_memory_cap(self.memory_cap)
        for name in ("memory_cap", "trial_margin"):
            if getattr(self, name) is not None and self.schedule != AUTO:
                raise InvalidOptionError(f"--{name.replace('_', '-')} applies to --schedule auto, not "
                                         f"{self.schedule!r}")
        if self.trial_margin is not None:
            check_trial_margin(self.trial_margin)
        if self.trial_margin is not None and self.cluster == "inprocess":
            raise InvalidOptionError("--trial-margin needs host workers to measure on (--cluster local, emulated or "
                                     "ray://...): --cluster inprocess ranks by the simulator alone")
        if self.schedule == AUTO and (self.split_backward or self.delay_wgrad is not None):
            raise InvalidOptionError("--schedule auto chooses the split and the weight-gradient delay itself: "
                                     "leave out --split-backward and --delay-wgrad")
        from ..runtime.worker import TRANSPORTS  # noqa: PLC0415

        if self.transport not in TRANSPORTS:
            raise InvalidOptionError(f"--transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.transport != "gloo" and self.cluster == "inprocess":
            raise InvalidOptionError(f"--transport {self.transport} needs host workers (--cluster local, emulated or "
                                     "ray://...): --cluster inprocess moves no data between hosts")
        from .checkpoint import check_options  # noqa: PLC0415

        check_options(self)
        if self.trace and self.cluster == "inprocess":
            raise InvalidOptionError("--trace needs host workers (--cluster local, emulated or ray://...): "
                                     "--cluster inprocess runs every stage in this process and moves no data")

    def _check_schedule(self) -> None:
        """The schedule is ``auto`` or a registered family, and takes the options given."""
        from ..pipeline.compare import check_options  # noqa: PLC0415

        if self.schedule == AUTO:
            if self.model_chunks is not None:
                raise InvalidOptionError("--schedule auto chooses the chunks itself: leave out --model-chunks")
            return
        check_options(self.schedule, self.delay_wgrad, self.model_chunks)

    def _fill_schedule_defaults(self) -> None:
        """``layers`` and ``microbatches`` left as None take the defaults, raised to what
        the chosen schedule needs: a layer per model stage (a virtual schedule on S stages
        runs S x chunks of them) and the fewest microbatches the family runs (DualPipeV: 2S;
        interleaved 1F1B: a multiple of S), so
        ``--schedule NAME`` alone runs every family; values given are only checked. They
        are filled in at construction: ``dataclasses.replace(cfg, schedule=...)`` keeps
        them, so pass ``layers=None, microbatches=None`` with it to derive them again."""
        if self.layers is None:
            self.layers = max(DEFAULT_LAYERS, self.model_stages)
        if self.microbatches is None:
            self.microbatches = DEFAULT_MICROBATCHES
            family = None if self.schedule == AUTO else schedule_kind(self.schedule)
            while family is not None and not family.runs_at(self.stages, self.microbatches):
                self.microbatches += 1  # at most S more: the fewest it runs, then a multiple of S

    @property
    def chunks(self) -> int | None:
        """What ``generate`` gets as ``chunks`` for the chosen family (None: its own)."""
        return None if self.schedule == AUTO else chunks_for(self.schedule, self.model_chunks)

    @property
    def model_stages(self) -> int:
        """Model stages the chosen schedule runs: one per chunk of every stage (``auto``:
        one per stage; the distributed trainer cuts the model again for a virtual pick)."""
        if self.schedule == AUTO:
            return self.stages
        family = schedule_kind(self.schedule)
        return self.stages * (self.chunks if family.chunks is None else family.chunks)

    def model_kwargs(self) -> dict:
        return {"layers": self.layers, "d": self.width, "heads": self.heads, "seq": self.seq, "seed": self.seed}


@dataclass
class TrainResult:
    losses: list[float]
    step_seconds: list[float]
    schedule: Schedule
    samples_per_second: float
    steps: list = field(default_factory=list)  # per step: every host's record (distributed runs)
    start_step: int = 0  # a resumed run: the checkpoint's step (``losses`` holds every step, the seconds this run's)


def build_schedule(cfg: TrainConfig, model, costs: Costs = DEFAULT_COSTS, log=None, model_for=None) -> Schedule:
    """The schedule IR for the config, with the model's skip edges added, validated.
    ``--schedule auto`` is ranked with ``costs`` as given, uncalibrated (``train`` on a
    cluster calibrates first), its ranking printed to ``log``; with ``model_for`` (see
    ``choose_schedule``) among the virtual-stage schedules too.

    Any registered family runs (``pipeline.SCHEDULE_KINDS``); one over virtual stages
    takes the skips of the model cut into one stage per chunk: ``model``'s own where it
    is cut so (the in-process runner builds it so), else ``model_for``'s."""
    if cfg.schedule == AUTO:
        return choose_schedule(cfg, model, costs, log=log, model_for=model_for).schedule
    delay = cfg.delay_wgrad
    if delay == "auto":
        delay = auto_backward(cfg.schedule, cfg.stages, cfg.microbatches, costs)
    sched = generate(cfg.schedule, cfg.stages, cfg.microbatches, split_backward=cfg.split_backward or delay is not None,
                     delay_wgrad=delay, chunks=cfg.chunks)
    sched = with_skips(sched, _skips_of(cfg, sched, model, model_for))
    validate(sched)
    return sched


def _skips_of(cfg: TrainConfig, sched: Schedule, model, model_for=None):
    """The skip edges of the model cut into ``sched``'s model stages: ``model``'s where it
    is cut so, else ``model_for``'s; a model that cannot be cut so is named."""
    n = sched.num_virtual_stages
    if model.num_stages == n:
        return model.skips
    skips = _skips_by_size(model, model_for)(n) if model_for is not None else None
    if skips is None:
        raise InvalidOptionError(f"--schedule {cfg.schedule} runs {cfg.stages} stages x {sched.num_chunks} chunks = "
                                 f"{n} model stages: the model ({cfg.layers} layers) cannot be cut into {n}")
    return skips


def build_model_for(cfg: TrainConfig):
    """``cfg``'s model with parameters, cut into ``cfg.model_stages`` (one per chunk of
    every stage), or an error naming the schedule's chunks where it cannot be."""
    from ..models import build_model  # noqa: PLC0415

    try:
        return build_model(cfg.model, cfg.model_stages, **cfg.model_kwargs())
    except InvalidOptionError as e:
        if cfg.model_stages == cfg.stages:
            raise
        chunks = cfg.model_stages // cfg.stages
        raise InvalidOptionError(f"--schedule {cfg.schedule} runs {cfg.stages} stages x {chunks} chunks = "
                                 f"{cfg.model_stages} model stages: {e}") from None


def choose_schedule(cfg: TrainConfig, model, costs: Costs, predict=None, log=None, wgrad_fraction: float = 0.5,
                    model_for=None):
    """``--schedule auto``: every family the trainer runs, ranked (``rank_schedules``);
    prints the ranking to ``log`` (a stream; None: silent) and returns the pick
    (``auto_schedule.Ranked``), or raises naming the least peak when nothing fits
    ``cfg.memory_cap``."""
    return pick_schedule(rank_schedules(cfg, model, costs, predict, wgrad_fraction, model_for), log)


def pick_schedule(ranked: list, log=None, measured: dict | None = None):
    """The pick of ``rank_schedules``' list, the ranking printed to ``log`` first (a stream;
    None: silent), so a cap nothing fits shows every peak: the first ranked
    (``auto_schedule.choose``), or with ``measured`` (a trial's label -> (seconds, where))
    the fastest measured (``auto_schedule.choose_measured``)."""
    from ..pipeline import auto_schedule  # noqa: PLC0415
    from ..report.tables import table  # noqa: PLC0415

    headers = auto_schedule.HEADERS
    try:
        pick = auto_schedule.choose_measured(ranked, {k: v[0] for k, v in (measured or {}).items()})
    except InvalidOptionError:  # nothing fits the cap: raised again after the table shows every peak
        pick = None
    if measured:
        headers = auto_schedule.HEADERS[:-1] + auto_schedule.MEASURED_HEADERS + auto_schedule.HEADERS[-1:]
    if log:
        print("--schedule auto (predicted iteration time, peak live activations of the fullest stage in "
              "microbatches" + ("; finalists measured" if measured else "") + "):", file=log)
        print(table(headers, auto_schedule.table_rows(ranked, measured, pick)), file=log)
    if pick is None:
        pick = auto_schedule.choose(ranked)  # raises, naming the least peak
    if log:
        print(f"picked {pick.candidate.label}", file=log, flush=True)
    return pick


TRIAL_STEPS = 2
"""Timed steps (after one warm-up) a finalist gets in each trial round of ``trial_finalists``
(none in the first round where a calibration run already ran its schedule); its measured
time is the median over all its steps, calibration's included."""


def trial_finalists(cfg: TrainConfig, cluster, ranked: list, data, runs=(), margin: float | None = None,
                    log=None) -> dict[str, tuple[float, str]]:
    """``--schedule auto``'s last step: measure the finalists (``auto_schedule.finalists``:
    predicted within ``margin`` of the fastest, default ``TRIAL_MARGIN``) on ``cluster``.
    A finalist whose schedule a calibration run (``runs``, as ``calibrate`` keeps them)
    already ran starts with that run's step times; every other one runs one warm-up and
    ``TRIAL_STEPS`` timed steps. Then, round after round (at most
    ``auto_schedule.TRIAL_ROUNDS`` in all), the finalists whose steps cannot yet be told
    from the fastest's (``auto_schedule.contenders``) run again, one after another, so a
    drift of the machine lands on each of them. Returns candidate label -> (median of all
    its steps, where: "calibration", "trial", "calibration + trial x2", ...), for
    ``pick_schedule``. Why measure at all: the predictor draws each action's time from
    other schedules' runs, and how busy a schedule keeps a host changes its actions' times
    (``auto_schedule.TRIAL_MARGIN`` says by how much)."""
    from statistics import median  # noqa: PLC0415

    from ..pipeline import auto_schedule  # noqa: PLC0415
    from .distributed import DistributedPipeline  # noqa: PLC0415

    ran = {r["schedule"]: [float(x) for x in r["seconds"]] for r in runs if r.get("schedule") and r.get("seconds")}
    final = auto_schedule.finalists(ranked, auto_schedule.TRIAL_MARGIN if margin is None else margin)
    by_label = {r.candidate.label: r for r in final}
    steps: dict[str, list[float]] = {}
    calibrated: set[str] = set()
    trials: dict[str, int] = {}
    for r in final:
        if r.schedule.to_text() in ran:
            steps[r.candidate.label] = list(ran[r.schedule.to_text()])
            calibrated.add(r.candidate.label)

    def measure(label: str, what: str) -> None:
        r = by_label[label]
        if log:
            print(f"--schedule auto: {what}: {label} (predicted {r.predicted_s:.4g} s, 1 + {TRIAL_STEPS} steps)",
                  file=log, flush=True)
        pipe = DistributedPipeline(cluster, cfg.model, cfg.stages, r.schedule, microbatch_size=cfg.microbatch_size,
                                   model_kwargs=cfg.model_kwargs(), dp=cfg.dp, strategy=cfg.strategy,
                                   optimizer=cfg.optimizer, lr=cfg.lr, transport=cfg.transport)
        pipe.step(next(data))
        steps.setdefault(label, []).extend(pipe.step(next(data)).seconds for _ in range(TRIAL_STEPS))
        trials[label] = trials.get(label, 0) + 1

    to_run = [r.candidate.label for r in final if r.candidate.label not in steps]
    for k, label in enumerate(to_run):
        measure(label, f"trial {k + 1}/{len(to_run)} ({len(final) - len(to_run)} of {len(final)} finalists timed "
                       "in calibration already)")
    for n in range(2, auto_schedule.TRIAL_ROUNDS + 1):
        close = auto_schedule.contenders(steps)
        if len(close) < 2:
            break
        close = [r.candidate.label for r in final if r.candidate.label in close]  # in ranked order
        for label in close:
            measure(label, f"round {n}/{auto_schedule.TRIAL_ROUNDS}, {len(close)} finalists within the noise")

    def where(label: str) -> str:
        parts = (["calibration"] if label in calibrated else []) + (
            [f"trial x{trials[label]}" if trials[label] > 1 else "trial"] if label in trials else [])
        return " + ".join(parts)

    return {label: (float(median(v)), where(label)) for label, v in steps.items()}


def rank_schedules(cfg: TrainConfig, model, costs: Costs, predict=None, wgrad_fraction: float = 0.5,
                   model_for=None) -> list:
    """Every family the trainer runs, with the model's skip edges, validated, predicted
    (``predict(schedule)``, default: the simulator with ``costs``) and ranked
    (``auto_schedule.rank``).

    ``model_for(num_model_stages)``: the model cut into that many stages (its skips only
    are read), for a runner that holds several model chunks per stage (the distributed
    trainer): the virtual-stage schedules are then candidates too, each with the skips
    of the model built with one stage per chunk, where that model can be built (enough
    layers for every chunk). Without it only the one-chunk families are."""
    from ..pipeline import auto_schedule, simulate_schedule  # noqa: PLC0415

    if predict is None:
        def predict(s):
            return simulate_schedule(s, costs, signal=cfg.strategy == "signal").iteration_time

    skips = _skips_by_size(model, model_for)

    def runnable(s):
        s = with_skips(s, skips(s.num_virtual_stages))
        validate(s)
        return s
    cands = auto_schedule.candidates(cfg.stages, cfg.microbatches, costs, virtual=model_for is not None)
    if model_for is not None:  # a virtual-stage candidate only where its model can be built
        cands = [c for c in cands if skips(_model_stages(c, cfg)) is not None]
    return auto_schedule.rank(cands, cfg.stages, cfg.microbatches, predict, runnable=runnable,
                              memory_cap=cfg.memory_cap, wgrad_fraction=wgrad_fraction)


def _model_stages(candidate, cfg: TrainConfig) -> int:
    """How many model stages ``candidate``'s schedule needs: one per chunk of every stage."""
    return candidate.generate(cfg.stages, cfg.microbatches).num_virtual_stages


def _skips_by_size(model, model_for):
    """``skips(num_model_stages)``: the skip edges of the model cut into that many stages
    (``model``'s own for its size), or None where ``model_for`` cannot build it (too few
    layers). Without ``model_for``: always ``model``'s own (one-chunk candidates only)."""
    if model_for is None:  # one-chunk candidates only: the model's own skips, whatever its size
        return lambda n: model.skips
    known = {model.num_stages: model.skips}

    def skips(n: int):
        if n not in known:
            try:
                known[n] = model_for(n).skips
            except ValueError:  # e.g. "4 layers cannot fill 8 stages"
                known[n] = None
        return known[n]
    return skips


def calibrate(cfg: TrainConfig, cluster, model, data, log=None, model_for=None, on_run=None) -> Calibration:
    """Run ``CALIBRATION`` on ``cluster`` (backward split, then whole) and return what
    ``--schedule auto`` ranks with: costs, a predictor over the measured durations and
    edge times, and the measured weight-gradient share of the activation state. With
    ``model_for`` (see ``choose_schedule``) and a model that can be cut into two stages
    per stage, also ``VIRTUAL_CALIBRATION``: a virtual-stage schedule is then predicted
    from the run with its own placement (loop or V), since an action's time depends on
    the transfers its host serves meanwhile (the loop run sends every skip over the
    network, a V keeps the U-Transformer's inside a mesh); a whole backward that run
    did not measure is drawn as its two halves (``B`` runs them back to back).

    ``on_run(run, pipe)``, if given, sees each calibration run as it ends: ``run`` holds
    ``kind``, ``split``, ``chunks``, ``placement``, ``model_stages``, ``schedule`` (its
    text), ``records`` (per timed step, the hosts' records), ``seconds`` (per timed
    step) and ``edge_s`` (edge times, empty where not timed); e.g. to save them
    (``calibration_from`` reads them back), or to read the pipeline's regime without a
    run of its own."""
    from .distributed import DistributedPipeline  # noqa: PLC0415

    kind, steps = CALIBRATION
    runs = [(kind, split, None) for split in (True, False)]
    skips = _skips_by_size(model, model_for)
    if model_for is not None and skips(2 * cfg.stages) is not None:
        runs += [r for r in VIRTUAL_CALIBRATION if schedule_kind(r[0]).runs_at(cfg.stages, cfg.microbatches)]
    done = []
    for kind, split, chunks in runs:
        sched = generate(kind, cfg.stages, cfg.microbatches, split_backward=split, chunks=chunks)
        sched = with_skips(sched, skips(sched.num_virtual_stages))
        if log:
            print(f"--schedule auto: calibrating ({kind}, backward {'split' if split else 'whole'}, {cfg.strategy}, "
                  f"1 + {steps} steps)", file=log, flush=True)
        pipe = DistributedPipeline(cluster, cfg.model, cfg.stages, sched, microbatch_size=cfg.microbatch_size,
                                   model_kwargs=cfg.model_kwargs(), dp=cfg.dp, strategy=cfg.strategy,
                                   optimizer=cfg.optimizer, lr=cfg.lr, transport=cfg.transport)
        pipe.step(next(data))
        got = [pipe.step(next(data)) for _ in range(steps)]
        times = pipe.time_edges(repeats=3) if sched.virtual or split else {}
        done.append({"kind": kind, "split": split, "chunks": chunks, "records": [g.per_host for g in got],
                     "seconds": [g.seconds for g in got], "schedule": sched.to_text(), "edge_s": times,
                     "placement": sched.placement, "model_stages": sched.num_virtual_stages})
        if on_run is not None:
            on_run(done[-1], pipe)
    return calibration_from(done, cfg)


def calibration_from(runs: list[dict], cfg: TrainConfig) -> Calibration:
    """``calibrate``'s result from its runs (as ``on_run`` sees them; e.g. saved by a
    benchmark and read back, to check the predictor offline): costs from the one-chunk
    runs, the weight share from the split one, and a predictor that takes each
    virtual-stage schedule's durations and edge times from the run with its placement
    over its model cut (other schedules: the one-chunk runs pooled)."""
    from .measure import costs_from, predict, stage_times  # noqa: PLC0415

    one_chunk = [r for r in runs if r["model_stages"] == cfg.stages]
    split = [r for r in one_chunk if r["split"]]
    if not split:
        raise InvalidArgumentError(f"no one-chunk calibration run with the backward split among {len(runs)} run(s) "
                                   f"over {sorted({r['model_stages'] for r in runs})} model stages; {cfg.stages} "
                                   f"stages need one (it gives BI, BW and the edge times)")
    records = [step for r in one_chunk for step in r["records"]]
    edge_s = split[0]["edge_s"]
    virtual = {r["placement"]: r for r in runs if r["model_stages"] != cfg.stages}
    costs = costs_from(stage_times(records, cfg.stages), edge_s, cfg.stages)
    kept = [rec["state_bytes"]["BI"] / rec["state_bytes"]["F"] for rec in split[0]["records"][0]
            if rec.get("state_bytes", {}).get("F") and "BI" in rec["state_bytes"]]
    signal = cfg.strategy == "signal"

    def predict_measured(s: Schedule) -> float:
        own = virtual.get(s.placement) if s.virtual else None
        if own is not None and own["model_stages"] == s.num_virtual_stages:
            return predict(s, own["records"], own["edge_s"], signal=signal)
        return predict(s, records, edge_s, signal=signal)
    return Calibration(costs, predict_measured, max(kept, default=0.5), list(runs))


def data_stream(cfg: TrainConfig, state: dict | None = None) -> DataStream:
    """The run's training steps, from the start or from ``state`` (a ``DataStream.state()``:
    a resumed run draws exactly the steps the uninterrupted run would have drawn next)."""
    rows = cfg.microbatch_size
    if cfg.data == "corpus":
        corpus = stdlib_corpus()
        return DataStream(lambda rng: batches(corpus, cfg.microbatches, rows, cfg.seq, rng=rng), cfg.seed, state)
    if cfg.data == "synthetic":
        return DataStream(lambda rng: synthetic(cfg.microbatches, rows, cfg.seq, rng=rng), cfg.seed, state)
    raise InvalidOptionError(f"unknown data {cfg.data!r}; choose corpus or synthetic")


def open_cluster(cfg: TrainConfig, log=sys.stderr):
    """The cluster ``cfg.cluster`` names, with one host per stage replica."""
    from .distributed import PipelineCluster  # noqa: PLC0415

    return PipelineCluster.open(cfg.cluster, cfg.stages * cfg.dp, cfg.devices_per_host, nic=cfg.nic,
                                timeout=cfg.timeout, cpu=cfg.host_cpus, log=log)


def train(cfg: TrainConfig, log=sys.stderr) -> TrainResult:
    """Train ``cfg``'s model with its schedule, in this process or on a cluster's hosts.

    Raises:
        MissingExtraError: jax or optax is absent (the extra ``jax`` in-process, ``train``
            on a cluster), before any work starts.
    """
    positive_int(cfg.steps, "--steps")
    for module in TRAINER_MODULES + (("orbax.checkpoint",) if cfg.checkpoint_dir else ()):
        require(module, extra="jax" if cfg.cluster == "inprocess" else "train")
    if cfg.cluster == "inprocess":
        return _train_inprocess(cfg, log)
    return _train_distributed(cfg, log)


def _train_inprocess(cfg: TrainConfig, log) -> TrainResult:
    jnp = require("jax.numpy")

    from .local_pipeline import run_schedule  # noqa: PLC0415
    from .worker import make_optimizer  # noqa: PLC0415

    if cfg.dp != 1:
        raise InvalidOptionError("--cluster inprocess runs one replica per stage; use --dp 1")
    model = build_model_for(cfg)  # one model stage per chunk of every stage
    # auto: one process runs the stages one after another, nothing to measure: default costs
    sched = build_schedule(cfg, model, log=log)
    opt, update = make_optimizer(cfg.optimizer, cfg.lr)
    state = opt.init(model.params)
    ck = writer = None
    if cfg.checkpoint_dir:
        from .checkpoint import INPROCESS, Checkpoints, PartWriter, restore_part  # noqa: PLC0415

        ck = Checkpoints(cfg, sched, [INPROCESS])
        if ck.restored:
            got = restore_part(ck.dir / INPROCESS, ck.start, {"params": model.params, "opt_state": state})
            model.params, state = got["params"], got["opt_state"]
        writer = PartWriter(ck.dir / INPROCESS)
    data = data_stream(cfg, ck.data_state() if ck else None)
    losses, seconds = (ck.losses() if ck else []), []
    start = ck.start if ck else 0
    with _bar(cfg, log, start) as bar:
        _resumed(ck, bar)
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            run = run_schedule(model, sched, [{k: jnp.asarray(v) for k, v in mb.items()} for mb in next(data)])
            model.params, state = update(model.params, state, run.grads)
            seconds.append(time.perf_counter() - t0)
            losses.append(run.loss)
            if ck:
                _saved(ck.report([writer.finished()]), bar)
                if ck.due(step):
                    _saved(ck.report([writer.save(step, {"params": model.params, "opt_state": state}, ck.keep())]),
                           bar)
                    ck.saving(step, data.state(), losses)
                    bar.note(f"checkpoint: writing step {step}")
            bar.step(_status(cfg, run.loss, seconds))
        if ck:
            _finish(ck, bar, lambda: [writer.wait()], lambda keep: writer.prune(keep))
            writer.close()
    return TrainResult(losses, seconds, sched, _rate(cfg, seconds), start_step=start)


def _resumed(ck, bar) -> None:
    if ck is not None and ck.restored:
        bar.note(f"resumed from {ck.dir} at step {ck.start} (of {ck.total})")


def _saved(step, bar) -> None:
    """Says that ``step`` (None: none) has just become a complete checkpoint."""
    if step is not None:
        bar.note(f"checkpoint: step {step} complete")


def _finish(ck, bar, wait, prune) -> None:
    """At the end: wait for the last save, write its metadata, keep the last ``KEEP``."""
    _saved(ck.report(wait()), bar)
    prune(ck.keep())


def _bar(cfg: TrainConfig, log, start: int = 0):
    """Progress over the training steps (silent when ``log`` is None), from ``start`` (resumed)."""
    from ..report.progress import Progress  # noqa: PLC0415

    return Progress(cfg.steps, "train", log, enabled=bool(log), initial=start)


def _status(cfg: TrainConfig, loss: float, seconds: list[float]) -> str:
    """The rate counts the steps after the first, as the summary does (the first compiles)."""
    if len(seconds) < 2:
        return f"loss {loss:.4f}  (first step, compiling: {seconds[-1]:.1f} s)"
    return f"loss {loss:.4f}  {_rate(cfg, seconds):.1f} samples/s"


def _rate(cfg: TrainConfig, seconds: list[float]) -> float:
    """Samples per second over the steps after the first (which compiles)."""
    timed = seconds[1:] or seconds
    return len(timed) * cfg.microbatches * cfg.microbatch_size / sum(timed)


def models_by_size(cfg: TrainConfig):
    """``model_for(num_model_stages)`` for ``choose_schedule``/``calibrate``: ``cfg``'s model
    cut into that many stages, abstract (shapes only), for the virtual-stage candidates."""
    from .distributed import abstract_model  # noqa: PLC0415

    return lambda num_model_stages: abstract_model(cfg.model, num_model_stages, cfg.model_kwargs())


def _train_distributed(cfg: TrainConfig, log) -> TrainResult:
    from .distributed import DistributedPipeline, abstract_model  # noqa: PLC0415
    from ..report.trace import write_chrome_trace  # noqa: PLC0415

    model = abstract_model(cfg.model, cfg.stages, cfg.model_kwargs())  # the schedule needs its edges only
    model_for = models_by_size(cfg)
    auto = cfg.schedule == AUTO
    # auto: a cap nothing fits fails here, before any host starts (peaks do not depend on costs)
    sched = build_schedule(cfg, model, model_for=model_for)
    losses, seconds, records = [], [], []
    # a resume that does not match its checkpoint is refused before any host starts (auto: after the pick)
    ck = _stage_checkpoints(cfg, sched) if cfg.checkpoint_dir and not auto else None
    with open_cluster(cfg, log) as cluster:
        if auto:  # measured on this cluster, then ranked; training starts afresh with the pick
            trial_data = data_stream(cfg)
            cal = calibrate(cfg, cluster, model, trial_data, log, model_for=model_for)
            ranked = rank_schedules(cfg, model, cal.costs, cal.predict, cal.wgrad_fraction, model_for)
            measured = trial_finalists(cfg, cluster, ranked, trial_data, cal.runs, cfg.trial_margin, log)
            sched = pick_schedule(ranked, log, measured).schedule
        if log:
            print(f"setting up {cfg.stages} stages x {cfg.dp} data-parallel hosts ({cfg.strategy}, {sched.name})",
                  file=log, flush=True)
        pipe = DistributedPipeline(cluster, cfg.model, cfg.stages, sched, microbatch_size=cfg.microbatch_size,
                                   model_kwargs=cfg.model_kwargs(), dp=cfg.dp, strategy=cfg.strategy,
                                   optimizer=cfg.optimizer, lr=cfg.lr, transport=cfg.transport)
        if cfg.checkpoint_dir:
            ck = ck or _stage_checkpoints(cfg, sched)
            pipe.start_checkpoints(ck.dir, ck.start if ck.restored else None)
        data = data_stream(cfg, ck.data_state() if ck else None)
        losses = ck.losses() if ck else []
        start = ck.start if ck else 0
        with _bar(cfg, log, start) as bar:
            _resumed(ck, bar)
            for step in range(start + 1, cfg.steps + 1):
                res = pipe.step(next(data))
                losses.append(res.loss)
                seconds.append(res.seconds)
                records.append(res.per_host)
                if ck:
                    _saved(ck.report(pipe.checkpoints_done(res.per_host)), bar)
                    if ck.due(step):
                        _saved(ck.report(pipe.save_checkpoint(step, ck.keep())), bar)
                        ck.saving(step, data.state(), losses)
                        bar.note(f"checkpoint: writing step {step}")
                bar.step(_status(cfg, res.loss, seconds))
            if ck:
                _finish(ck, bar, pipe.wait_checkpoints, pipe.prune_checkpoints)
    if cfg.trace:
        # the last steps (after compilation), so the trace shows the steady state
        write_chrome_trace(records[-min(3, len(records)):], cfg.trace)
        if log:
            print(f"wrote {cfg.trace} (open in chrome://tracing or ui.perfetto.dev)", file=log)
    return TrainResult(losses, seconds, sched, _rate(cfg, seconds), records, start_step=start)


def _stage_checkpoints(cfg: TrainConfig, sched: Schedule):
    """The driver's side of the checkpoints of a run on host workers: one part per stage mesh."""
    from .checkpoint import Checkpoints, stage_part  # noqa: PLC0415

    return Checkpoints(cfg, sched, [stage_part(s) for s in range(cfg.stages)])


def write_loss(result: TrainResult, cfg: TrainConfig, out: str | Path) -> list[Path]:
    """loss.json and loss.png (the curve over the steps)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": cfg.model, "stages": cfg.stages, "dp": cfg.dp, "schedule": result.schedule.name,
            "strategy": cfg.strategy, "transport": cfg.transport, "cluster": cfg.cluster, "optimizer": cfg.optimizer,
            "lr": cfg.lr,
            "samples_per_second": result.samples_per_second, "loss": result.losses}
    (out / "loss.json").write_text(json.dumps(meta, indent=1))
    from ..report.charts import loss_png  # noqa: PLC0415

    loss_png(result.losses, out / "loss.png", f"{cfg.model}, {cfg.stages} stages x dp {cfg.dp}, "
                                              f"{result.schedule.name}, {cfg.strategy}, {cfg.cluster}")
    return [out / "loss.json", out / "loss.png"]
