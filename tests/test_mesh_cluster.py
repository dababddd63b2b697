import math

import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec, DeviceMesh, InvalidClusterError, InvalidMeshError


def test_mesh_on_hosts_uses_first_devices_host_major():
    m = DeviceMesh.parse("4x2@1,2,3,4", devices_per_host=4)
    assert m.devices == (4, 5, 8, 9, 12, 13, 16, 17)
    assert m.shape == (4, 2)
    assert m.hosts == (1, 2, 3, 4)
    assert m.label() == "4x2@1-4"


def test_mesh_from_devices_and_labels():
    m = DeviceMesh.from_devices([[0, 2], [5, 7]], devices_per_host=4)
    assert m.hosts == (0, 1)
    assert m.label() == "2x2[0, 2, 5, 7]"
    assert DeviceMesh.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("text,fragment", [
    ("2y4@0", "cannot parse"), ("2x4@0,0", "host twice"), ("3x3@0,1", "do not divide"),
    ("2x8@0,1", "needs 8 devices per host"), ("0x4@0", "non-positive"),
])
def test_mesh_errors(text, fragment):
    with pytest.raises(InvalidMeshError, match=fragment):
        DeviceMesh.parse(text, devices_per_host=4)


def test_mesh_rejects_duplicate_devices():
    with pytest.raises(InvalidMeshError, match="twice"):
        DeviceMesh.from_devices([1, 1], 4)


def test_cluster_rates_and_lists():
    c = ClusterSpec(num_hosts=2, devices_per_host=4, nic_send_gbps=[8, 16], nic_recv_gbps=4, nics_per_host=2)
    assert c.send_rate(0) == 8 * 2 * 1e9 / 8
    assert c.recv_rate(1) == 4 * 2 * 1e9 / 8
    assert c.link_rate(1, 0) == c.recv_rate(0)
    assert c.link_rate(1, 1) == c.intra_rate
    assert ClusterSpec.from_dict(c.to_dict()) == c
    ideal = ClusterSpec(2, 4, intra_host_gbps=math.inf)
    assert ClusterSpec.from_dict(ideal.to_dict()) == ideal


@pytest.mark.parametrize("kw,fragment", [
    (dict(num_hosts=0, devices_per_host=4), "num_hosts"),
    (dict(num_hosts=2, devices_per_host=4, nic_send_gbps=[1, 2, 3]), "3 values but the cluster has 2"),
    (dict(num_hosts=2, devices_per_host=4, nic_send_gbps=-1), "positive"),
    (dict(num_hosts=2, devices_per_host=4, latency_s=-1), "latency_s"),
])
def test_cluster_errors(kw, fragment):
    with pytest.raises(InvalidClusterError, match=fragment):
        ClusterSpec(**kw)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True))
def test_host_lists_round_trip_through_ranges(hosts):
    from alpa_comm.mesh import host_list_text, parse_mesh_text

    text = host_list_text(hosts)
    assert parse_mesh_text(f"{len(hosts)}x1@{text}") == ((len(hosts), 1), tuple(hosts))
    assert parse_mesh_text("2x8@0-1") == ((2, 8), (0, 1))


def test_a_backwards_host_range_is_refused_by_name():
    from alpa_comm.mesh import parse_mesh_text

    with pytest.raises(InvalidMeshError, match="'5-2' runs backwards"):
        parse_mesh_text("4x1@5-2")
