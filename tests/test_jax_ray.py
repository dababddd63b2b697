"""``alpa_comm.jax`` in Ray actors the test owns: a trainer that is one 2-process
``jax.distributed`` program (actors 0-1, FSDP over 4 devices) pushes a transformer's
weights to two inference engines that are each their own single-process JAX program
(actors 2 and 3, tensor-parallel over 2 devices), every step, with one ``reshard_tree``
call per actor; the group meets at a named Ray actor. Every received shard is compared
with NumPy, bit for bit; an engine killed between syncs is named in every survivor (a
process killed in the middle of a transfer: tests/test_jax_processes.py, same executor)."""
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import local_ray_marks

ray = pytest.importorskip("ray")
pytest.importorskip("jax")
pytest.importorskip("torch")
pytestmark = [pytest.mark.timeout(600), *local_ray_marks()]

TRAINERS, ENGINES, DEVICES = (0, 1), (2, 3), 2
HERE = Path(__file__).resolve().parent


class Member:
    """One actor: its own JAX (2 CPU devices); the trainers form one jax.distributed
    program; all four form the alpa_comm group ``name``."""

    def __init__(self, name: str, rank: int, coordinator: str, timeout: float):
        import jax

        jax.config.update("jax_num_cpu_devices", DEVICES)
        if rank in TRAINERS:
            jax.distributed.initialize(coordinator, num_processes=len(TRAINERS), process_id=rank)
        from alpa_comm.jax import ProcessGroup

        self.rank = rank
        self.group = ProcessGroup.from_ray(name, rank, len(TRAINERS) + len(ENGINES), timeout=timeout)

    def pid(self) -> int:
        import os

        return os.getpid()

    def sync(self, step: int, wire_dtype=None):
        """One weight sync; engines return (wrong shards, shards checked), trainers None."""
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        from alpa_comm.jax import reshard_tree
        from alpa_comm.runtime.backend import CommunicationError
        from alpa_comm.runtime.executor import numpy_dtype
        from alpa_comm_bench.shapes import transformer_weights

        weights = {k: w + np.float32(step) for k, w in transformer_weights(0.25, width=64).items()}
        try:
            if self.rank in TRAINERS:
                devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
                train = NamedSharding(Mesh(np.array(devices).reshape(2, 2), ("data", "fsdp")), P(("data", "fsdp")))
                params = {k: jax.make_array_from_callback(w.shape, train, lambda i, w=w: w[i], dtype=w.dtype)
                          for k, w in weights.items()}
                assert reshard_tree(params, None, group=self.group, wire_dtype=wire_dtype) is None
                return None
            mesh = Mesh(np.array(jax.devices()), ("tp",))
            targets = {k: NamedSharding(mesh, P(None, "tp") if w.ndim == 2 else P()) for k, w in weights.items()}
            got = reshard_tree(None, targets, group=self.group)
        except CommunicationError as e:
            return {"error": str(e)}
        if wire_dtype:
            weights = {k: w.astype(numpy_dtype(wire_dtype)).astype(w.dtype) for k, w in weights.items()}
        wrong = checked = 0
        for k, y in got.items():
            assert y.sharding == targets[k] and y.shape == weights[k].shape
            for s in y.addressable_shards:
                checked += 1
                wrong += not np.array_equal(np.asarray(s.data), weights[k][s.index])
        return wrong, checked


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module (starting it costs seconds); each test makes its own actors."""
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu", "GLOO_SOCKET_IFNAME": "lo",
                                       # actors import Member from this file
                                       "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}})
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def actors(ray_session):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    cls = ray.remote(num_cpus=0)(Member)
    name = f"test-{time.monotonic_ns()}"
    members = [cls.remote(name, r, coordinator, 15.0) for r in TRAINERS + ENGINES]
    try:
        ray.get([m.pid.remote() for m in members])
        yield members
    finally:
        for m in members:  # a fresh group for the next test: every member ends here
            ray.kill(m)


def test_ray_actors_sync_a_model_between_jax_programs_bit_exact(actors):
    for step in range(3):  # the first plans; the later ones reuse the prepared plan
        out = ray.get([m.sync.remote(step) for m in actors], timeout=300)
        assert out[:2] == [None, None]
        for wrong, checked in out[2:]:
            assert checked > 0 and wrong == 0, out
    out = ray.get([m.sync.remote(7, "bfloat16") for m in actors], timeout=300)
    assert all(wrong == 0 for wrong, _ in out[2:]), out  # rounded to bfloat16 on the wire, float32 out


def test_an_engine_that_dies_is_named_in_every_survivor_within_the_timeout(actors):
    ray.get([m.sync.remote(0) for m in actors], timeout=300)
    pending = [m.sync.remote(1) for m in actors[:3]]  # engine 3 never comes: it is killed
    ray.kill(actors[3])
    t0 = time.monotonic()
    out = ray.get(pending, timeout=120)
    assert time.monotonic() - t0 < 60
    for r, o in enumerate(out):
        assert isinstance(o, dict) and "host 3" in o["error"], (r, o)


def test_a_group_name_serves_one_group_per_job(ray_session):
    from alpa_comm.errors import InvalidOptionError
    from alpa_comm.jax import ProcessGroup

    name = f"once-{time.monotonic_ns()}"
    ProcessGroup.from_ray(name, 0, 2)
    with pytest.raises(InvalidOptionError, match="already joined the Ray group"):
        ProcessGroup.from_ray(name, 0, 2)
    with pytest.raises(InvalidOptionError, match="rank 2 must be in"):
        ProcessGroup.from_ray(name, 2, 2)
