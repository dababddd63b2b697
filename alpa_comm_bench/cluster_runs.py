"""``alpa-comm bench`` (``--mode cluster``): Alpa's reference suites measured against
baseline Alpa on a cluster of alpa_comm's host workers.

Every method of a case runs in the same run on the same cluster: a warm-up, then
``repeat`` timed runs (median and spread reported). Every run is checked: each
destination device's buffer is hashed on its host and compared with the hash of the
NumPy reference slice; a mismatch stops the benchmark (``VerificationError``).

Before the suites, one 1 -> 1 device copy between two hosts is timed
(``probes.calibrate``); its rate calibrates the simulator and the planner plans with it.
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

from alpa_comm import suites
from alpa_comm.errors import InvalidOptionError
from alpa_comm.placement import Resharding
from alpa_comm.report.progress import Progress
from alpa_comm.resharding import plan_resharding
from alpa_comm.resharding.strategies import carries_data
from alpa_comm.runtime.executor import view
from alpa_comm.sim import simulate
from alpa_comm.topology import ClusterSpec

from . import shapes
from .probes import calibrate
from .result import Result, VerificationError, digest
from .weight_sync import WEIGHT_SYNC_METHODS, run_weight_sync

SIMULATION_ONLY = ("local_allgather", "global_allgather")
"""Methods compared in simulation only: on an emulated cluster they cost minutes a case
and the paper already shows them far behind."""
SUITE_NAMES = tuple(suites.SUITES)
"""What ``--suite all`` runs."""


def suite_cases(name: str, size_mb: float) -> list[suites.Case]:
    """A suite's cases with tensors of about ``size_mb`` MiB."""
    return suites.suite_cases(name, suites.n_to_m_last_dim(size_mb), size_mb)


def bench_methods(name: str) -> tuple[suites.Method, ...]:
    """The methods of suite ``name`` that are measured (``SIMULATION_ONLY`` left out)."""
    return tuple(m for m in suites.suite(name).methods if m.name not in SIMULATION_ONLY)


def run_case(cluster, calibrated: ClusterSpec, suite: str, case, methods, repeat: int, seed: int = 0,
             progress=None, compiled_sends=None) -> list[Result]:
    """Every one of ``methods`` on ``case``: one tensor put once, each method's plan run
    ``repeat + 1`` times (the first a warm-up), every run verified."""
    x = np.random.default_rng(seed).standard_normal(case.shape).astype(np.float32)
    a = cluster.put(x, case.src_mesh, case.src_spec)
    full = tuple((0, n) for n in x.shape)
    out = []
    for m in methods:
        plan, source = suites.plan_method(case, m, calibrated, seed=seed, compiled_sends=compiled_sends)
        expected = None
        if carries_data(m.strategy):
            expected = {d: digest(view(x, full, box))
                        for d, box in plan.resharding.dst.device_boxes(x.shape).items()}
        times = []
        for i in range(repeat + 1):
            if progress:
                progress(f"{suite} case {case.name}: {m.name} run {i + 1}/{repeat + 1}")
            # Alpa's workers run their messages one tile after another in a fixed order (one
            # ungrouped NCCL call each, a single-threaded actor): its baselines run so here
            b = cluster.reshard(a, case.dst_mesh, case.dst_spec, plan=plan, in_order=m.name in suites.ALPA_BASELINES)
            if expected is not None:
                got = cluster.checksums(b)
                bad = sorted(d for d, h in expected.items() if got.get(d) != h)
                if bad:
                    raise VerificationError(f"{suite} case {case.name}, {m.name}: devices {bad} received wrong data")
            if i:
                times.append(cluster.last.seconds)
            b.delete()
        bound = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                                cluster=calibrated, strategy="broadcast", loadbalance="naive").lower_bound_seconds
        out.append(Result(suite, case.name, m.name, m.strategy, m.loadbalance, times, statistics.median(times),
                          bound, simulate(plan).makespan, plan.nbytes,
                          None if expected is None else True, {"baseline": source} if source else {}))
    a.delete()
    return out


def check(cluster_spec: ClusterSpec, suite_names, size_mb: float) -> list:
    """Plan every case and method once up front, so bad input fails before anything runs;
    returns the (suite, case, methods) to run."""
    work = [(s, c, bench_methods(s)) for s in suite_names
            if s != "weight-sync" for c in suite_cases(s, size_mb)]
    if "weight-sync" in suite_names:
        if cluster_spec.num_hosts < 3:
            raise InvalidOptionError(f"the weight-sync suite needs 3 hosts, the cluster has {cluster_spec.num_hosts}")
        from alpa_comm.resharding.tree import plan_resharding_tree, tree_flatten  # noqa: PLC0415

        for tree in shapes.weight_sync_trees().values():
            plan_resharding_tree({p: Resharding.between(x.shape, "float32", shapes.WEIGHT_SYNC_SRC, x.train,
                                                        shapes.WEIGHT_SYNC_DST, x.infer)
                                  for p, x in tree_flatten(tree)}, cluster=cluster_spec, loadbalance="naive")
    for _, c, methods in work:
        for m in methods:
            plan_resharding(c.shape, c.dtype, c.src_mesh, c.src_spec, c.dst_mesh, c.dst_spec, cluster=cluster_spec,
                            strategy=m.strategy, loadbalance="naive")
    return work


def run(cluster, suite_names, size_mb: float, repeat: int, progress_stream=sys.stderr,
        compiled_sends=None) -> tuple[ClusterSpec, float, list[Result]]:
    """Every case and method of ``suite_names`` (``compiled_sends``: Alpa's own messages for
    its baselines, see ``suites.plan_method``); returns (the calibrated cluster spec, the
    calibration copy's seconds, the rows)."""
    weight_sync = "weight-sync" in suite_names
    plan_ = check(cluster.spec, suite_names, size_mb)
    calibrated, t_copy = calibrate(cluster, size_mb, repeat, progress_stream)
    total = sum(len(ms) * (repeat + 1) for _, _, ms in plan_)
    total += len(shapes.weight_sync_trees()) * len(WEIGHT_SYNC_METHODS) * (repeat + 1) if weight_sync else 0
    bar = Progress(total, "bench", progress_stream, unit="run") if progress_stream else None
    results = []
    for suite, case, methods in plan_:
        results += run_case(cluster, calibrated, suite, case, methods, repeat, progress=bar,
                            compiled_sends=compiled_sends)
    if weight_sync:
        results += run_weight_sync(cluster, calibrated, repeat, progress=bar)
    if bar:
        bar.close()
    return calibrated, t_copy, results
