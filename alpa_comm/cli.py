"""The ``alpa-comm`` command line.

Sub-commands take the same mesh/spec/strategy vocabulary as the Python API;
bad input ends with exit code 2 and a message naming the offending value.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .topology import ClusterSpec
from .errors import AlpaCommError
from .resharding import LOADBALANCE_MODES, STRATEGIES, plan_resharding
from .resharding.explain import fmt_bytes, fmt_seconds
from .resharding.plan import smallest_cluster
from .report.tables import table
from . import suites


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be comma-separated integers, got {text!r}") from None


def _chunks(text: str):
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"chunks must be a positive integer or 'auto', got {text!r}") from None


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (defaults: the smallest that holds both meshes)")
    g.add_argument("--hosts", type=int, help="number of hosts")
    g.add_argument("--devices-per-host", type=int, help="devices per host")
    g.add_argument("--nic-gbps", type=float, default=10.0, help="NIC bandwidth per host, Gbit/s (default 10)")
    g.add_argument("--intra-gbps", type=float, default=1200.0,
                   help="intra-host link bandwidth, Gbit/s (default 1200, NVLink-class)")
    g.add_argument("--latency-us", type=float, default=20.0, help="per-message latency, microseconds (default 20)")


def add_resharding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", type=_shape, help="tensor shape, e.g. 1024,1024,16")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--src-mesh", help="source mesh SHAPE@HOSTS, e.g. 2x4@0,1")
    p.add_argument("--src-spec", help="source sharding spec, e.g. S0RR")
    p.add_argument("--dst-mesh", help="destination mesh, e.g. 2x4@2,3")
    p.add_argument("--dst-spec", help="destination sharding spec, e.g. S01RR")
    p.add_argument("--strategy", default="broadcast", choices=STRATEGIES, help="per-task strategy (default broadcast)")
    p.add_argument("--loadbalance", default="auto", choices=LOADBALANCE_MODES,
                   help="sender choice and ordering (default auto: dfs when small, else greedy)")
    p.add_argument("--chunks", type=_chunks, default=None, help="broadcast chunks per slice, or 'auto' (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the randomized greedy search")
    p.add_argument("--suite", choices=sorted(suites.SUITES),
                   help="plan a reference suite with every method side by side instead of one resharding")
    p.add_argument("--last-dim", type=int, default=512, help="n-to-m suite: last tensor dim (paper: 512)")
    p.add_argument("--size-mb", type=float, default=1024, help="1-to-m suite: vector size in MiB (paper: 1024)")
    add_cluster_args(p)


def cluster_from_args(args, src_mesh=None, dst_mesh=None, hosts=None, dph=None) -> ClusterSpec:
    kw = dict(nic_send_gbps=args.nic_gbps, intra_host_gbps=args.intra_gbps, latency_s=args.latency_us * 1e-6)
    if args.hosts or hosts:
        kw["num_hosts"] = args.hosts or hosts
    if args.devices_per_host or dph:
        kw["devices_per_host"] = args.devices_per_host or dph
    if src_mesh is None:
        return ClusterSpec(**kw)
    return smallest_cluster(src_mesh, dst_mesh, **kw)


def _suite_cases(args):
    if args.suite == "n-to-m":
        return suites.n_to_m(args.last_dim)
    return suites.one_to_m(int(args.size_mb * (1 << 20)))


def plan_from_args(args):
    """The single resharding the options describe (plan and simulate share it)."""
    missing = [o for o in ("shape", "src_mesh", "src_spec", "dst_mesh", "dst_spec") if getattr(args, o) is None]
    if missing:
        raise AlpaCommError("missing option(s): " + ", ".join("--" + m.replace("_", "-") for m in missing)
                            + " (or use --suite)")
    cluster = cluster_from_args(args, args.src_mesh, args.dst_mesh)
    return plan_resharding(args.shape, args.dtype, args.src_mesh, args.src_spec, args.dst_mesh, args.dst_spec,
                           cluster=cluster, strategy=args.strategy, loadbalance=args.loadbalance,
                           chunks=args.chunks, seed=args.seed)


def cmd_plan(args) -> int:
    if args.suite:
        return _plan_suite(args)
    plan = plan_from_args(args)
    print(plan.to_json(indent=1) if args.json else plan.explain())
    return 0


def _plan_suite(args) -> int:
    cluster = cluster_from_args(args, hosts=suites.SUITE_HOSTS, dph=suites.SUITE_DEVICES_PER_HOST)
    cases = _suite_cases(args)
    results = []
    t0 = time.monotonic()
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] planning case {case.name} ...", file=sys.stderr, flush=True)
        row = {}
        for m in suites.METHODS:
            plan = plan_resharding(case.shape, case.dtype, case.src_mesh, case.src_spec, case.dst_mesh,
                                   case.dst_spec, cluster=cluster, strategy=m.strategy,
                                   loadbalance=m.loadbalance, chunks=args.chunks, seed=args.seed)
            row[m.name] = plan
        results.append((case, row))
    print(f"planned {len(cases)} cases x {len(suites.METHODS)} methods in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    if args.json:
        out = []
        for case, row in results:
            bound = row["broadcast"].lower_bound_seconds
            for name, plan in row.items():
                out.append({"suite": case.suite, "case": case.name, "method": name,
                            "predicted_seconds": plan.predicted_seconds, "lower_bound_seconds": bound})
        print(json.dumps(out, indent=1))
        return 0
    print(f"Suite {args.suite} on {cluster.describe()}")
    print("Each cell: predicted time, and in brackets its ratio to the physical lower bound.\n")
    headers = ["case", "src -> dst", "size", "lower bound"] + [m.name for m in suites.METHODS]
    rows = []
    for case, row in results:
        bound = row["broadcast"].lower_bound_seconds
        cells = [case.name, f"{case.src_spec}@{case.src_mesh.split('@')[0]} -> {case.dst_spec}@{case.dst_mesh.split('@')[0]}",
                 fmt_bytes(row["broadcast"].nbytes), fmt_seconds(bound)]
        cells += [f"{fmt_seconds(p.predicted_seconds)} ({p.predicted_seconds / bound:.2f})" for p in row.values()]
        rows.append(cells)
    print(table(headers, rows))
    print("\nMethods: " + "; ".join(f"{m.name} = {m.note}" for m in suites.METHODS))
    return 0


def cmd_simulate(args) -> int:
    from pathlib import Path  # noqa: PLC0415

    from .sim import simulate  # noqa: PLC0415
    from .sim.simulate import effective_gbps  # noqa: PLC0415

    if args.suite:
        from .sim.suite import run_suite, suite_table, wide_table, write_outputs  # noqa: PLC0415

        cluster = cluster_from_args(args, hosts=suites.SUITE_HOSTS, dph=suites.SUITE_DEVICES_PER_HOST)
        t0 = time.monotonic()
        rows = run_suite(args.suite, cluster, args.last_dim, args.size_mb, args.seed)
        print(f"simulated in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        print(f"Simulated {args.suite} suite on {cluster.describe()}\n")
        print(wide_table(rows))
        print()
        print(suite_table(rows))
        if args.out:
            paths = write_outputs(args.suite, rows, cluster, Path(args.out))
            print("\nwrote " + ", ".join(str(p) for p in paths.values()))
        return 0
    plan = plan_from_args(args)
    res = simulate(plan)
    print(plan.explain(max_transfers=0))
    print(f"\n  simulated: {fmt_seconds(res.makespan)}  ({effective_gbps(plan.nbytes, res.makespan):.2f} Gbit/s "
          f"effective, {res.makespan / plan.lower_bound_seconds:.2f}x the lower bound)\n")
    rows = [[h, fmt_bytes(res.host_sent.get(h, 0)), fmt_bytes(res.host_received.get(h, 0)),
             f"{100 * res.host_busy_fraction.get(h, 0):.0f} %"] for h in sorted(res.host_busy_fraction)]
    print(table(["host", "NIC sent", "NIC received", "NIC busy"], rows, markdown=False))
    if args.trace:
        from .report.trace import write_chrome_trace  # noqa: PLC0415

        print(f"\nChrome trace: {write_chrome_trace(res, args.trace)} (open in https://ui.perfetto.dev)")
    if args.png:
        from .report.charts import gantt_png  # noqa: PLC0415

        print(f"Gantt chart: {gantt_png(res, args.png)}")
    return 0


def _delay(text: str):
    if text == "auto":
        return "auto"
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--delay-wgrad takes 'auto', an integer or one per stage, got {text!r}") \
            from None
    return values[0] if len(values) == 1 else values


def cmd_schedule(args) -> int:
    from pathlib import Path  # noqa: PLC0415

    from .pipeline import Costs, Schedule, memory, simulate_schedule, validate  # noqa: PLC0415
    from .pipeline import compare as report  # noqa: PLC0415
    from .report.schedule_pictures import ascii_timeline, timeline_png  # noqa: PLC0415
    from .report.trace import write_chrome_trace  # noqa: PLC0415

    costs = Costs(t_fwd=args.t_fwd, t_bwd=args.t_bwd, t_comm=args.t_comm)
    if args.compare:
        variants = report.compare(args.stages, args.microbatches, costs)
        bound = report.signal_bound(args.stages, args.microbatches, costs)
        limit = report.comm_limit(args.stages, args.microbatches, costs)
        print(f"S={args.stages} stages, M={args.microbatches} microbatches, t_fwd={args.t_fwd:g}, "
              f"t_bwd={args.t_bwd:g}, t_comm={args.t_comm:g}")
        print(f"signal upper bound (transfers free): {bound:g}; with fill and drain transfers on the critical path "
              f"no schedule beats {limit:g} = {bound / limit:.3f} of the bound\n")
        print(table(report.HEADERS, report.rows(variants, args.microbatches, bound)))
        if args.png:
            pick = [v for v in variants if v.label == "1f1b"] + [v for v in variants if "eager-1f1b + split + auto" in v.label]
            timeline_png([(v.label, v.result, args.stages) for v in pick], args.png)
            print(f"\nPNG: {args.png}")
        return 0
    if args.from_file:
        text = Path(args.from_file).read_text()
        sched = Schedule.from_json(text) if text.lstrip().startswith("{") else Schedule.from_text(text, args.from_file)
        label = f"{args.from_file}"
    else:
        variant = report.build(args.schedule, args.stages, args.microbatches, costs, args.split_backward,
                               args.delay_wgrad)
        sched, label = variant.schedule, variant.label
    validate(sched)
    S, M = sched.num_stages, sched.num_microbatches
    if args.format == "text":
        print(sched.to_text(), end="")
        return 0
    if args.format == "json":
        print(sched.to_json())
        return 0
    res = simulate_schedule(sched, costs)
    bound = report.signal_bound(S, M, costs)
    print(f"{label}: S={S}, M={M}, t_fwd={args.t_fwd:g}, t_bwd={args.t_bwd:g}, t_comm={args.t_comm:g}")
    print(ascii_timeline(res, S))
    mem = memory(sched)
    print(f"\niteration time {res.iteration_time:g}   signal bound {bound:g}   throughput {bound / res.iteration_time:.3f}"
          f" of the bound   bubble {100 * res.bubble_fraction:.1f} %")
    print("peak live activations per stage (microbatch units): " + " ".join(f"{m.peak_activations:g}" for m in mem))
    if any(m.peak_pending_wgrad for m in mem):
        print("peak pending weight gradients per stage: " + " ".join(str(m.peak_pending_wgrad) for m in mem))
    if args.png:
        timeline_png([(label, res, S)], args.png)
        print(f"PNG: {args.png}")
    if args.trace:
        print(f"Chrome trace: {write_chrome_trace(res, args.trace)}")
    return 0


def cmd_cluster(args) -> int:
    from .runtime.emulated import netns  # noqa: PLC0415

    if args.action == "up":
        from .runtime.cluster import launch_emulated  # noqa: PLC0415

        network = launch_emulated(args.hosts, None if args.nic == "none" else args.nic, cpu=args.host_cpus)
        print(f"emulated cluster up: {args.hosts} hosts ({', '.join(netns.host_ip(h) for h in range(args.hosts))}), "
              f"NIC {args.nic}, Ray at {network.info['address']}")
        print("drive it from Python with Cluster.attach_emulated(devices_per_host=...); "
              "tear it down with 'alpa-comm cluster down'")
        return 0
    network = netns.EmulatedNetwork.load()
    leftovers = netns.existing_namespaces()
    if args.action == "status":
        if network is None and not leftovers:
            print("no emulated cluster is up")
            return 0
        status = network.status() if network else {"namespaces": leftovers, "note": "state file missing"}
        print(json.dumps(status, indent=1))
        return 0
    from .runtime.cluster import teardown_emulated  # noqa: PLC0415

    if network is None and not leftovers:
        print("no emulated cluster is up; nothing to do")
        return 0
    teardown_emulated(network or netns.EmulatedNetwork(len(leftovers), None))
    print("emulated cluster removed (namespaces, links, processes)")
    return 0


def open_cluster(kind: str, hosts: int, devices_per_host: int, nic: str, timeout: float):
    """emulated (root + iproute2), local, or ray://ADDR / ADDR of an existing Ray cluster."""
    from .runtime import Cluster  # noqa: PLC0415

    if kind == "emulated":
        return Cluster.emulated(hosts, devices_per_host, nic=None if nic == "none" else nic, timeout=timeout)
    if kind == "local":
        return Cluster.local(hosts, devices_per_host, timeout=timeout)
    address = kind[len("ray://"):] if kind.startswith("ray://") else kind
    return Cluster.connect(address, devices_per_host, timeout=timeout)


def cmd_bench(args) -> int:
    from pathlib import Path  # noqa: PLC0415

    from . import bench  # noqa: PLC0415

    names = bench.SUITE_NAMES if args.suite == "all" else (args.suite,)
    if args.repeat < 1 or args.size_mb <= 0:
        raise AlpaCommError(f"--repeat must be >= 1 and --size-mb > 0, got {args.repeat} and {args.size_mb}")
    if args.cluster in ("emulated", "local"):  # a connected cluster is checked once its size is known
        bench.check(ClusterSpec(num_hosts=args.hosts, devices_per_host=args.devices_per_host), names, args.size_mb)
    with open_cluster(args.cluster, args.hosts, args.devices_per_host, args.nic, args.timeout) as cluster:
        calibrated, t_copy, results = bench.run(cluster, names, args.size_mb, args.repeat)
        desc = {"kind": args.cluster, "description": cluster.spec.describe(), "nic": args.nic,
                "hosts": cluster.spec.num_hosts, "devices_per_host": cluster.spec.devices_per_host,
                "calibrated_nic_gbps": calibrated.nic_send_gbps, "one_copy_seconds": t_copy,
                "size_mb": args.size_mb, "repeat": args.repeat}
    print(f"\nalpa-comm bench on {desc['description']} ({args.cluster}); one {args.size_mb:g} MiB copy "
          f"between two hosts: {t_copy:.3f} s = {calibrated.nic_send_gbps:.3f} Gbit/s (simulator calibrated to it)\n")
    print(bench.results_table(results))
    print()
    print(bench.acceptance_table(results))
    paths = bench.write(results, desc, Path(args.out))
    print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_train(args) -> int:
    from .train.trainer import TrainConfig, train, write_loss  # noqa: PLC0415

    cfg = TrainConfig(**{k: getattr(args, k) for k in TrainConfig.__dataclass_fields__ if hasattr(args, k)})
    result = train(cfg)
    timed = result.step_seconds[1:] or result.step_seconds
    print(f"{cfg.model}, {cfg.stages} stages x dp {cfg.dp}, {result.schedule.name}, {cfg.strategy} on {cfg.cluster}: "
          f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f} over {cfg.steps} steps; "
          f"{sum(timed) / len(timed):.3f} s/step after the first, {result.samples_per_second:.1f} samples/s")
    if args.out:
        for path in write_loss(result, cfg, args.out):
            print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alpa-comm", description=__doc__.splitlines()[0].strip("`. ")
                                     + ": plan, simulate and run cross-mesh resharding.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan one cross-mesh resharding (or a reference suite) and explain it",
                       description="Plan a cross-mesh resharding: unit tasks, strategy, sender choice and order, "
                                   "predicted time vs the physical lower bound.")
    add_resharding_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (docs/plan-json.md)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate a resharding (or a reference suite) on a flow-level network model",
                       description="Plan, then execute the plan on a flow-level network simulator (max-min fair "
                                   "NIC sharing, the plan's per-host order): makespan, per-host bytes and busy "
                                   "time, timeline. --suite runs every method side by side on the paper's testbed.")
    add_resharding_args(p)
    for action in p._actions:
        if action.dest == "suite":
            action.choices = ["1-to-m", "n-to-m", "balance"]
            action.help = "run a reference suite (balance: load-balancing ablation on the n-to-m cases)"
    p.add_argument("--out", help="suite mode: directory for the markdown table, JSON and PNG")
    p.add_argument("--trace", help="single case: write a Chrome trace JSON here")
    p.add_argument("--png", help="single case: write a Gantt chart PNG here")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedule", help="generate, validate, simulate and draw pipeline schedules",
                       description="Pipeline schedules (GPipe, 1F1B, eager-1F1B, split and delayed backward): "
                                   "print them, validate them, simulate them with compute and transfer times, "
                                   "draw them. --compare puts every variant side by side.")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages, one per mesh (default 4)")
    p.add_argument("--microbatches", type=int, default=8, help="microbatches per iteration (default 8)")
    p.add_argument("--schedule", default="eager-1f1b", choices=["gpipe", "1f1b", "eager-1f1b"])
    p.add_argument("--split-backward", action="store_true", help="split B into BI (input grad) and BW (weight grad)")
    p.add_argument("--delay-wgrad", type=_delay, default=None,
                   help="delay BW: 'auto' (least delay that helps, from the cost model), N, or N0,N1,... per stage")
    p.add_argument("--t-fwd", type=float, default=1.0, help="forward time per stage (default 1)")
    p.add_argument("--t-bwd", type=float, default=2.0, help="backward time per stage (default 2; BI and BW half each)")
    p.add_argument("--t-comm", type=float, default=0.5, help="time of one cross-mesh transfer (default 0.5)")
    p.add_argument("--format", choices=["text", "json", "ascii"], default="ascii",
                   help="text/json: print the schedule itself; ascii: simulate and draw (default)")
    p.add_argument("--from-file", help="read a schedule (text form or JSON) instead of generating one")
    p.add_argument("--compare", action="store_true", help="every schedule variant side by side")
    p.add_argument("--png", help="write a timeline PNG here")
    p.add_argument("--trace", help="write a Chrome trace JSON here")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("bench", help="measure every method side by side on a real (emulated) cluster",
                       description="The microbenchmark against baseline Alpa: every method of every case in the "
                                   "same run on the same cluster, warm-up + repeated timed runs, every run "
                                   "verified by per-device checksums; table, results.json and PNGs.")
    p.add_argument("--suite", default="n-to-m", choices=["1-to-m", "n-to-m", "balance", "weight-sync", "all"],
                   help="all = 1-to-m, n-to-m and balance; weight-sync = per-array vs coalesced pytree resharding")
    p.add_argument("--cluster", default="emulated",
                   help="emulated (root + iproute2; default), local, or ray://ADDR of a running Ray cluster")
    p.add_argument("--hosts", type=int, default=5, help="hosts of an emulated or local cluster (default 5)")
    p.add_argument("--devices-per-host", type=int, default=4)
    p.add_argument("--nic", default="400mbit", help="emulated NIC rate per host and direction (default 400mbit)")
    p.add_argument("--size-mb", type=float, default=64, help="tensor size in MiB (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per method after one warm-up (default 3)")
    p.add_argument("--timeout", type=float, default=30, help="per-wait timeout, seconds (default 30)")
    p.add_argument("--out", default="out/bench", help="directory for results.json, results.md and PNGs")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("train", help="train GPT or U-Transformer through a pipeline schedule, stages on hosts",
                       description="Pipeline training on JAX: each stage on its own host (mesh of local "
                                   "devices), the schedule IR executed by the host workers, activations and "
                                   "gradients moved by cross-mesh resharding; data: Python's standard library "
                                   "as bytes. Prints progress; --out writes the loss curve, --trace a Chrome trace.")
    p.add_argument("--model", choices=["gpt", "utransformer"], default="gpt")
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="transformer layers (U-Transformer: 2L, L = layers/2)")
    p.add_argument("--width", type=int, default=64, help="model width d (default 64)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32, help="sequence length in bytes (default 32)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=4, help="rows per microbatch (all dp replicas together)")
    p.add_argument("--schedule", default="eager-1f1b", choices=["gpipe", "1f1b", "eager-1f1b"])
    p.add_argument("--split-backward", action="store_true", help="separate input- and weight-gradient actions")
    p.add_argument("--delay-wgrad", type=_delay, default=None,
                   help="delay weight gradients: 'auto', N, or one N per stage (implies --split-backward)")
    p.add_argument("--strategy", default="broadcast", choices=["broadcast", "alpa", "send_recv", "signal"],
                   help="cross-mesh resharding between stages (signal: one byte, the no-communication bound)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel hosts per stage (default 1)")
    p.add_argument("--cluster", default="local",
                   help="inprocess (one process), local (Ray on this machine), emulated (root: shaped NICs) or "
                        "ray://ADDR (default local)")
    p.add_argument("--devices-per-host", type=int, default=2, help="JAX devices per host (default 2)")
    p.add_argument("--nic", default="400mbit", help="emulated NIC rate, e.g. 400mbit, 1gbit, none")
    p.add_argument("--host-cpus", type=float, default=None,
                   help="emulated: cap each host at this many CPU cores (stages then compute side by side "
                        "at a steady rate, as separate machines would)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    p.add_argument("--data", default="corpus", choices=["corpus", "synthetic"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any transfer may wait (default 60)")
    p.add_argument("--trace", help="write a Chrome trace of the last steps here")
    p.add_argument("--out", help="write loss.json and loss.png here")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("cluster", help="start, inspect or remove the emulated multi-host cluster (root, iproute2)",
                       description="An emulated cluster on this machine: one network namespace per host on a "
                                   "bridge, tc-shaped NICs, one Ray node per host. 'down' removes everything "
                                   "it created, also after a crash.")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--hosts", type=int, default=5, help="number of hosts (default 5)")
    p.add_argument("--nic", default="400mbit", help="NIC rate per host and direction, e.g. 400mbit, 1gbit, none")
    p.add_argument("--host-cpus", type=float, default=None, help="cap each host at this many CPU cores")
    p.set_defaults(func=cmd_cluster)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (AlpaCommError, ValueError, RuntimeError) as e:
        print(f"alpa-comm {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
