"""Planning without lost hosts (``plan_resharding_tree(lost_hosts=...)``), the pure half of
a failover: a plan over the live replicas delivers every live destination device its
box and touches no lost host, or ``LostDataError`` names exactly the slices only lost
hosts held."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm import ClusterSpec, ShardingSpec
from alpa_comm.errors import LostDataError
from alpa_comm.placement import Resharding
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.resharding.unit_tasks import decompose
from alpa_comm.resharding.verify import verify_plan
from alpa_comm.mesh import DeviceMesh
from strategies_hyp import resharding_cases


def _touched_hosts(plan) -> set[int]:
    host = plan.cluster.host_of
    out = set()
    for t in plan.transfers:
        devices = ([t.sender] if t.sender is not None else []) + list(t.receivers)
        for p in t.parts:
            devices += [p.sender, *p.receivers]
        out |= {host(d) for d in devices}
    return out


@settings(max_examples=60, deadline=None)
@given(case=resharding_cases(max_hosts=6, max_dph=2, overlap=True), leaves=st.integers(1, 3),
       strategy=st.sampled_from(["broadcast", "send_recv"]), data=st.data())
def test_a_plan_without_lost_hosts_serves_every_live_device_or_names_the_lost_slices(case, leaves, strategy, data):
    shape, src, sspec, dst, dspec, dph = case
    src_mesh, dst_mesh = DeviceMesh.parse(src, dph), DeviceMesh.parse(dst, dph)
    hosts = sorted(set(src_mesh.hosts) | set(dst_mesh.hosts))
    lost = frozenset(data.draw(st.lists(st.sampled_from(hosts), max_size=len(hosts) - 1, unique=True)))
    cluster = ClusterSpec(num_hosts=max(hosts) + 1, devices_per_host=dph, nic_send_gbps=10, latency_s=50e-6)
    moves = [Resharding.between(shape, "float32", src_mesh, sspec, dst_mesh, dspec) for _ in range(leaves)]
    tasks = decompose(shape, 4, src_mesh, ShardingSpec.parse(str(sspec)), dst_mesh, ShardingSpec.parse(str(dspec)))
    host = cluster.host_of
    orphans = [t.index for t in tasks if any(host(d) not in lost for d in t.dst_devices)
               and all(host(d) in lost for d in t.src_devices)]
    if orphans:
        with pytest.raises(LostDataError) as e:
            plan_resharding_tree(moves, cluster=cluster, strategy=strategy, lost_hosts=lost, cache=False)
        assert sorted(e.value.lost) == sorted((f"/{i}", box) for i in range(leaves) for box in orphans)
        assert f"hosts {sorted(lost)}" in str(e.value)
        return
    plan = plan_resharding_tree(moves, cluster=cluster, strategy=strategy, lost_hosts=lost, cache=False)
    verify_plan(plan, lost_hosts=lost)
    assert not _touched_hosts(plan) & lost


def test_a_lost_replica_shifts_its_share_to_the_live_one_and_the_cache_keeps_them_apart():
    """Two data-parallel replicas (hosts 0 and 1) send to host 2: the plan sends from host
    0 while it lives (its NIC is as fast as the receiver's); with host 0 lost, host 1
    sends everything; the plans are cached apart."""
    cluster = ClusterSpec(num_hosts=3, devices_per_host=2, nic_send_gbps=10, latency_s=50e-6)
    moves = [Resharding.between((1024, 1024), "float32", "2x2@0,1", "RS1", "1x2@2", "RS1") for _ in range(4)]
    both = plan_resharding_tree(moves, cluster=cluster, bucket_bytes=None)
    one = plan_resharding_tree(moves, cluster=cluster, bucket_bytes=None, lost_hosts={0})
    senders = lambda plan: {cluster.host_of(t.sender if t.sender is not None else t.parts[0].sender)  # noqa: E731
                            for t in plan.transfers}
    assert 0 in senders(both) and senders(one) == {1}
    again = plan_resharding_tree(moves, cluster=cluster, bucket_bytes=None)
    assert again.cache_hit and again.transfers == both.transfers
    verify_plan(one, lost_hosts={0})
    with pytest.raises(LostDataError, match=r"hosts \[0, 1\]"):
        plan_resharding_tree(moves, cluster=cluster, lost_hosts={0, 1})
