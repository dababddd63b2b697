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
* ``"alpa_comm_eager"``: the above, plus the schedule ``"eager_1f1b"``
  registered for ``PipeshardParallel(pipeline_schedule="eager_1f1b")``, built
  from alpa_comm's eager-1F1B generator with a clock table checked for order
  (Alpa's own ``1f1b_overlap_friendly`` fails whenever a stage sends to
  another mesh).

Worker processes: Alpa's ``MeshHostWorker`` actors run in other processes, so
patches made in the driver do not reach them. ``install`` swaps the class Alpa
instantiates for ``alpa_worker.AlpaCommMeshHostWorker``, a subclass that Ray
pickles by reference: every actor process imports ``alpa_comm.integrations.
alpa_worker`` to build it, and that import applies the worker-side patches
there. This module never runs on import and is never imported by the rest of
alpa_comm; the translation it relies on (``alpa_translate``) needs no Alpa.

This glue has not run against a live Alpa (Alpa 0.2.3 pins jax 0.3.22,
ray 2.1.0 and a custom jaxlib that no registry serves); docs/alpa.md gives
the commands to check it on an installation.
"""
from __future__ import annotations

import functools
import importlib

from ..errors import AlpaCommError, InvalidOptionError
from .alpa_translate import inputs_from_task_spec, plan_to_strategy, schedule_to_clocks

SUPPORTED_ALPA_VERSION = "0.2.3"
OPTION = "comm_optimization"
VALUES = ("off", "alpa_comm", "alpa_comm_eager")
EAGER_SCHEDULE_NAME = "eager_1f1b"
PLANNING_NIC_GBPS = 10.0  # only relative speeds matter to the load balancer


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
        return _strategy(cmr, spec, "broadcast")

    def send_recv_strategy(self, spec, src_mesh, dst_mesh):
        return _strategy(cmr, spec, "sendrecv")

    _patch(communicator, "_generate_broadcast_resharding_strategy", broadcast_strategy)
    _patch(communicator, "_generate_send_recv_resharding_strategy", send_recv_strategy)
    worker = importlib.import_module("alpa_comm.integrations.alpa_worker")
    device_mesh = _module("alpa.device_mesh")
    _patch(device_mesh, "MeshHostWorker", worker.subclass(device_mesh.MeshHostWorker))
    if value == "alpa_comm_eager":
        schedules = _module("alpa.pipeline_parallel.schedules")
        registry = getattr(schedules, "pipeline_schedule", None)
        if registry is None:
            raise AlpaIntegrationError("alpa.pipeline_parallel.schedules has no 'pipeline_schedule' registry")
        _patch_item(registry, EAGER_SCHEDULE_NAME, eager_schedule_class(schedules.PipelineSchedule))


def _strategy(cmr, spec, mode: str):
    from ..resharding import plan_resharding  # noqa: PLC0415

    inputs = inputs_from_task_spec(spec)
    plan = plan_resharding(inputs.shape, inputs.dtype, inputs.src_mesh, inputs.src_spec, inputs.dst_mesh,
                           inputs.dst_spec, cluster=inputs.cluster(PLANNING_NIC_GBPS),
                           strategy="broadcast" if mode == "broadcast" else "send_recv", loadbalance="auto")
    per_spec_plans, order = plan_to_strategy(plan, spec, inputs.strings, mode)
    is_local_allgather = spec.final_dst_spec != spec.dst_sharding_spec
    return cmr.ReshardingStrategy(mode, per_spec_plans, order, is_local_allgather)


def eager_schedule_class(base):
    """Alpa ``PipelineSchedule`` subclass running alpa_comm's eager-1F1B."""
    from ..pipeline import generate  # noqa: PLC0415

    class EagerOneFOneB(base):
        @property
        def name(self):
            return EAGER_SCHEDULE_NAME

        def _generate_schedule(self):
            sched = generate("eager-1f1b", self.num_mesh, self.num_batch)
            return schedule_to_clocks(sched, self.apply_grad_placement)

        @property
        def first_backward_batch_index(self):
            return 0

        @property
        def last_backward_batch_index(self):
            return self.num_batch - 1

        def previous_backward_batch_index(self, batch_idx):
            if batch_idx <= 0:
                raise ValueError(f"microbatch {batch_idx} has no previous backward")
            return batch_idx - 1

    return EagerOneFOneB


# ------------------------------------------------------------------ patching
_MISSING = object()


def _patch(obj, attr: str, value) -> None:
    _state["originals"].setdefault(("attr", id(obj), attr), (obj, attr, getattr(obj, attr, _MISSING)))
    setattr(obj, attr, value)


def _patch_item(mapping, key, value) -> None:
    _state["originals"].setdefault(("item", id(mapping), key), (mapping, key, mapping.get(key, _MISSING)))
    mapping[key] = value


def _restore() -> None:
    for k in [k for k in _state["originals"] if isinstance(k, tuple)]:
        target, name, old = _state["originals"].pop(k)
        if k[0] == "attr":
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)
        elif old is _MISSING:
            target.pop(name, None)
        else:
            target[name] = old
