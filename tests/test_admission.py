"""``admission.admitted_seconds`` under a limit: ``auto`` passes the best estimate so far
as the limit so that a plan that cannot beat it stops early. Stopping early must never
change the ranking: under any limit the estimate is the unlimited one wherever that is
within the limit, and above the limit (``inf`` or the full value) wherever it is not."""
import math

from hypothesis import given, settings, strategies as st

from alpa_comm import ClusterSpec, DeviceMesh, STRATEGIES, plan_resharding
from alpa_comm.resharding.admission import admitted_seconds

from strategies_hyp import resharding_cases


@settings(max_examples=60, deadline=None)
@given(resharding_cases(overlap=True), st.sampled_from(STRATEGIES), st.sampled_from([0.0, 20e-6, 1e-3]),
       st.floats(0.0, 1.5))
def test_a_limit_only_ever_cuts_an_estimate_above_it(case, strategy, lat, fraction):
    shape, src_t, sspec, dst_t, dspec, dph = case
    hosts = max(max(DeviceMesh.parse(t, dph).hosts) for t in (src_t, dst_t)) + 1
    cluster = ClusterSpec(num_hosts=hosts, devices_per_host=dph, nic_send_gbps=[10 + 5 * h for h in range(hosts)],
                          latency_s=lat)
    plan = plan_resharding(shape, "float32", src_t, sspec, dst_t, dspec, cluster=cluster, strategy=strategy,
                           loadbalance="greedy", cache=False)
    full = admitted_seconds(plan.transfers, cluster)
    assert full == admitted_seconds(plan.transfers, cluster, math.inf)
    for limit in (full * fraction, full, full * (1 - 1e-12)):
        got = admitted_seconds(plan.transfers, cluster, limit)
        if full <= limit:
            assert got == full
        else:
            assert got == full or got == math.inf
