"""Worker-side half of the Alpa adapter.

Alpa creates its ``MeshHostWorker`` actors from the module attribute
``alpa.device_mesh.MeshHostWorker``; ``alpa.configure`` points it at the
subclass defined here. Ray pickles an importable class by reference, so every
actor process imports this module to rebuild the class — and this import is
what applies ``worker_patches()`` in that process, where driver-side patches
never reach. Importing it needs Alpa; nothing else in alpa_comm imports it.

What changes on a worker: Alpa's broadcast of one slice to a group
(``alpa.collective.worker_nccl_util.broadcast``, one ``ncclBroadcast`` over the
whole slice) becomes ``chunked_broadcast``: the same call through Alpa's own
collective layer, once per chunk, with the chunk count alpa_comm's cost model
picks for that many bytes and receivers. Every member of a group computes the same
count from the same numbers, so the NCCL calls pair up. NCCL pipelines each call
along its ring by itself; what the chunks add on a GPU is bounded staging memory
(Alpa copies a non-contiguous slice into a temporary buffer of the slice's size
before sending and after receiving) and copies that overlap the wire.
"""
from __future__ import annotations

import importlib
import os

from ..resharding import cost_model
from ..topology import PAPER_TESTBED
from .alpa_planning import PLANNING_NIC_GBPS

WORKER_MARK = "ALPA_COMM_WORKER_PATCHED"
_state: dict = {"broadcast": None}


def worker_chunks(nbytes: int, world_size: int, nic_gbps: float = PLANNING_NIC_GBPS) -> int:
    """Chunks for a broadcast of ``nbytes`` to a group of ``world_size`` devices: the cost
    model's best for a chain of that many hops at ``nic_gbps`` (a pure function of its
    arguments, so every member of the group gets the same answer)."""
    rate = nic_gbps * 1e9 / 8
    return cost_model.auto_chunks(int(nbytes), [rate] * max(1, int(world_size) - 1), PAPER_TESTBED["latency_s"])


def chunk_slices(tensor_slices, chunks: int) -> list[list[list[slice]]]:
    """``tensor_slices`` (one list of slices per device, all of one shape) cut into
    ``chunks`` parts along the first dim longer than 1: per chunk, the slices of every
    device. Row-major order is kept, so a contiguous slice stays contiguous per chunk."""
    first = tensor_slices[0]
    extents = [int(s.stop) - int(s.start) for s in first]
    dim = next((d for d, n in enumerate(extents) if n > 1), None)
    if dim is None or chunks <= 1:
        return [[list(s) for s in tensor_slices]]
    k = min(chunks, extents[dim])
    bounds = [extents[dim] * i // k for i in range(k + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        part = []
        for device_slices in tensor_slices:
            s = list(device_slices)
            start = int(s[dim].start)
            s[dim] = slice(start + a, start + b)
            part.append(s)
        out.append(part)
    return out


def chunked_broadcast(original):
    """Alpa's ``worker_nccl_util.broadcast`` (``original``), one call per chunk."""

    def broadcast(worker, uuid, comm_key, world_size, devices_ids, devices_global_rank, tensor_slices, group_name):
        itemsize = worker.buffers[uuid][devices_ids[0]].dtype.itemsize
        elements = 1
        for s in tensor_slices[0]:
            elements *= int(s.stop) - int(s.start)
        for part in chunk_slices(tensor_slices, worker_chunks(elements * itemsize, world_size)):
            original(worker, uuid, comm_key, world_size, devices_ids, devices_global_rank, part, group_name)

    broadcast.alpa_comm_chunked = True
    return broadcast


def worker_patches() -> None:
    """Patches every Alpa worker process needs; idempotent. Without CUDA (Alpa imports
    its NCCL layer only where ``global_config.has_cuda``) there is no broadcast to patch,
    and ``alpa_comm_status`` says so."""
    os.environ[WORKER_MARK] = "1"
    if _state["broadcast"] is not None:
        return
    try:
        nccl = importlib.import_module("alpa.collective.worker_nccl_util")
    except ImportError:
        return
    if not getattr(nccl.broadcast, "alpa_comm_chunked", False):
        _state["broadcast"] = nccl.broadcast
        nccl.broadcast = chunked_broadcast(nccl.broadcast)


def undo_worker_patches() -> None:
    """Put Alpa's own broadcast back in this process (the driver, on ``configure("off")``)."""
    original, _state["broadcast"] = _state["broadcast"], None
    if original is not None:
        importlib.import_module("alpa.collective.worker_nccl_util").broadcast = original


def _build():
    base = importlib.import_module("alpa.device_mesh").MeshHostWorker
    base = getattr(base, "_alpa_comm_base", base)  # in the driver the attribute may already be ours

    class AlpaCommMeshHostWorker(base):
        _alpa_comm_base = base

        def __init__(self, *args, **kwargs):
            worker_patches()
            super().__init__(*args, **kwargs)

        def alpa_comm_status(self) -> dict:
            return {"pid": os.getpid(), "patched": os.environ.get(WORKER_MARK) == "1",
                    "chunked_broadcast": _state["broadcast"] is not None}

    AlpaCommMeshHostWorker.__module__ = __name__
    AlpaCommMeshHostWorker.__qualname__ = "AlpaCommMeshHostWorker"
    return AlpaCommMeshHostWorker


AlpaCommMeshHostWorker = _build()
worker_patches()


def subclass(base):
    """The class Alpa should instantiate (built once, on the original ``base``)."""
    return AlpaCommMeshHostWorker
