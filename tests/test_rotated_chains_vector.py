"""``rotated_chains``'s NumPy passes over many parts give what its plain-Python passes give."""
from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec
from alpa_comm.resharding.kinds import rotated_chains as rc


def _python(fn, *args):
    saved = rc._VECTOR_MIN
    rc._VECTOR_MIN = 1 << 60  # never vectorise
    try:
        return fn(*args)
    finally:
        rc._VECTOR_MIN = saved


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1 << 40), min_size=64, max_size=400), st.integers(1, 9), st.integers(1, 5),
       st.integers(0, 3))
def test_vectorised_entries_messages_runs_and_seconds_match_python(sizes, hosts, senders, zeros):
    sizes = [0] * zeros + sizes
    ring = list(range(20, 20 + hosts))
    who = [i * senders // len(sizes) for i in range(len(sizes))]
    assert rc.entry_hosts(sizes, ring) == _python(rc.entry_hosts, sizes, ring)
    assert rc.scatter_messages(sizes, who, ring) == _python(rc.scatter_messages, sizes, who, ring)
    assert rc.runs(sizes, ring) == _python(rc.runs, sizes, ring)
    cluster = ClusterSpec(num_hosts=32, devices_per_host=2, nic_send_gbps=100, latency_s=20e-6)
    seconds = rc.RotatedChains.group_seconds(sizes, who, ring, cluster)
    assert seconds == _python(rc.RotatedChains.group_seconds, list(sizes), list(who), ring, cluster)
