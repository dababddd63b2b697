"""A pipeline worker killed in the middle of training on the emulated cluster: the run
ends with a CommunicationError naming the host within 60 s, and everything is removed."""
import os
import signal
import threading
import time

import pytest

from alpa_comm.pipeline import generate
from alpa_comm.runtime.backend import CommunicationError
from alpa_comm.runtime.emulated import netns

from conftest import emulation_marks

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("optax")

from alpa_comm.models import build_model  # noqa: E402
from alpa_comm.train.data import synthetic  # noqa: E402
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster  # noqa: E402
from alpa_comm.pipeline.edges import with_skips  # noqa: E402

pytestmark = emulation_marks()
KW = {"layers": 3, "d": 16, "heads": 2, "seq": 8}


def test_a_killed_worker_ends_training_with_the_host_named_and_cleans_up():
    """Over gloo, the default transport. The mailbox bounds its waits whatever the transport;
    TcpBackend's own test names a peer that dies mid-message (test_tcp_backend)."""
    mbs = next(synthetic(4, 4, KW["seq"], seed=3))
    with PipelineCluster.emulated(3, 1, nic="400mbit", timeout=10, log=None) as c:
        pids = list(c.network.pids)
        model = build_model("gpt", 3, **KW)
        pipe = DistributedPipeline(c, "gpt", 3, with_skips(generate("1f1b", 3, 4), model.skips), microbatch_size=4,
                                   model_kwargs=KW)
        pipe.step(mbs)  # compiled and running
        victim = ray.get(c.workers[1].pid.remote())
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(CommunicationError, match="host 1"):
            for _ in range(1000):
                pipe.step(mbs)
        assert time.monotonic() - t0 < 60
    assert not netns.existing_namespaces()
    assert not [p for p in pids if netns._alive(p)]


def test_cpu_cap_puts_a_host_s_processes_in_its_cgroup_and_down_removes_it():
    import subprocess
    try:
        netns.check_cpu_cap(0.5)
    except netns.EmulationUnavailable as e:
        pytest.skip(str(e))
    net = netns.EmulatedNetwork(2, None, cpu=0.5).up()
    try:
        group = netns.cpu_cgroup(1)
        assert int((group / "cpu.cfs_quota_us").read_text()) == netns.CPU_PERIOD_US // 2
        p = subprocess.Popen(net.exec_prefix(1) + ["sleep", "30"])
        net.track(p.pid)
        time.sleep(0.5)
        assert str(p.pid) in (group / "cgroup.procs").read_text().split()
        assert p.pid in netns.namespace_pids(netns.namespace(1))
    finally:
        net.down()
    assert not netns.cpu_cgroup(1).exists() and not netns.existing_namespaces()
    with pytest.raises(netns.AlpaCommError, match="must be a number >= 0.2"):  # every bad value: test_errors_and_cli
        netns.check_cpu_cap(0)
