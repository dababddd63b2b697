"""``rotated_chains``: rings that share their sending hosts' NICs are admitted two at a
time there, so their order decides which overlap; ``admission_order`` puts rings on
other receiving hosts side by side and a ring that overlaps them all after them."""
from alpa_comm import ClusterSpec
from alpa_comm.placement import Resharding
from alpa_comm.resharding.admission import MAX_PER_RESOURCE
from alpa_comm.resharding.kinds import rotated_chains as rc
from alpa_comm.resharding.resources import nic_receive, nic_send
from alpa_comm.resharding.tree import plan_resharding_tree
from alpa_comm.sim import simulate


def test_the_window_is_the_admission_window():
    assert rc.WINDOW == MAX_PER_RESOURCE


def _ring(senders, ring, scatter, steps):
    busy = {nic_send(s): scatter / len(ring) for s in senders}
    busy.update({nic_receive(h): scatter for h in ring})
    return ((scatter, busy), (steps, {r: steps for h in ring for r in (nic_send(h), nic_receive(h))}))


def test_a_short_ring_over_every_host_goes_after_the_long_rings_on_disjoint_hosts():
    senders = range(8)
    dense = _ring(senders, [8, 9, 10, 11], 0.01, 0.05)  # first, as the tree lists it
    even = _ring(senders, [8, 10], 0.1, 0.5)
    odd = _ring(senders, [9, 11], 0.1, 0.5)
    assert rc.admission_order([dense, even, odd]) == [1, 2, 0]
    span = rc._play([dense, even, odd], 2, [1, 2, 0])[0]
    assert span < rc._play([dense, even, odd], 2, [0, 1, 2])[0]
    assert abs(span - 0.66) < 1e-9  # the two long rings side by side, then the short one


def test_an_order_that_cannot_gain_is_kept():
    senders = range(4)
    rings = [_ring(senders, [4, 5], 0.1, 0.2 * (k + 1)) for k in range(3)]  # all on one pair of hosts
    assert rc.admission_order(rings) == [0, 1, 2]
    assert rc.admission_order(rings[:2]) == [0, 1]


def test_a_dense_ring_listed_before_two_expert_rings_does_not_hold_one_back():
    """Replicas of two hosts: the dense leaf's ring spans every replica host, each expert
    ring half of them; all three read every training host's NICs. Listed first, the dense
    ring took a window beside the first expert ring and the second waited for it (1.51x
    the bound); after the two expert rings the plan reaches the bound."""
    t, r, d = 4, 2, 2
    cluster = ClusterSpec(num_hosts=t + 2 * r, devices_per_host=d, nic_send_gbps=100, latency_s=20e-6)
    src, dst = f"{t}x{d}@0-{t - 1}", f"{r}x2x{d}@{t}-{t + 2 * r - 1}"
    tree = {"a_dense": Resharding.between((16 << 19,), "bfloat16", src, "S01", dst, "R"),
            "b_experts": [Resharding.between((8, 64 * t * d, 1024), "bfloat16", src, "RS01R", dst, "S1RS2")
                          for _ in range(4)]}
    plan = plan_resharding_tree(tree, cluster=cluster, strategy="rotated_chains", cache=False)
    rings = [t for t in plan.transfers if t.kind == "rotated_chains"]
    assert len(rings) == 3
    assert len({cluster.host_of(x) for x in rings[-1].receivers}) == 2 * r  # the dense ring last
    assert simulate(plan).makespan <= 1.10 * plan.latency_bound_seconds
