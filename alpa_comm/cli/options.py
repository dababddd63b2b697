"""Argument groups and values shared by the ``alpa-comm`` commands, and the objects
built from them. Choices come from the core's registries (transfer kinds,
load balancers, schedules, suites), so a new kind or schedule shows up here
without an edit."""
from __future__ import annotations

import argparse
import os
import sys

from .. import suites
from ..errors import AlpaCommError
from ..pipeline import DEFAULT_CHUNKS, SCHEDULE_KINDS, VIRTUAL_SCHEDULES
from ..resharding import LOADBALANCE_MODES, STRATEGIES, plan_resharding
from ..resharding.planner import smallest_cluster
from ..topology import ClusterSpec
from .values import count, nic_rate, number, output_dir

MAX_ELEMENTS = 1 << 60
"""A tensor with more elements does not fit any machine (and overflows int64 byte counts)."""


# ------------------------------------------------------------------ value types
def shape_value(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers, got {text!r}")
    total = 1
    for d in dims:
        total *= d
    if total > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"has {total:.3g} elements, more than any machine holds: {text!r}")
    return dims


def chunks_value(text: str):
    if text == "auto":
        return None
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
    return v


def delay_value(text: str):
    if text == "auto":
        return "auto"
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = [-1]
    if min(values) < 0:
        raise argparse.ArgumentTypeError(f"takes 'auto', an integer >= 0 or one per stage, got {text!r}")
    return values[0] if len(values) == 1 else values


def reject_unused(args, unused: dict[str, str], why: str) -> None:
    """Refuse options that do nothing in the chosen mode instead of ignoring them:
    ``unused`` maps each option's dest to its flag."""
    given = sorted(flag for dest, flag in unused.items() if dest in getattr(args, "given", ()))
    if given:
        raise AlpaCommError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing {why}")


# --------------------------------------------------------------- argument groups
def add_cluster_model_args(p: argparse.ArgumentParser) -> None:
    """The modelled cluster of ``plan`` and ``simulate``."""
    g = p.add_argument_group("cluster (defaults: the smallest that holds both meshes)")
    g.add_argument("--hosts", type=count(1), help="number of hosts")
    g.add_argument("--devices-per-host", type=count(1), help="devices per host")
    g.add_argument("--nic-gbps", type=number(0, exclusive=True), default=10.0,
                   help="NIC bandwidth per host, Gbit/s (default 10)")
    g.add_argument("--intra-gbps", type=number(0, exclusive=True, allow_inf=True), default=1200.0,
                   help="intra-host link bandwidth, Gbit/s, or inf (default 1200, NVLink-class)")
    g.add_argument("--latency-us", type=number(0, maximum=1e7), default=20.0,
                   help="per-message latency, microseconds (default 20)")


def add_strategy_arg(p: argparse.ArgumentParser, help_suffix: str = "") -> None:
    p.add_argument("--strategy", default="broadcast", choices=STRATEGIES,
                   help="how slices move between meshes (default broadcast)" + help_suffix)


AUTO_SCHEDULE = "auto"
"""``--schedule auto``: every family simulated with the costs given, the fastest that fits
the memory cap run (``pipeline.auto_schedule``)."""


def add_schedule_args(p: argparse.ArgumentParser, delay_help: str, auto: bool = False) -> None:
    """``--schedule`` (every family of ``pipeline.SCHEDULE_KINDS``, virtual ones included),
    ``--model-chunks``, ``--split-backward``, ``--delay-wgrad``; ``auto`` adds the choice by
    simulation and its ``--memory-cap``."""
    kinds = {k.name: k.summary for k in SCHEDULE_KINDS.values()}
    if auto:
        kinds[AUTO_SCHEDULE] = ("predict every schedule above (schedule: the simulator with --t-fwd/--t-bwd/"
                                "--t-comm; train: measured in a calibration run first) and run the fastest that "
                                "fits --memory-cap (prints the ranking)")
        p.add_argument("--memory-cap", type=number(0, exclusive=True, maximum=1e6), default=None,
                       help="with --schedule auto: the most live activations a stage may hold, in microbatches "
                            "of a whole stage (1F1B's first stage holds min(S, M); default: no cap)")
    p.add_argument("--schedule", default="eager-1f1b", choices=list(kinds),
                   help="; ".join(f"{k}: {v}" for k, v in kinds.items()) + " (default eager-1f1b)")
    p.add_argument("--model-chunks", type=count(2, 64), default=None,
                   help="model chunks per stage (virtual stages) for " + ", ".join(VIRTUAL_SCHEDULES)
                        + f" (default {DEFAULT_CHUNKS})")
    p.add_argument("--split-backward", action="store_true",
                   help="split B into BI (input grad) and BW (weight grad)")
    p.add_argument("--delay-wgrad", type=delay_value, default=None, help=delay_help)


def add_resharding_args(p: argparse.ArgumentParser) -> None:
    """One resharding (or a reference suite) and how to plan it."""
    p.add_argument("--shape", type=shape_value, help="tensor shape, e.g. 1024,1024,16")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--src-mesh", help="source mesh SHAPE@HOSTS, e.g. 2x4@0,1")
    p.add_argument("--src-spec", help="source sharding spec, e.g. S0RR")
    p.add_argument("--dst-mesh", help="destination mesh, e.g. 2x4@2,3")
    p.add_argument("--dst-spec", help="destination sharding spec, e.g. S01RR")
    add_strategy_arg(p)
    p.add_argument("--loadbalance", default="auto", choices=LOADBALANCE_MODES,
                   help="sender choice and ordering (default auto: dfs when small, else greedy)")
    p.add_argument("--chunks", type=chunks_value, default=None, help="broadcast chunks per slice, or 'auto' (default)")
    p.add_argument("--seed", type=count(0), default=0, help="seed of the randomized greedy search")
    p.add_argument("--plan-cache", metavar="DIR", type=output_dir,
                   default=os.environ.get("ALPA_COMM_PLAN_CACHE") or None,
                   help="keep plans in DIR and serve them from there next time (default: $ALPA_COMM_PLAN_CACHE, "
                        "else in this process only)")
    p.add_argument("--suite", choices=list(suites.SUITES),
                   help="a reference suite with every method side by side instead of one resharding: "
                        + "; ".join(f"{s.name}: {s.summary}" for s in suites.SUITES.values()))
    add_alpa_baseline_arg(p)
    p.add_argument("--last-dim", type=count(2), default=512, help="n-to-m suites: last tensor dim (paper: 512)")
    p.add_argument("--size-mb", type=number(0, exclusive=True, maximum=1 << 30), default=1024,
                   help="1-to-m and replicate suites: tensor size in MiB (paper: 1024)")
    add_cluster_model_args(p)


ALPA_BASELINE_SOURCES = ("code", "model")


def add_alpa_baseline_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpa-baseline", choices=ALPA_BASELINE_SOURCES, default="code",
                   help="suites: where Alpa's baselines (alpa, alpa_send_recv) come from: 'code' = the messages "
                        "Alpa 0.2.3's own strategy generation and task compiler produce (run from its wheel, "
                        "fetched once; needs the extra 'alpa'; falls back to 'model', saying so, where the "
                        "wheel cannot be fetched or run), 'model' = "
                        "alpa_comm's model of Alpa (each piece sent once) (default code)")


def alpa_baseline(args, cases, devices_per_host: int):
    """The ``compiled_sends`` for ``suites.plan_method`` that ``--alpa-baseline`` asks for
    (None: alpa_comm's model), with one line on stderr saying which is used."""
    if not any(m.name in suites.ALPA_BASELINES for c in cases for m in suites.suite(c.suite).methods):
        return None
    if args.alpa_baseline == "model":
        print(f"Alpa baselines: {suites.FROM_MODEL} (--alpa-baseline model)", file=sys.stderr)
        return None
    from ..integrations.alpa_baseline import AlpaBaseline  # noqa: PLC0415
    from .needs import alpa_code  # noqa: PLC0415

    alpa_code()
    print("Alpa baselines: compiling every case with Alpa 0.2.3's own code ...", file=sys.stderr, flush=True)
    provider = AlpaBaseline(cases, devices_per_host)
    if not provider.available:
        print(f"Alpa baselines: {suites.FROM_MODEL}: Alpa's code could not run ({provider.reason})", file=sys.stderr)
        return None
    print(f"Alpa baselines: {suites.FROM_ALPA_CODE}", file=sys.stderr)
    return provider


def add_live_cluster_args(p: argparse.ArgumentParser, default: str, kinds: str, hosts_default: int | None,
                          devices_default: int, host_cpus: bool = False) -> None:
    """A cluster that runs things: emulated, local or an existing Ray cluster."""
    p.add_argument("--cluster", default=default, help=f"{kinds} (default {default})")
    if hosts_default is not None:
        p.add_argument("--hosts", type=count(1, 256), default=hosts_default,
                       help=f"hosts of an emulated or local cluster (default {hosts_default})")
    p.add_argument("--devices-per-host", type=count(1, 1024), default=devices_default,
                   help=f"devices per host (default {devices_default})")
    add_emulated_host_args(p, host_cpus)


def add_emulated_host_args(p: argparse.ArgumentParser, host_cpus: bool = False) -> None:
    """How emulated hosts are shaped: NIC rate, and (where asked) a CPU cap per host."""
    p.add_argument("--nic", type=nic_rate, default="400mbit",
                   help="emulated NIC rate per host and direction, e.g. 400mbit, 1gbit, none (default 400mbit)")
    if host_cpus:
        p.add_argument("--host-cpus", type=number(0, exclusive=True, maximum=4096), default=None,
                       help="emulated: cap each host at this many CPU cores (hosts then compute side by side "
                            "at a steady rate, as separate machines would)")


# ------------------------------------------------------------- built objects
def cluster_from_args(args, src_mesh=None, dst_mesh=None, hosts=None, dph=None) -> ClusterSpec:
    kw = dict(nic_send_gbps=args.nic_gbps, intra_host_gbps=args.intra_gbps, latency_s=args.latency_us * 1e-6)
    if args.hosts or hosts:
        kw["num_hosts"] = args.hosts or hosts
    if args.devices_per_host or dph:
        kw["devices_per_host"] = args.devices_per_host or dph
    if src_mesh is None:
        return ClusterSpec(**kw)
    return smallest_cluster(src_mesh, dst_mesh, **kw)


ONE_RESHARDING = {"shape": "--shape", "dtype": "--dtype", "src_mesh": "--src-mesh", "src_spec": "--src-spec",
                  "dst_mesh": "--dst-mesh", "dst_spec": "--dst-spec", "strategy": "--strategy",
                  "loadbalance": "--loadbalance", "plan_cache": "--plan-cache"}
"""Options of one resharding, which a suite (every case, every method) replaces."""


def suite_cluster(args) -> ClusterSpec:
    """The modelled cluster of a reference suite (the paper's 5 hosts x 4 devices by default)."""
    reject_unused(args, ONE_RESHARDING, "with --suite (it plans every case with every method)")
    unread = {"last_dim": "--last-dim", "size_mb": "--size-mb"}
    unread.pop(suites.suite(args.suite).sized_by)
    reject_unused(args, unread, f"with --suite {args.suite} (its cases are sized by "
                                f"--{suites.suite(args.suite).sized_by.replace('_', '-')})")
    return cluster_from_args(args, hosts=suites.SUITE_HOSTS, dph=suites.SUITE_DEVICES_PER_HOST)


def plan_from_args(args):
    """The single resharding the options describe (plan and simulate share it)."""
    missing = [o for o in ("shape", "src_mesh", "src_spec", "dst_mesh", "dst_spec") if getattr(args, o) is None]
    if missing:
        raise AlpaCommError("missing option(s): " + ", ".join("--" + m.replace("_", "-") for m in missing)
                            + " (or use --suite)")
    suite_only = {"last_dim": "--last-dim", "size_mb": "--size-mb", "alpa_baseline": "--alpa-baseline"}
    reject_unused(args, suite_only, "without --suite")
    cluster = cluster_from_args(args, args.src_mesh, args.dst_mesh)
    if getattr(args, "plan_cache", None):
        from ..runtime.plan_store import use_disk_plan_cache  # noqa: PLC0415

        use_disk_plan_cache(args.plan_cache)
    return plan_resharding(args.shape, args.dtype, args.src_mesh, args.src_spec, args.dst_mesh, args.dst_spec,
                           cluster=cluster, strategy=args.strategy, loadbalance=args.loadbalance,
                           chunks=args.chunks, seed=args.seed)
