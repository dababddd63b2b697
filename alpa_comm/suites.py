"""Alpa's reference cases (the paper's many-to-many and one-to-many reshardings, the
load-balancing ablation, sharded to replicated; DESIGN.md) and the methods compared on
them, as plain data. They are descriptions, not a benchmark: the library itself reads
them (``alpa-comm plan --suite``, the Alpa baseline integration that compiles these
cases with Alpa's own code, Alpa's conformance harness), and ``plan_method`` is the one
place a method becomes a plan. What runs and measures them lives in the benchmark
package, ``alpa_comm_bench`` (``alpa-comm simulate --suite``, ``alpa-comm bench``).

Mesh dim 0 = hosts, dim 1 = devices in a host. Source meshes start at host 0,
destination meshes at the next free host, so the n-to-m suite needs 5 hosts of
4 devices and the 1-to-m suite 5 hosts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import InvalidOptionError
from .placement import Resharding, ReshardingFields
from .resharding.planner import plan_from_sends, plan_resharding


@dataclass(frozen=True)
class Case(ReshardingFields):
    """One reference case: a named resharding (meshes and specs as text)."""

    suite: str
    name: str
    resharding: Resharding

    @classmethod
    def of(cls, suite: str, name: str, shape, src_mesh: str, src_spec: str, dst_mesh: str, dst_spec: str,
           dtype: str = "float32") -> "Case":
        return cls(suite, name, Resharding.between(shape, dtype, src_mesh, src_spec, dst_mesh, dst_spec))



@dataclass(frozen=True)
class Method:
    """A way to run a resharding: a strategy plus a load-balance mode."""

    name: str
    strategy: str
    loadbalance: str
    note: str


METHODS = (
    Method("alpa_send_recv", "send_recv", "loads", "Alpa baseline: send/recv, normal load balance"),
    Method("alpa", "alpa", "loads", "Alpa baseline: send/recv + Alpa's local all-gather"),
    Method("local_allgather", "local_allgather", "auto", "send/recv to one device per host + all-gather"),
    Method("global_allgather", "global_allgather", "auto", "scatter + global all-gather"),
    Method("broadcast_naive", "broadcast", "naive", "chunked broadcast, lowest sender, fixed order"),
    Method("broadcast_size", "broadcast", "size", "chunked broadcast, LPT load balance"),
    Method("broadcast", "broadcast", "auto", "chunked broadcast, dfs/greedy load balance + order"),
    Method("auto", "auto", "auto", "the kind the planner predicts fastest for the case (strategy auto)"),
    Method("signal", "signal", "auto", "one byte per task: the upper bound"),
)
METHOD_BY_NAME = {m.name: m for m in METHODS}
BALANCE_METHODS = (
    METHOD_BY_NAME["alpa"],
    Method("bc_naive", "broadcast", "naive", "broadcast, lowest sender, task order"),
    Method("bc_loads", "broadcast", "loads", "broadcast, Alpa's 'normal' byte balance"),
    Method("bc_size", "broadcast", "size", "broadcast, LPT (load balance only)"),
    Method("bc_greedy", "broadcast", "greedy", "broadcast, randomized greedy order"),
    Method("bc_dfs", "broadcast", "dfs", "broadcast, DFS with pruning"),
)
"""The load-balancing ablation (the paper's Figure 8), beside Alpa's default."""
REPLICATE_METHODS = (
    METHOD_BY_NAME["alpa_send_recv"],
    METHOD_BY_NAME["alpa"],
    METHOD_BY_NAME["broadcast"],
    Method("rotated_chains", "rotated_chains", "auto", "slices to the same hosts as one ring (rotated chains)"),
    Method("double_tree", "double_tree", "auto", "each slice down two pipelined binary trees"),
    METHOD_BY_NAME["auto"],
    METHOD_BY_NAME["signal"],
)
"""Sharded to replicated (RL weight sync, all-gather-like changes): many receiving hosts
per slice, where one chain per slice leaves NICs idle."""
BASELINE = "alpa"
ALPA_BASELINES = ("alpa", "alpa_send_recv")
"""Methods that stand for Alpa itself (``plan_method`` takes their sends from Alpa's code)."""
FROM_ALPA_CODE = "Alpa 0.2.3's own strategy + task compiler"
FROM_MODEL = "alpa_comm's model of Alpa"


def plan_method(case: Case, method: Method, cluster, *, seed: int = 0, chunks: int | None = None,
                compiled_sends: Callable | None = None):
    """(plan, where the plan came from) for ``method`` on ``case``: the one place a suite
    method becomes a plan, for ``plan --suite``, ``simulate --suite`` and ``bench``.

    For Alpa's baselines (``ALPA_BASELINES``), ``compiled_sends(case, method)`` may give the
    (sender, receiver, box) messages Alpa 0.2.3's own code compiles
    (``integrations.alpa_baseline``: re-sends included); the plan then sends exactly those
    (``plan_from_sends``), labelled ``FROM_ALPA_CODE``. Without them (no harness, or None)
    the baseline is alpa_comm's model of Alpa's strategy (``FROM_MODEL``), which sends
    each piece once where Alpa 0.2.3 may send it several times. Other methods: ``""``."""
    if method.name in ALPA_BASELINES:
        sends = compiled_sends(case, method) if compiled_sends is not None else None
        if sends is not None:
            return plan_from_sends(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh,
                                   case.dst_spec, sends, cluster=cluster, strategy=method.strategy), FROM_ALPA_CODE
    baseline = method.name in ALPA_BASELINES  # Alpa sends every piece as its own message: never coalesced
    plan = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec,
                           cluster=cluster, strategy=method.strategy, loadbalance=method.loadbalance,
                           chunks=chunks, seed=seed, bucket_bytes=None if baseline else "auto")
    return plan, FROM_MODEL if baseline else ""
SUITE_HOSTS = 5
SUITE_DEVICES_PER_HOST = 4


def _host_list(first: int, count: int) -> str:
    return ",".join(str(h) for h in range(first, first + count))


def n_to_m(last_dim: int = 512) -> list[Case]:
    """Alpa's many-to-many cases; the paper's tensor is (1024, 1024, 512) float32."""
    big = (1024, 1024, last_dim)
    rows = [
        ("1", big, "2x4", "S0RR", "2x4", "S0RR"),
        ("2", big, "2x4", "RRR", "2x4", "S0RR"),
        ("3", big, "2x4", "RS0R", "2x4", "S0RR"),
        ("4", big, "2x4", "RS01R", "2x4", "S01RR"),
        ("5", big, "2x4", "S1RR", "2x4", "S0RR"),
        ("6", (3072, 1024, max(1, last_dim * 170 // 512)), "2x4", "S0RR", "3x4", "S0RR"),
        ("7", big, "1x4", "S1RR", "2x4", "RRR"),
        ("9", big, "2x4", "RS0R", "2x4", "RRS0"),
    ]
    out = []
    for name, shape, sm, ss, dm, ds in rows:
        sh = int(sm.split("x")[0])
        dh = int(dm.split("x")[0])
        out.append(Case.of("n-to-m", name, shape, f"{sm}@{_host_list(0, sh)}", ss,
                        f"{dm}@{_host_list(sh, dh)}", ds))
    return out


def one_to_m(nbytes: int = 1 << 30) -> list[Case]:
    """One device sends a float32 vector (1 GiB in the paper) to a replicated mesh."""
    n = nbytes // 4
    out = []
    for hosts, devices in ((1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (3, 2), (4, 2)):
        out.append(Case.of("1-to-m", f"{hosts}x{devices}", (n,), "1x1@0", "R",
                        f"{hosts}x{devices}@{_host_list(1, hosts)}", "R"))
    return out


def replicate(nbytes: int = 1 << 30) -> list[Case]:
    """Every destination host needs the whole float32 tensor: a sharded layout to
    replicated copies over 3 and 4 receiving hosts (5 hosts in all)."""
    n = max(16, nbytes // 4 // 16 * 16)
    return [Case.of("replicate", "2x4->3x4", (n // 16, 16), "2x4@0,1", "S01R", "3x4@2,3,4", "RR"),
            Case.of("replicate", "1x4->4x4", (n // 16, 16), "1x4@0", "S1R", "4x4@1,2,3,4", "RR")]


def n_to_m_last_dim(size_mb: float) -> int:
    """The last dim that makes the n-to-m tensor about ``size_mb`` MiB (even: case 9
    splits it in two)."""
    return max(2, int(size_mb * (1 << 20) / (1024 * 1024 * 4)) // 2 * 2)


@dataclass(frozen=True)
class Suite:
    """A reference suite: its cases (sized by the n-to-m last dim or the 1-to-m MiB)
    and the methods compared on them."""

    name: str
    summary: str
    cases: Callable[[int, float], list[Case]]  # (last_dim, size_mb) -> cases
    methods: tuple[Method, ...]
    sized_by: str = "size_mb"  # the size option its cases read: "last_dim" or "size_mb"


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("1-to-m", "one device to a replicated mesh (the paper's Figure 6)",
          lambda last_dim, size_mb: one_to_m(int(size_mb * (1 << 20))), METHODS),
    Suite("n-to-m", "Alpa's many-to-many cases (the paper's Figure 5)",
          lambda last_dim, size_mb: n_to_m(last_dim), METHODS, "last_dim"),
    Suite("balance", "load-balancing ablation on the n-to-m cases (the paper's Figure 8)",
          lambda last_dim, size_mb: n_to_m(last_dim), BALANCE_METHODS, "last_dim"),
    Suite("replicate", "sharded to replicated on 3 and 4 receiving hosts (weight sync)",
          lambda last_dim, size_mb: replicate(int(size_mb * (1 << 20))), REPLICATE_METHODS),
)}
"""Every reference suite by name: plan, simulate and bench all read it."""


def suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise InvalidOptionError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}") from None


def suite_cases(name: str, last_dim: int = 512, size_mb: float = 1024) -> list[Case]:
    return suite(name).cases(last_dim, size_mb)
