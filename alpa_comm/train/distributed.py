"""The distributed pipeline trainer (driver side).

    with PipelineCluster.emulated(4, 2, nic="400mbit") as cluster:
        pipe = DistributedPipeline(cluster, "utransformer", 4, schedule, microbatch_size=8,
                                   model_kwargs=dict(layers=8, d=128, seq=64), strategy="broadcast")
        for step in batches:
            result = pipe.step(step)        # one call per host per step

Stage ``s`` replica ``r`` runs on host ``s*dp + r``. The driver plans every edge
between stage meshes once (``edges.edge_plans``), ships each host its part of
the plans and its stage's actions, then only hands out data: the workers run
the schedule themselves, so a step costs one round-trip, not one per action.
A failing or killed host ends the step with ``CommunicationError`` naming it.

Schedules over virtual stages (``interleaved-1f1b``, ``zb-v``, ``dualpipev``) run as
in the in-process runner: the model is built with one model stage per chunk
(``S * C``), model stage ``v`` lives on stage ``schedule.place(v)[0]``, edges between
model stages on two meshes are planned (named by the model stages they join, so two
between the same meshes never meet), and edges inside one mesh are local hand-offs.
``stage_params`` then lists every model stage's parameters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .._extras import require
from ..errors import InvalidArgumentError, InvalidOptionError
from ..pipeline.edges import (Edge, check_transfers, edge_hosts, edge_plans, link_seconds, model_edges,
                              model_stage_meshes, split_edges, stage_hosts)
from ..pipeline.ir import Schedule, ScheduleError
from ..resharding.host_job import HostJob
from ..resharding.strategies import STRATEGIES
from ..runtime.cluster import Cluster
from ..runtime.worker import TRANSPORTS
from ..topology import ClusterSpec
from ..validation import positive_int
from .stage_setup import StageSetup
from .worker import PipelineWorker


class PipelineCluster(Cluster):
    """A ``Cluster`` whose host workers can run pipeline stages."""

    worker_class = PipelineWorker


@dataclass
class StepResult:
    loss: float
    seconds: float
    per_host: list[dict] = field(default_factory=list)  # each worker's record (events, transfers, memory)


def abstract_model(name: str, num_stages: int, model_kwargs: dict):
    """The model's stage functions and its parameters' shapes, without allocating the
    parameters (the driver only plans; each worker builds its own stage's weights)."""
    jax = require("jax")  # optional: a missing jax names its extra

    from ..models import build_model  # noqa: PLC0415

    built = {}

    def build():
        built["model"] = build_model(name, num_stages, **model_kwargs)
        return built["model"].params

    param_shapes = jax.eval_shape(build)
    model = built["model"]
    model.params = param_shapes  # shapes only: the traced values must not escape
    return model


def activation_shapes(model, microbatch_size: int, seq: int) -> tuple[dict[tuple[int, str], tuple], str]:
    """Shape of every stage output for one microbatch, keyed (stage, name), by abstract evaluation
    (``model.params`` may be arrays or shapes)."""
    jax, jnp = require("jax"), require("jax.numpy")  # optional: a missing jax names its extra

    batch = {k: jax.ShapeDtypeStruct((microbatch_size, seq), jnp.int32) for k in ("tokens", "targets")}
    outs: dict[int, dict] = {}
    for i, fn in enumerate(model.stages):
        inputs = {k: outs[src][k] for k, src in model.consumes[i].items()}
        outs[i] = jax.eval_shape(fn, model.params[i], inputs, batch)
    shapes = {(i, k): tuple(v.shape) for i, o in outs.items() for k, v in o.items() if k != "loss"}
    dtypes = {str(v.dtype) for o in outs.values() for k, v in o.items() if k != "loss"}
    if len(dtypes) != 1:
        raise InvalidArgumentError(f"stage outputs mix dtypes {sorted(dtypes)}")
    return shapes, dtypes.pop()


@dataclass
class PipelinePlan:
    """What a pipeline plans before any host runs: model stage -> mesh, the abstract
    model, tokens per row, activation shapes and dtype, the edges between meshes, their
    plans (one microbatch each), how many microbatches a step moves and the cluster spec
    the plans were made for."""

    mesh_of: list[int]
    model: object
    seq: int
    shapes: dict
    dtype: str
    edges: list[Edge]
    plans: dict
    num_microbatches: int
    cluster: ClusterSpec

    def link_seconds(self) -> float:
        """Per step, the least time the busiest NIC needs for these plans' transfers
        (``edges.link_seconds``; the data-parallel gradient mean not counted)."""
        return link_seconds([p for plans in self.plans.values() for p in plans], self.cluster,
                            self.num_microbatches)


def plan_pipeline(model: str, model_kwargs: dict, schedule: Schedule, microbatch_size: int, dp: int,
                  cluster: ClusterSpec, strategy: str, loadbalance: str = "auto") -> PipelinePlan:
    """Plan a pipeline without a cluster (only its spec): what ``DistributedPipeline``
    sets its hosts up with, and what a benchmark needs to bound a configuration offline."""
    mesh_of = model_stage_meshes(schedule)  # one model stage per chunk of every stage
    abstract = abstract_model(model, len(mesh_of), model_kwargs)
    seq = model_kwargs.get("seq", 16)
    shapes, dtype = activation_shapes(abstract, microbatch_size, seq)
    # edges inside one mesh are local hand-offs: only those between meshes are planned
    edges: list[Edge] = split_edges(model_edges(abstract.consumes), mesh_of)[0]
    if schedule.virtual:  # a missing skip named now, not as a stage without its inputs mid-step
        check_transfers(schedule, edges)
    plans = edge_plans(edges, shapes, dtype, dp, cluster.devices_per_host, cluster, strategy, loadbalance,
                       mesh_of=mesh_of)
    return PipelinePlan(mesh_of, abstract, seq, shapes, dtype, edges, plans, schedule.num_microbatches, cluster)


class DistributedPipeline:
    def __init__(self, cluster: Cluster, model: str, num_stages: int, schedule: Schedule, *, microbatch_size: int,
                 model_kwargs: dict | None = None, dp: int = 1, strategy: str = "broadcast",
                 loadbalance: str = "auto", optimizer: str = "sgd", lr: float = 0.1, transport: str = "gloo"):
        """``transport``: what the mailboxes move transfers over (``runtime.worker.TRANSPORTS``:
        gloo, or alpa_comm's own TCP streams); the cluster joins it on first use."""
        if strategy not in STRATEGIES:
            raise InvalidOptionError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        positive_int(dp, "dp")
        need = num_stages * dp
        if cluster.spec.num_hosts < need:
            raise InvalidOptionError(f"{num_stages} stages x {dp} data-parallel hosts need {need} hosts; the "
                                     f"cluster has {cluster.spec.num_hosts}")
        if schedule.num_stages != num_stages and schedule.virtual:
            raise ScheduleError(f"the schedule has {schedule.num_stages} stages x {schedule.num_chunks} chunks, the "
                                f"pipeline {num_stages} stages: num_stages counts stages (meshes), the model gets one "
                                f"model stage per chunk ({schedule.num_virtual_stages})")
        if schedule.num_stages != num_stages:
            raise ScheduleError(f"the schedule has {schedule.num_stages} stages, the model {num_stages}")
        k = cluster.spec.devices_per_host
        if microbatch_size % (dp * k):
            raise InvalidOptionError(f"microbatch size {microbatch_size} must divide over {dp} hosts x {k} devices")
        if transport not in TRANSPORTS:
            raise InvalidOptionError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        self.cluster, self.schedule, self.dp, self.strategy = cluster, schedule, dp, strategy
        self.transport = transport
        self.num_stages, self.microbatch_size = num_stages, microbatch_size
        self.model_kwargs = dict(model_kwargs or {})
        # one model stage per chunk of every stage; model stage v runs on mesh_of[v]
        self.pipeline_plan = planned = plan_pipeline(model, self.model_kwargs, schedule, microbatch_size, dp,
                                                     cluster.spec, strategy, loadbalance)
        self.mesh_of, self.model, self.shapes, self.dtype = planned.mesh_of, planned.model, planned.shapes, planned.dtype
        self.edges, self.plans = planned.edges, planned.plans
        cluster.join_transport(transport)  # after planning: a bad request connects nothing
        edge_index = {e.name: i for i, e in enumerate(self.edges)}
        edge_keys = {e.name: list(e.keys) for e in self.edges}
        self.hosts = list(range(need))
        refs = []
        for s in range(num_stages):
            for r, h in enumerate(stage_hosts(s, dp)):
                jobs = {e.name: [HostJob.for_host(p, h) for p in self.plans[e]] for e in self.edges
                        if h in edge_hosts(e, dp, self.mesh_of)}
                cfg = StageSetup(
                    stage=s, replica=r, dp=dp, num_stages=num_stages, model=model, model_kwargs=self.model_kwargs,
                    schedule=schedule, jobs=jobs, edge_index=edge_index, edge_keys=edge_keys,
                    timeout=cluster.timeout, strategy=strategy, optimizer=optimizer, lr=lr,
                    input_shapes=self._input_shapes(s), batch_shape=(microbatch_size // dp, planned.seq),
                    transport=transport)
                refs.append((cluster.workers[h].setup_stage.remote(cfg), h))
        # set-up compiles the stage's programs (minutes on a slow host the first time)
        self.setup = cluster._wait(refs, "setting up its pipeline stage (compiling)",
                                   timeout=max(600.0, cluster.timeout))

    def _input_shapes(self, stage: int) -> dict[int, dict[str, tuple]]:
        """Per model stage on ``stage``'s mesh, its inputs' shapes on one replica (the
        replica's share of the microbatch's rows)."""
        rows = self.microbatch_size // self.dp
        return {v: {key: (rows,) + tuple(self.shapes[(src, key)][1:]) for key, src in self.model.consumes[v].items()}
                for v, mesh in enumerate(self.mesh_of) if mesh == stage}

    @property
    def loss_stage(self) -> int:
        """The stage whose mesh runs the last model stage (and so reports the losses): the
        last stage, or with a V the first."""
        return self.mesh_of[-1]

    # ---------------------------------------------------------------- steps
    def _rows(self, r: int) -> slice:
        n = self.microbatch_size // self.dp
        return slice(r * n, (r + 1) * n)

    def step(self, microbatches: list[dict]) -> StepResult:
        """One training step over ``microbatches`` (dicts of NumPy ``tokens``/``targets``)."""
        self.cluster._check_usable()
        if len(microbatches) != self.schedule.num_microbatches:
            raise InvalidOptionError(f"the schedule has {self.schedule.num_microbatches} microbatches, "
                                     f"{len(microbatches)} were given")
        refs = []
        for s in range(self.num_stages):
            for r, h in enumerate(stage_hosts(s, self.dp)):
                part = [{k: np.asarray(v)[self._rows(r)] for k, v in mb.items()} for mb in microbatches]
                refs.append((self.cluster.workers[h].train_step.remote(part), h))
        t0 = time.time()
        results = self.cluster._wait(refs, "running a training step", timeout=2 * self.cluster.timeout + 30)
        seconds = time.time() - t0
        last = [res for res in results if res["stage"] == self.loss_stage]
        losses = [v for res in last for v in res["losses"].values()]
        return StepResult(float(np.mean(losses)), seconds, results)

    def stage_params(self) -> list:
        """Every model stage's parameters (replica 0), as NumPy trees, by model stage: one
        per stage without virtual stages, one per chunk of every stage with them."""
        refs = [(self.cluster.workers[stage_hosts(s, self.dp)[0]].stage_params.remote(), s)
                for s in range(self.num_stages)]
        by_stage = {v: p for per_mesh in self.cluster._wait(refs, "fetching parameters") for v, p in per_mesh.items()}
        return [by_stage[v] for v in range(len(self.mesh_of))]

    # ---------------------------------------------------------------- checkpoints (``checkpoint``)
    def _writers(self) -> list[int]:
        """The hosts that write checkpoints: each stage's replica 0 (every replica holds the same state)."""
        return [stage_hosts(s, self.dp)[0] for s in range(self.num_stages)]

    def start_checkpoints(self, directory, step: int | None) -> None:
        """Every host restores its stage's state from ``directory`` at ``step`` (None: a fresh
        run, nothing to restore); the writers open their part for saving."""
        refs = [(self.cluster.workers[h].checkpoint_open.remote(str(directory), step, h in self._writers()), h)
                for h in self.hosts]
        self.cluster._wait(refs, "restoring its checkpoint" if step is not None else "opening its checkpoints")

    def save_checkpoint(self, step: int, keep: list[int]) -> list:
        """The writers start saving ``step`` (each waits for its previous save first, keeping the
        steps in ``keep``); returns each writer's latest finished step."""
        refs = [(self.cluster.workers[h].checkpoint_save.remote(step, keep), h) for h in self._writers()]
        return self.cluster._wait(refs, f"saving checkpoint step {step}")

    @staticmethod
    def checkpoints_done(per_host: list[dict]) -> list:
        """Each writer's latest finished save, as its last training step reported it."""
        return [r["checkpoint_done"] for r in per_host if r.get("checkpoint_writer")]

    def wait_checkpoints(self) -> list:
        refs = [(self.cluster.workers[h].checkpoint_wait.remote(), h) for h in self._writers()]
        return self.cluster._wait(refs, "finishing its checkpoint")

    def prune_checkpoints(self, keep: list[int]) -> None:
        refs = [(self.cluster.workers[h].checkpoint_prune.remote(keep), h) for h in self._writers()]
        self.cluster._wait(refs, "removing old checkpoints")

    def regime(self) -> list[dict]:
        """Per stage (replica 0): its forward's flop count and its host's matmul rate
        (``PipelineWorker.regime``), one stage after another so the hosts' timings do
        not compete for the machine's cores."""
        out = []
        for s in range(self.num_stages):
            h = stage_hosts(s, self.dp)[0]
            out += self.cluster._wait([(self.cluster.workers[h].regime.remote(), h)], "measuring its regime")
        return out

    def link_seconds(self) -> float:
        """Per step, the least time the busiest NIC of the cluster needs for this pipeline's
        transfers (bytes over rate): with the compute-only time, the physical bound."""
        return self.pipeline_plan.link_seconds()

    def time_edges(self, repeats: int = 3) -> dict[str, float]:
        """Each planned edge's transfer alone (median of ``repeats``), in seconds, by edge
        name (model stages; ``measure.costs_from`` maps them to meshes with ``mesh_of``)."""
        return {name: got["seconds"] for name, got in self.edge_costs(repeats).items()}

    def edge_costs(self, repeats: int = 3) -> dict[str, dict]:
        """Each planned edge run alone ``repeats`` times, by edge name: ``seconds`` (first
        byte posted to last byte in, over its hosts; median), ``cpu_seconds`` (its hosts'
        CPU meanwhile, summed; median), ``cpu_by_thread`` (the same by thread name,
        ``runtime.thread_cpu``; each name's median) and ``bytes`` (through NICs, sent,
        per run)."""
        out = {}
        for e in self.edges:
            # every host takes the barrier; one outside this pipeline (a smaller pipeline on a
            # cluster an earlier, larger one set up) must not run its stale plan of the same name
            refs = [(w.time_edge.remote(e.name if h in self.hosts else None, repeats, self.cluster.timeout), h)
                    for h, w in enumerate(self.cluster.workers)]
            runs = [r for r in self.cluster._wait(refs, f"timing edge {e.name}") if r]
            per_rep = [max(run[i][1] for run in runs) - min(run[i][0] for run in runs) for i in range(repeats)]
            cpu = [sum(run[i][2] for run in runs) for i in range(repeats)]
            names = {n for run in runs for rep in run for n in rep[3]}
            by_thread = {n: float(np.median([sum(run[i][3].get(n, 0.0) for run in runs) for i in range(repeats)]))
                         for n in sorted(names)}
            sent = sum(n for p in self.plans[e] for n in p.network_bytes()[0].values())
            out[e.name] = {"seconds": float(np.median(per_rep)), "cpu_seconds": float(np.median(cpu)),
                           "cpu_by_thread": by_thread, "bytes": sent}
        return out
