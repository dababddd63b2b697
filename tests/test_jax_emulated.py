"""``alpa_comm.jax`` across the emulated cluster: one ``jax.distributed`` process per
emulated host (its own network namespace and ``tc``-shaped NIC, CPU devices, gloo over
the shaped links), random meshes and PartitionSpecs bit-exact, a weight-sync pytree in
bfloat16 on the wire, and a process killed mid-transfer named in every survivor.

Needs root and iproute2 (CI has both); skipped with the reason elsewhere."""
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import jax_processes
from conftest import emulation_marks, require_machine_free
from test_jax_processes import DEVICES, WORLD, cases

pytest.importorskip("jax")
pytest.importorskip("torch")
pytestmark = emulation_marks() + [pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def network():
    from alpa_comm.runtime.emulated import netns

    require_machine_free()
    net = netns.EmulatedNetwork(WORLD, "400mbit").up()
    pids = net.pids
    try:
        yield net
    finally:
        net.down()
        assert not netns.existing_namespaces() and not netns.STATE_FILE.exists()
        assert not [p for p in pids if netns._alive(p)], "processes we started are still running"


def _ok(results, batch):
    for rank, (out, err) in enumerate(results):
        assert out is not None, f"rank {rank} failed:\n{err}"
        for case, r in zip(batch, out):
            assert r.get("skipped") or ("error" not in r and not r["wrong"]), (rank, case, r)


@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],  # no shrinking: a launch each
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.lists(cases(), min_size=5, max_size=5))
def test_random_cases_across_emulated_hosts(network, batch):
    _ok(jax_processes.run(WORLD, DEVICES, batch, network=network), batch)


def test_weight_sync_and_a_killed_host(network):
    """A pytree from an FSDP layout on hosts 0-1 to a tensor-parallel layout on host 2 in
    bfloat16 on the wire, received as float32; then host 1 exits instead of the next
    resharding and hosts 0 and 2 both name it."""
    train = {"ids": [[0, 1], [2, 3]], "axes": ["data", "fsdp"], "spec": "S01R"}
    infer = {"ids": [[4, 5]], "axes": ["replica", "tp"], "spec": "RS1"}
    tree = {"tree": [{"shape": [64, 32], "dtype": "float32", "src": train, "dst": infer},
                     {"shape": [32], "dtype": "float32", "src": {**train, "spec": "S01"},
                      "dst": {**infer, "spec": "R"}}], "wire": "bfloat16"}
    everyone = {"ids": [[0, 1], [2, 3], [4, 5]], "axes": ["x", "y"], "spec": "S0R"}
    move = {"shape": [6, 6], "dtype": "float32", "src": everyone, "dst": {**everyone, "spec": "RS0"},
            "timeout": 10}
    results = jax_processes.run(WORLD, DEVICES, [tree, move, {**move, "kill": 1}], network=network, timeout=300)
    assert results[1][0] is None
    for rank in (0, 2):
        out, err = results[rank]
        assert out is not None, err
        assert not out[0].get("error") and not out[0]["wrong"] and not out[1]["wrong"], out
        assert "host 1" in out[2].get("error", "") and out[2]["seconds"] < 60, out[2]
