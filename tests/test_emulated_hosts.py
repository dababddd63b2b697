"""The many-hosts benchmark (benchmarks/emulated_hosts.py), CI-sized on loopback: every kind
runs in separate plain processes over the TCP transport, bit-exact, and the table, JSON and
picture are written beside the simulator's figures. (On emulated hosts it needs root and
minutes: its results are committed under benchmarks/results/emulated/hosts16.)"""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_kind_runs_bit_exact_in_separate_processes(tmp_path):
    spec = importlib.util.spec_from_file_location("emulated_hosts", ROOT / "benchmarks" / "emulated_hosts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--local", "--hosts", "4", "--size-mb", "0.25", "--repeat", "1", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["strategy"] for r in data["rows"]} == set(bench.KINDS)
    assert all(r["exact"] and r["measured_seconds"] > 0 and r["simulated_seconds"] > 0 for r in data["rows"])
    assert (tmp_path / "results.png").stat().st_size > 0 and "bit-exact: 11 of 11" in (tmp_path / "results.md").read_text()
