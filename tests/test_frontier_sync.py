"""benchmarks/frontier_sync.py on a tiny model: its rows, table columns and marks; the
frontier shapes against the published parameter counts; the tree planner's shared
layouts and identity-keyed cache hits."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from alpa_comm import ClusterSpec, Resharding
from alpa_comm.resharding.cache import PlanCache
from alpa_comm.resharding.planner import LowerBounds
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.resharding.unit_tasks import decompose
from alpa_comm_bench import frontier_shapes as fs

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("frontier_sync", ROOT / "benchmarks/frontier_sync.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("frontier_sync", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("model, billions, leaves", [("deepseek-v3", 671.0, 1025), ("kimi-k2", 1026.4, 1035),
                                                     ("qwen3-235b", 235.1, 1131)])
def test_published_shapes(model, billions, leaves):
    m = fs.MODELS[model]
    assert round(fs.param_count(m) / 1e9, 1) == billions
    assert len(fs.model_params(m)) == leaves


def test_every_scenario_layout_is_valid():
    """Each published scenario's leaves resolve on its cluster (specs divide the shapes)."""
    for s in fs.SCENARIOS:
        cluster = fs.frontier_cluster(s)
        moves = fs.tree(s)
        for move in moves[:40]:  # the embedding, a dense layer and a MoE layer
            move.resolve(cluster)
        assert {m.dtype for m in moves} == ({fs.BF16} if s.wire == "bf16" else {fs.BF16, fs.FP8_WIRE})


def test_tiny_rows_table_and_marks():
    bench = _bench()
    s = fs.Scenario("tiny", "ep_fsdp", 4, 2, 2, "fp8", devices=4)
    row = bench.measure(s, fs.TINY, cached_repeat=5)
    assert set(bench.COLUMNS) <= set(row)
    assert row["leaves"] == len(fs.model_params(fs.TINY)) and row["unit_tasks"] > row["leaves"]
    assert row["bound_s"] > 0 and row["simulated_s"] >= row["bound_s"] * 0.999
    text = bench.table([row])
    header = text.splitlines()[0]
    for col in ("cold plan (s)", "cached (ms)", "planner peak (MiB)", "simulated (ms)", "bound (ms)", "x bound",
                "simulator run (s)", "marks: cold / cached / sim"):
        assert col in header
    good = dict(row, cold_s=1.0, cached_ms=0.1, x_bound=1.05)
    assert bench.marks(good) == {"cold": True, "cached": True, "sim": True}
    bad = dict(row, cold_s=5.5, cached_ms=0.6, x_bound=1.2)
    assert bench.marks(bad) == {"cold": False, "cached": False, "sim": False}
    assert "**no**" in bench.table([bad]) and "**no**" not in bench.table([good])


def test_grouped_bounds_equal_the_pass_over_every_task():
    s = fs.Scenario("tiny", "fsdp", 2, 2, 1, devices=4)
    cluster = fs.frontier_cluster(s)
    moves = [m.resolve(cluster) for m in fs.tree(s, fs.TINY)]
    per = [decompose(m.shape, 2 if m.dtype == fs.BF16 else 1, m.src_mesh, m.src_spec, m.dst_mesh, m.dst_spec)
           for m in moves]
    flat = LowerBounds([t for ts in per for t in ts], cluster)
    groups = {}
    for m, ts in zip(moves, per):
        groups.setdefault(repr(m), [ts, 0])[1] += 1
    grouped = LowerBounds(None, cluster, [tuple(g) for g in groups.values()])
    for strategy in ("broadcast", "send_recv"):
        assert grouped.bandwidth(strategy) == flat.bandwidth(strategy)
        assert grouped.latency_aware(strategy) == flat.latency_aware(strategy)
    assert len(grouped.tasks) == len(flat.tasks)


def test_identity_hits_never_serve_a_changed_tree():
    cluster = ClusterSpec(num_hosts=3, devices_per_host=2, nic_send_gbps=100)

    def move(n):
        return Resharding.between((n, 8), "float32", "2x2@0,1", "S01R", "1x2@2", "RS1")

    cache = PlanCache()
    leaves = [move(8) for _ in range(4)]
    first = plan_resharding_tree(leaves, cluster=cluster, cache=cache)
    assert plan_resharding_tree(leaves, cluster=cluster, cache=cache).cache_hit
    leaves[2] = move(16)  # the same list, one leaf replaced
    changed = plan_resharding_tree(leaves, cluster=cluster, cache=cache)
    assert not changed.cache_hit and changed.nbytes > first.nbytes
    assert plan_resharding_tree([move(8) for _ in range(4)], cluster=cluster, cache=cache).transfers == first.transfers
