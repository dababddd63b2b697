"""Data-parallel gradient all-reduce in flat buckets over a ``Backend``.

Many small messages cost a latency each (DeepSpeed's lesson), so the gradient
arrays of a stage are packed into flat buckets of at most ``bucket_bytes`` and
each bucket is summed by the backend's own all-reduce (gloo's collective; a ring
over send/recv for backends without one). ``benchmarks/allreduce.py`` compares
it with the hand-written ring side by side.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InvalidArgumentError
from ..validation import one_of
from .backend import DEFAULT_TIMEOUT_S, Backend, ring_allreduce_sum

DEFAULT_BUCKET_BYTES = 4 << 20
ALLREDUCE_METHODS = ("backend", "ring")


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
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float = DEFAULT_TIMEOUT_S,
                   method: str = "backend") -> list[np.ndarray]:
    """The mean of every array over ``hosts``, moved in flat buckets; returns new arrays.
    Arrays of one dtype per call (gradients). ``method``: ``backend`` (its all-reduce)
    or ``ring`` (the ring over send/recv, for comparison)."""
    one_of(method, ALLREDUCE_METHODS, "all-reduce method")
    if len(hosts) == 1 or not arrays:
        return [np.array(a, copy=True) for a in arrays]
    dtype = arrays[0].dtype
    if any(a.dtype != dtype for a in arrays):
        raise InvalidArgumentError(f"all-reduce takes arrays of one dtype, got {sorted({str(a.dtype) for a in arrays})}")
    out: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
    for b, group in enumerate(buckets([a.size for a in arrays], dtype.itemsize, bucket_bytes)):
        flat = np.concatenate([np.ravel(arrays[i]) for i in group])
        tag = tag_base + b * 2 * len(hosts)
        if method == "ring":
            ring_allreduce_sum(backend, flat, hosts, tag, timeout)
        else:
            backend.allreduce_sum(flat, hosts, tag, timeout)
        flat /= len(hosts)
        pos = 0
        for i in group:
            out[i] = flat[pos:pos + arrays[i].size].reshape(arrays[i].shape)
            pos += arrays[i].size
    return out
