"""The plan cache: the same resharding planned again is the same plan, served at once;
anything the planner reads changes the key."""
from alpa_comm import ClusterSpec, DeviceMesh, ShardingSpec, plan_resharding
from alpa_comm.placement import Resharding
from alpa_comm.resharding.cache import PLAN_CACHE, PlanCache
from alpa_comm.resharding.tree import plan_resharding_tree

ARGS = ((64, 32), "float32", "2x2@0,1", "S0R", "2x2@2,3", "RS1")


def test_a_second_plan_is_the_first_one_marked_as_a_hit():
    cache = PlanCache()
    first = plan_resharding(*ARGS, cache=cache)
    second = plan_resharding(*ARGS, cache=cache)
    assert not first.cache_hit and second.cache_hit
    assert second.transfers is first.transfers and second.predicted_seconds == first.predicted_seconds
    assert "served from the plan cache" in second.explain() and "plan cache" not in first.explain()
    assert cache.stats() == {"plans": 1, "hits": 1, "misses": 1, "max_plans": cache.max_plans}
    assert second.to_json() == first.to_json()  # the JSON form does not carry the label


def test_text_and_objects_share_an_entry_and_options_do_not():
    cache = PlanCache()
    plan_resharding(*ARGS, cache=cache)
    objects = (DeviceMesh.parse("2x2@0,1", 2), ShardingSpec.parse("S0R"), DeviceMesh.parse("2x2@2,3", 2),
               ShardingSpec.parse("RS1"))
    assert plan_resharding((64, 32), "float32", *objects, cache=cache).cache_hit
    for change in ({"strategy": "send_recv"}, {"loadbalance": "naive"}, {"chunks": 4}, {"seed": 1},
                   {"cluster": ClusterSpec(num_hosts=4, devices_per_host=2, nic_send_gbps=25)}):
        assert not plan_resharding(*ARGS, cache=cache, **change).cache_hit, change
    assert not plan_resharding((64, 16), *ARGS[1:], cache=cache).cache_hit


def test_bypass_and_eviction():
    cache = PlanCache(max_plans=2)
    assert not plan_resharding(*ARGS, cache=False).cache_hit
    for chunks in (1, 2, 3):
        plan_resharding(*ARGS, chunks=chunks, cache=cache)
    assert len(cache) == 2 and not plan_resharding(*ARGS, chunks=1, cache=cache).cache_hit
    cache.clear()
    assert len(cache) == 0 and cache.hits == 0


def test_the_default_cache_serves_repeated_plans_and_tree_plans():
    PLAN_CACHE.clear()
    plan_resharding(*ARGS)
    assert plan_resharding(*ARGS).cache_hit
    tree = {"w": Resharding.between((32, 16), "float32", "2x4@0,1", "S01R", "1x4@2", "RS1"),
            "b": [Resharding.between((16,), "float32", "2x4@0,1", "S01", "1x4@2", "R")]}
    cluster = ClusterSpec(num_hosts=3, devices_per_host=4)
    first = plan_resharding_tree(tree, cluster=cluster)
    again = plan_resharding_tree(tree, cluster=cluster)
    assert again.cache_hit and again.transfers is first.transfers
    assert not plan_resharding_tree(tree, cluster=cluster, bucket_bytes=None).cache_hit


def test_a_disk_store_serves_plans_to_a_new_process(tmp_path):
    import subprocess
    import sys

    from alpa_comm.runtime.plan_store import DiskPlanStore

    store = DiskPlanStore(tmp_path / "plans")
    first = plan_resharding(*ARGS, cache=PlanCache(store=store))
    assert len(store) == 1 and not first.cache_hit
    fresh = PlanCache(store=store)  # a new process's empty memory, the same directory
    again = plan_resharding(*ARGS, cache=fresh)
    assert again.cache_hit and again.to_json() == first.to_json()
    assert fresh.stats()["store_hits"] == 1 and plan_resharding(*ARGS, cache=fresh).cache_hit
    code = ("import sys; from alpa_comm import plan_resharding; from alpa_comm.runtime.plan_store import "
            "use_disk_plan_cache; use_disk_plan_cache(sys.argv[1]); "
            f"p = plan_resharding(*{ARGS!r}); print(p.cache_hit)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "plans")], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_a_damaged_entry_is_a_miss_and_is_rewritten(tmp_path):
    from alpa_comm.runtime.plan_store import DiskPlanStore

    store = DiskPlanStore(tmp_path)
    plan_resharding(*ARGS, cache=PlanCache(store=store))
    (entry,) = tmp_path.glob("*.plan.pickle")
    entry.write_bytes(entry.read_bytes()[:20])
    assert not plan_resharding(*ARGS, cache=PlanCache(store=store)).cache_hit
    assert plan_resharding(*ARGS, cache=PlanCache(store=store)).cache_hit
    assert not list(tmp_path.glob("*.tmp"))


def test_a_store_on_a_file_is_refused_by_name(tmp_path):
    import pytest

    from alpa_comm.errors import InvalidOptionError
    from alpa_comm.runtime.plan_store import DiskPlanStore

    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidOptionError, match="is a file"):
        DiskPlanStore(tmp_path / "f")


def test_a_repeated_call_is_served_without_parsing_anything(monkeypatch):
    """The inputs as given are an alias of the parsed key: a repeated call (even on
    8,192-device meshes, where resolving takes milliseconds) resolves nothing; clearing
    the cache or evicting the plan drops the alias with it."""
    cache = PlanCache(max_plans=1)
    big = ((1 << 16, 64), "float32", "512x8@0-511", "S01R", "512x8@512-1023", "RS1")
    cluster = ClusterSpec(num_hosts=1024, devices_per_host=8)
    first = plan_resharding(*big, cluster=cluster, cache=cache)
    tree = [Resharding.between((32, 16), "float32", "2x4@0,1", "S01R", "1x4@2", "RS1")]
    small = ClusterSpec(num_hosts=3, devices_per_host=4)

    def refuse(self, *a, **k):
        raise AssertionError("resolved again")
    real = Resharding.resolve
    monkeypatch.setattr(Resharding, "resolve", refuse)
    again = plan_resharding(*big, cluster=cluster, cache=cache)
    assert again.cache_hit and again.transfers is first.transfers
    monkeypatch.setattr(Resharding, "resolve", real)
    plan_resharding_tree(tree, cluster=small, cache=cache)  # evicts the big plan (max_plans=1)
    monkeypatch.setattr(Resharding, "resolve", refuse)
    assert plan_resharding_tree(tree, cluster=small, cache=cache).cache_hit
    try:
        plan_resharding(*big, cluster=cluster, cache=cache)
    except AssertionError as e:
        assert "resolved again" in str(e)  # its plan left the cache: the alias went too
    else:
        raise AssertionError("an evicted plan was served")
    monkeypatch.setattr(Resharding, "resolve", real)
    cache.clear()
    monkeypatch.setattr(Resharding, "resolve", refuse)
    try:
        plan_resharding_tree(tree, cluster=small, cache=cache)
    except AssertionError as e:
        assert "resolved again" in str(e)
    else:
        raise AssertionError("a cleared cache still served a plan")
