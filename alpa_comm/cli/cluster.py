"""Commands that run on a live cluster: ``alpa-comm cluster`` (the emulated one),
``alpa-comm bench`` (every method side by side, measured) and ``alpa-comm train``."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import AlpaCommError
from ..pipeline.auto_schedule import TRIAL_MARGIN
from ..runtime.worker import TRANSPORTS
from ..topology import ClusterSpec
from . import needs
from .options import (add_alpa_baseline_arg, add_emulated_host_args, add_live_cluster_args, add_schedule_args,
                      add_strategy_arg, alpa_baseline, reject_unused)
from .values import auto_or_count, count, model_name, number, output_dir, output_file

MAX_SEQ = 8192
"""Longer byte sequences run for many minutes a step on CPUs: a typo more likely than a plan."""


def register(sub) -> None:
    _register_bench(sub)
    _register_train(sub)
    p = sub.add_parser("cluster", help="start, inspect or remove the emulated multi-host cluster (root, iproute2)",
                       description="An emulated cluster on one machine: one network namespace per host on a "
                                   "bridge, tc-shaped NICs, one Ray node per host. 'down' removes everything "
                                   "it created, also after a crash.")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--hosts", type=count(1, 256), default=5, help="number of hosts (default 5)")
    add_emulated_host_args(p, host_cpus=True)
    p.set_defaults(func=cmd_cluster)


def _register_bench(sub) -> None:
    from .. import suites  # noqa: PLC0415

    p = sub.add_parser("bench", help="measure every method side by side on a real (emulated) cluster",
                       description="The microbenchmark against baseline Alpa: every method of every case in the "
                                   "same run on the same cluster, warm-up + repeated timed runs, every run "
                                   "verified by per-device checksums; table, results.json and PNGs.")
    p.add_argument("--suite", default="n-to-m", choices=[*suites.SUITES, "weight-sync", *DATA_PLANE_SUITES, "all"],
                   help=f"all = {', '.join(suites.SUITES)}; weight-sync = per-array vs coalesced pytree resharding; "
                        f"with --mode processes also same-layout, layout-change, data-plane (both): the data plane "
                        f"beside JAX's own cross-host device_put and the transport's raw rate")
    add_live_cluster_args(p, "emulated", "emulated (root + iproute2), local, or ray://ADDR of a running Ray cluster",
                          hosts_default=5, devices_default=4)
    p.add_argument("--mode", choices=["cluster", "processes"], default="cluster",
                   help="cluster: tensors in alpa_comm's own host workers (default); processes: the user's own "
                        "JAX processes (alpa_comm.jax): --suite weight-sync (against gather-then-broadcast and "
                        "per-leaf transfers) or same-layout / layout-change / data-plane (against JAX's "
                        "device_put and both transports' raw rates); --cluster local is loopback with no tc "
                        "(the unshaped regime)")
    p.add_argument("--streams", type=auto_or_count(1, 8), default="auto",
                   help="--mode processes: TCP streams per pair of processes (tcp and gloo alike), or auto "
                        "(from the NIC rate: one per 10 Gbit/s; loopback counts as 40) (default auto)")
    p.add_argument("--size-mb", type=number(0, exclusive=True, maximum=1 << 20), default=64,
                   help="tensor size in MiB (default 64; processes mode: the model's size)")
    p.add_argument("--repeat", type=count(1, 10_000), default=3,
                   help="timed runs per method after one warm-up (default 3)")
    p.add_argument("--timeout", type=number(0, exclusive=True), default=30,
                   help="per-wait timeout, seconds (default 30)")
    p.add_argument("--out", type=output_dir, default="out/bench",
                   help="directory for results.json, results.md and PNGs")
    add_alpa_baseline_arg(p)
    p.set_defaults(func=cmd_bench)


def _register_train(sub) -> None:
    p = sub.add_parser("train", help="train GPT or U-Transformer through a pipeline schedule, stages on hosts",
                       description="Pipeline training on JAX: each stage on its own host (mesh of local "
                                   "devices), the schedule IR executed by the host workers, activations and "
                                   "gradients moved by cross-mesh resharding; data: Python's standard library "
                                   "as bytes. Prints progress; --out writes the loss curve, --trace a Chrome trace.")
    p.add_argument("--model", type=model_name, default="gpt",
                   help="gpt, utransformer, or package.module:function returning a PipelineModel (a model of "
                        "your own; see docs/train.md)")
    p.add_argument("--stages", type=count(1, 64), default=4, help="pipeline stages, one host each (default 4)")
    p.add_argument("--layers", type=count(1, 1024), default=None,
                   help="transformer layers (U-Transformer: 2L, L = layers/2; default 4, or one per model stage "
                        "where the schedule runs more: stages x chunks)")
    p.add_argument("--width", type=count(1, 1 << 16), default=64, help="model width d (default 64)")
    p.add_argument("--heads", type=count(1, 1024), default=4, help="attention heads, dividing --width (default 4)")
    p.add_argument("--seq", type=count(1, MAX_SEQ), default=32, help="sequence length in bytes (default 32)")
    p.add_argument("--microbatches", type=count(1, 4096), default=None,
                   help="microbatches per step (default 4, or the fewest above it the schedule runs: dualpipev 2 x "
                        "stages, interleaved-1f1b a multiple of the stages)")
    p.add_argument("--microbatch-size", type=count(1, 1 << 20), default=4,
                   help="rows per microbatch (all dp replicas together)")
    add_schedule_args(p, "delay weight gradients: N or one N per stage (implies --split-backward), or 'auto': "
                         "the least delay per stage that shortens the simulated iteration, the backward kept "
                         "whole where no delay does", auto=True)
    p.add_argument("--trial-margin", type=number(0, maximum=10), default=None,
                   help="with --schedule auto on host workers: after calibrating, run every candidate predicted "
                        "within this fraction of the fastest for a few steps and keep the measured fastest "
                        f"(default {TRIAL_MARGIN:g}; 0: only the predicted pick and its ties)")
    add_strategy_arg(p, "; signal: one byte, the no-communication bound")
    p.add_argument("--transport", default="gloo", choices=TRANSPORTS,
                   help="what host workers move transfers over: gloo (torch.distributed; default) or tcp "
                        "(alpa_comm's own TCP streams: one connection per pair of hosts, messages in order, "
                        "each read whole, paced at the NIC rate; benchmarks/transport_compare.py compares them)")
    p.add_argument("--dp", type=count(1, 64), default=1, help="data-parallel hosts per stage (default 1)")
    add_live_cluster_args(p, "local", "inprocess (one process), local (Ray on the local machine), emulated (root: "
                                      "shaped NICs) or ray://ADDR", hosts_default=None, devices_default=2,
                          host_cpus=True)
    p.add_argument("--steps", type=count(1, 10_000_000), default=50, help="training steps (default 50)")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--lr", type=number(0, exclusive=True, maximum=100), default=3e-3,
                   help="learning rate (default 3e-3)")
    p.add_argument("--data", default="corpus", choices=["corpus", "synthetic"])
    p.add_argument("--seed", type=count(0), default=0)
    p.add_argument("--timeout", type=number(0, exclusive=True), default=60.0,
                   help="seconds any transfer may wait (default 60)")
    p.add_argument("--trace", type=output_file, help="write a Chrome trace of the last steps here")
    p.add_argument("--out", type=output_dir, help="write loss.json and loss.png into this folder")
    p.add_argument("--checkpoint-dir", type=output_dir, default=None,
                   help="save checkpoints here (Orbax; each stage mesh its parameters and optimizer state, "
                        "written in the background; on a cluster a directory every host sees)")
    p.add_argument("--checkpoint-every", type=count(1, 10_000_000), default=None,
                   help="steps between checkpoints, and the last step (default 10; needs --checkpoint-dir)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the latest complete checkpoint in --checkpoint-dir, to --steps in all")
    p.set_defaults(func=cmd_train)


def _reject_emulated_only(args) -> None:
    """--nic and --host-cpus shape emulated hosts; elsewhere they would be ignored."""
    if args.cluster != "emulated":
        reject_unused(args, {"nic": "--nic", "host_cpus": "--host-cpus"},
                      f"with --cluster {args.cluster} (they shape emulated hosts only)")


def cmd_cluster(args) -> int:
    from ..runtime.emulated import netns  # noqa: PLC0415

    if args.action != "up":
        reject_unused(args, {"hosts": "--hosts", "nic": "--nic", "host_cpus": "--host-cpus"},
                      f"with '{args.action}' (they describe a cluster to start)")
    if args.action == "up":
        needs.modules("ray", extra="runtime")  # a Ray node per host
        needs.root(args, "'up'")
        from ..runtime.emulated.launch import launch_emulated  # noqa: PLC0415

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
        status["stale"] = netns.stale_reason()  # why the next 'up' would remove it; None: in use
        print(json.dumps(status, indent=1))
        return 0
    from ..runtime.emulated.launch import teardown_emulated  # noqa: PLC0415

    if network is None and not leftovers:
        print("no emulated cluster is up; nothing to do")
        return 0
    needs.root(args, "'down'")
    teardown_emulated(netns.existing_network())
    print("emulated cluster removed (namespaces, links, processes)")
    return 0


def cmd_bench(args) -> int:
    from ..runtime import Cluster  # noqa: PLC0415

    bench, report = needs.bench("cluster_runs"), needs.bench("report")
    names = bench.SUITE_NAMES if args.suite == "all" else (args.suite,)
    _reject_emulated_only(args)
    _bench_needs(args)
    if args.mode == "processes":
        return _bench_processes(args)
    reject_unused(args, {"streams": "--streams"}, "without --mode processes (alpa_comm's own workers use one)")
    if args.suite in DATA_PLANE_SUITES:
        raise AlpaCommError(f"--suite {args.suite} runs in the user's own JAX processes: add --mode processes")
    if args.cluster.startswith("ray://"):
        reject_unused(args, {"hosts": "--hosts"}, "with a running Ray cluster (its hosts are what it has)")
    if args.cluster in ("emulated", "local"):  # a connected cluster is checked once its size is known
        bench.check(ClusterSpec(num_hosts=args.hosts, devices_per_host=args.devices_per_host), names, args.size_mb)
    cases = [c for n in names if n != "weight-sync" for c in bench.suite_cases(n, args.size_mb)]
    compiled = alpa_baseline(args, cases, args.devices_per_host)
    with Cluster.open(args.cluster, args.hosts, args.devices_per_host, args.nic, args.timeout) as cluster:
        calibrated, t_copy, results = bench.run(cluster, names, args.size_mb, args.repeat,
                                                compiled_sends=compiled)
        desc = {"kind": args.cluster, "description": cluster.spec.describe(), "nic": args.nic,
                "hosts": cluster.spec.num_hosts, "devices_per_host": cluster.spec.devices_per_host,
                "calibrated_nic_gbps": calibrated.nic_send_gbps, "latency_s": calibrated.latency_s,
                "one_copy_seconds": t_copy,
                "size_mb": args.size_mb, "repeat": args.repeat}
    print(f"\nalpa-comm bench on {desc['description']} ({args.cluster}); one {args.size_mb:g} MiB copy "
          f"between two hosts: {t_copy:.3f} s = {calibrated.nic_send_gbps:.3f} Gbit/s (simulator calibrated to it)\n")
    print(report.results_table(results))
    print()
    print(report.acceptance_table(results))
    if report.baseline_note(results):
        print(f"\n{report.baseline_note(results)}.")
    paths = report.write_bench_outputs(results, desc, Path(args.out))
    print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _bench_processes(args) -> int:
    """``--mode processes``: the weight-sync suite in six JAX processes of our own."""
    sync, report = needs.bench("sync_processes"), needs.bench("report")
    if args.suite not in ("weight-sync", *DATA_PLANE_SUITES):
        raise AlpaCommError(f"--mode processes runs --suite weight-sync, {', '.join(DATA_PLANE_SUITES)}, "
                            f"not --suite {args.suite}")
    if args.cluster not in ("emulated", "local"):
        raise AlpaCommError(f"--mode processes starts its own processes: --cluster emulated or local, "
                            f"not {args.cluster!r}")
    reject_unused(args, {"hosts": "--hosts", "devices_per_host": "--devices-per-host",
                         "alpa_baseline": "--alpa-baseline"},
                  f"with --mode processes ({sync.WORLD} processes x {sync.DEVICES} devices, no Alpa)")
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:5.0f} s] {msg}", file=sys.stderr, flush=True)
    if args.suite in DATA_PLANE_SUITES:
        return _bench_data_plane(args, say)
    reject_unused(args, {"streams": "--streams"}, "with --suite weight-sync (its group picks its own)")
    results, desc = sync.run(None if args.nic == "none" else args.nic, args.size_mb, args.repeat,
                             timeout=args.timeout, emulated=args.cluster == "emulated", progress=say)
    print(f"\nalpa-comm bench --mode processes on {desc['description']}; process-to-process copies move "
          f"{desc['measured_copy_gbps']:.3f} Gbit/s (the slope between two sizes; the lower bounds use it) "
          f"after {1e3 * desc['fixed_seconds_per_call']:.0f} ms that every call costs\n")
    print(report.results_table(results))
    print()
    print(report.acceptance_table(results))
    paths = report.write_bench_outputs(results, desc, Path(args.out))
    print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    return 0


DATA_PLANE_SUITES = ("same-layout", "layout-change", "data-plane")


def _bench_data_plane(args, say) -> int:
    """``--mode processes --suite same-layout | layout-change | data-plane``."""
    data_plane, report = needs.bench("data_plane"), needs.bench("report")
    suites = data_plane.SUITES if args.suite == "data-plane" else (args.suite,)
    results, desc = data_plane.run(suites, None if args.nic == "none" else args.nic, args.size_mb, args.repeat,
                                   timeout=args.timeout, emulated=args.cluster == "emulated", streams=args.streams,
                                   progress=say)
    print(f"\nalpa-comm bench --mode processes on {desc['description']}; 'x lower bound' is the time over the "
          f"faster transport's raw rate (tcp or gloo) for the same bytes between the same processes\n")
    print(report.results_table(results))
    print()
    print(report.acceptance_table(results))
    if desc["jax_refusals"]:
        print("\nJAX's own device_put on the layout-change cases (each in processes of its own):\n")
        print(report.jax_refusals_table(desc["jax_refusals"]))
    paths = report.write_bench_outputs(results, desc, Path(args.out))
    print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _bench_needs(args) -> None:
    """The extras a benchmark run uses (its PNGs are drawn last), and root for an
    emulated cluster."""
    if args.mode == "processes":
        needs.modules("jax")  # the user's own JAX processes
        needs.modules("torch")  # the gloo transport and gloo's broadcast, measured beside alpa_comm's own
    else:
        needs.modules("ray", "torch")  # host workers on Ray, transfers over gloo
    needs.png(True)
    if args.cluster == needs.EMULATED:
        needs.root(args, "--cluster emulated", "use --cluster local (loopback, no NIC shaping)")


def _train_needs(args) -> None:
    """The extras training uses: jax and optax in one process; the runtime too (extra
    ``train``, which brings both) on host workers; matplotlib for --out's loss curve."""
    if args.cluster == "inprocess":
        needs.modules("jax", "optax")
    else:
        needs.modules("jax", "optax", "ray", *(["torch"] if args.transport == "gloo" else []), extra="train")
    needs.png(args.out)
    if args.cluster == needs.EMULATED:
        needs.root(args, "--cluster emulated", "use --cluster local or inprocess")


def cmd_train(args) -> int:
    from ..train.trainer import TrainConfig, train, write_loss  # noqa: PLC0415

    _reject_emulated_only(args)
    _train_needs(args)
    cfg = TrainConfig(**{k: getattr(args, k) for k in TrainConfig.__dataclass_fields__ if hasattr(args, k)})
    result = train(cfg, log=sys.stderr)  # this call's stderr, not the one bound when the module loaded
    timed = result.step_seconds[1:] or result.step_seconds
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"{cfg.model}, {cfg.stages} stages x dp {cfg.dp}, {result.schedule.name}, {cfg.strategy} on {cfg.cluster}: "
          f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f} over {cfg.steps} steps{resumed}; "
          f"{sum(timed) / len(timed):.3f} s/step after the first, {result.samples_per_second:.1f} samples/s")
    if args.out:
        for path in write_loss(result, cfg, args.out):
            print(f"wrote {path}")
    return 0
