import json
import subprocess
import sys

import pytest

from alpa_comm import (ClusterSpec, InvalidMeshError, InvalidOptionError, InvalidSpecError, plan_resharding)
from alpa_comm.cli import main

GOOD = dict(shape=(8, 8), dtype="float32", src_mesh="2x2@0,1", src_spec="S0R", dst_mesh="2x2@2,3", dst_spec="RS1")


def plan(**kw):
    args = {**GOOD, **kw}
    return plan_resharding(args.pop("shape"), args.pop("dtype"), args.pop("src_mesh"), args.pop("src_spec"),
                           args.pop("dst_mesh"), args.pop("dst_spec"), **args)


@pytest.mark.parametrize("kw,err,fragment", [
    (dict(src_spec="S0Q"), InvalidSpecError, "S0Q"),
    (dict(src_spec="S0RR"), InvalidSpecError, "3 dimension"),
    (dict(dst_spec="S1S1"), InvalidSpecError, "mesh dim 1 more than once"),
    (dict(dst_spec="S2R"), InvalidSpecError, "mesh dim 2"),
    (dict(shape=(6, 8), src_spec="S01R"), InvalidSpecError, "length 6 is not divisible by its 4"),
    (dict(dst_mesh="2x2@2,9", cluster=ClusterSpec(4, 2)), InvalidMeshError, "host\\(s\\) \\[9\\]"),
    (dict(strategy="teleport"), InvalidOptionError, "teleport"),
    (dict(loadbalance="best"), InvalidOptionError, "best"),
    (dict(dtype="float8"), InvalidOptionError, "float8"),
    (dict(shape=(0, 8)), InvalidSpecError, "positive"),
    (dict(chunks=0), InvalidOptionError, "chunks"),
])
def test_bad_input_names_the_value(kw, err, fragment):
    with pytest.raises(err, match=fragment):
        plan(**kw)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        plan(strategy="nope")


def test_cli_plan_text(capsys):
    assert main(["plan", "--shape", "1024,1024,16", "--src-mesh", "2x4@0,1", "--src-spec", "S0RR",
                 "--dst-mesh", "2x4@2,3", "--dst-spec", "S0RR", "--strategy", "broadcast"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "lower bound" in out and "broadcast" in out


def test_cli_plan_json_contract(capsys):
    assert main(["plan", "--shape", "64,64,4", "--src-mesh", "2x4@0,1", "--src-spec", "RS0R", "--dst-mesh",
                 "2x4@2,3", "--dst-spec", "S0RR", "--strategy", "send_recv", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("predicted_seconds", "lower_bound_seconds", "strategy", "loadbalance", "unit_tasks"):
        assert key in d
    e = d["unit_tasks"][0]
    for key in ("index", "src_devices", "dst_devices", "nbytes", "sender", "strategy"):
        assert key in e
    assert all(len(pair) == 2 for pair in e["index"])
    # send/recv: a slice replicated on two hosts may be served by both, one entry per sender
    per_task = {}
    for e in d["unit_tasks"]:
        per_task.setdefault(e["task"], []).append(e["sender"])
    assert all(len(set(s)) == len(s) for s in per_task.values())


def test_cli_plan_with_cluster_options(capsys):
    assert main(["plan", "--shape", "16,16", "--src-mesh", "1x2@0", "--src-spec", "S1R", "--dst-mesh", "2x2@1,2",
                 "--dst-spec", "RR", "--hosts", "6", "--devices-per-host", "4", "--nic-gbps", "25"]) == 0
    out = capsys.readouterr().out
    assert "6 hosts x 4 devices, NIC 25 Gbit/s" in out


def test_cli_suite(capsys):
    assert main(["plan", "--suite", "n-to-m", "--last-dim", "8"]) == 0
    out = capsys.readouterr().out
    assert "alpa_send_recv" in out and "broadcast" in out and "| 9 " in out


def test_cli_bad_input_exit_code(capsys):
    assert main(["plan", "--shape", "8,8", "--src-mesh", "2x2@0,1", "--src-spec", "S0X", "--dst-mesh", "2x2@2,3",
                 "--dst-spec", "RR"]) == 2
    assert "S0X" in capsys.readouterr().err
    assert main(["plan", "--shape", "8,8"]) == 2
    assert "--src-mesh" in capsys.readouterr().err


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "alpa_comm.cli", "plan", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--loadbalance" in out.stdout


def test_a_nic_bucket_set_by_hand_is_taken_or_named(monkeypatch):
    """``ALPA_COMM_TBF_BURST`` replaces the computed tbf bucket, read as tc reads a size; a
    value that is no size, or a bucket smaller than a frame (tbf would drop full frames and
    a transfer stall), is named before any namespace exists (``up`` computes it first)."""
    import re

    from alpa_comm.runtime.emulated import netns

    monkeypatch.delenv(netns.TBF_BURST_ENV, raising=False)
    assert netns._burst("100mbit") == f"{64 * 1024}b"  # 1/250 s of 100 Mbit/s is 50 kB: the floor
    assert netns._burst("1gbit") == "500000b"
    for size, n in (("1mb", 1 << 20), ("1048576b", 1 << 20), ("256k", 256 << 10), ("64KB", 64 << 10),
                    ("1.5M", 3 << 19), ("4096", 4096)):
        monkeypatch.setenv(netns.TBF_BURST_ENV, size)
        assert netns._burst("100mbit") == f"{n}b"
    for bad in ("0b", "-5", "1mbit", "lots", "1x", "100b", "1k", "4g"):
        monkeypatch.setenv(netns.TBF_BURST_ENV, bad)
        with pytest.raises(netns.AlpaCommError, match=re.escape(f"ALPA_COMM_TBF_BURST={bad!r}")):
            netns._burst("100mbit")


def test_a_cpu_share_a_cgroup_cannot_hold_is_named_before_anything_starts():
    """An emulated host's CPU cap must be a finite number of cores of at least the kernel's
    least quota per period: 0.1 core, inf or a bool are named (not an OverflowError or a
    failed cgroup write after the namespaces exist), by the trainer's options too."""
    import numpy as np

    from alpa_comm.runtime.emulated import netns
    from alpa_comm.train.trainer import TrainConfig

    for bad in (0, 0.1, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(netns.AlpaCommError, match=f"must be a number >= 0.2.*got {bad!r}"):
            netns.check_cpu_cores(bad)
    for good in (0.2, 0.5, 2, np.float32(0.5), np.int64(1)):
        netns.check_cpu_cores(good)
    with pytest.raises(InvalidOptionError, match="--host-cpus: .*got 0.1"):
        TrainConfig(host_cpus=0.1)
