"""``planner.rotate_shared_chains``: chains to the same hosts enter at different hosts, by
bytes, so no host forwards every large chain while another forwards none."""
from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec
from alpa_comm.resharding.plan import Transfer
from alpa_comm.resharding.planner import rotate_shared_chains

CLUSTER = ClusterSpec(num_hosts=6, devices_per_host=2, nic_send_gbps=1.0, latency_s=350e-6)
RECEIVERS = (4, 5, 6, 7, 8, 9, 10, 11)  # hosts 2-5, two devices each


def chains(sizes, receivers=RECEIVERS, senders=(0, 2)):
    return [Transfer(i, i, "broadcast", senders[i % len(senders)], receivers, ((0, 1),), n, 4, 0.0, 1.0)
            for i, n in enumerate(sizes)]


def entering_host(t: Transfer) -> int:
    return CLUSTER.host_of(t.receivers[0])


def test_equal_chains_rotate_one_host_at_a_time():
    out = rotate_shared_chains(chains([1 << 20] * 8), CLUSTER)
    assert [entering_host(t) for t in out] == [2, 3, 4, 5, 2, 3, 4, 5]


def test_large_chains_between_small_ones_enter_at_different_hosts():
    """Large and small alternating: by count every large chain entered at host 2 and 4."""
    out = rotate_shared_chains(chains([42 << 20, 1 << 20] * 4), CLUSTER)
    assert sorted(entering_host(t) for t in out if t.nbytes > 1 << 20) == [2, 3, 4, 5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 1 << 26), min_size=1, max_size=24))
def test_each_chain_keeps_its_hosts_in_cyclic_order_and_the_bytes_spread(sizes):
    out = rotate_shared_chains(chains(sizes), CLUSTER)
    hosts = [2, 3, 4, 5]
    entered = dict.fromkeys(hosts, 0)
    for before, after in zip(chains(sizes), out):
        assert sorted(after.receivers) == sorted(before.receivers) and after.nbytes == before.nbytes
        order = [CLUSTER.host_of(r) for r in after.receivers[::2]]
        k = hosts.index(order[0])
        assert order == hosts[k:] + hosts[:k]
        entered[order[0]] += after.nbytes
    # greedy by bytes: no host is entered by more than the least-entered host plus the largest chain
    assert max(entered.values()) - min(entered.values()) <= max(sizes)
