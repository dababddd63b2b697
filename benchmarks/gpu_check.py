"""GPU check of the NCCL path: what one GPU can prove, and every transfer kind on N GPUs.

Prepared to run in one short go on a GPU machine (needs cupy-cuda12x; jax[cuda] for the
DLPack round trip):

    python benchmarks/gpu_check.py [--devices N] [--size-mb 16] [--timeout 60]
    python benchmarks/gpu_check.py --model     # the same checks on the NCCL model, no GPU

One GPU proves: CuPy <-> JAX DLPack round trips without a copy; an NCCL communicator of
world size 1 (an all-reduce, and a send to itself grouped with its receive); and the
stream rules the NCCL model (``alpa_comm.testing.nccl_model``) encodes, against real
CuPy streams (work on one stream runs in order; ``wait_event`` holds a stream until the
event; an event is done only after the stream's earlier work). One GPU cannot run NCCL
between two ranks (NCCL binds a rank to a distinct GPU), so nothing cross-rank is claimed
from it.

N >= 2 GPUs prove every transfer kind through NCCL: each rank is a process driving one
GPU (``NcclBackend``), the executor keeps every buffer in device memory (CuPy arrays,
no host staging), every destination buffer is compared bit-exactly with NumPy, and the
ring all-reduce sums exactly; with 3 GPUs or more, the pipeline trainer's transport
(``OrderedMailbox``: 1F1B, eager-1F1B with delay, ZB-H1) on three stage hosts, a thread
per GPU. ``--model`` runs the N-rank part on the model (ranks as threads), which is how CI
checks this script.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import sys
import threading
import time

import numpy as np

KINDS = ("send_recv", "local_allgather", "global_allgather", "broadcast", "double_tree", "rotated_chains")


def cases(n: int, size_mb: float):
    """(label, plan) of every kind over 1-device hosts: a mesh of the first half of the
    GPUs to one of the rest, four layouts each."""
    from alpa_comm import ClusterSpec, plan_resharding

    cluster = ClusterSpec(num_hosts=n, devices_per_host=1)
    half = n // 2
    src = f"{half}x1@" + ",".join(map(str, range(half)))
    dst = f"{n - half}x1@" + ",".join(map(str, range(half, n)))
    unit = 2 * half * (n - half)
    elems = max(unit, int(size_mb * (1 << 20) / 4) // unit * unit)
    out = []
    for sspec, dspec in (("S0", "S0"), ("R", "S0"), ("S0", "R"), ("R", "R")):
        for kind in KINDS:
            plan = plan_resharding((elems,), "float32", src, sspec, dst, dspec, cluster=cluster, strategy=kind)
            out.append((f"{sspec}@{src} -> {dspec}@{dst} {kind}", plan))
    return out


def rank_main(rank, world, uid, plans_json, arrays, timeout, results) -> None:
    """One rank: every plan with device buffers over ``NcclBackend``, then a ring
    all-reduce; puts (rank, [(ok, seconds)] per plan, all-reduce ok) on ``results``."""
    import cupy

    from alpa_comm.resharding import HostJob
    from alpa_comm.resharding.plan import ReshardingPlan
    from alpa_comm.runtime.backend import NcclBackend
    from alpa_comm.runtime.executor import ExecutorOptions, HostExecutor, Layout, view

    try:
        cupy.cuda.Device(rank).use()
        backend = NcclBackend(rank, world, uid, timeout)
        out = []
        for text, x in zip(plans_json, arrays):
            plan = ReshardingPlan.from_json(text)
            job = HostJob.for_host(plan, rank)
            layout = Layout.of(job.leaves[0])
            full = tuple((0, n) for n in x.shape)
            src = {d: cupy.asarray(b) for d, b in layout.source_shards(x, job.is_local).items()}
            dst = layout.empty_destinations(job.is_local, alloc=lambda d, shape, dtype: cupy.zeros(shape, dtype))
            options = ExecutorOptions(timeout, xp=cupy)
            t0 = time.perf_counter()
            HostExecutor(rank, layout, src, dst, backend, job.host_of, options=options).run(job.transfers)
            seconds = time.perf_counter() - t0
            ok = all(isinstance(b, cupy.ndarray) and np.array_equal(cupy.asnumpy(b), view(x, full, layout.dst_boxes[d]))
                     for d, b in dst.items())
            out.append((ok, seconds))
        flat = cupy.arange(1000, dtype=cupy.float32) * (rank + 1)
        backend.allreduce_sum(flat, list(range(world)), 0, timeout)
        summed = np.array_equal(cupy.asnumpy(flat), np.arange(1000, dtype=np.float32) * (world * (world + 1) / 2))
        backend.barrier(timeout)
        results.put((rank, out, summed, None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put((rank, [], False, f"{type(e).__name__}: {e}"))


def one_gpu() -> list[tuple[str, bool, str]]:
    """What one GPU proves (name, ok, detail)."""
    import cupy
    from cupy.cuda import nccl

    out = []
    try:
        import jax
        import jax.numpy as jnp

        x = jnp.arange(1 << 20, dtype=jnp.float32)
        c = cupy.from_dlpack(x)
        same = c.data.ptr == x.unsafe_buffer_pointer()
        back = jax.dlpack.from_dlpack(c)
        out.append(("JAX -> CuPy -> JAX by DLPack", same and bool((back == x).all()),
                    "no copy" if same else "copied"))
    except Exception as e:  # noqa: BLE001
        out.append(("JAX -> CuPy -> JAX by DLPack", False, f"{type(e).__name__}: {e}"))
    s = cupy.cuda.Stream(non_blocking=True)
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    a = cupy.arange(4096, dtype=cupy.float32)
    comm.allReduce(a.data.ptr, a.data.ptr, a.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
    b = cupy.zeros_like(a)
    nccl.groupStart()
    comm.send(a.data.ptr, a.nbytes, nccl.NCCL_UINT8, 0, s.ptr)
    comm.recv(b.data.ptr, b.nbytes, nccl.NCCL_UINT8, 0, s.ptr)
    nccl.groupEnd()
    s.synchronize()
    out.append(("NCCL world of 1: all-reduce, grouped send to itself", bool((a == b).all()), ""))
    comm.destroy()
    # the model's stream rules against CuPy's streams
    big = cupy.zeros(1 << 26, dtype=cupy.float32)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with s1:
        for _ in range(20):
            big += 1  # long work on s1
        ev = s1.record()
    s2.wait_event(ev)
    with s2:
        first = big[:1].copy()  # ordered after s1's work by the event
    s2.synchronize()
    out.append(("wait_event orders another stream after the event", float(first.get()[0]) == 20.0, ""))
    s1.synchronize()
    out.append(("an event is done once its stream's earlier work is", bool(ev.done), ""))
    with s1:
        c = cupy.zeros(1, dtype=cupy.float32)
        for i in range(100):
            c += i  # in order on one stream
    s1.synchronize()
    out.append(("work on one stream runs in issue order", float(c.get()[0]) == sum(range(100)), ""))
    return out


def run_ranks(n, uid, plans, arrays, timeout, model: bool):
    """Each rank's report: processes (one GPU each), or threads on the model."""
    payload = [p.to_json() for _, p in plans]
    if model:
        results: queue.Queue = queue.Queue()
        threads = [threading.Thread(target=rank_main, args=(r, n, uid, payload, arrays, timeout, results))
                   for r in range(n)]
    else:
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        threads = [ctx.Process(target=rank_main, args=(r, n, uid, payload, arrays, timeout, results))
                   for r in range(n)]
    for t in threads:
        t.start()
    got = {}
    for _ in threads:
        rank, out, summed, error = results.get(timeout=timeout * (len(plans) + 2) + 60)
        got[rank] = (out, summed, error)
    for t in threads:
        t.join(10)
    return got


def pipeline_transport(n: int, timeout: float) -> int:
    """The pipeline trainer's transport (one agreed transfer order, ``OrderedMailbox``) on
    three stage hosts, a thread per GPU (NCCL allows a rank per thread); failures."""
    if n < 3:
        print("gpu_check: the pipeline transport needs 3 GPUs (a stage host each): not run")
        return 0
    from alpa_comm.pipeline.generators import generate
    from alpa_comm.testing.pipeline_transport import CHAIN3, run_pipeline_transport

    failed = 0
    for kind, split, delay in (("1f1b", False, None), ("eager-1f1b", True, 1), ("zb-h1", True, None)):
        schedule = generate(kind, 3, 4, split_backward=split, delay_wgrad=delay)
        try:
            checked = sum(run_pipeline_transport(schedule, CHAIN3, dp=1, k=1, strategy="broadcast",
                                                 timeout=timeout, device_of=lambda h: h % n))
            print(f"OK   pipeline transport, {schedule.name} on 3 stage hosts: {checked} buffers bit-exact")
        except AssertionError as e:
            failed += 1
            print(f"FAIL pipeline transport, {schedule.name}: {e}")
    return failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all; with --model: 4)")
    p.add_argument("--size-mb", type=float, default=16, help="bytes per case (default 16 MiB)")
    p.add_argument("--timeout", type=float, default=60, help="seconds any one wait may take")
    p.add_argument("--model", action="store_true", help="run the N-rank checks on the NCCL model (no GPU)")
    args = p.parse_args(argv)
    if not args.model:
        return check(args)
    from alpa_comm.testing import nccl_model

    with nccl_model.install(stall_s=10):
        print("gpu_check: on the NCCL model (ranks are threads; nothing runs on a GPU)")
        return check(args)


def check(args) -> int:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        print(f"gpu_check: CuPy with NCCL is not installed ({e}); pip install cupy-cuda12x")
        return 2
    failed, exact = 0, 0
    if not args.model:
        n = args.devices or cupy.cuda.runtime.getDeviceCount()
        print(f"gpu_check: {n} GPU(s) visible")
        for name, ok, detail in one_gpu():
            failed += not ok
            print(f"{'OK  ' if ok else 'FAIL'} one GPU: {name}{': ' + detail if detail else ''}", flush=True)
    else:
        n = args.devices or 4
    if n < 2:
        print("gpu_check: one GPU: NCCL needs a GPU per rank, so no transfer between ranks ran")
        return 1 if failed else 0
    plans = cases(n, args.size_mb)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(plan.shape).astype(np.float32) for _, plan in plans]
    print(f"gpu_check: {len(plans)} plans on {n} ranks ({args.size_mb:g} MiB each)", flush=True)
    got = run_ranks(n, nccl.get_unique_id(), plans, arrays, args.timeout, args.model)
    errors = {r: e for r, (_, _, e) in got.items() if e}
    for r, e in sorted(errors.items()):
        print(f"FAIL rank {r}: {e}")
    if errors:
        return 1
    for i, (label, plan) in enumerate(plans):
        ok = all(got[r][0][i][0] for r in got)
        secs = max(got[r][0][i][1] for r in got)
        failed += not ok
        exact += ok
        timing = ("" if args.model  # the model's times say nothing about a GPU's
                  else f": {secs * 1e3:.1f} ms (predicted {plan.predicted_seconds * 1e3:.1f} ms)")
        print(f"{'OK  ' if ok else 'FAIL'} {label}{timing}")
    summed = all(got[r][1] for r in got)
    failed += not summed
    print(f"{'OK  ' if summed else 'FAIL'} ring all-reduce over {n} ranks")
    failed += pipeline_transport(n, args.timeout)
    print(f"gpu_check: {exact}/{len(plans)} plans bit-exact{' (on the model)' if args.model else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
