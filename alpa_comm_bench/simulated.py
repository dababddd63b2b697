"""``alpa-comm simulate --suite``: a reference suite through the planner and the
simulator, every method side by side (returns rows; ``suite_report`` turns them into
tables and files)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from alpa_comm import suites
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.sim.simulate import effective_gbps, simulate
from alpa_comm.topology import ClusterSpec


@dataclass
class Row:
    """One method on one case, simulated."""

    suite: str
    case: str
    method: str
    seconds: float
    predicted: float
    lower_bound: float
    nbytes: int
    host_sent: dict
    host_received: dict
    moves_data: bool = True  # False for signal rows (their bound is the real data's)
    source: str = ""  # Alpa baselines: suites.FROM_ALPA_CODE or FROM_MODEL

    @property
    def gbps(self) -> float:
        return effective_gbps(self.nbytes, self.seconds)


def run_suite(name: str, cluster: ClusterSpec, last_dim: int = 512, size_mb: float = 1024, seed: int = 0,
              progress: Callable[[str], None] | None = None, compiled_sends: Callable | None = None) -> list[Row]:
    """Every method of every case of suite ``name``, planned and simulated on ``cluster``.
    ``progress`` is called with one line per case (the shell decides where it goes);
    ``compiled_sends``: Alpa's own messages for its baselines (``suites.plan_method``)."""
    cases = suites.suite_cases(name, last_dim, size_mb)
    methods = suites.suite(name).methods
    rows = []
    for i, case in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {name} case {case.name}: {len(methods)} methods")
        for m in methods:
            plan, source = suites.plan_method(case, m, cluster, seed=seed, compiled_sends=compiled_sends)
            res = simulate(plan)
            bound = plan.lower_bound_seconds if carries_data(m.strategy) else None
            rows.append(Row(name, case.name, m.name, res.makespan, plan.predicted_seconds, bound or 0.0,
                            plan.nbytes, res.host_sent, res.host_received, carries_data(m.strategy), source))
    # the signal rows get the real data's bound for their ratio
    bounds = {r.case: r.lower_bound for r in rows if r.lower_bound}
    for r in rows:
        if not r.lower_bound:
            r.lower_bound = bounds.get(r.case, 0.0)
    return rows
