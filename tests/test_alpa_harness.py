"""Alpa 0.2.3's own code, run here: its real ``device_mesh``, ``resharding_tensor``,
``schedules`` and ``cross_mesh_resharding`` modules import through the harness (stand-ins
only for jax 0.3.22's C++ extension, XLA and Ray), and Alpa's ``VirtualPhysicalMesh`` +
``VirtualDistributedArray`` place every shard where alpa_comm's placements say, for
random specs in the forms alpa_comm hands Alpa (``ShardingSpec.to_alpa``).

Runs in a subprocess (the harness replaces ``jax`` in its process); skipped, with the
reason, where the package registry cannot be reached."""
import json
import random
from typing import NamedTuple

import pytest

from alpa_comm import ShardingSpec
from alpa_comm.mesh import DeviceMesh
from alpa_comm.placement import Placement

pytestmark = pytest.mark.timeout(600)

ALPA_MODULES = ("alpa.device_mesh", "alpa.pipeline_parallel.resharding_tensor",
                "alpa.pipeline_parallel.schedules", "alpa.pipeline_parallel.cross_mesh_resharding")

SETUP = r'''
import json, sys
import numpy as np
load(ALPA_ROOT, MODULES)
from jax.interpreters.pxla import Chunked, NoSharding, Replicated, ShardedAxis, ShardingSpec
from alpa.global_env import global_config
from alpa.device_mesh import VirtualPhysicalMesh
from alpa.pipeline_parallel.resharding_tensor import VirtualDistributedArray
from alpa.pipeline_parallel.cross_mesh_resharding import (CrossMeshCommunicator, ReshardingStrategy,
                                                          ReshardingTaskSpec, SymbolicBroadcastReshardingTask,
                                                          SymbolicReshardingTask)
global_config.debug_with_pipeshard_runtime = True  # compile the task lists; put nothing on Ray workers

class Aval:  # what Alpa reads of jax's ShapedArray
    def __init__(self, shape):
        self.shape, self.dtype = tuple(shape), "float32"

class Worker:  # a mesh host worker: only its identity is used when compiling
    def __init__(self, host):
        self.host = host

def mesh_of(side):
    mesh = VirtualPhysicalMesh(host_ids=side["hosts"], num_devices_per_host=side["dph"],
                               host_info=[{"NodeManagerAddress": f"10.0.0.{h}"} for h in side["hosts"]])
    mesh.workers = [Worker(h) for h in side["hosts"]]
    return mesh

def spec_of(side):
    return ShardingSpec([NoSharding() if s == "N" else Chunked(s) for s in side["sharding"]],
                        [ShardedAxis(a) if k == "S" else Replicated(a) for k, a in side["mapping"]])

def array_of(mesh, shape, spec):
    return VirtualDistributedArray(device_mesh=mesh, aval=Aval(shape), sharding_spec=spec)

def box(index, shape):
    return [[0 if s.start is None else int(s.start), n if s.stop is None else int(s.stop)]
            for s, n in zip(index, shape)]

class Group:  # Alpa's CollectiveGroup maps, without NCCL
    def __init__(self, meshes):
        self.device_str_to_device_id_map, self.device_str_to_mesh_worker_map = {}, {}
        self.device_str_to_rank_map = {}
        rank = 0
        for mesh in meshes:
            for i, worker in enumerate(mesh.workers):
                for j, local in enumerate(mesh.devices[i]):
                    s = mesh.device_strs[i * mesh.num_devices_per_host + j]
                    self.device_str_to_device_id_map[s] = local
                    self.device_str_to_mesh_worker_map[s] = worker
                    self.device_str_to_rank_map[s] = (rank, local)
                rank += 1

cases, out = json.loads(sys.stdin.read()), []
'''
"""Run before every script below: Alpa's own modules loaded, helpers that build Alpa's
objects from the JSON cases the test sends on stdin, and ``out`` for one result per case."""


def run_alpa(harness, body: str, cases: list[dict]) -> list:
    """``body`` run after ``SETUP`` on ``cases`` in the harness: the ``out`` it fills."""
    done = harness(f"MODULES = {ALPA_MODULES!r}\n" + SETUP + body + "\nprint(json.dumps(out))\n",
                   stdin=json.dumps(cases))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def alpa_side(mesh: DeviceMesh, spec: ShardingSpec) -> dict:
    """A mesh and spec as the JSON the scripts turn into Alpa's objects (``to_alpa``'s forms)."""
    alpa = spec.to_alpa(mesh.shape)
    return {"hosts": list(mesh.hosts), "dph": mesh.devices_per_host,
            "sharding": ["N" if type(s).__name__ == "NoSharding" else list(s.chunks) for s in alpa.sharding],
            "mapping": [["S", m.axis] if type(m).__name__ == "ShardedAxis" else ["R", m.replicas]
                        for m in alpa.mesh_mapping]}


@pytest.fixture(scope="module")
def harness():
    from alpa_comm.integrations.alpa_harness.loader import run_in_subprocess
    from alpa_comm.integrations.alpa_harness.sources import SourcesUnavailable, alpa_root

    try:
        alpa_root()
    except SourcesUnavailable as e:
        pytest.skip(str(e))
    return run_in_subprocess


def test_alpa_s_own_modules_import(harness):
    done = harness(f"mods = load(ALPA_ROOT, {ALPA_MODULES!r})\n"
                   "print(sorted(m.__file__.split('alpa-0.2.3/')[1] for m in mods.values()))")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alpa/pipeline_parallel/cross_mesh_resharding.py" in done.stdout


# ----------------------------------------------------------------- placements
PLACE = r'''
for case in cases:
    mesh, shape = mesh_of(case["side"]), case["shape"]
    array = array_of(mesh, shape, spec_of(case["side"]))
    tiles = [{"devices": [int(d) for d in t.replica_device_ids], "strs": t.replica_device_strs,
              "box": box(t.indices, shape)} for t in array.tiles.flat]
    out.append({"indices": [box(i, shape) for i in array.indices], "tiles": tiles,
                "device_strs": mesh.device_strs})
'''


def random_cases(n: int, seed: int = 0) -> list[dict]:
    """Specs in our notation on (hosts x devices) meshes, with shapes they divide."""
    rng = random.Random(seed)
    cases = []
    while len(cases) < n:
        hosts, dph, rank = rng.randint(1, 3), rng.choice([1, 2, 4]), rng.randint(1, 3)
        free = [0, 1]
        dims = []
        for _ in range(rank):
            choice = rng.choice(["R", "S0", "S1", "S01", "S10"])
            used = [int(c) for c in choice[1:]]
            if all(m in free for m in used):
                for m in used:
                    free.remove(m)
                dims.append(choice)
            else:
                dims.append("R")
        spec = ShardingSpec.parse("".join(dims))
        sizes = {0: hosts, 1: dph}
        shape = []
        for d in dims:
            parts = 1
            for c in d[1:]:
                parts *= sizes[int(c)]
            shape.append(parts * rng.randint(1, 3))
        mesh = DeviceMesh.parse(f"{hosts}x{dph}@" + ",".join(map(str, range(hosts))), dph)
        cases.append({"shape": shape, "spec": str(spec), "mesh": f"{hosts}x{dph}", "side": alpa_side(mesh, spec)})
    return cases


def test_alpa_places_every_shard_where_our_placements_do(harness):
    cases = random_cases(150)
    for case, got in zip(cases, run_alpa(harness, PLACE, cases)):
        dph = case["side"]["dph"]
        mesh = DeviceMesh.parse(f"{case['mesh']}@" + ",".join(map(str, case["side"]["hosts"])), dph)
        ours = Placement(mesh, ShardingSpec.parse(case["spec"])).device_boxes(tuple(case["shape"]))
        flat = list(mesh.devices)  # Alpa's flat device index i is row-major over (host, local device)
        assert [list(map(list, ours[d])) for d in flat] == got["indices"], case
        for tile in got["tiles"]:
            holders = sorted(flat.index(d) for d in flat if list(map(list, ours[d])) == tile["box"])
            assert sorted(tile["devices"]) == holders, (case, tile)
        assert got["device_strs"][:dph] == [f"10.0.0.0:gpu:{j}" for j in range(dph)]


# ---------------------------------------------------------------- suite cases
SMALL = {3: (24, 8, 4), 1: (24,)}
"""Alpa's suite cases at a size whose every element can be checked (same meshes, specs,
divisibility)."""


class SuiteCase(NamedTuple):
    name: str
    shape: tuple
    src_mesh: DeviceMesh
    src_spec: ShardingSpec
    dst_mesh: DeviceMesh
    dst_spec: ShardingSpec
    texts: tuple  # (src mesh, dst mesh) as the suite writes them, for planning on the suite's cluster

    def json(self, **extra) -> dict:
        return {"shape": list(self.shape), "src": alpa_side(self.src_mesh, self.src_spec),
                "dst": alpa_side(self.dst_mesh, self.dst_spec), **extra}


def suite_cases() -> list[SuiteCase]:
    """Every n-to-m and 1-to-m case, at ``SMALL`` size."""
    from alpa_comm.suites import n_to_m, one_to_m

    def mesh(text):
        return DeviceMesh.parse(text, int(text.split("@")[0].split("x")[1]))

    return [SuiteCase(c.name, SMALL[len(c.shape)], mesh(c.src_mesh), ShardingSpec.parse(c.src_spec),
                      mesh(c.dst_mesh), ShardingSpec.parse(c.dst_spec), (c.src_mesh, c.dst_mesh))
            for c in n_to_m(8) + one_to_m(1 << 20)]


PIECES = r'''
for case in cases:
    shape = case["shape"]
    src = array_of(mesh_of(case["src"]), shape, spec_of(case["src"]))
    dst = array_of(mesh_of(case["dst"]), shape, spec_of(case["dst"]))
    spec = ReshardingTaskSpec(src, dst, dst.sharding_spec)
    pieces = []
    for tile, slices, in_dst in spec.dst_tile_to_src_tiles_map:
        for ts, where in zip(slices, in_dst):
            from_src = [[int(t.start) + int(o.start), int(t.start) + int(o.stop)]
                        for t, o in zip(ts.indices, ts.offset)]
            from_dst = [[int(t.start) + int(w.start), int(t.start) + int(w.stop)] for t, w in zip(tile.indices, where)]
            assert from_src == from_dst, (from_src, from_dst)  # Alpa's two views of a piece agree
            pieces.append({"box": from_src, "holders": [int(d) for d in ts.replica_device_ids],
                           "receivers": [int(d) for d in tile.replica_device_ids]})
    out.append(pieces)
'''


def test_alpa_and_alpa_comm_cut_the_suites_into_the_same_pieces(harness):
    """On every n-to-m and 1-to-m case, each destination device needs each element from
    the same source devices in Alpa's own tile map (``ReshardingTaskSpec``) as in our
    unit tasks (``decompose``)."""
    import numpy as np

    from alpa_comm.resharding.unit_tasks import decompose

    cases = suite_cases()
    for c, pieces in zip(cases, run_alpa(harness, PIECES, [c.json() for c in cases])):
        name, shape = c.name, c.shape
        src_flat, dst_flat = list(c.src_mesh.devices), list(c.dst_mesh.devices)
        theirs = {d: np.zeros(shape, np.int64) for d in dst_flat}  # per element: bit mask of holders
        for p in pieces:
            mask = sum(1 << src_flat[h] for h in p["holders"])
            for r in p["receivers"]:
                region = theirs[dst_flat[r]][tuple(slice(a, b) for a, b in p["box"])]
                assert not region.any(), f"case {name}: Alpa sends an element twice to device {dst_flat[r]}"
                region[...] = mask
        ours = {d: np.zeros(shape, np.int64) for d in dst_flat}
        for t in decompose(shape, 4, c.src_mesh, c.src_spec, c.dst_mesh, c.dst_spec):
            mask = sum(1 << s for s in t.src_devices)
            for r in t.dst_devices:
                ours[r][tuple(slice(a, b) for a, b in t.index)] = mask
        boxes = Placement(c.dst_mesh, c.dst_spec).device_boxes(shape)
        for d in dst_flat:
            mine = tuple(slice(a, b) for a, b in boxes[d])
            assert theirs[d][mine].all(), f"case {name}: Alpa leaves part of device {d}'s shard unfilled"
            assert np.array_equal(theirs[d], ours[d]), f"case {name}: device {d} gets elements from other holders"


# ------------------------------------------------- Alpa's own strategy, sent bytes
ALPA_SENDS = r'''
for case in cases:
    src_mesh, dst_mesh = mesh_of(case["src"]), mesh_of(case["dst"])
    shape = case["shape"]
    src = array_of(src_mesh, shape, spec_of(case["src"]))
    final = spec_of(case["dst"])
    sent = final
    if case["rewrite"]:
        try:
            sent = CrossMeshCommunicator._rewrite_allgather_spec(final, dst_mesh.num_hosts, shape)
        except AssertionError as e:
            out.append({"error": str(e)})
            continue
    spec = ReshardingTaskSpec(src, array_of(dst_mesh, shape, sent), final)
    loads = {s: 0 for s in src_mesh.device_strs}
    dst_loads = {s: 0 for s in dst_mesh.device_strs}
    spec.set_resharding_strategy(
        CrossMeshCommunicator._generate_send_recv_resharding_strategy_by_loads(spec, loads, dst_loads))
    task = SymbolicReshardingTask(spec, Group([src_mesh, dst_mesh]), src_mesh, dst_mesh)
    sends = []
    for worker, tasks in task.sender_tasks.items():
        for t in tasks:
            where = [[int(o.start), int(o.stop)] for o in t.tile_spec.offset]
            n = int(np.prod([b - a for a, b in where]))
            sends.append([worker.host, t.tile_spec.rank, n, int(t.device_id), int(t.tile_spec.gpu_idx), where])
    out.append({"sends": sends, "rewritten": sent != final,
                "ranks": [w.host for w in src_mesh.workers + dst_mesh.workers]})
'''


def _busiest(per_host: dict) -> int:
    return max(per_host.values(), default=0)


def test_alpa_comm_never_moves_more_through_the_busiest_host_than_alpa_does(harness):
    """Alpa 0.2.3's own strategy (``normal`` load balance) and task compiler
    (``SymbolicReshardingTask._compile_send_recv_tasks``) on every suite case, plain and
    with its local-allgather rewrite where Alpa accepts the spec: the bytes through the
    busiest host's NIC against alpa_comm's broadcast plan. Alpa sends every source tile
    of a receiver once per (tile, receiver, piece) entry of its order, so a destination
    tile made of m pieces costs m times its bytes; there alpa_comm must move fewer."""
    from alpa_comm import plan_resharding
    from alpa_comm.topology import ClusterSpec

    runs = [(c, rewrite) for c in suite_cases() for rewrite in (False, True)]
    results = run_alpa(harness, ALPA_SENDS, [c.json(rewrite=rewrite) for c, rewrite in runs])
    cluster = ClusterSpec(num_hosts=5, devices_per_host=4)
    resends = 0
    for (c, rewrite), got in zip(runs, results):
        if "error" in got:  # Alpa's rewrite refuses two replicated mesh dims ("Only support 1D and 2D mesh")
            assert rewrite and "Only support" in got["error"]
            continue
        out, into = {}, {}
        for host, rank, n, *_ in got["sends"]:
            dst_host = got["ranks"][rank]
            if dst_host != host:
                out[host] = out.get(host, 0) + 4 * n
                into[dst_host] = into.get(dst_host, 0) + 4 * n
        plan = plan_resharding(c.shape, "float32", c.texts[0], c.src_spec, c.texts[1], c.dst_spec,
                               cluster=cluster, strategy="broadcast", cache=False)
        sent, received = plan.network_bytes()
        ours, theirs = max(_busiest(sent), _busiest(received)), max(_busiest(out), _busiest(into))
        assert ours <= theirs, f"case {c.name}: alpa_comm moves {ours} B through a host, Alpa {theirs} B"
        # the same bytes (sender device, offset in its tile) to the same receiver device again
        unique = {(h, dev, json.dumps(where), r, gpu) for h, r, _, dev, gpu, where in got["sends"]}
        if len(got["sends"]) > len(unique):
            resends += 1
            assert ours < theirs, f"case {c.name}: Alpa re-sends, yet alpa_comm moves as much ({ours} B)"
    assert resends >= 5, resends  # plain mode re-sends on cases 3, 4, 5, 7 and 9 in Alpa 0.2.3


# ------------------------------------- our strategies through Alpa's own compilers
OUR_STRATEGY = r'''
from alpa_comm import plan_resharding
from alpa_comm.integrations.alpa_translate import inputs_from_task_spec, plan_to_strategy

def compiled(case, strategy, mode, task_class):
    # our plan of the case, translated to Alpa's strategy in ``mode`` and compiled by Alpa
    src_mesh, dst_mesh = mesh_of(case["src"]), mesh_of(case["dst"])
    shape = tuple(case["shape"])
    src = array_of(src_mesh, shape, spec_of(case["src"]))
    dst = array_of(dst_mesh, shape, spec_of(case["dst"]))
    spec = ReshardingTaskSpec(src, dst, dst.sharding_spec)
    inp = inputs_from_task_spec(spec)  # our translation, on Alpa's own objects
    plan = plan_resharding(inp.shape, inp.dtype, inp.src_mesh, inp.src_spec, inp.dst_mesh, inp.dst_spec,
                           cluster=inp.cluster(), strategy=strategy)
    per_spec_plans, order = plan_to_strategy(plan, spec, inp.strings, mode)
    spec.set_resharding_strategy(ReshardingStrategy(mode, per_spec_plans, order, False))
    task = task_class(spec, Group([src_mesh, dst_mesh]), src_mesh, dst_mesh)  # Alpa's own task compiler
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)

    def held(device_str):  # what a source or destination device holds of x
        for mesh, array in ((src_mesh, src), (dst_mesh, dst)):
            if device_str in mesh.device_strs:
                return x[array.indices[mesh.device_strs.index(device_str)]]

    return task, order, src_mesh, dst_mesh, held
'''

EXECUTE = OUR_STRATEGY + r'''
for case in cases:
    task, _, src_mesh, dst_mesh, held = compiled(case, case["strategy"], "sendrecv", SymbolicReshardingTask)
    rank_host = [w.host for w in src_mesh.workers + dst_mesh.workers]
    queues, keys = {}, []
    for worker, tasks in task.sender_tasks.items():  # NCCL p2p: in order per (sender, receiver) pair
        for t in tasks:
            s = f"10.0.0.{worker.host}:gpu:{t.device_id}"
            queues.setdefault((worker.host, t.device_id, rank_host[t.tile_spec.rank], t.tile_spec.gpu_idx),
                              []).append(held(s)[tuple(t.tile_spec.offset)].copy())
            keys.append((s, t.tile_spec.rank, t.tile_spec.gpu_idx, str(t.tile_spec.offset)))
    wrong = []
    for worker, tasks in task.receiver_tasks.items():
        for t in tasks:
            buf = np.full(t.shape, np.nan, np.float32)
            for ts in t.tile_specs:
                sender = (rank_host[ts.rank], ts.gpu_idx, worker.host, t.device_id)
                buf[tuple(ts.offset)] = queues[sender].pop(0)
            d = f"10.0.0.{worker.host}:gpu:{t.device_id}"
            if not np.array_equal(buf, held(d)):
                wrong.append(d)
    left = sum(len(q) for q in queues.values())
    out.append({"sends": len(keys), "unique": len(set(keys)), "wrong": wrong, "left": left})
'''


@pytest.mark.parametrize("strategy", ["broadcast", "send_recv"])
def test_our_strategy_through_alpa_s_compiler_is_bit_exact_and_sends_each_piece_once(harness, strategy):
    """Our translation on Alpa's own task specs, our plan back as Alpa's strategy, Alpa's own
    ``SymbolicReshardingTask`` compiling it, and the compiled send/recv lists executed on
    NumPy buffers as NCCL pairs them (in order per sender/receiver pair): every destination
    buffer bit-exact, nothing left unreceived, no piece sent twice."""
    cases = suite_cases()
    for c, got in zip(cases, run_alpa(harness, EXECUTE, [c.json(strategy=strategy) for c in cases])):
        assert not got["wrong"] and got["left"] == 0, (c.name, got)
        assert got["sends"] == got["unique"], f"case {c.name}: a piece is sent twice ({got})"


EXECUTE_BROADCAST = OUR_STRATEGY + r'''
for case in cases:
    task, order, _, dst_mesh, held = compiled(case, "broadcast", "broadcast", SymbolicBroadcastReshardingTask)
    data = {}  # broadcast group -> the bytes its root sends
    for worker, groups in task.broadcast_tasks.items():
        for key, g in groups.items():
            if g.devices_global_rank[:1] == [0]:
                data[key] = held(f"10.0.0.{worker.host}:gpu:{g.devices_ids[0]}")[tuple(g.tensor_slices[0])]
    buffers = {}
    for worker, groups in task.broadcast_tasks.items():
        for key, g in groups.items():
            for dev, rank, where in zip(g.devices_ids, g.devices_global_rank, g.tensor_slices):
                if rank == 0:
                    continue
                d = f"10.0.0.{worker.host}:gpu:{dev}"
                buf = buffers.setdefault(d, np.full(g.recv_tile_shape, np.nan, np.float32))
                buf[tuple(where)] = data[key]
    wrong = [d for d in dst_mesh.device_strs if d not in buffers or not np.array_equal(buffers[d], held(d))]
    out.append({"wrong": wrong, "groups": len(data), "order": len(order)})
'''


def test_our_broadcast_strategy_through_alpa_s_broadcast_compiler_is_bit_exact(harness):
    """The broadcast mode that ``comm_optimization="alpa_comm"`` sets: our plan as Alpa's
    broadcast strategy, compiled by Alpa's own ``SymbolicBroadcastReshardingTask`` and its
    broadcast groups executed on NumPy buffers: every destination device bit-exact, one
    group per piece."""
    cases = suite_cases()
    for c, got in zip(cases, run_alpa(harness, EXECUTE_BROADCAST, [c.json() for c in cases])):
        assert not got["wrong"], (c.name, got)
        assert got["groups"] == got["order"], (c.name, got)


def test_facts_the_adapter_relies_on_hold_in_alpa_0_2_3(harness):
    """Alpa reports the version the adapter checks for, and has no schedule registry (so the
    adapter's eager-1F1B cannot register there; it refuses and leaves Alpa untouched)."""
    from alpa_comm.integrations.alpa import SUPPORTED_ALPA_VERSION

    done = harness('mods = load(ALPA_ROOT, ("alpa.version", "alpa.pipeline_parallel.schedules"))\n'
                   'print(mods["alpa.version"].__version__)\n'
                   'print(hasattr(mods["alpa.pipeline_parallel.schedules"], "pipeline_schedule"))\n')
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [SUPPORTED_ALPA_VERSION, "False"]
