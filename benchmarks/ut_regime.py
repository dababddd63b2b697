"""The emulated training regime that ``cpu_by_thread.py`` and ``transport_compare.py``
share: a U-Transformer over 4 emulated hosts x 2 devices, each host capped at a share of
a core, at one NIC rate. One place for its options, their checks and how a configuration
is set up, so the two benchmarks measure the same thing. (``train_pipeline.py`` has its
own: two models, Alpa's baseline, auto.)"""
from __future__ import annotations

import argparse
import sys

from alpa_comm.errors import AlpaCommError
from alpa_comm.models import build_model
from alpa_comm.pipeline import generate
from alpa_comm.pipeline.edges import with_skips
from alpa_comm.runtime.emulated.netns import check_cpu_cores, rate_gbps
from alpa_comm.train.data import synthetic
from alpa_comm.train.distributed import DistributedPipeline, PipelineCluster

S = 4  # stages, one emulated host each
DEVICES_PER_HOST = 2
MODEL = "utransformer"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_options(p: argparse.ArgumentParser) -> None:
    """The regime's options (NIC rate, CPU cap, model and microbatch sizes, timed steps)."""
    p.add_argument("--nic", default="100mbit", help="emulated NIC rate per host and direction (tc syntax)")
    p.add_argument("--host-cpus", type=float, default=0.5, help="CPU cores per emulated host (default 0.5)")
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--rows", type=int, default=16, help="rows per microbatch")
    p.add_argument("--seq", type=int, default=64, help="tokens per row")
    p.add_argument("--width", type=int, default=256, help="model width d")
    p.add_argument("--layers", type=int, default=8, help="U-Transformer layers")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration (and repeat, where repeated)")


def check_options(p: argparse.ArgumentParser, args, counts=("microbatches", "rows", "seq", "width", "layers",
                                                            "steps")) -> None:
    """Every count >= 1, a CPU share a cgroup can hold and a NIC rate tc can read, else
    ``p.error`` naming the value."""
    for name in counts:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rows % DEVICES_PER_HOST:
        p.error(f"--rows must divide over a host's {DEVICES_PER_HOST} devices, got {args.rows}")
    try:
        check_cpu_cores(args.host_cpus)
    except AlpaCommError as e:
        p.error(f"--host-cpus: {e}")
    try:
        rate_gbps(args.nic)
    except Exception as e:  # noqa: BLE001 - named for the user
        p.error(f"--nic: cannot read rate {args.nic!r} ({e})")


def model_kwargs(args) -> dict:
    return {"layers": args.layers, "d": args.width, "heads": 4, "seq": args.seq}


def open_cluster(args):
    return PipelineCluster.emulated(S, DEVICES_PER_HOST, nic=args.nic, timeout=120, cpu=args.host_cpus)


def pipeline(cluster, kind: str, strategy: str, args, transport: str = "gloo") -> DistributedPipeline:
    """``kind`` over the regime's stages (two chunks a stage for the virtual-stage
    schedules), with the model's skip edges, moving data with ``strategy`` over
    ``transport``."""
    kw = model_kwargs(args)
    sched = generate(kind, S, args.microbatches)
    sched = with_skips(sched, build_model(MODEL, sched.num_virtual_stages, **kw).skips)
    return DistributedPipeline(cluster, MODEL, S, sched, microbatch_size=args.rows, model_kwargs=kw,
                               strategy=strategy, optimizer="sgd", lr=0.01, transport=transport)


def data(args):
    """The same synthetic microbatches for every configuration (seed 0)."""
    return synthetic(args.microbatches, args.rows, args.seq, seed=0)
