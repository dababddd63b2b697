"""``benchmarks/weight_sync_scale.py --local`` at a tiny size: six JAX processes on
loopback run every method, verify every received shard and report each process's
measured peak memory; receiving into the old weights holds less than a fresh copy."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "weight_sync_scale.py"


def test_every_method_verifies_and_reports_memory(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--local", "--layers", "2", "--width", "128", "--vocab", "4096",
                        "--repeat", "1", "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["method"] for row in rows] == ["alpa_comm", "alpa_comm_atomic", "alpa_comm_fresh", "jax_device_put",
                                              "gather_broadcast"]
    assert all(row["verified"] and row["leaves"] == 2 * 12 + 3 and row["seconds"] > 0 for row in rows)
    assert set(rows[0]) == {"method", "model_bytes", "leaves", "replicas", "nic", "seconds", "gbps_busiest_receiver",
                            "bound_seconds", "peak_extra_bytes", "bucket_bytes", "verified"}
    assert all(row["peak_extra_bytes"] >= 0 for row in rows)
    for name in ("results.md", "results.json", "results.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_help_and_bad_input_are_named():
    assert "weight sync" in subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                                           text=True).stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--local", "--methods", "alpa_comm,nccl"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "unknown method(s) ['nccl']" in r.stderr
