"""The runtime on the emulated multi-host cluster (network namespaces + tc): bit-exact
reshardings of the reference suites under every strategy, cleanup (the killed-host
test is in test_runtime_fault.py: it needs this module's cluster gone).

Needs root and iproute2 (CI has both); skipped with the reason elsewhere.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("ray")
pytest.importorskip("torch")

from alpa_comm import Cluster  # noqa: E402
from alpa_comm.suites import n_to_m, one_to_m  # noqa: E402
from alpa_comm.runtime.emulated import netns  # noqa: E402

from conftest import emulation_marks, require_machine_free  # noqa: E402

pytestmark = emulation_marks()
from alpa_comm.resharding.strategies import auto_candidates  # noqa: E402

STRATEGIES = [*auto_candidates(), "alpa", "auto", "signal"]  # every kind that moves data, then the rest


@pytest.fixture(scope="module")
def cluster():
    require_machine_free()
    c = Cluster.emulated(5, 4, nic="1gbit", timeout=30, log=None)
    pids = list(c.network.pids)
    try:
        yield c
    finally:
        c.shutdown()
        assert not netns.existing_namespaces()
        assert not netns.STATE_FILE.exists()
        assert not [p for p in pids if netns._alive(p)], "processes we started are still running"


def run_case(cluster, case, strategy, seed=0):
    x = np.random.default_rng(seed).standard_normal(case.shape).astype(np.float32)
    a = cluster.put(x, case.src_mesh, case.src_spec)
    b = cluster.reshard(a, case.dst_mesh, case.dst_spec, strategy=strategy)
    if strategy != "signal":
        full = tuple((0, n) for n in x.shape)
        from alpa_comm.placement import device_boxes
        from alpa_comm.runtime.executor import view
        shards = b.shards()
        for d, box in device_boxes(x.shape, b.mesh, b.spec).items():
            assert np.array_equal(shards[d], view(x, full, box)), f"device {d} wrong ({case.name}, {strategy})"
    a.delete()
    b.delete()


CASES = n_to_m(2) + one_to_m(2 << 20)  # a few MB each


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.suite}-{c.name}")
def test_reference_cases_every_strategy_bit_exact(cluster, case):
    for strategy in STRATEGIES:
        run_case(cluster, case, strategy)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["S0R", "RS1", "S01R", "RR", "S1S0"]), st.sampled_from(["S0R", "RS0", "RS01", "RR", "S10R"]),
       st.sampled_from(STRATEGIES[:-1]), st.sampled_from(["2x2@0,1", "1x4@0", "2x4@0,1"]),
       st.sampled_from(["2x2@2,3", "3x2@2,3,4", "1x2@4"]))
def test_random_cases_bit_exact(cluster, src_spec, dst_spec, strategy, src_mesh, dst_mesh):
    from alpa_comm.suites import Case
    run_case(cluster, Case.of("random", "h", (96, 48), src_mesh, src_spec, dst_mesh, dst_spec), strategy)


def test_second_up_fails_clearly(cluster):
    with pytest.raises(netns.ClusterExistsError, match="already up"):
        netns.EmulatedNetwork(2).up()


def test_tree_reshard_every_leaf_bit_exact(cluster):
    from alpa_comm.resharding.tree import Placement, tree_flatten
    rng = np.random.default_rng(5)
    xs = {"layers": [{"w": rng.standard_normal((64, 32)).astype(np.float32),
                      "b": rng.standard_normal(32).astype(np.float32)} for _ in range(6)]}
    arrays = {"layers": [{"w": cluster.put(lx["w"], "2x4@0,1", "S01R"), "b": cluster.put(lx["b"], "2x4@0,1", "S01")}
                         for lx in xs["layers"]]}
    placements = {"layers": [{"w": Placement("1x4@2", "RS1"), "b": Placement("1x4@2", "R")} for _ in xs["layers"]]}
    for bucket in (None, "auto"):
        out = cluster.reshard_tree(arrays, placements, bucket_bytes=bucket)
        for (path, x), (_, o) in zip(tree_flatten(xs), tree_flatten(out)):
            assert np.array_equal(o.gather(), x), path
