"""A host killed in the middle of a reshard on the emulated cluster: a CommunicationError
naming it within 60 s, never a hang, and shutdown still removes everything."""
import os
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from alpa_comm import Cluster  # noqa: E402
from alpa_comm.runtime.backend import CommunicationError  # noqa: E402
from alpa_comm.runtime.emulated import netns  # noqa: E402

from conftest import emulation_marks  # noqa: E402

pytestmark = emulation_marks()


def test_killed_host_raises_naming_it_and_cleans_up():
    with Cluster.emulated(3, 2, nic="400mbit", timeout=20, log=None) as c:
        pids = list(c.network.pids)
        x = np.zeros((16 << 20,), np.float32)  # 64 MB: several seconds of send/recv at 400 Mbit/s
        a = c.put(x, "1x1@0", "R")
        victim = c.workers[2].pid.remote()
        import ray
        victim_pid = ray.get(victim)
        threading.Timer(2.0, os.kill, (victim_pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(CommunicationError, match="host 2"):
            c.reshard(a, "2x2@1,2", "R", strategy="send_recv")
        assert time.monotonic() - t0 < 60
        with pytest.raises(CommunicationError, match="unusable"):
            c.reshard(a, "2x2@1,2", "R")
    assert not netns.existing_namespaces()
    assert not [p for p in pids if netns._alive(p)]


def test_link_down_raises_naming_a_host_within_60_s():
    """Cut one host's link in the middle of a reshard: the waits time out and the error
    names the host; nothing hangs; shutdown cleans up."""
    import subprocess
    with Cluster.emulated(3, 2, nic="400mbit", timeout=5, log=None) as c:
        x = np.zeros((16 << 20,), np.float32)
        a = c.put(x, "1x1@0", "R")
        threading.Timer(2.0, subprocess.run, (["ip", "link", "set", "acomm-v2", "down"],)).start()
        t0 = time.monotonic()
        with pytest.raises(CommunicationError, match="host"):
            c.reshard(a, "2x2@1,2", "R", strategy="send_recv")
        assert time.monotonic() - t0 < 60
    assert not netns.existing_namespaces()


def test_a_cluster_left_by_a_killed_run_is_removed_by_the_next_up(tmp_path):
    """A run SIGKILLed before tearing down leaves namespaces behind: the next ``up`` removes
    them (saying why) instead of failing every later run; a live owner still blocks."""
    import subprocess
    import sys

    script = ("import sys, time\n"
              "from alpa_comm.runtime.emulated import netns\n"
              "netns.EmulatedNetwork(2, None).up()\n"
              "print('up', flush=True)\n"
              "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        assert netns.stale_reason() is None  # its owner lives: in use
        with pytest.raises(netns.ClusterExistsError, match=f"PID {owner.pid}"):
            netns.EmulatedNetwork(2, None).up()
        owner.kill()
        owner.wait()
        assert f"PID {owner.pid}" in netns.stale_reason()
        net = netns.EmulatedNetwork(3, None).up()  # removes the stale one, then builds its own
        try:
            assert netns.existing_namespaces() == [netns.namespace(h) for h in range(3)]
        finally:
            net.down()
    finally:
        owner.kill()
        owner.wait()
        if netns.cluster_exists() and netns.stale_reason() is not None:
            netns.remove_existing()
    assert not netns.cluster_exists()
