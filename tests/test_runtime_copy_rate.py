"""A Cluster plans with its hosts' measured copy rate unless the user gives one: the
spec's 1200 Gbit/s default is NVLink's, a CPU host's device copies are NumPy copies,
and planning with the default picks a few big chunks whose copies trail the wire."""
import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from alpa_comm import Cluster  # noqa: E402
from alpa_comm.runtime.worker import HostWorker  # noqa: E402
from conftest import local_ray_marks  # noqa: E402

pytestmark = local_ray_marks()


def test_the_probe_measures_a_positive_rate():
    assert HostWorker(0, 1, 2).copy_gbps(nbytes=1 << 20, repeats=1) > 0


def test_plans_with_the_measured_rate_and_keeps_a_given_one():
    with Cluster.local(2, 2, timeout=30) as c:
        measured = c.spec.intra_host_gbps
        assert 0 < measured < 1200
        assert f"intra-host {measured:g} Gbit/s" in c.spec.describe()
        plan = c.plan(c.put(np.zeros(1 << 20, "float32"), "1x1@0", "R"), "1x2@1", "R")
        assert plan.cluster.intra_host_gbps == measured
    with Cluster.local(1, 2, timeout=30, intra_host_gbps=77.0) as c:
        assert c.spec.intra_host_gbps == 77.0
