"""benchmarks/predictor_check.py runs on a committed result directory and reports every
calibration run three ways, with errors a reader can check against the measured times."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks/results/train_emulated_gpt_200mbit"


def _tool():
    spec = importlib.util.spec_from_file_location("predictor_check", ROOT / "benchmarks/predictor_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not (RESULT / "calibration_gpt.json").exists(), reason="no committed calibration runs")
def test_predictor_check_on_a_committed_run(tmp_path):
    assert _tool().main([str(RESULT), "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert len(rows) == 4 and all(r["measured_s"] > 0 for r in rows)
    for r in rows:  # GPT has no skip edges: every predictor lands near the measurement
        for key in ("draws_s", "replay_s", "replay_own_links_s"):
            assert abs(r[key] - r["measured_s"]) / r["measured_s"] < 0.25, (r["schedule"], key, r)
        assert 0 < r["replay_no_transfers_s"] <= r["replay_s"] + 1e-9, r  # free transfers never slow a replay
    assert (tmp_path / "errors.png").stat().st_size > 0
    md = (tmp_path / "results.md").read_text()
    assert "replay, own links" in md and "exposed" in md


def test_predictor_check_names_a_directory_without_results(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _tool().main([str(tmp_path)])
    assert str(tmp_path) in capsys.readouterr().err
