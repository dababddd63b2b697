import subprocess
import sys


def test_planning_imports_no_heavy_frameworks():
    code = ("import sys, alpa_comm, alpa_comm.cli, alpa_comm.resharding.verify\n"
            "alpa_comm.plan_resharding((8, 8), 'float32', '2x2@0,1', 'S0R', '2x2@2,3', 'RS1')\n"
            "bad = [m for m in ('jax', 'ray', 'torch', 'cupy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
