"""The examples run as the docs show them (small models): every shard each inference
process or engine receives is checked inside the example, which exits non-zero on a
wrong one."""
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import local_ray_marks

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--steps", "2", "--layers", "1", "--width", "64"]


@pytest.mark.parametrize("script,extra", [("weight_sync.py", []), ("weight_sync.py", ["--wire-dtype", "bfloat16"]),
                                          pytest.param("weight_sync_ray.py", [], marks=local_ray_marks())])
def test_weight_sync_examples_run_and_verify(script, extra):
    pytest.importorskip("torch")
    if script.endswith("_ray.py"):
        pytest.importorskip("ray")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *SMALL, *extra], capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if "step 1" in ln]
    assert lines and all("0 wrong shards" in ln for ln in lines if "wrong" in ln), done.stdout


def test_jax_quickstart_runs_and_is_bit_exact():
    """docs/jax.md's first example: three processes it starts itself, one layout change and
    a tree onto the third process, every received shard checked against NumPy (needs only
    the ``jax`` extra)."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "jax_quickstart.py")], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "process 2: every shard bit-exact" in done.stdout, done.stdout
