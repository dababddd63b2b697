"""Alpa 0.2.3's own code, run here: its real ``device_mesh``, ``resharding_tensor``,
``schedules`` and ``cross_mesh_resharding`` modules import through the harness (stand-ins
only for jax 0.3.22's C++ extension, XLA and Ray), and Alpa's ``VirtualPhysicalMesh`` +
``VirtualDistributedArray`` place every shard where alpa_comm's placements say, for
random specs in the forms alpa_comm hands Alpa (``ShardingSpec.to_alpa``).

Runs in a subprocess (the harness replaces ``jax`` in its process); skipped, with the
reason, where the package registry cannot be reached."""
import json
import random

import pytest

from alpa_comm import ShardingSpec
from alpa_comm.mesh import DeviceMesh
from alpa_comm.placement import Placement

pytestmark = pytest.mark.timeout(600)

ALPA_MODULES = ("alpa.device_mesh", "alpa.pipeline_parallel.resharding_tensor",
                "alpa.pipeline_parallel.schedules", "alpa.pipeline_parallel.cross_mesh_resharding")

PLACE = r'''
import json, sys
mods = load(ALPA_ROOT, MODULES)
from jax.interpreters.pxla import Chunked, NoSharding, Replicated, ShardedAxis, ShardingSpec
from alpa.device_mesh import VirtualPhysicalMesh
from alpa.pipeline_parallel.resharding_tensor import VirtualDistributedArray

class Aval:  # what VirtualDistributedArray reads of jax's ShapedArray
    def __init__(self, shape):
        self.shape = tuple(shape)

def box(index, shape):
    return [[0 if s.start is None else int(s.start), n if s.stop is None else int(s.stop)]
            for s, n in zip(index, shape)]

out = []
for case in json.loads(sys.stdin.read()):
    hosts, dph, shape = case["hosts"], case["dph"], case["shape"]
    sharding = [NoSharding() if s == "N" else Chunked(s) for s in case["sharding"]]
    mapping = [ShardedAxis(a) if k == "S" else Replicated(a) for k, a in case["mapping"]]
    mesh = VirtualPhysicalMesh(host_ids=list(range(hosts)), num_devices_per_host=dph,
                               host_info=[{"NodeManagerAddress": f"10.0.0.{h}"} for h in range(hosts)])
    array = VirtualDistributedArray(device_mesh=mesh, aval=Aval(shape), sharding_spec=ShardingSpec(sharding, mapping))
    tiles = [{"devices": [int(d) for d in t.replica_device_ids], "strs": t.replica_device_strs,
              "box": box(t.indices, shape)} for t in array.tiles.flat]
    out.append({"indices": [box(i, shape) for i in array.indices], "tiles": tiles,
                "device_strs": mesh.device_strs})
print(json.dumps(out))
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
        alpa = spec.to_alpa((hosts, dph))
        cases.append({"hosts": hosts, "dph": dph, "shape": shape, "spec": str(spec),
                      "sharding": ["N" if type(s).__name__ == "NoSharding" else list(s.chunks) for s in alpa.sharding],
                      "mapping": [["S", m.axis] if type(m).__name__ == "ShardedAxis" else ["R", m.replicas]
                                  for m in alpa.mesh_mapping]})
    return cases


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


def test_alpa_places_every_shard_where_our_placements_do(harness):
    cases = random_cases(150)
    done = harness(f"MODULES = {ALPA_MODULES!r}\n" + PLACE, stdin=json.dumps(cases))
    assert done.returncode == 0, done.stderr[-3000:]
    for case, got in zip(cases, json.loads(done.stdout)):
        mesh = DeviceMesh.parse(f"{case['hosts']}x{case['dph']}@" + ",".join(map(str, range(case["hosts"]))),
                                case["dph"])
        ours = Placement(mesh, ShardingSpec.parse(case["spec"])).device_boxes(tuple(case["shape"]))
        flat = list(mesh.devices)  # Alpa's flat device index i is row-major over (host, local device)
        assert [list(map(list, ours[d])) for d in flat] == got["indices"], case
        for tile in got["tiles"]:
            holders = sorted(flat.index(d) for d in flat if list(map(list, ours[d])) == tile["box"])
            assert sorted(tile["devices"]) == holders, (case, tile)
        assert got["device_strs"][:case["dph"]] == [f"10.0.0.0:gpu:{j}" for j in range(case["dph"])]

