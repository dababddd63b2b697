"""The driver API on a local Ray cluster (no shaping): data, errors, lifecycle."""
import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from conftest import local_ray_marks  # noqa: E402

from alpa_comm import STRATEGIES, Cluster, InvalidMeshError, InvalidSpecError  # noqa: E402
from alpa_comm.resharding.strategies import carries_data  # noqa: E402
from alpa_comm.runtime.backend import CommunicationError  # noqa: E402


pytestmark = local_ray_marks()


@pytest.fixture(scope="module")
def cluster():
    with Cluster.local(4, 2, timeout=30) as c:
        yield c


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if carries_data(s)])
def test_put_reshard_gather(cluster, strategy):
    x = np.random.default_rng(0).standard_normal((16, 8, 4)).astype(np.float32)
    a = cluster.put(x, "2x2@0,1", "S0RR")
    b = cluster.reshard(a, "2x2@2,3", "RS01R", strategy=strategy)
    assert np.array_equal(b.gather(), x)
    boxes = {d: s.shape for d, s in b.shards().items()}
    assert set(boxes) == {4, 5, 6, 7} and all(shape == (16, 2, 4) for shape in boxes.values())
    assert cluster.last.seconds > 0 and strategy in (cluster.last.plan.strategy, cluster.last.plan.strategy_asked)
    c = cluster.reshard(b, "2x2@0,1", "RRS1", strategy=strategy)  # and back, another layout
    assert np.array_equal(c.gather(), x)


def test_rotated_chains_replicate_over_three_hosts_through_gloo(cluster):
    x = np.random.default_rng(3).standard_normal((12, 10)).astype(np.float32)
    a = cluster.put(x, "1x2@0", "S1R")
    b = cluster.reshard(a, "3x2@1,2,3", "RR", strategy="rotated_chains")
    assert [t.kind for t in cluster.last.plan.transfers] == ["rotated_chains"]
    assert len(cluster.last.plan.transfers[0].parts) == 2
    assert all(np.array_equal(s, x) for s in b.shards().values()) and len(b.shards()) == 6


def test_meshes_and_specs_as_objects(cluster):
    from alpa_comm import DeviceMesh, ShardingSpec
    x = np.arange(64, dtype=np.int32).reshape(8, 8)
    a = cluster.put(x, DeviceMesh.parse("1x2@0", 2), ShardingSpec.parse("RS1"))
    b = cluster.reshard(a, DeviceMesh.parse("2x2@2,3", 2), ShardingSpec.parse("S01R"))
    assert np.array_equal(b.gather(), x)


def test_bad_input_before_any_byte_moves(cluster):
    x = np.zeros((8, 8), np.float32)
    with pytest.raises(InvalidMeshError, match=r"host\(s\) \[6, 7\]"):
        cluster.put(x, "2x2@6,7", "S0R")
    with pytest.raises(InvalidSpecError, match="not divisible"):
        cluster.put(np.zeros((7, 8), np.float32), "2x2@0,1", "S0R")
    a = cluster.put(x, "2x2@0,1", "S0R")
    with pytest.raises(InvalidSpecError, match="3 dimension"):
        cluster.reshard(a, "2x2@2,3", "S0RR")
    colocated = cluster.reshard(a, "2x2@1,2", "RS1")  # meshes sharing host 1: allowed, bit-exact
    assert np.array_equal(colocated.gather(), x)
    with pytest.raises(InvalidMeshError, match=r"host\(s\) \[9\]"):
        cluster.reshard(a, "1x2@9", "RR")


def test_signal_moves_no_data(cluster):
    a = cluster.put(np.ones((8, 8), np.float32), "2x2@0,1", "S0R")
    b = cluster.reshard(a, "2x2@2,3", "RR", strategy="signal")
    with pytest.raises(CommunicationError, match="signal"):
        b.gather()


def test_reshard_tree(cluster):
    from alpa_comm.resharding.tree import Placement
    rng = np.random.default_rng(3)
    xs = {"w": rng.standard_normal((16, 8)).astype(np.float32),
          "b": [rng.standard_normal(8).astype(np.float32) for _ in range(5)]}
    arrays = {"w": cluster.put(xs["w"], "2x2@0,1", "S01R"), "b": [cluster.put(b, "2x2@0,1", "S01") for b in xs["b"]]}
    placements = {"w": Placement("1x2@2", "RS1"), "b": [Placement("1x2@3", "R") for _ in xs["b"]]}
    out = cluster.reshard_tree(arrays, placements, bucket_bytes="auto")
    assert np.array_equal(out["w"].gather(), xs["w"])
    assert all(np.array_equal(o.gather(), x) for o, x in zip(out["b"], xs["b"]))
    assert cluster.last.plan.messages < 6
    with pytest.raises(ValueError, match="structure"):
        cluster.reshard_tree(arrays, {"w": Placement("1x2@2", "RS1")})


def test_reshard_tree_of_a_long_list_keeps_each_leaf_its_own(cluster):
    """A flat list of more than ten leaves of different shapes: leaf i of the plan is array
    i of the list (its paths sort "/10" before "/2" as text), every result bit-exact."""
    from alpa_comm.resharding.tree import Placement
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((4 + 2 * i, 3 + i % 2, 2)).astype(np.float32) for i in range(12)]
    arrays = [cluster.put(x, "2x2@0,1", "S0RR") for x in xs]
    out = cluster.reshard_tree(arrays, [Placement("1x2@2", "RRS1") for _ in xs])
    assert [leaf.shape for leaf in cluster.last.plan.leaves] == [x.shape for x in xs]
    assert all(np.array_equal(o.gather(), x) for o, x in zip(out, xs))


@pytest.mark.parametrize("hosts", [[0, 1, 2, 3], [1, 3]])
def test_gloo_allreduce_is_the_mean_and_matches_the_ring(cluster, hosts):
    import ray

    def _allreduce_on_host(worker, hosts, method, seed):  # nested: Ray ships it by value
        from alpa_comm.runtime.allreduce import allreduce_mean

        rng = np.random.default_rng(seed + worker.host)
        arrays = [rng.standard_normal(n).astype(np.float32) for n in (5, 1000, 3)]
        out = allreduce_mean(worker.backend, arrays, hosts, tag_base=1 << 20, bucket_bytes=2048, method=method)
        return arrays, out

    got = {}
    for method in ("backend", "ring"):
        got[method] = ray.get([cluster.workers[h].run.remote(_allreduce_on_host, hosts, method, 7) for h in hosts])
    inputs = [arrays for arrays, _ in got["backend"]]
    for i in range(3):
        mean = np.mean([a[i] for a in inputs], axis=0)
        for method in got:
            for _, out in got[method]:
                np.testing.assert_allclose(out[i], mean, rtol=1e-6, atol=1e-6)

