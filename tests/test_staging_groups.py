"""``resharding.staging``: the groups of leaves a call receiving leaf by leaf runs in turn
keep every host's staging within the limit (a leaf over it alone), in the tree's order."""
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_comm.placement import Resharding
from alpa_comm.resharding.staging import staged_bytes, staging_groups

NEEDS = st.lists(st.dictionaries(st.integers(0, 3), st.integers(1, 1000), min_size=1, max_size=4), max_size=40)


@settings(max_examples=300, deadline=None)
@given(NEEDS, st.integers(1, 2000))
def test_every_group_fits_on_every_host_or_holds_one_leaf(per_leaf, limit):
    groups = staging_groups(per_leaf, limit)
    assert [i for g in groups for i in g] == list(range(len(per_leaf)))
    for g in groups:
        assert g
        used: dict = {}
        for i in g:
            for h, n in per_leaf[i].items():
                used[h] = used.get(h, 0) + n
        assert len(g) == 1 or all(n <= limit for n in used.values()), (g, used)
    for a, b in zip(groups, groups[1:]):  # greedy: the next group's first leaf did not fit
        used = {}
        for i in a + b[:1]:
            for h, n in per_leaf[i].items():
                used[h] = used.get(h, 0) + n
        assert any(n > limit for n in used.values())


def test_staged_bytes_counts_each_destination_device_shard_on_its_host():
    move = Resharding.between((8, 6), "float32", "2x2@0,1", "S0R", "2x2@2,3", "S0S1")
    assert staged_bytes(move, 2) == {2: 2 * 4 * 3 * 4, 3: 2 * 4 * 3 * 4}
    rep = Resharding.between((8, 6), "bfloat16", "1x2@0", "S1", "1x2@1", "RR")
    assert staged_bytes(rep, 2) == {1: 2 * 8 * 6 * 2}
