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
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import suites
from .cluster import ClusterSpec
from .report import table
from .resharding import plan_resharding
from .resharding.explain import fmt_seconds
from .resharding.unit_tasks import device_boxes
from .runtime.executor import view
from .sim import simulate

BENCH_METHODS = (
    suites.METHOD_BY_NAME["alpa_send_recv"],
    suites.METHOD_BY_NAME["alpa"],
    suites.METHOD_BY_NAME["broadcast_naive"],
    suites.METHOD_BY_NAME["broadcast_size"],
    suites.METHOD_BY_NAME["broadcast"],
    suites.METHOD_BY_NAME["signal"],
)
BALANCE_METHODS = suites.BALANCE_METHODS
SUITE_NAMES = ("1-to-m", "n-to-m", "balance")


class VerificationError(RuntimeError):
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
    if name == "1-to-m":
        return suites.one_to_m(int(size_mb * (1 << 20)))
    last = max(2, int(size_mb * (1 << 20) / (1024 * 1024 * 4)) // 2 * 2)  # case 9 splits the last dim in 2
    return suites.n_to_m(last)


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
             progress=None) -> list[Result]:
    x = np.random.default_rng(seed).standard_normal(case.shape).astype(np.float32)
    a = cluster.put(x, case.src_mesh, case.src_spec)
    full = tuple((0, n) for n in x.shape)
    out = []
    for m in methods:
        plan = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                               cluster=calibrated, strategy=m.strategy, loadbalance=m.loadbalance, seed=seed)
        expected = None
        if m.strategy != "signal":
            expected = {d: _digest(view(x, full, box)) for d, box in device_boxes(x.shape, plan.dst_mesh,
                                                                                 plan.dst_spec).items()}
        times = []
        for i in range(repeat + 1):
            if progress:
                progress(f"{suite} case {case.name}: {m.name} run {i + 1}/{repeat + 1}")
            b = cluster.reshard(a, case.dst_mesh, case.dst_spec, plan=plan)
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
                          None if expected is None else True))
    a.delete()
    return out


class Progress:
    """One line redrawn in place: a bar, the step, elapsed time."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream, self.t0 = total, 0, stream, time.monotonic()

    def __call__(self, what: str) -> None:
        self.done += 1
        frac = min(1.0, self.done / max(1, self.total))
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        self.stream.write(f"\r[{bar}] {100 * frac:5.1f} % {time.monotonic() - self.t0:6.0f} s  {what[:70]:<70}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")


def check(cluster_spec: ClusterSpec, suite_names, size_mb: float) -> list:
    """Plan every case and method once up front, so bad input fails before anything runs."""
    work = [(s, c, BALANCE_METHODS if s == "balance" else BENCH_METHODS) for s in suite_names
            for c in suite_cases(s, size_mb)]
    for _, c, methods in work:
        for m in methods:
            plan_resharding(c.shape, c.dtype, c.src_mesh, c.src_spec, c.dst_mesh, c.dst_spec, cluster=cluster_spec,
                            strategy=m.strategy, loadbalance="naive")
    return work


def run(cluster, suite_names, size_mb: float, repeat: int, progress_stream=sys.stderr) -> tuple[ClusterSpec, float,
                                                                                                list[Result]]:
    plan_ = check(cluster.spec, suite_names, size_mb)
    calibrated, t_copy = calibrate(cluster, size_mb, repeat, progress_stream)
    total = sum(len(ms) * (repeat + 1) for _, _, ms in plan_)
    bar = Progress(total, progress_stream) if progress_stream else None
    results = []
    for suite, case, methods in plan_:
        results += run_case(cluster, calibrated, suite, case, methods, repeat, progress=bar)
    if bar:
        bar.close()
    return calibrated, t_copy, results


def speedups(results: list[Result]) -> dict[tuple[str, str, str], dict[str, float]]:
    base = {(r.suite, r.case, r.method): r.median_seconds for r in results}
    out = {}
    for r in results:
        out[(r.suite, r.case, r.method)] = {b: base[(r.suite, r.case, b)] / r.median_seconds
                                            for b in ("alpa", "alpa_send_recv") if (r.suite, r.case, b) in base}
    return out


def results_table(results: list[Result]) -> str:
    sp = speedups(results)
    rows = []
    for r in results:
        s = sp[(r.suite, r.case, r.method)]
        spread = f"{min(r.seconds):.3f}-{max(r.seconds):.3f}"
        rows.append([r.suite, r.case, r.method, fmt_seconds(r.median_seconds), spread, f"{r.gbps:.3f}",
                     f"{r.median_seconds / r.lower_bound_seconds:.2f}" if r.strategy != "signal" else "-",
                     f"{s.get('alpa', float('nan')):.2f}x", fmt_seconds(r.predicted_seconds),
                     "yes" if r.verified else ("n/a" if r.verified is None else "NO")])
    return table(["suite", "case", "method", "median", "spread (s)", "effective Gbit/s", "x lower bound",
                  "speedup vs alpa", "simulator", "verified"], rows)


def write(results: list[Result], cluster_desc: dict, out: Path) -> dict[str, Path]:
    from .plots import suite_bars  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    js = out / "results.json"
    tmp = js.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cluster": cluster_desc, "results": [
        {k: v for k, v in asdict(r).items() if k != "extra"} for r in results]}, indent=1))
    tmp.replace(js)
    paths["json"] = js
    md = out / "results.md"
    md.write_text(f"# alpa-comm bench\n\nCluster: {cluster_desc.get('description', '')}\n\n"
                  f"{acceptance_table(results)}\n\n{results_table(results)}\n")
    paths["markdown"] = md
    for suite in dict.fromkeys(r.suite for r in results):
        rs = [r for r in results if r.suite == suite]
        cases = list(dict.fromkeys(r.case for r in rs))
        methods = [m for m in dict.fromkeys(r.method for r in rs) if m != "signal"]
        paths[suite] = suite_bars(cases, methods, {(r.case, r.method): r.median_seconds for r in rs},
                                  out / f"{suite.replace('-', '_')}.png",
                                  f"measured {suite} ({cluster_desc.get('description', '')})",
                                  bounds={r.case: r.lower_bound_seconds for r in rs})
    return paths


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
        ours = ("broadcast_naive", "broadcast_size", "broadcast")
        best = {c: min((by[("n-to-m", c, m)] for m in ours), key=lambda r: r.median_seconds) for c in cases}
        for b in ("alpa_send_recv", "alpa"):
            slower = [c for c in cases if best[c].median_seconds > by[("n-to-m", c, b)].median_seconds]
            out.append((f"n-to-m: best method at least as fast as {b}", not slower,
                        "every case" if not slower else f"slower on cases {slower}"))
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
    bc = [r for r in results if r.strategy == "broadcast" and r.suite in ("n-to-m", "1-to-m")]
    if bc:
        errs = [(abs(r.predicted_seconds - r.median_seconds) / r.median_seconds, r) for r in bc]
        worst_err, worst_r = max(errs, key=lambda e: e[0])
        out.append(("simulator within 25 % of measured (broadcast methods)", worst_err <= 0.25,
                    f"worst {100 * worst_err:.0f} % ({worst_r.suite} case {worst_r.case}, {worst_r.method})"))
    return out


def acceptance_table(results: list[Result]) -> str:
    return table(["check", "met", "detail"], [[c, "yes" if ok else "NO", d] for c, ok, d in acceptance(results)])
