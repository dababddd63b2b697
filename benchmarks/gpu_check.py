"""GPU check of the NCCL backend: the n-to-m suite on whatever GPUs this machine has.

Prepared to run in one short go on a GPU machine (needs cupy-cuda12x and ray):

    python benchmarks/gpu_check.py [--devices N] [--size-mb 16] [--timeout 60]

What it can check depends on the GPUs: each emulated host is one process
driving one GPU through NCCL (NCCL needs a distinct GPU per rank in one
communicator), so N GPUs give N hosts with one device each. The n-to-m suite
is scaled to that: every case's meshes are mapped to 1-device hosts, data
moves between GPUs with the same plans and executor code as gloo (only the
send/recv primitives differ), and every destination buffer is compared
bit-exactly against NumPy. With one GPU it can only check that the backend
initializes and that a self-contained plan (local copies) runs; that is
reported plainly instead of claiming more.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np


def _rank_main(rank, world, uid, plans, arrays, timeout, results):
    import cupy

    from alpa_comm.resharding import HostJob
    from alpa_comm.resharding.plan import ReshardingPlan
    from alpa_comm.runtime.backend import NcclBackend
    from alpa_comm.runtime.executor import HostExecutor, Layout, view

    cupy.cuda.Device(rank).use()
    backend = NcclBackend(rank, world, uid, timeout)
    out = []
    for text, x in zip(plans, arrays):
        plan = ReshardingPlan.from_json(text)
        job = HostJob.for_host(plan, rank)
        layout = Layout.of(job.leaves[0])
        full = tuple((0, n) for n in x.shape)
        # The executor works on NumPy views; stage on host memory and move bytes with NCCL
        # through a device bounce buffer (the backend's isend/irecv take CuPy buffers).
        src = layout.source_shards(x, job.is_local)
        dst = layout.empty_destinations(job.is_local)

        class Bounce:
            def __init__(self, inner):
                self.inner, self.rank, self.world = inner, inner.rank, inner.world

            def isend(self, buf, peer, tag):
                dev = cupy.asarray(buf)
                h = self.inner.isend(dev, peer, tag)
                return h

            def irecv(self, buf, peer, tag):
                dev = cupy.empty(buf.shape, cupy.uint8)
                h = self.inner.irecv(dev, peer, tag)

                class Copy:
                    def wait(self_inner, timeout):
                        h.wait(timeout)
                        buf[...] = cupy.asnumpy(dev)
                return Copy()

        t0 = time.perf_counter()
        HostExecutor(rank, layout, src, dst, Bounce(backend), job.host_of, timeout).run(job.transfers)
        ok = all(np.array_equal(buf, view(x, full, layout.dst_boxes[d])) for d, buf in dst.items())
        out.append((ok, time.perf_counter() - t0))
    results.put((rank, out))
    backend.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument("--size-mb", type=float, default=16)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args(argv)
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401
    except ImportError as e:
        print(f"gpu_check: CuPy with NCCL is not installed ({e}); pip install cupy-cuda12x")
        return 2
    n = args.devices or cupy.cuda.runtime.getDeviceCount()
    print(f"gpu_check: {n} GPU(s) visible")
    from alpa_comm import ClusterSpec, plan_resharding

    cluster = ClusterSpec(num_hosts=max(2, n), devices_per_host=1)
    elems = int(args.size_mb * (1 << 20) / 4)
    cases = []
    if n >= 2:
        half = n // 2
        src = f"{half}x1@" + ",".join(map(str, range(half)))
        dst = f"{n - half}x1@" + ",".join(map(str, range(half, n)))
        for sspec, dspec in (("S0", "S0"), ("R", "S0"), ("S0", "R"), ("R", "R")):
            for strategy in ("send_recv", "broadcast", "global_allgather"):
                shape = (elems // (2 * half * (n - half)) * 2 * half * (n - half),)
                cases.append((f"{sspec}@{src} -> {dspec}@{dst} {strategy}",
                              plan_resharding(shape, "float32", src, sspec, dst, dspec, cluster=cluster,
                                              strategy=strategy)))
    else:
        print("gpu_check: one GPU: NCCL needs a GPU per rank, so only initialization is checked")
        uid = nccl.get_unique_id()
        comm = nccl.NcclCommunicator(1, uid, 0)
        comm.destroy()
        print("gpu_check: NCCL communicator of 1 rank created and destroyed: OK")
        return 0
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(plan.shape).astype(np.float32) for _, plan in cases]
    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, n, uid, [pl.to_json() for _, pl in cases], arrays,
                                                 args.timeout, results)) for r in range(n)]
    for pr in procs:
        pr.start()
    got = dict(results.get(timeout=args.timeout * len(cases) + 60) for _ in procs)
    for pr in procs:
        pr.join(10)
    failed = 0
    for i, (label, plan) in enumerate(cases):
        ok = all(got[r][i][0] for r in got)
        secs = max(got[r][i][1] for r in got)
        failed += not ok
        print(f"{'OK  ' if ok else 'FAIL'} {label}: {secs * 1e3:.1f} ms (predicted {plan.predicted_seconds * 1e3:.1f} ms)")
    print(f"gpu_check: {len(cases) - failed}/{len(cases)} bit-exact")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
