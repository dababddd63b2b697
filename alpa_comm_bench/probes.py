"""Copy-rate probes: how fast bytes really move between two hosts or two processes,
measured in the benchmark's own run. Their rates calibrate the simulator (the
``predicted`` column models the NICs as they deliver, not as configured) and set the
lower bounds the measured times are compared with.

* ``calibrate``: one 1 -> 1 device copy between two hosts of a ``Cluster``;
* ``copy_times`` + ``copy_rate``: copies of two sizes between two JAX processes, whose
  slope leaves out what every call costs whatever its size.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from alpa_comm.topology import ClusterSpec


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


def copy_times(rank: int, of: dict, group, barrier, pair: tuple[int, int], nbytes: int, repeat: int) -> dict:
    """The NIC rate as processes see it, measured in the benchmark's own launch: copies
    of ``nbytes / 4`` and ``nbytes`` from process ``pair[0]``'s first device to process
    ``pair[1]``'s, every process at a common ``barrier`` each time; returns bytes ->
    seconds of the ``repeat`` runs after a warm-up (``copy_rate`` turns them into a rate)."""
    import jax  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: PLC0415

    from alpa_comm.jax import reshard  # noqa: PLC0415

    src1 = NamedSharding(Mesh(np.array(of[pair[0]][:1]), ("x",)), P())
    dst1 = NamedSharding(Mesh(np.array(of[pair[1]][:1]), ("x",)), P())
    out = {}
    for n in (nbytes // 16, nbytes // 4):  # float32 elements
        probe = jax.make_array_from_callback((n,), src1, lambda idx, n=n: np.ones(n, np.float32)[idx],
                                             dtype=np.float32)
        times = []
        for _ in range(repeat + 1):
            barrier()
            t0 = time.perf_counter()
            if rank in pair:
                reshard(probe, dst1, group=group, strategy="send_recv")
            times.append(time.perf_counter() - t0)
        out[str(n * 4)] = times[1:]
    return out


def copy_rate(reports: list[dict], repeat: int) -> tuple[float, float]:
    """(bytes/s one process sends another, seconds every call costs whatever its size):
    the slope between the two copy sizes of ``copy_times`` (slowest process of each run,
    median over runs), which leaves out what every call costs."""
    (small, t_small), (large, t_large) = [
        (int(n), statistics.median(max(r["copies"][n][i] for r in reports if r.get("copies")) for i in range(repeat)))
        for n in sorted(next(r["copies"] for r in reports if r.get("copies")), key=int)]
    rate = (large - small) / max(t_large - t_small, 1e-9)
    return rate, max(0.0, t_small - small / rate)
