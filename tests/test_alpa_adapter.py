"""The Alpa adapter (``alpa_comm.integrations.alpa``) on Alpa 0.2.3's own package: its real
``__init__``, ``alpa.init`` (against a pretend Ray cluster), schedule dispatch in
``compile_executable``, instruction emitter, stage profiling and worker-side NCCL glue.

Each test runs a script in a harness subprocess (the harness replaces ``jax`` in its
process); skipped, with the reason, where the package registry cannot be reached."""
import sys

import pytest

from alpa_comm.integrations import alpa as adapter

pytestmark = pytest.mark.timeout(600)


def test_missing_alpa_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "alpa", None)
    with pytest.raises(adapter.AlpaIntegrationError, match="Alpa is not installed"):
        adapter.install()


@pytest.fixture(scope="module")
def harness():
    from conftest import alpa_package_runner

    return alpa_package_runner()


INIT = r'''
from alpa_comm import InvalidOptionError
import alpa.pipeline_parallel.compile_executable as ce
import alpa.pipeline_parallel.stage_profiling as sp
from alpa.pipeline_parallel.cross_mesh_resharding import CrossMeshCommunicator

def where(f):
    return getattr(f, "__module__", "?")

own = [where(ce.compile_pipeshard_executable_internal), where(sp.dummy_resharding_broadcast_strategy),
       where(CrossMeshCommunicator._generate_broadcast_resharding_strategy), where(alpa.device_mesh.MeshHostWorker)]
adapter.install()
try:
    alpa.init(cluster="ray", comm_optimization="fast")
except InvalidOptionError as e:
    out["bad"] = [str(e), alpa.api.is_initialized]
for value in adapter.VALUES:
    alpa.init(cluster="ray", comm_optimization=value)
    mesh = alpa.get_global_virtual_physical_mesh()
    out[value] = {"initialized": alpa.api.is_initialized, "mesh": [mesh.num_hosts, mesh.num_devices_per_host],
                  "mode": alpa.global_config.resharding_mode,
                  "patched": [where(ce.compile_pipeshard_executable_internal),
                              where(sp.dummy_resharding_broadcast_strategy),
                              where(CrossMeshCommunicator._generate_broadcast_resharding_strategy),
                              where(alpa.device_mesh.MeshHostWorker)]}
    alpa.shutdown()
out["own"] = own
adapter.uninstall()
out["restored"] = [where(ce.compile_pipeshard_executable_internal), where(sp.dummy_resharding_broadcast_strategy),
                   where(CrossMeshCommunicator._generate_broadcast_resharding_strategy),
                   where(alpa.device_mesh.MeshHostWorker), alpa.init is alpa.api.init,
                   alpa.global_config.resharding_mode]
alpa.__version__ = "0.2.2"
try:
    adapter.install()
except adapter.AlpaIntegrationError as e:
    out["version"] = str(e)
'''


def test_each_documented_value_gets_through_alpa_s_real_init(harness):
    """``alpa.init(cluster="ray", comm_optimization=v)`` for every documented value runs
    Alpa's own init (its ``DeviceCluster`` finds the pretend cluster's 4 x 4 GPUs); a bad
    value is refused before Alpa starts; ``uninstall`` restores every patched attribute;
    another Alpa version is refused by name."""
    out = harness(INIT)
    assert "'fast'" in out["bad"][0] and out["bad"][1] is False
    ours = "alpa_comm.integrations.alpa"
    for value in adapter.VALUES:
        assert out[value]["initialized"] and out[value]["mesh"] == [4, 4], value
    assert out["off"]["mode"] == "send_recv" and out["off"]["patched"] == out["own"]
    assert out["alpa_comm"]["mode"] == "broadcast"
    assert out["alpa_comm"]["patched"][0] == out["own"][0]  # the schedule dispatch is Alpa's
    assert out["alpa_comm"]["patched"][1:3] == [ours, ours]
    assert out["alpa_comm"]["patched"][3] == "alpa_comm.integrations.alpa_worker"
    assert out["alpa_comm_eager"]["patched"][:3] == [ours, ours, ours]
    assert out["restored"] == out["own"] + [True, "send_recv"]
    assert "supports Alpa 0.2.3, found Alpa '0.2.2'" in out["version"]


DISPATCH = r'''
import types
import alpa.pipeline_parallel.compile_executable as ce
import alpa.pipeline_parallel.schedules as schedules
from alpa_comm.integrations.alpa_harness.alpa_objects import mesh_of
from alpa_comm.integrations.alpa_harness.pipeline_objects import trivial_stages
from alpa_comm.integrations.alpa_translate import validate_clocks

S, M = 3, 6
meshes = [mesh_of({"hosts": [h], "dph": 4}) for h in range(S)]

class Captured(Exception):
    pass

def capture(jax_all_stages, sliced_meshes, schedule, *args, **kwargs):
    raise Captured(schedule)

# stand-ins for the steps before the dispatch that need jaxprs and XLA; the dispatch itself,
# the schedule classes and the dependency generator are Alpa's
ce.split_and_process_layers = lambda *a: (a[0], [], [], None, None, None, None, {}, [], [])
ce.slice_apply_grad_for_stage_construction = lambda *a: ([], None)
# stages that are only their markers: nothing to split, so the table is the plain eager order
ce.cluster_layers_and_slice_mesh = lambda *a: (trivial_stages(S), list(range(S)) + list(reversed(range(S))), meshes,
                                               types.SimpleNamespace(submesh_logical_shapes=None,
                                                                     submesh_autosharding_option_dicts=None))
ce.process_apply_gradient = lambda *a: ([], {}, [], [])
ce.create_donation_mapping = lambda *a: {}
ce.split_donate_invars = lambda mapping, stages, gensym: ({}, stages)
ce._rewrite_global_outvars_post_concate = lambda *a: ([], {})
ce.gen_dependency_with_stages = lambda *a: schedules.gen_linear_pipeline_dependency(2 * S)
ce.shard_each_stage = capture
closed = types.SimpleNamespace(jaxpr=types.SimpleNamespace(invars=[]))

def dispatch(name):
    args = (closed, None, 1, [], [], None, M, name, None, None, "test", None, None, None, None)
    try:
        ce.compile_pipeshard_executable_internal(*args)
    except Captured as c:
        return type(c.args[0]).__name__, c.args[0].schedules
    except ValueError as e:
        return "error", str(e)

names = ["gpipe", "1f1b", "inference", "1f1b_overlap_friendly", "eager_1f1b"]
out["off"] = {n: dispatch(n)[0] for n in names}
out["off_error"] = dispatch("eager_1f1b")[1]
adapter.install()
adapter.configure("alpa_comm_eager")
out["eager"] = {n: dispatch(n)[0] for n in names}
table = dispatch("eager_1f1b")[1]
validate_clocks(table, S, M)
friendly = schedules.OverlapFriendlyPipeDreamSchedule(dependency=schedules.gen_linear_pipeline_dependency(2 * S),
                                                      meshes=meshes, apply_grad_placement={}, num_batch=M)
out["same_as_overlap_friendly"] = table == friendly.schedules
out["flush_restored"] = ce.PipeDreamFlush is schedules.PipeDreamFlush
adapter.configure("off")
out["off_again"] = dispatch("eager_1f1b")[0]
'''


def test_eager_1f1b_goes_through_alpa_s_own_schedule_dispatch(harness):
    """Alpa 0.2.3's ``compile_pipeshard_executable_internal`` picks the schedule class by an
    if/elif over names: without the adapter "eager_1f1b" is Alpa's ``ValueError``; with
    ``alpa_comm_eager`` it reaches the same dispatch and builds ``EagerOneFOneB``, whose
    clock table is valid and is the order of Alpa's ``OverlapFriendlyPipeDreamSchedule``;
    every other name still gets Alpa's class, and nothing stays swapped afterwards."""
    out = harness(DISPATCH)
    alpa_own = {"gpipe": "GpipeSchedule", "1f1b": "PipeDreamFlush", "inference": "InferenceSchedule",
                "1f1b_overlap_friendly": "OverlapFriendlyPipeDreamSchedule"}
    assert out["off"] == {**alpa_own, "eager_1f1b": "error"}
    assert out["off_error"] == "Invalid schedule: eager_1f1b"
    assert out["eager"] == {**alpa_own, "eager_1f1b": "EagerOneFOneB"}
    assert out["same_as_overlap_friendly"] and out["flush_restored"] and out["off_again"] == "error"


EMITTER = r'''
import types
from alpa.pipeline_parallel.runtime_emitter import OverlapFriendlyPipelineInstEmitter
from alpa_comm.integrations.alpa_harness.alpa_objects import Var

def send_vars(cross_mesh):
    x = Var("x", (4,))
    emitter = object.__new__(OverlapFriendlyPipelineInstEmitter)  # Alpa's method on a minimal emitter
    emitter.stages = [types.SimpleNamespace(invars=[], outvars=[x]),
                      types.SimpleNamespace(invars=[x], outvars=[], input_sharding_specs=[None])]
    emitter.schedule = types.SimpleNamespace(stage_placement=lambda i: {i if cross_mesh else 0})
    emitter.global_invars, emitter.grad_dummy_invars = [], {}
    emitter.stage_send_vars = [[] for _ in emitter.stages]
    emitter._compile_sharding_specs = lambda: None
    try:
        emitter._get_stage_send_vars([[x], []])
        return "ok"
    except TypeError as e:
        return "TypeError: " + str(e)

out["same_mesh"], out["cross_mesh"] = send_vars(False), send_vars(True)
'''


def test_alpa_s_overlap_friendly_emitter_fails_once_a_stage_sends_across_meshes(harness):
    """Why ``eager_1f1b`` runs through Alpa's standard emitter: 0.2.3's
    ``OverlapFriendlyPipelineInstEmitter`` sorts the variables a stage sends with a key
    function of three parameters, which ``sorted`` calls with one."""
    out = harness(EMITTER)
    assert out["same_mesh"] == "ok"
    assert out["cross_mesh"].startswith("TypeError") and "positional argument" in out["cross_mesh"]


PROFILING = r'''
import alpa.pipeline_parallel.stage_profiling as sp
from alpa.pipeline_parallel.cross_mesh_resharding import ReshardingTaskSpec
from alpa_comm.integrations.alpa_harness import alpa_objects as ao
from alpa_comm.integrations.alpa_harness.conformance import cases

adapter.install()
adapter.configure("alpa_comm")
out["rows"] = []
for case in cases():
    src_mesh, dst_mesh = ao.mesh_of(case["src"]), ao.mesh_of(case["dst"])
    for i, t in enumerate(case["tensors"]):
        src = ao.array_of(src_mesh, t["shape"], ao.spec_of(t["src"]))
        dst = ao.array_of(dst_mesh, t["shape"], ao.spec_of(t["dst"]))
        spec = ReshardingTaskSpec(src, dst, dst.sharding_spec)
        spec.set_resharding_strategy(sp.dummy_resharding_broadcast_strategy(spec))  # as profiling does
        x = ao.values(t["shape"], i)
        buffers, messages, _ = ao.execute(ao.compile_task(spec, src_mesh, dst_mesh), spec, x)
        out["rows"].append([case["name"], spec.strategy.mode, ao.check_delivery(spec, x, buffers)])
'''


def test_alpa_s_stage_profiling_gets_its_strategies_from_alpa_comm(harness):
    """Alpa's stage-profiling cost model builds each boundary tensor's strategy with
    ``dummy_resharding_*_strategy``; with the adapter on, those come from alpa_comm's
    planner, and Alpa's compiler turns them into tasks that deliver every tile exactly."""
    out = harness(PROFILING)
    assert len(out["rows"]) >= 20
    for name, mode, wrong in out["rows"]:
        assert mode == "broadcast" and wrong == [], name


BOUNDARY = r'''
# What both worker tests share: the state MeshHostWorker's methods use, the workers of one
# boundary tensor with their buffers set, the check of every destination tile, and the
# cases (the conformance cases and a 4 MiB one that the cost model chunks).
from alpa_comm.integrations.alpa_harness import alpa_objects as ao
from alpa_comm.integrations.alpa_harness.conformance import _communicator, cases

class HostWorker:
    def __init__(self, n):
        self.buffers, self.broadcast_tasks, self.num_devices = {}, {}, n
        self.local_devices = list(range(n))

def boundary(case, chunked, place=lambda data, local: data):
    # per tensor of the case: (var, spec, task, x, src_mesh, dst_mesh, workers), the workers'
    # buffers set (place: where one device keeps its block)
    adapter.configure("alpa_comm")
    comm, src_mesh, dst_mesh, xs = _communicator(case, "alpa_comm")
    if not chunked:  # Alpa's own broadcast on the workers
        adapter.configure("off")
    for i, var in enumerate(xs):
        spec = comm.resharding_specs[0][1][var]
        task = ao.compile_task(spec, src_mesh, dst_mesh)
        x = ao.values(var.aval.shape, i)
        workers = {}
        for mesh, array, uuid in ((src_mesh, spec.src, 1), (dst_mesh, spec.dst, 2)):
            for h, w in enumerate(mesh.workers):
                hw = workers[w] = HostWorker(4)
                hw.uuid = uuid
                hw.buffers[uuid] = [None] * 4
                for j, local in enumerate(mesh.devices[h]):
                    block = x[array.indices[h * mesh.num_devices_per_host + j]]
                    data = np.ascontiguousarray(block) if uuid == 1 else np.zeros_like(block)
                    hw.buffers[uuid][local] = place(data, local)
        yield var, spec, task, x, src_mesh, dst_mesh, workers

def wrong_tiles(var, spec, x, dst_mesh, workers):
    return [f"{var}:{h}:{local}" for h, w in enumerate(dst_mesh.workers) for j, local in enumerate(dst_mesh.devices[h])
            if not np.array_equal(np.asarray(workers[w].buffers[2][local]),
                                  x[spec.dst.indices[h * dst_mesh.num_devices_per_host + j]])]

big = {"name": "4 MiB replicated 1x4 -> 4x4", "src": {"hosts": [0], "dph": 4}, "dst": {"hosts": [1, 2, 3, 4], "dph": 4},
       "tensors": [{"shape": [1024, 1024], "src": {"sharding": ["N", "N"], "mapping": [["R", 4]]},
                    "dst": {"sharding": ["N", [4]], "mapping": [["R", 4], ["S", 0]]}}]}
'''


WORKER = r'''
import types
import numpy as np
import alpa.collective.worker_nccl_util as nccl            # Alpa's own file
import alpa.collective.worker_nccl_util_cupy as cupy_glue  # Alpa's own file
from alpa.device_mesh import MeshHostWorker

# NumPy stand-ins for CuPy/XLA buffers and for NCCL's broadcast (rank 0's n elements from its
# pointer, copied to every other rank's pointer, in call order per communicator)
world, cursor, calls = {}, {}, []

class CupyLike(np.ndarray):
    """As a CuPy array: indexing every dim with an int gives a 0-d view, not a copy."""
    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == self.ndim and all(isinstance(k, (int, np.integer)) for k in key):
            key = key + (Ellipsis,)
        return super().__getitem__(key)

def flat(t, n):
    base = t
    while base.base is not None:
        base = base.base
    start = (t.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // t.itemsize
    return base.reshape(-1)[start:start + n]

def broadcast_partialgpu(tensors, n, comm_key, world_size, devices_ids, ranks, group_name):
    calls.append(comm_key)
    for t, rank in zip(tensors, ranks):
        if rank == 0:
            world.setdefault(comm_key, []).append(flat(t, n).copy())
        else:
            k = cursor.get((comm_key, rank), 0)
            flat(t, n)[:] = world[comm_key][k]
            cursor[(comm_key, rank)] = k + 1

def tensor_set(buf, value, starts):
    out = buf.copy()
    out[tuple(slice(s, s + n) for s, n in zip(starts, value.shape))] = value
    return out

ident = lambda x, *a, **k: x
cupy_glue.col = types.SimpleNamespace(broadcast_partialgpu=broadcast_partialgpu)
cupy_glue.xla_buffer_to_cupy = lambda b, *a, **k: b.view(CupyLike)
cupy_glue.cupy_to_xla_buffer = cupy_glue.cupy_to_jax_tensor = ident
cupy_glue.xla_buffer_to_jax_tensor = cupy_glue.jax_tensor_to_cupy = cupy_glue.jax_tensor_to_xla_buffer = ident
cupy_glue.jax_tensor_index = lambda t, starts, shape: t[tuple(slice(s, s + n) for s, n in zip(starts, shape))].copy()
cupy_glue.jax_tensor_set = tensor_set
cupy_glue.device_put = ident
cupy_glue.jnp = types.SimpleNamespace(ones=np.ones)
alpa.device_mesh.worker_nccl_util = nccl  # what device_mesh imports where CUDA is present
alpa.global_config.nccl_mode = "cupy"

def run(case, chunked):
    world.clear(); cursor.clear(); calls.clear()
    wrong, groups = [], 0
    for var, spec, task, x, src_mesh, dst_mesh, workers in boundary(case, chunked):
        senders = [w for w in src_mesh.workers if w in task.broadcast_tasks]
        for w in senders + [w for w in dst_mesh.workers if w in task.broadcast_tasks]:
            hw = workers[w]
            MeshHostWorker.put_resharding_broadcast_task(hw, 7, task.broadcast_tasks[w], "g")
            MeshHostWorker.run_resharding_broadcast_task(hw, 7, hw.uuid, set_empty_buffer=False)
        groups += sum(len(g) for g in task.broadcast_tasks.values())  # one NCCL call per worker and group
        wrong += wrong_tiles(var, spec, x, dst_mesh, workers)
    return {"wrong": wrong, "calls": len(calls), "groups": groups}

adapter.install()
for case in cases() + [big]:
    out[case["name"]] = {"alpa": run(case, False), "chunked": run(case, True)}
from alpa_comm.integrations.alpa_worker import worker_chunks
out["big_chunks"] = worker_chunks(1024 * 256 * 4, 5)
'''


def test_workers_run_the_chunked_broadcast_through_alpa_s_own_nccl_glue(harness):
    """The worker code path without GPUs: Alpa's ``MeshHostWorker.run_resharding_broadcast_task``
    and its CuPy glue (``worker_nccl_util_cupy.broadcast``, both Alpa's files) run on NumPy
    buffers, with NCCL's broadcast replaced by a copy between the ranks' memory. With the
    adapter's worker patch each group's slice goes as the chunks alpa_comm's cost model picks
    (more NCCL calls on the 4 MiB case), and every destination buffer is bit-exact — as with
    Alpa's own, unchunked broadcast."""
    out = harness(BOUNDARY + WORKER)
    big = out.pop("4 MiB replicated 1x4 -> 4x4")
    chunks = out.pop("big_chunks")
    for name, runs in list(out.items()) + [("big", big)]:
        assert runs["alpa"]["wrong"] == [] and runs["chunked"]["wrong"] == [], (name, runs)
        assert runs["alpa"]["calls"] == runs["alpa"]["groups"], name
    assert chunks > 1 and big["chunked"]["calls"] == big["chunked"]["groups"] * chunks


WORKER_ON_MODEL = r'''
import threading, types
import numpy as np
from alpa_comm.testing import nccl_model as M
from alpa_comm.integrations.alpa_harness import loader

installed = M.install()  # kept: CuPy and NCCL are the model's from here on
model = installed.__enter__()
np.int, np.float = int, float    # Alpa 0.2.3 predates NumPy 1.24: its nccl_util maps numpy.int, numpy.float
alpa.global_config.has_cuda = True  # nccl_util imports CuPy only where CUDA is
real = loader.real_files(loader.ALPA_NCCL_COLLECTIVE)                                  # Alpa's own files
col_types = real["alpa.collective.types"]
nccl_util = real["alpa.collective.collective_group.nccl_util"]
cuda_stream = real["alpa.collective.collective_group.cuda_stream"]
ncg = real["alpa.collective.collective_group.nccl_collective_group"]
import alpa.collective.worker_nccl_util as nccl                                         # Alpa's own file
import alpa.collective.worker_nccl_util_cupy as cupy_glue                               # Alpa's own file
from alpa.device_mesh import MeshHostWorker

# What stands in for Ray and XLA, and only that: each host worker is a thread (a Ray actor
# there) with its own NCCLGroup and stream pools; the NCCL id of a communicator key is shared
# through a dict (Ray's named-actor store there); XLA buffers are model device arrays, and XLA
# reading one waits for the worker's devices (XLA's work ordered after the NCCL streams).
mine = threading.local()
uids, uid_lock = {}, threading.Lock()

def rendezvous(self, rank, comm_key, max_counter, nccl_uid=None):
    with uid_lock:
        return uids.setdefault(comm_key, nccl_uid if nccl_uid is not None else nccl_util.get_nccl_unique_id())
ncg.NCCLGroup._rendezvous_nccl_uid = rendezvous

def get_stream_pool(device_idx):
    pools = mine.__dict__.setdefault("pools", {})
    if device_idx not in pools:
        pools[device_idx] = cuda_stream.StreamPool(device_idx)
    return pools[device_idx]
ncg.get_stream_pool = cuda_stream.get_stream_pool = get_stream_pool

def broadcast_partialgpu(tensor_list, n_elements, comm_key, world_size, devices_ids, devices_global_rank,
                         group_name="default", local_start_pos_list=None):
    """alpa.collective.collective.broadcast_partialgpu, with this worker's group."""
    opts = col_types.BroadcastOptions()
    opts.n_elements, opts.comm_key, opts.world_size = n_elements, comm_key, world_size
    opts.devices_ids, opts.devices_global_rank = devices_ids, devices_global_rank
    opts.local_start_pos_list = local_start_pos_list if local_start_pos_list is not None else []
    mine.group.broadcast_partialgpu(tensor_list, opts)

class CupyLike(M.ModelArray):
    """As a CuPy array: indexing every dim with an int gives a 0-d view, not a copy."""
    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == self.ndim and all(isinstance(k, (int, np.integer)) for k in key):
            key = key + (Ellipsis,)
        return super().__getitem__(key)

def to_xla(t):
    for d in range(mine.devices):
        M.Device(d).synchronize()
    return t.view(M.ModelArray)  # an XLA buffer on the same GPU

def tensor_set(buf, value, starts):
    out = buf.copy()  # stays on buf's GPU
    out[tuple(slice(s, s + n) for s, n in zip(starts, value.shape))] = value
    return out

cupy_glue.col = types.SimpleNamespace(broadcast_partialgpu=broadcast_partialgpu)
cupy_glue.xla_buffer_to_cupy = lambda b, *a, **k: b.view(CupyLike)  # DLPack: the same memory, the same GPU
cupy_glue.jax_tensor_to_cupy = lambda t, *a, **k: t.view(CupyLike)
cupy_glue.cupy_to_xla_buffer = cupy_glue.cupy_to_jax_tensor = to_xla
cupy_glue.xla_buffer_to_jax_tensor = cupy_glue.jax_tensor_to_xla_buffer = lambda x, *a, **k: x
kept = []  # see keep()

def keep(a):
    """Alpa's glue drops its last reference to a tile it copied for a non-contiguous
    broadcast as soon as the NCCL call is enqueued, before it has run (its own TODO on
    recordStream says so); here freed memory is reused at once, so such tiles are kept
    until the step ends, as a stream-ordered allocator would."""
    kept.append(a)
    return a

cupy_glue.jax_tensor_index = lambda t, starts, shape: keep(t[tuple(slice(s, s + n) for s, n in zip(starts, shape))].copy())
cupy_glue.device_put = lambda x, device: keep(M.on_device(np.array(x), device))
cupy_glue.jax_tensor_set = tensor_set
cupy_glue.jnp = types.SimpleNamespace(ones=np.ones)
alpa.device_mesh.worker_nccl_util = nccl
alpa.global_config.nccl_mode = "cupy"

def run(case, chunked):
    wrong, errors, calls = [], [], 0
    for var, spec, task, x, src_mesh, dst_mesh, workers in boundary(case, chunked, M.on_device):
        active = [w for w in list(src_mesh.workers) + list(dst_mesh.workers) if w in task.broadcast_tasks]

        def work(rank, w):
            try:
                mine.group, mine.devices = ncg.NCCLGroup(len(active), rank, "g"), 4
                hw = workers[w]
                MeshHostWorker.put_resharding_broadcast_task(hw, 7, task.broadcast_tasks[w], "g")
                MeshHostWorker.run_resharding_broadcast_task(hw, 7, hw.uuid, set_empty_buffer=False)
                to_xla(np.zeros(0))  # the step ends with the worker's devices idle
            except BaseException as e:
                errors.append(f"{type(e).__name__}: {e}")
        before = model.operations
        uids.clear()  # new groups: new communicators (Alpa's store is per group there)
        threads = [threading.Thread(target=work, args=(r, w)) for r, w in enumerate(active)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        kept.clear()
        calls += model.operations - before
        wrong += wrong_tiles(var, spec, x, dst_mesh, workers)
    return {"wrong": wrong, "errors": errors[:3], "collectives": calls}

adapter.install()
for case in cases() + [big]:
    out[case["name"]] = {"alpa": run(case, False), "chunked": run(case, True)}
'''


def test_alpa_s_own_nccl_group_runs_the_chunked_broadcast_on_the_nccl_model(harness):
    """Alpa 0.2.3's own NCCL collective group (``NCCLGroup.broadcast_partialgpu``: a
    communicator per device made inside one NCCL group, its stream pools, the events that
    order them) and its worker glue run on the NCCL model, every host worker a thread:
    with Alpa's own broadcast and with the adapter's chunked one, every collective is
    called in the same order by every rank (the model checks), nothing deadlocks, and every
    destination buffer is bit-exact; the chunked broadcast makes more NCCL calls on the
    4 MiB case."""
    out = harness(BOUNDARY + WORKER_ON_MODEL)
    for name, runs in out.items():
        for mode in ("alpa", "chunked"):
            assert runs[mode]["errors"] == [] and runs[mode]["wrong"] == [], (name, mode, runs[mode])
    big = out["4 MiB replicated 1x4 -> 4x4"]
    assert big["chunked"]["collectives"] > big["alpa"]["collectives"] > 0
