"""alpa-comm bench on a local Ray cluster: every run verified, the documented JSON, a
corrupted shard caught, bad options rejected before anything starts."""
import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from conftest import local_ray_marks  # noqa: E402

from alpa_comm.cli import main  # noqa: E402
from alpa_comm.runtime import Cluster  # noqa: E402
from alpa_comm_bench import acceptance, cluster_runs, report, shapes  # noqa: E402
from alpa_comm_bench.result import VerificationError  # noqa: E402
from alpa_comm_bench.weight_sync import run_weight_sync  # noqa: E402


pytestmark = local_ray_marks()


@pytest.fixture(scope="module")
def cluster():
    with Cluster.local(5, 4, timeout=30) as c:
        yield c


def test_bench_runs_verifies_and_writes(cluster, tmp_path):
    calibrated, t_copy, results = cluster_runs.run(cluster, ["1-to-m"], size_mb=0.0625, repeat=1, progress_stream=None)
    assert t_copy > 0 and calibrated.nic_send_gbps > 0
    methods = {r.method for r in results}
    assert {"alpa_send_recv", "alpa", "broadcast_naive", "broadcast_size", "broadcast", "auto", "signal"} == methods
    assert all(r.verified is True for r in results if r.strategy != "signal")
    paths = report.write_bench_outputs(results, {"description": "local"}, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert set(data) == {"cluster", "results"}
    for key in ("suite", "case", "method", "seconds", "median_seconds", "lower_bound_seconds",
                "predicted_seconds", "verified"):
        assert key in data["results"][0]
    assert paths["1-to-m"].read_bytes()[:4] == b"\x89PNG"
    assert "speedup vs alpa" in report.results_table(results)


def test_a_corrupted_shard_fails_loudly(cluster, monkeypatch):
    real = cluster.checksums

    def corrupt(array):
        got = real(array)
        first = sorted(got)[0]
        got[first] = "0" * 32
        return got

    monkeypatch.setattr(cluster, "checksums", corrupt)
    case = cluster_runs.suite_cases("1-to-m", 0.0625)[1]
    with pytest.raises(VerificationError, match="received wrong data"):
        cluster_runs.run_case(cluster, cluster.spec, "1-to-m", case, cluster_runs.bench_methods("1-to-m")[:1],
                              repeat=1)


def test_bad_options_fail_before_starting(capsys):
    assert main(["bench", "--repeat", "0", "--cluster", "local"]) == 2
    assert "--repeat" in capsys.readouterr().err
    assert main(["bench", "--hosts", "2", "--cluster", "local"]) == 2  # the suites need 5 hosts
    assert "host" in capsys.readouterr().err
    assert main(["bench", "--suite", "same-layout", "--cluster", "local"]) == 2  # the user's processes only
    assert "--mode processes" in capsys.readouterr().err
    assert main(["bench", "--streams", "2", "--cluster", "local"]) == 2
    assert "--streams does nothing without --mode processes" in capsys.readouterr().err


def test_weight_sync_suite_runs_verified(cluster, monkeypatch):
    def tiny():
        P = shapes.Param
        small = {"layers": [{"w": P((16, 8), "S01R", "RS1"), "b": P((8,), "S01", "R")} for _ in range(3)]}
        return {"small-leaves": small}
    monkeypatch.setattr(shapes, "weight_sync_trees", tiny)
    results = run_weight_sync(cluster, cluster.spec, repeat=1)
    assert [r.method for r in results] == ["per_array", "tree_joint", "tree_packed"]
    assert all(r.verified for r in results)
    assert results[2].extra["messages"] < results[1].extra["messages"]
    assert any("weight-sync" in c for c, _, _ in acceptance.acceptance(results))
