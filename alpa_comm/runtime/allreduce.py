"""Data-parallel gradient all-reduce in flat buckets over a ``Backend``.

Many small messages cost a latency each (DeepSpeed's lesson), so the gradient
arrays of a stage are packed into flat buckets of at most ``bucket_bytes`` and
each bucket is all-reduced with a ring (reduce-scatter, then all-gather): every
host sends and receives 2(n-1)/n of the bucket, the bandwidth-optimal amount.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .backend import DEFAULT_TIMEOUT_S, Backend

DEFAULT_BUCKET_BYTES = 4 << 20


def ring_allreduce(backend: Backend, flat: np.ndarray, hosts: Sequence[int], tag_base: int,
                   timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Sum ``flat`` (1-D) over ``hosts`` in place; every host in ``hosts`` calls it."""
    hosts = list(hosts)
    n = len(hosts)
    if n == 1:
        return
    if backend.rank not in hosts:
        raise ValueError(f"host {backend.rank} is not in the all-reduce group {hosts}")
    p = hosts.index(backend.rank)
    nxt, prv = hosts[(p + 1) % n], hosts[(p - 1) % n]
    bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
    chunk = [flat[bounds[c]:bounds[c + 1]] for c in range(n)]
    scratch = np.empty(max(c.size for c in chunk), flat.dtype)
    u8 = lambda a: a.view(np.uint8)  # noqa: E731 - the backend moves bytes
    for s in range(n - 1):  # reduce-scatter: afterwards host p owns the sum of chunk p+1
        out, into = chunk[(p - s) % n], chunk[(p - s - 1) % n]
        tmp = scratch[:into.size]
        send = backend.isend(u8(np.ascontiguousarray(out)), nxt, tag_base + s)
        recv = backend.irecv(u8(tmp), prv, tag_base + s)
        recv.wait(timeout)
        send.wait(timeout)
        into += tmp
    for s in range(n - 1):  # all-gather the summed chunks around the ring
        out, into = chunk[(p + 1 - s) % n], chunk[(p - s) % n]
        send = backend.isend(u8(np.ascontiguousarray(out)), nxt, tag_base + n + s)
        recv = backend.irecv(u8(into), prv, tag_base + n + s)
        recv.wait(timeout)
        send.wait(timeout)


def buckets(sizes: Sequence[int], itemsize: int, bucket_bytes: int) -> list[list[int]]:
    """Consecutive arrays grouped so each group stays within ``bucket_bytes`` (an array
    larger than that is a bucket of its own)."""
    out: list[list[int]] = []
    used = 0
    for i, n in enumerate(sizes):
        b = n * itemsize
        if not out or used + b > bucket_bytes:
            out.append([])
            used = 0
        out[-1].append(i)
        used += b
    return out


def allreduce_mean(backend: Backend, arrays: list[np.ndarray], hosts: Sequence[int], tag_base: int,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """The mean of every array over ``hosts``, moved in flat buckets; returns new arrays.
    Arrays of one dtype per call (gradients)."""
    if len(hosts) == 1 or not arrays:
        return [np.array(a, copy=True) for a in arrays]
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        raise ValueError(f"all-reduce takes arrays of one dtype, got {sorted({str(a.dtype) for a in arrays})}")
    out: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
    for b, group in enumerate(buckets([a.size for a in arrays], dtype.itemsize, bucket_bytes)):
        flat = np.concatenate([np.ravel(arrays[i]) for i in group])
        ring_allreduce(backend, flat, hosts, tag_base + b * 2 * len(hosts), timeout)
        flat /= len(hosts)
        pos = 0
        for i in group:
            out[i] = flat[pos:pos + arrays[i].size].reshape(arrays[i].shape)
            pos += arrays[i].size
    return out
