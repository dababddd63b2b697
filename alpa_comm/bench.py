"""``alpa-comm bench``: the microbenchmark against baseline Alpa on a real cluster.

Every method of a case runs in the same run on the same cluster: a warm-up,
then ``repeat`` timed runs (median and spread reported). Every run is checked:
each destination device's buffer is hashed on its host and compared with the
hash of the NumPy reference slice; a mismatch stops the benchmark.

Before the suites, one 1 -> 1 device copy between two hosts is timed; its
rate calibrates the simulator (so the ``predicted`` column models the NICs as
they really deliver, not as configured), and the planner plans with it too.
"""
from __future__ import annotations

import hashlib
import statistics
import sys
from dataclasses import dataclass, field

import numpy as np

from . import suites
from .errors import AlpaCommError, InvalidOptionError
from .placement import Placement, Resharding
from .report.progress import Progress
from .resharding import plan_resharding
from .resharding.strategies import carries_data
from .runtime.executor import view
from .sim import simulate
from .topology import ClusterSpec

SIMULATION_ONLY = ("local_allgather", "global_allgather")
"""Methods compared in simulation only: on an emulated cluster they cost minutes a case
and the paper already shows them far behind."""
SUITE_NAMES = tuple(suites.SUITES)
TIE_TOLERANCE = 0.05
"""Two methods within 5 % of each other are a tie: the run-to-run spread of one method on
the emulated cluster (median of 3) is a few percent."""
WEIGHT_SYNC_METHODS = ("per_array", "tree_joint", "tree_packed")


class VerificationError(AlpaCommError, RuntimeError):
    """A destination device received wrong data."""


@dataclass
class Result:
    suite: str
    case: str
    method: str
    strategy: str
    loadbalance: str
    seconds: list[float]
    median_seconds: float
    lower_bound_seconds: float
    predicted_seconds: float
    nbytes: int
    verified: bool | None  # None: the signal strategy moves no data
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.nbytes * 8 / self.median_seconds / 1e9 if self.median_seconds > 0 else float("inf")


def _digest(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).reshape(-1), digest_size=16).hexdigest()


def suite_cases(name: str, size_mb: float):
    """A suite's cases with tensors of about ``size_mb`` MiB."""
    return suites.suite_cases(name, suites.n_to_m_last_dim(size_mb), size_mb)


def bench_methods(name: str):
    return tuple(m for m in suites.suite(name).methods if m.name not in SIMULATION_ONLY)


def calibrate(cluster, size_mb: float, repeat: int, progress=sys.stderr) -> tuple[ClusterSpec, float]:
    """Time one copy 1 device -> 1 device on another host; returns the cluster spec with
    the measured NIC rate, and that time."""
    n = int(size_mb * (1 << 20))
    x = np.random.default_rng(7).integers(0, 255, n, dtype=np.uint8)
    a = cluster.put(x, "1x1@0", "R")
    times = []
    for i in range(repeat + 1):
        cluster.reshard(a, "1x1@1", "R", strategy="send_recv").delete()
        if i:
            times.append(cluster.last.seconds)
    a.delete()
    t = statistics.median(times)
    gbps = n * 8 / t / 1e9
    if progress:
        print(f"calibration: one {size_mb:g} MiB copy between two hosts takes {t:.3f} s = {gbps:.3f} Gbit/s",
              file=progress, flush=True)
    spec = cluster.spec
    return ClusterSpec(num_hosts=spec.num_hosts, devices_per_host=spec.devices_per_host, nic_send_gbps=gbps,
                       intra_host_gbps=spec.intra_host_gbps, latency_s=spec.latency_s), t


def run_case(cluster, calibrated: ClusterSpec, suite: str, case, methods, repeat: int, seed: int = 0,
             progress=None, compiled_sends=None) -> list[Result]:
    x = np.random.default_rng(seed).standard_normal(case.shape).astype(np.float32)
    a = cluster.put(x, case.src_mesh, case.src_spec)
    full = tuple((0, n) for n in x.shape)
    out = []
    for m in methods:
        plan, source = suites.plan_method(case, m, calibrated, seed=seed, compiled_sends=compiled_sends)
        expected = None
        if carries_data(m.strategy):
            expected = {d: _digest(view(x, full, box))
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
    """Plan every case and method once up front, so bad input fails before anything runs."""
    work = [(s, c, bench_methods(s)) for s in suite_names
            if s != "weight-sync" for c in suite_cases(s, size_mb)]
    if "weight-sync" in suite_names:
        if cluster_spec.num_hosts < 3:
            raise InvalidOptionError(f"the weight-sync suite needs 3 hosts, the cluster has {cluster_spec.num_hosts}")
        from .resharding.tree import plan_resharding_tree, tree_flatten  # noqa: PLC0415

        for tree in weight_sync_trees().values():
            plan_resharding_tree({p: Resharding.between(x.shape, "float32", WEIGHT_SYNC_SRC, x.train, WEIGHT_SYNC_DST,
                                                        x.infer)
                                  for p, x in tree_flatten(tree)}, cluster=cluster_spec, loadbalance="naive")
    for _, c, methods in work:
        for m in methods:
            plan_resharding(c.shape, c.dtype, c.src_mesh, c.src_spec, c.dst_mesh, c.dst_spec, cluster=cluster_spec,
                            strategy=m.strategy, loadbalance="naive")
    return work


def run(cluster, suite_names, size_mb: float, repeat: int, progress_stream=sys.stderr,
        compiled_sends=None) -> tuple[ClusterSpec, float, list[Result]]:
    """Every case and method of ``suite_names`` (``compiled_sends``: Alpa's own messages for
    its baselines, see ``suites.plan_method``)."""
    weight_sync = "weight-sync" in suite_names
    plan_ = check(cluster.spec, suite_names, size_mb)
    calibrated, t_copy = calibrate(cluster, size_mb, repeat, progress_stream)
    total = sum(len(ms) * (repeat + 1) for _, _, ms in plan_)
    total += len(weight_sync_trees()) * len(WEIGHT_SYNC_METHODS) * (repeat + 1) if weight_sync else 0
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


def speedups(results: list[Result]) -> dict[tuple[str, str, str], dict[str, float]]:
    base = {(r.suite, r.case, r.method): r.median_seconds for r in results}
    out = {}
    for r in results:
        out[(r.suite, r.case, r.method)] = {b: base[(r.suite, r.case, b)] / r.median_seconds
                                            for b in ("alpa", "alpa_send_recv", "per_array", "gather_broadcast",
                                                      "jax_device_put")
                                            if (r.suite, r.case, b) in base}
    return out


def acceptance(results: list[Result]) -> list[tuple[str, bool, str]]:
    """The checks the benchmark is judged by, computed from one run's results."""
    by = {(r.suite, r.case, r.method): r for r in results}
    out = []
    one = [r for r in results if r.suite == "1-to-m" and r.method == "broadcast"]
    if one:
        worst = max(one, key=lambda r: r.median_seconds / r.lower_bound_seconds)
        ok = all(r.median_seconds / r.lower_bound_seconds <= 1.25 for r in one)
        out.append(("1-to-m: broadcast <= 1.25x the lower bound", ok,
                    f"worst {worst.median_seconds / worst.lower_bound_seconds:.2f}x (case {worst.case})"))
    cases = list(dict.fromkeys(r.case for r in results if r.suite == "n-to-m"))
    if cases:
        ours = ("broadcast_naive", "broadcast_size", "broadcast", "auto")
        best = {c: min((by[k] for m in ours if (k := ("n-to-m", c, m)) in by), key=lambda r: r.median_seconds)
                for c in cases}
        for b in ("alpa_send_recv", "alpa"):
            # where a case leaves nothing to gain (case 1: the same plan) both run alike, and
            # run-to-run noise decides the order: a tie within the tolerance is not a loss
            slower = [c for c in cases
                      if best[c].median_seconds > (1 + TIE_TOLERANCE) * by[("n-to-m", c, b)].median_seconds]
            worst = max(cases, key=lambda c: best[c].median_seconds / by[("n-to-m", c, b)].median_seconds)
            ratio = best[worst].median_seconds / by[("n-to-m", worst, b)].median_seconds
            out.append((f"n-to-m: best of ours not slower than {b} (tolerance {100 * TIE_TOLERANCE:.0f} %)",
                        not slower, f"worst case {worst}: {ratio:.2f}x its time"
                        + ("" if not slower else f"; slower on cases {slower}")))
        ratios = {c: best[c].median_seconds / best[c].lower_bound_seconds for c in cases}
        out.append(("n-to-m: best method within 1.3x of the lower bound", max(ratios.values()) <= 1.3,
                    ", ".join(f"{c}: {v:.2f}" for c, v in ratios.items())))
        misses, checked = [], 0
        for c in cases:
            for b in ("alpa_send_recv", "alpa"):
                base = by[("n-to-m", c, b)]
                predicted = base.predicted_seconds / best[c].predicted_seconds
                if predicted >= 2.0:
                    checked += 1
                    measured = base.median_seconds / best[c].median_seconds
                    if measured < 0.8 * predicted:
                        misses.append(f"case {c} vs {b}: {measured:.2f}x of predicted {predicted:.2f}x")
        out.append(("n-to-m: measured speedup >= 80 % of a predicted >= 2x", not misses,
                    f"{checked} predictions checked" + (f"; misses: {misses}" if misses else "")))
    rep = [r for r in results if r.suite == "replicate" and r.method in ("broadcast", "rotated_chains")]
    for case in dict.fromkeys(r.case for r in rep):
        ratios = {r.method: r.median_seconds / r.lower_bound_seconds for r in rep if r.case == case}
        out.append((f"replicate {case}: best of broadcast / rotated_chains within 1.3x of the lower bound",
                    min(ratios.values()) <= 1.3, ", ".join(f"{m} {v:.2f}x" for m, v in ratios.items())))
    ws = [r for r in results if r.suite == "weight-sync"]
    for case in dict.fromkeys(r.case for r in ws):
        per = by[("weight-sync", case, "per_array")]
        packed = by[("weight-sync", case, "tree_packed")]
        joint = by[("weight-sync", case, "tree_joint")]
        gain = per.median_seconds / packed.median_seconds
        small = per.extra.get("median_leaf_bytes", 0) < 64 << 10
        ok = gain >= 3 if small else gain >= 1
        out.append((f"weight-sync {case}: coalesced tree {'>= 3x' if small else 'not slower than'} per-array", ok,
                    f"{gain:.2f}x (median leaf {per.extra.get('median_leaf_bytes')} B)"))
        out.append((f"weight-sync {case}: joint balancing not slower than per-array",
                    joint.median_seconds <= per.median_seconds, f"{per.median_seconds / joint.median_seconds:.2f}x"))
    out += _processes_acceptance(results, by)
    out += _data_plane_acceptance(results, by)
    bc = [r for r in results if r.strategy in ("broadcast", "auto") and r.suite in ("n-to-m", "1-to-m")]
    for label, tolerance, pick in SIMULATOR_CHECKS:
        errs = [(abs(r.predicted_seconds - r.median_seconds) / r.median_seconds, r) for r in bc if pick(r)]
        if errs:
            worst_err, worst_r = max(errs, key=lambda e: e[0])
            out.append((f"simulator within {100 * tolerance:.0f} % of measured ({label})", worst_err <= tolerance,
                        f"worst {100 * worst_err:.0f} % ({worst_r.suite} case {worst_r.case}, {worst_r.method})"))
    return out


def _processes_acceptance(results: list[Result], by: dict) -> list[tuple[str, bool, str]]:
    """Weight sync in the user's own processes (``--mode processes``): the planned sync near
    the bound into the busiest receiving host, far ahead of gather-then-broadcast, and
    bfloat16 on the wire moving half the bytes."""
    out, suite = [], "weight-sync-processes"
    for case in dict.fromkeys(r.case for r in results if r.suite == suite):
        planned = by[(suite, case, "planned")]
        ratio = planned.median_seconds / planned.lower_bound_seconds
        out.append((f"weight-sync (processes) {case}: planned within 1.2x of the bound into the busiest host",
                    ratio <= 1.2, f"{ratio:.2f}x"))
        gb = by[(suite, case, "gather_broadcast")].median_seconds / planned.median_seconds
        out.append((f"weight-sync (processes) {case}: planned >= 3x faster than gather + gloo broadcast", gb >= 3,
                    f"{gb:.2f}x (vs gather + pipelined broadcast: "
                    f"{by[(suite, case, 'gather_pipelined')].median_seconds / planned.median_seconds:.2f}x, "
                    f"vs per-leaf: {by[(suite, case, 'per_leaf')].median_seconds / planned.median_seconds:.2f}x)"))
        half = by[(suite, case, "planned_bf16")]
        out.append((f"weight-sync (processes) {case}: bfloat16 on the wire moves half the bytes",
                    half.nbytes * 2 == planned.nbytes,
                    f"{half.nbytes / 2**20:.1f} of {planned.nbytes / 2**20:.1f} MiB, "
                    f"{planned.median_seconds / half.median_seconds:.2f}x faster"))
    return out


SMALL_CALL_BYTES = 4096
"""A case this small measures what a cached call costs, not bytes."""


def _data_plane_acceptance(results: list[Result], by: dict) -> list[tuple[str, bool, str]]:
    """The data plane in the user's processes (``--suite same-layout | layout-change``):
    same-layout moves at least as fast as JAX's own ``device_put`` and at >= 0.85 of the
    raw rate (the faster transport's: ``wire_bench``); layout changes >= 1.5x faster than JAX's best working alternative; a
    cached call on a small array within 5 ms."""
    out = []
    for suite, rule in (("same-layout-processes", "same"), ("layout-change-processes", "change")):
        for case in dict.fromkeys(r.case for r in results if r.suite == suite):
            ours, jax_ = (by[(suite, case, m)] for m in ("alpa_comm", "jax_device_put"))
            vs_jax = jax_.median_seconds / ours.median_seconds
            if ours.nbytes <= SMALL_CALL_BYTES:
                out.append((f"{suite} {case}: a cached call within 5 ms", ours.median_seconds <= 5e-3,
                            f"{1e3 * ours.median_seconds:.2f} ms (JAX's device_put {1e3 * jax_.median_seconds:.2f} ms)"))
            elif rule == "same":
                out.append((f"{suite} {case}: not slower than jax_device_put (tolerance "
                            f"{100 * TIE_TOLERANCE:.0f} %)", vs_jax >= 1 - TIE_TOLERANCE, f"{vs_jax:.2f}x"))
                share = ours.lower_bound_seconds / ours.median_seconds
                out.append((f"{suite} {case}: >= 0.85 of the raw rate", share >= 0.85, f"{share:.2f}"))
            else:
                out.append((f"{suite} {case}: >= 1.5x faster than JAX's best working alternative "
                            f"({jax_.extra.get('how')})",
                            vs_jax >= 1.5, f"{vs_jax:.2f}x; {ours.lower_bound_seconds / ours.median_seconds:.2f} of raw"))
    return out


ABLATIONS = ("broadcast_naive", "broadcast_size")
SIMULATOR_CHECKS = (
    ("the planner's orders: broadcast, auto", 0.25, lambda r: r.method not in ABLATIONS),
    # naive and size orders leave receivers contended; who wins each contention depends on
    # timing, so one of their runs can be 40 % slower than the next (measured spread)
    ("the ordering ablations: broadcast_naive, broadcast_size", 0.35, lambda r: r.method in ABLATIONS),
)
"""(what, tolerance, which results) of the simulator checks."""


# ------------------------------------------------------------------ weight sync
@dataclass(frozen=True)
class Param:
    """One parameter of a weight-sync tree: its shape and its training / inference specs."""

    shape: tuple
    train: str
    infer: str


def weight_sync_trees() -> dict[str, dict]:
    """Transformer-shaped parameter trees, each leaf (shape, training spec, inference spec):
    training fully sharded over 2 hosts x 4 devices, inference tensor-parallel over 4
    devices of one host (the RL post-training weight sync).

    * small-leaves: 12 layers of width 128 (150 arrays, 512 B to 256 KiB, median 512 B);
    * large-leaves: 6 layers of width 512, matrices only (24 arrays of 1-4 MiB)."""
    P = Param

    def layer(d, vectors=True):
        out = {"qkv": P((d, 3 * d), "S01R", "RS1"), "out": P((d, d), "S01R", "S1R"),
               "mlp1": P((d, 4 * d), "S01R", "RS1"), "mlp2": P((4 * d, d), "S01R", "S1R")}
        if vectors:
            out.update({"qkv_b": P((3 * d,), "S01", "S1"), "out_b": P((d,), "S01", "R"),
                        "mlp1_b": P((4 * d,), "S01", "S1"), "mlp2_b": P((d,), "S01", "R"),
                        "ln1": [P((d,), "S01", "R"), P((d,), "S01", "R")],
                        "ln2": [P((d,), "S01", "R"), P((d,), "S01", "R")]})
        return out
    small = {"embed": P((512, 128), "S01R", "RS1"), "pos": P((128, 128), "S01R", "RR"),
             "layers": [layer(128) for _ in range(12)], "final_ln": [P((128,), "S01", "R"), P((128,), "S01", "R")]}
    large = {"layers": [layer(512, vectors=False) for _ in range(6)]}
    return {"small-leaves": small, "large-leaves": large}


WEIGHT_SYNC_SRC, WEIGHT_SYNC_DST = "2x4@0,1", "1x4@2"


def run_weight_sync(cluster, calibrated: ClusterSpec, repeat: int, progress=None, seed: int = 0) -> list[Result]:
    """Per-array resharding vs one joint tree plan vs the joint plan with coalescing,
    side by side on the same cluster, every leaf verified."""
    from .resharding.tree import plan_resharding_tree, tree_flatten, tree_unflatten  # noqa: PLC0415

    out = []
    rng = np.random.default_rng(seed)
    for name, tree in weight_sync_trees().items():
        flat = tree_flatten(tree)
        leaf_paths = [p for p, _ in flat]
        params = [p for _, p in flat]
        xs = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        arrays = tree_unflatten(tree, [cluster.put(x, WEIGHT_SYNC_SRC, p.train) for x, p in zip(xs, params)])
        placements = tree_unflatten(tree, [Placement(WEIGHT_SYNC_DST, p.infer) for p in params])
        layouts = tree_unflatten(tree, [Resharding.between(p.shape, "float32", WEIGHT_SYNC_SRC, p.train,
                                                           WEIGHT_SYNC_DST, p.infer) for p in params])
        expected = [{d: _digest(view(x, tuple((0, n) for n in p.shape), b))
                     for d, b in Placement(WEIGHT_SYNC_DST, p.infer).resolved(calibrated.devices_per_host)
                     .device_boxes(p.shape).items()}
                    for x, p in zip(xs, params)]
        src_list = [a for _, a in tree_flatten(arrays)]
        nbytes = sum(x.nbytes for x in xs)
        for method in WEIGHT_SYNC_METHODS:
            times, messages = [], 0
            for i in range(repeat + 1):
                if progress:
                    progress(f"weight-sync {name}: {method} run {i + 1}/{repeat + 1}")
                if method == "per_array":
                    results, seconds, predicted, bound = [], 0.0, 0.0, 0.0
                    for a, p in zip(src_list, params):
                        plan = plan_resharding(a.shape, a.dtype, a.mesh, a.spec, WEIGHT_SYNC_DST, p.infer,
                                               cluster=calibrated)
                        results.append(cluster.reshard(a, WEIGHT_SYNC_DST, p.infer, plan=plan))
                        seconds += cluster.last.seconds
                        predicted += simulate(plan).makespan
                    messages = None
                    bound = plan_resharding_tree(layouts, cluster=calibrated, bucket_bytes=None).lower_bound_seconds
                else:
                    bucket = None if method == "tree_joint" else "auto"
                    tplan = plan_resharding_tree(layouts, cluster=calibrated, bucket_bytes=bucket)
                    res_tree = cluster.reshard_tree(arrays, placements, bucket_bytes=bucket)
                    results = [a for _, a in tree_flatten(res_tree)]
                    seconds, predicted = cluster.last.seconds, simulate(tplan).makespan
                    bound = tplan.lower_bound_seconds
                    messages = tplan.messages
                for path, r, exp in zip(leaf_paths, results, expected):
                    got = cluster.checksums(r)
                    bad = sorted(d for d, h in exp.items() if got.get(d) != h)
                    if bad:
                        raise VerificationError(f"weight-sync {name}, {method}: {path} wrong on devices {bad}")
                    r.delete()
                if i:
                    times.append(seconds)
            out.append(Result("weight-sync", name, method, "broadcast", "auto", times, statistics.median(times),
                              bound, predicted, nbytes, True,
                              {"leaves": len(flat), "messages": messages,
                               "median_leaf_bytes": int(np.median([x.nbytes for x in xs]))}))
        for a in src_list:
            a.delete()
    return out
