"""The Alpa adapter's option plumbing and errors, against a stand-in 'alpa' package with
Alpa 0.2.3's module layout (the real Alpa cannot be installed here)."""
import sys
import types

import numpy as np
import pytest

from alpa_comm import InvalidOptionError
from alpa_comm.integrations import alpa as adapter

from alpa_fixtures import task_spec


def fake_alpa(version="0.2.3"):
    mods = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    class Config:
        resharding_mode = "send_recv"

    class ReshardingStrategy:
        def __init__(self, mode, per_spec_plans, order, is_local_allgather):
            self.mode, self.per_spec_plans, self.order = mode, per_spec_plans, order
            self.is_local_allgather = is_local_allgather

    class CrossMeshCommunicator:
        def _generate_broadcast_resharding_strategy(self, spec, src_mesh, dst_mesh):
            return "alpa's own"

        def _generate_send_recv_resharding_strategy(self, spec, src_mesh, dst_mesh):
            return "alpa's own"

    class PipelineSchedule:
        def __init__(self, *, dependency, meshes, apply_grad_placement, num_batch=1):
            self.dependency, self.meshes = dependency, meshes
            self.apply_grad_placement, self.num_batch = apply_grad_placement, num_batch
            self._schedules = self._generate_schedule()

        @property
        def num_mesh(self):
            return len(self.meshes)

    class MeshHostWorker:
        def __init__(self, *args):
            self.args = args

    calls = []
    alpa = mod("alpa", __version__=version, global_config=Config(),
               init=lambda *a, **k: calls.append((a, k)) or "initialized")
    alpa.api = mod("alpa.api", init=alpa.init)
    mod("alpa.device_mesh", MeshHostWorker=MeshHostWorker)
    mod("alpa.pipeline_parallel")
    mod("alpa.pipeline_parallel.cross_mesh_resharding", CrossMeshCommunicator=CrossMeshCommunicator,
        ReshardingStrategy=ReshardingStrategy)
    mod("alpa.pipeline_parallel.schedules", PipelineSchedule=PipelineSchedule, pipeline_schedule={})
    return mods, calls


@pytest.fixture
def alpa_stub(monkeypatch):
    mods, calls = fake_alpa()
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.delitem(sys.modules, "alpa_comm.integrations.alpa_worker", raising=False)
    yield mods, calls
    adapter.uninstall()


def test_missing_alpa_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "alpa", None)
    with pytest.raises(adapter.AlpaIntegrationError, match="Alpa is not installed"):
        adapter.install()


def test_other_version_is_refused(monkeypatch):
    mods, _ = fake_alpa("0.2.2")
    monkeypatch.setitem(sys.modules, "alpa", mods["alpa"])
    with pytest.raises(adapter.AlpaIntegrationError, match="supports Alpa 0.2.3, found Alpa '0.2.2'"):
        adapter.install()


def test_option_values_and_patching(alpa_stub):
    mods, calls = alpa_stub
    alpa = mods["alpa"]
    adapter.install()
    with pytest.raises(InvalidOptionError, match="'fast'"):
        alpa.init(cluster="ray", comm_optimization="fast")
    assert calls == []  # nothing started on a bad value
    assert alpa.init(cluster="ray", comm_optimization="alpa_comm_eager") == "initialized"
    assert calls == [((), {"cluster": "ray"})]
    assert alpa.global_config.resharding_mode == "broadcast"
    assert alpa.api.init is alpa.init
    cmr = mods["alpa.pipeline_parallel.cross_mesh_resharding"]
    spec = task_spec((64, 64), "float32", "2x4@0,1", "RS0", "2x4@2,3", "S0R", 4)
    spec.final_dst_spec = spec.dst_sharding_spec = None
    strategy = cmr.CrossMeshCommunicator()._generate_broadcast_resharding_strategy(spec, None, None)
    assert strategy.mode == "broadcast" and len(strategy.per_spec_plans) == len(spec.dst_tile_to_src_tiles_map)
    assert isinstance(strategy.per_spec_plans[0], np.ndarray)
    schedules = mods["alpa.pipeline_parallel.schedules"]
    cls = schedules.pipeline_schedule["eager_1f1b"]
    sched = cls(dependency=None, meshes=[0, 1, 2], apply_grad_placement={6: 0}, num_batch=4)
    assert sched.name == "eager_1f1b" and sched.previous_backward_batch_index(2) == 1
    assert sched._schedules[-1][0] == (3, 6)
    worker_cls = mods["alpa.device_mesh"].MeshHostWorker
    assert worker_cls.__module__ == "alpa_comm.integrations.alpa_worker"
    assert worker_cls(1).alpa_comm_status()["patched"]
    # switching off restores Alpa's own pieces
    alpa.init(comm_optimization="off")
    assert cmr.CrossMeshCommunicator()._generate_broadcast_resharding_strategy(spec, None, None) == "alpa's own"
    assert "eager_1f1b" not in schedules.pipeline_schedule
    assert alpa.global_config.resharding_mode == "send_recv"


def test_a_failure_part_way_leaves_alpa_untouched(alpa_stub):
    """Alpa 0.2.3 has no schedule registry (checked on its own code in test_alpa_harness):
    asking for eager-1F1B fails, and every patch made before the failure is undone."""
    mods, calls = alpa_stub
    alpa = mods["alpa"]
    del mods["alpa.pipeline_parallel.schedules"].pipeline_schedule
    cmr = mods["alpa.pipeline_parallel.cross_mesh_resharding"]
    own = (cmr.CrossMeshCommunicator._generate_broadcast_resharding_strategy,
           cmr.CrossMeshCommunicator._generate_send_recv_resharding_strategy,
           mods["alpa.device_mesh"].MeshHostWorker)
    adapter.install()
    with pytest.raises(adapter.AlpaIntegrationError, match="pipeline_schedule"):
        alpa.init(cluster="ray", comm_optimization="alpa_comm_eager")
    assert calls == []  # Alpa never started
    assert alpa.global_config.resharding_mode == "send_recv"
    assert (cmr.CrossMeshCommunicator._generate_broadcast_resharding_strategy,
            cmr.CrossMeshCommunicator._generate_send_recv_resharding_strategy,
            mods["alpa.device_mesh"].MeshHostWorker) == own
    assert alpa.init(cluster="ray", comm_optimization="alpa_comm") == "initialized"  # the rest still works
    assert alpa.global_config.resharding_mode == "broadcast"
