"""Enable alpa_comm inside Alpa 0.2.3 through an ``alpa.init`` option.

    from alpa_comm.integrations.alpa import install
    install()                                   # once, before alpa.init
    alpa.init(cluster="ray", comm_optimization="alpa_comm_eager")

``comm_optimization`` values:

* ``"off"`` (default): Alpa unchanged.
* ``"alpa_comm"``: cross-mesh resharding planned by alpa_comm — unit tasks
  load-balanced and ordered at host level (DFS when small, randomized greedy
  otherwise) and handed to Alpa as its own ``ReshardingStrategy`` in
  broadcast mode (``global_config.resharding_mode = "broadcast"``).
  All tensors of one stage boundary are planned together (one load state).
  Alpa's stage-profiling cost model gets its strategies from the same planner.
* ``"alpa_comm_eager"``: the above, plus ``PipeshardParallel(pipeline_schedule=
  "eager_1f1b")``, dispatched through Alpa 0.2.3's own if/elif over schedule names
  (``eager_dispatch``). Its clock table is the eager-1F1B order (Alpa's own
  ``1f1b_overlap_friendly`` order, which 0.2.3's emitter cannot run across meshes),
  with backward weight delaying: each backward stage Alpa builds is split into its
  input- and weight-gradient computations (``alpa_weight_delay``) and the weight part
  runs one step later, so the input gradient's cross-mesh send leaves first.

Worker processes: Alpa's ``MeshHostWorker`` actors run in other processes, so
patches made in the driver do not reach them. ``install`` swaps the class Alpa
instantiates for ``alpa_worker.AlpaCommMeshHostWorker``, a subclass that Ray
pickles by reference: every actor process imports ``alpa_comm.integrations.
alpa_worker`` to build it, and that import applies the worker-side patches
there. This module never runs on import and is never imported by the rest of
alpa_comm; the translation it relies on (``alpa_translate``) needs no Alpa.

The adapter is tested on Alpa 0.2.3's own code (``tests/test_alpa_harness.py``: the
wheel's modules run with stand-ins for jaxlib, XLA and Ray); what needs GPUs and
NCCL is listed in docs/alpa.md.
"""
from __future__ import annotations

import functools
import importlib
import sys

from ..errors import AlpaCommError, InvalidOptionError
from .alpa_translate import inputs_from_task_spec, plan_to_strategy, schedule_to_clocks
from .alpa_planning import PLANNING_NIC_GBPS
from .alpa_weight_delay import split_backward_stages

SUPPORTED_ALPA_VERSION = "0.2.3"
OPTION = "comm_optimization"
VALUES = ("off", "alpa_comm", "alpa_comm_eager")
EAGER_SCHEDULE_NAME = "eager_1f1b"


class AlpaIntegrationError(AlpaCommError, RuntimeError):
    """Alpa is missing, of another version, or not in the shape this adapter expects."""


_state: dict = {"installed": False, "originals": {}, "mode": "off"}


def _import_alpa():
    try:
        alpa = importlib.import_module("alpa")
    except ImportError as e:
        raise AlpaIntegrationError(
            f"Alpa is not installed ({e}); alpa_comm's adapter needs alpa=={SUPPORTED_ALPA_VERSION}. "
            "Without Alpa, use alpa_comm directly (alpa_comm.Cluster, alpa-comm bench).") from e
    version = getattr(alpa, "__version__", None)
    if version != SUPPORTED_ALPA_VERSION:
        raise AlpaIntegrationError(f"alpa_comm's adapter supports Alpa {SUPPORTED_ALPA_VERSION}, found Alpa "
                                   f"{version!r}")
    return alpa


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise AlpaIntegrationError(f"Alpa {SUPPORTED_ALPA_VERSION} should have module {name}: {e}") from e


def install() -> None:
    """Add the ``comm_optimization`` option to ``alpa.init``. Idempotent."""
    alpa = _import_alpa()
    if _state["installed"]:
        return
    original_init = alpa.init

    @functools.wraps(original_init)
    def init(*args, comm_optimization: str = "off", **kwargs):
        configure(comm_optimization)  # validated before Alpa starts anything
        return original_init(*args, **kwargs)

    _state["originals"]["init"] = original_init
    alpa.init = init
    api = getattr(alpa, "api", None)
    if api is not None and getattr(api, "init", None) is original_init:
        api.init = init
    _state["installed"] = True


def uninstall() -> None:
    """Undo ``install`` and ``configure`` (restores every patched attribute)."""
    if not _state["installed"]:
        return
    alpa = importlib.import_module("alpa")
    configure("off")
    alpa.init = _state["originals"].pop("init")
    api = getattr(alpa, "api", None)
    if api is not None:
        api.init = alpa.init
    _state["installed"] = False


def configure(value: str) -> None:
    """Switch the integration to ``value`` (one of ``VALUES``)."""
    if value not in VALUES:
        raise InvalidOptionError(f"unknown {OPTION} value {value!r}; choose one of {', '.join(VALUES)}")
    alpa = _import_alpa()
    _restore()
    _state["mode"] = value
    if value == "off":
        return
    try:
        _apply(alpa, value)
    except BaseException:
        _restore()  # all or nothing: a failure part-way leaves Alpa exactly as it was
        _state["mode"] = "off"
        raise


def _apply(alpa, value: str) -> None:
    """Every patch ``value`` needs (``configure`` undoes them all if one fails)."""
    config = alpa.global_config
    _patch(config, "resharding_mode", "broadcast")
    cmr = _module("alpa.pipeline_parallel.cross_mesh_resharding")
    communicator = cmr.CrossMeshCommunicator

    def broadcast_strategy(self, spec, src_mesh, dst_mesh):
        return _boundary_strategy(cmr, self, spec, "broadcast")

    def send_recv_strategy(self, spec, src_mesh, dst_mesh):
        return _boundary_strategy(cmr, self, spec, "sendrecv")

    _patch(communicator, "_generate_broadcast_resharding_strategy", broadcast_strategy)
    _patch(communicator, "_generate_send_recv_resharding_strategy", send_recv_strategy)
    # Alpa's stage-profiling cost model plans each boundary tensor with these two
    profiling = _module("alpa.pipeline_parallel.stage_profiling")
    _patch(profiling, "dummy_resharding_broadcast_strategy", lambda spec: _strategy(cmr, spec, "broadcast"))
    _patch(profiling, "dummy_resharding_send_recv_strategy", lambda spec: _strategy(cmr, spec, "sendrecv"))
    worker = importlib.import_module("alpa_comm.integrations.alpa_worker")
    worker.worker_patches()  # in this process too, undone by _restore
    device_mesh = _module("alpa.device_mesh")
    _patch(device_mesh, "MeshHostWorker", worker.subclass(device_mesh.MeshHostWorker))
    if value == "alpa_comm_eager":
        compile_executable = _module("alpa.pipeline_parallel.compile_executable")
        schedules = _module("alpa.pipeline_parallel.schedules")
        _patch(compile_executable, "compile_pipeshard_executable_internal",
               eager_dispatch(compile_executable, schedules.PipeDreamFlush))


# ------------------------------------------------------------- strategies
def _strategy(cmr, spec, mode: str):
    """Alpa's ``ReshardingStrategy`` for one ``ReshardingTaskSpec``, planned alone."""
    from ..resharding import plan_resharding  # noqa: PLC0415

    inputs = inputs_from_task_spec(spec)
    plan = plan_resharding(inputs.shape, inputs.dtype, inputs.src_mesh, inputs.src_spec, inputs.dst_mesh,
                           inputs.dst_spec, cluster=inputs.cluster(PLANNING_NIC_GBPS),
                           strategy=_OUR_STRATEGY[mode], loadbalance="auto",
                           bucket_bytes=None)  # Alpa's strategy names one tile per message
    return _as_alpa(cmr, spec, plan.transfers, inputs.strings, mode)


_OUR_STRATEGY = {"broadcast": "broadcast", "sendrecv": "send_recv"}


def _as_alpa(cmr, spec, transfers, strings, mode: str):
    per_spec_plans, order = plan_to_strategy(transfers, spec, strings, mode)
    is_local_allgather = spec.final_dst_spec != spec.dst_sharding_spec
    return cmr.ReshardingStrategy(mode, per_spec_plans, order, is_local_allgather)


def _boundary_strategy(cmr, communicator, spec, mode: str):
    """The strategy for ``spec`` from one plan of every tensor crossing its stage boundary.

    Alpa's ``CrossMeshCommunicator`` asks for one tensor at a time, after it has
    built all of them (``resharding_specs[src mesh][dst mesh]``); Alpa balances them
    with loads shared across the communicator. Here the tensors of a boundary are
    planned together (``plan_resharding_tree``: one load state, one order), once per
    boundary and mode, and each tensor gets its part of that plan."""
    boundary = _boundary_of(communicator, spec)
    if boundary is None:  # a spec Alpa built elsewhere: plan it alone
        return _strategy(cmr, spec, mode)
    cache = communicator.__dict__.setdefault("_alpa_comm_plans", {})
    key = (boundary, mode)
    if key not in cache:
        cache[key] = _plan_boundary(communicator.resharding_specs[boundary[0]][boundary[1]], mode)
    per_spec, strings = cache[key]
    return _as_alpa(cmr, spec, per_spec[id(spec)], strings, mode)


def _boundary_of(communicator, spec):
    for i, row in enumerate(getattr(communicator, "resharding_specs", None) or ()):
        for j, specs in enumerate(row):
            if any(s is spec for s in specs.values()):
                return i, j
    return None


def _plan_boundary(specs: dict, mode: str):
    """One joint plan of a boundary's tensors: {id(spec): its transfers}, device strings."""
    from ..resharding.tree import plan_resharding_tree  # noqa: PLC0415

    ordered = list(specs.values())
    inputs = [inputs_from_task_spec(s) for s in ordered]
    strings = inputs[0].strings
    tree = {f"t{i:06d}": inp.resharding for i, inp in enumerate(inputs)}
    plan = plan_resharding_tree(tree, cluster=inputs[0].cluster(PLANNING_NIC_GBPS), strategy=_OUR_STRATEGY[mode],
                                loadbalance="auto", bucket_bytes=None)
    per_leaf: dict[int, list] = {i: [] for i in range(len(ordered))}
    for t in plan.transfers:
        per_leaf[t.leaf].append(t)
    return {id(s): per_leaf[i] for i, s in enumerate(ordered)}, strings


# ---------------------------------------------------------------- schedule
WEIGHT_DELAY = 1
"""How far each weight-gradient computation is delayed inside Alpa (``delay_wgrad``): one
step puts the next forward, and its send, between a stage's input-gradient and
weight-gradient computations. Alpa has no per-stage costs to choose more from."""


def eager_dispatch(compile_executable, schedule_base):
    """``compile_pipeshard_executable_internal`` that also knows ``"eager_1f1b"``.

    Alpa 0.2.3 has no schedule registry: the function picks the schedule class by
    an if/elif over names. For ``"eager_1f1b"`` this runs Alpa's own function with
    ``"1f1b"`` while two names it calls stand for ours (both restored as soon as it
    returns):

    * ``cluster_layers_and_slice_mesh``: Alpa's own, then each backward stage split into
      its input- and weight-gradient computations (``alpa_weight_delay``), the weight
      parts appended as stages on their meshes; everything after it (apply-gradient
      slicing, donation, dependencies, sharding, the standard instruction emitter)
      takes the longer stage list as it is;
    * ``PipeDreamFlush`` (the class the dispatch builds for 1F1B): the eager-1F1B
      schedule over those stages, each weight-gradient task placed by the delay rule.
    """
    original = compile_executable.compile_pipeshard_executable_internal

    @functools.wraps(original)
    def compile_internal(*args, **kwargs):
        args, kwargs, name = _schedule_argument(args, kwargs)
        if name != EAGER_SCHEDULE_NAME:
            return original(*args, **kwargs)
        args, kwargs, _ = _schedule_argument(args, kwargs, "1f1b")
        split: dict = {"weight_stages": {}}
        cluster = compile_executable.cluster_layers_and_slice_mesh
        dispatched = compile_executable.PipeDreamFlush

        def cluster_and_split(*a, **k):
            stages, stage_to_mesh, meshes, option = cluster(*a, **k)
            stages, stage_to_mesh, split["weight_stages"] = split_backward_stages(
                stages, stage_to_mesh, new_var=_fresh_variables(stages))
            return stages, stage_to_mesh, meshes, option

        compile_executable.cluster_layers_and_slice_mesh = cluster_and_split
        compile_executable.PipeDreamFlush = eager_schedule_class(schedule_base, split)
        try:
            return original(*args, **kwargs)
        finally:
            compile_executable.PipeDreamFlush = dispatched
            compile_executable.cluster_layers_and_slice_mesh = cluster

    compile_internal.__module__ = __name__  # ours, whatever functools.wraps copied
    return compile_internal


def _fresh_variables(stages):
    """``aval -> Var`` unused by any stage: jax 0.3.22's ``gensym`` over their jaxprs (in
    Alpa's process; the harness, whose ``jax`` is a stand-in, replaces this function)."""
    from jax.core import gensym  # noqa: PLC0415 - Alpa's jax, only where Alpa runs

    return gensym([s.closed_jaxpr().jaxpr for s in stages], suffix="_wd")


_SCHEDULE_POSITION = 7  # compile_pipeshard_executable_internal(closed_jaxpr, ..., num_microbatch, pipeline_schedule, ...)


def _schedule_argument(args, kwargs, replace: str | None = None):
    """The ``pipeline_schedule`` argument (positional or keyword), optionally replaced."""
    if "pipeline_schedule" in kwargs:
        name = kwargs["pipeline_schedule"]
        if replace is not None:
            kwargs = {**kwargs, "pipeline_schedule": replace}
        return args, kwargs, name
    if len(args) <= _SCHEDULE_POSITION:
        raise AlpaIntegrationError("compile_pipeshard_executable_internal was called without pipeline_schedule")
    name = args[_SCHEDULE_POSITION]
    if replace is not None:
        args = args[:_SCHEDULE_POSITION] + (replace,) + args[_SCHEDULE_POSITION + 1:]
    return args, kwargs, name


def eager_schedule_class(base, split: dict | None = None):
    """Alpa schedule (a ``PipeDreamFlush``: same backward bookkeeping, so each
    accumulator chains microbatch b to b-1) whose clock table is alpa_comm's eager-1F1B:
    forwards run ahead during warm-up so a stage's send overlaps the next forward. This
    is the order of Alpa's own ``OverlapFriendlyPipeDreamSchedule`` (checked in the
    harness), which 0.2.3 cannot run once a stage sends to another mesh (its emitter's
    sort key raises ``TypeError``); here it runs through Alpa's standard emitter.

    ``split["weight_stages"]`` (mesh -> stage index, filled when the stages are built):
    those meshes' weight-gradient computations are tasks of their own, delayed by
    ``WEIGHT_DELAY``; the emitter sends each input gradient at the clock its consumer
    runs, which is before the weight-gradient task of the same microbatch."""
    from ..pipeline import generate  # noqa: PLC0415

    class EagerOneFOneB(base):
        @property
        def name(self):
            return EAGER_SCHEDULE_NAME

        def _generate_schedule(self):
            weight_stages = (split or {}).get("weight_stages") or {}
            if weight_stages:
                sched = generate("eager-1f1b", self.num_mesh, self.num_batch, split_backward=True,
                                 delay_wgrad=WEIGHT_DELAY)
            else:
                sched = generate("eager-1f1b", self.num_mesh, self.num_batch)
            return schedule_to_clocks(sched, self.apply_grad_placement, weight_stages)

    EagerOneFOneB.__qualname__ = EagerOneFOneB.__name__ = "EagerOneFOneB"
    return EagerOneFOneB


# ------------------------------------------------------------------ patching
_MISSING = object()


def _patch(obj, attr: str, value) -> None:
    _state["originals"].setdefault(("attr", id(obj), attr), (obj, attr, getattr(obj, attr, _MISSING)))
    setattr(obj, attr, value)


def _restore() -> None:
    """Undo every ``_patch`` (attributes only: the adapter patches nothing else), and the
    worker's patches in this process."""
    worker = sys.modules.get("alpa_comm.integrations.alpa_worker")
    if worker is not None:
        worker.undo_worker_patches()
    for k in [k for k in _state["originals"] if isinstance(k, tuple)]:
        target, name, old = _state["originals"].pop(k)
        if old is _MISSING:
            delattr(target, name)
        else:
            setattr(target, name, old)
