"""The pipeline trainer's transport over NCCL, every stage host a thread of this process:
what ``tests/test_nccl_transport.py`` runs on the NCCL model and ``benchmarks/gpu_check.py``
runs on N GPUs (a thread per GPU, as NCCL allows one rank per thread).

A host runs its stage's SEND and RECV actions of ``schedule`` through the mailbox
``train.transport.make_mailbox`` picks for an NCCL backend (``OrderedMailbox``), with the
real ``NcclSubgroupBackend`` and receive buffers in device memory; no compute runs (the
transport's order is what is under test), and every received buffer is compared with what
its sender sent.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..pipeline.edges import edge_name, edge_plans, model_edges, stage_hosts
from ..pipeline.ir import Schedule
from ..resharding.host_job import HostJob
from ..topology import ClusterSpec
from ..train.transport import OrderedMailbox, ReshardMailbox, make_mailbox

CHAIN3 = [{}, {"x": 0}, {"x": 1}]
"""Three stages, each consuming the one before (``PipelineModel.consumes``)."""
SKIPS4 = [{}, {"x": 0}, {"x": 1, "skip": 0}, {"x": 2}]
"""Four stages with a skip edge from stage 0 to stage 2 (U-Transformer-like)."""


def _arrays(edges, shapes, num_microbatches) -> dict:
    """The whole array each (edge, key, microbatch) carries, distinct everywhere."""
    out, base = {}, 0
    for e in edges:
        for key in e.keys:
            shape = shapes[(e.src if e.direction == "F" else e.dst, key)]
            for m in range(num_microbatches):
                n = int(np.prod(shape))
                out[(e.name, key, m)] = ((np.arange(n) + base) % 65_521).astype(np.float32).reshape(shape)
                base += n
    return out


def run_pipeline_transport(schedule: Schedule, consumes: list, dp: int, k: int, strategy: str, steps: int = 2,
                           tagged: bool = False, timeout: float = 20,
                           device_of: Callable[[int], int] = lambda host: 0) -> list[int]:
    """Run ``steps`` steps of ``schedule``'s transfers (stages consuming as ``consumes``,
    ``dp`` hosts a stage, ``k`` devices a host) over NCCL (``cupy``: a GPU's, or the
    model's where it is installed), host h on GPU ``device_of(h)``; returns the buffers
    checked per host. ``tagged``: the mailbox for tagged transports instead (posts every
    receive at once), which NCCL does not allow. Raises ``AssertionError`` naming every
    host's failure (a buffer that differs, a timeout naming the peer, a deadlock)."""
    S = schedule.num_stages
    shapes = {(s, key): (4 * dp * k, 6 + s) for s in range(S) for c in consumes for key, src in c.items() if src == s}
    edges = model_edges(consumes)
    plans = edge_plans(edges, shapes, "float32", dp, k, ClusterSpec(num_hosts=S * dp, devices_per_host=k), strategy)
    arrays = _arrays(edges, shapes, schedule.num_microbatches)
    edge_index = {e.name: i for i, e in enumerate(edges)}
    edge_keys = {e.name: list(e.keys) for e in edges}
    hosts = list(range(S * dp))
    from torch.distributed import HashStore  # noqa: PLC0415 - the in-memory rendezvous store

    store = HashStore()

    def host(h: int) -> int:
        import cupy  # noqa: PLC0415 - a GPU's, or the model's

        from ..runtime.backend import NcclSubgroupBackend  # noqa: PLC0415

        stage = h // dp
        backend = NcclSubgroupBackend(h, hosts, store, device_of(h), timeout=timeout)
        jobs = {e.name: [HostJob.for_host(p, h) for p in plans[e]] for e in edges
                if h in stage_hosts(e.src, dp) or h in stage_hosts(e.dst, dp)}
        args = (h, backend, jobs, edge_index, edge_keys, k)
        io = dict(to_buffers=lambda shards: shards, from_buffers=lambda name, key, bufs: bufs,
                  alloc=lambda d, shape, dtype: cupy.empty(shape, dtype))
        if tagged:
            box = ReshardMailbox(*args, num_microbatches=schedule.num_microbatches, timeout=timeout, **io)
        else:
            box = make_mailbox(*args, schedule=schedule, stage=stage, timeout=timeout, **io)
            if not isinstance(box, OrderedMailbox):
                raise AssertionError(f"an NCCL backend got a {type(box).__name__}")
        checked = 0
        try:
            for _ in range(steps):
                checked += _step(schedule, stage, box, jobs, edge_keys, arrays, cupy)
        finally:
            box.close()
            backend.close()
        return checked

    return _on_threads(hosts, host, timeout=6 * timeout)


def _step(schedule: Schedule, stage: int, box, jobs, edge_keys, arrays, cupy) -> int:
    """One step of ``stage``'s SEND/RECV actions; returns the buffers checked."""
    peer, checked = schedule.peer, 0
    for a in schedule.stages[stage]:
        if a.kind.is_recv:
            box.post(a.kind[-1], peer(stage, a), stage, a.mb)
    for a in schedule.stages[stage]:
        if not a.kind.is_comm:
            continue
        p = peer(stage, a)
        src, dst = (stage, p) if a.kind.is_send else (p, stage)
        name = edge_name(a.kind[-1], src, dst)
        if a.kind.is_send:
            box.send(a.kind[-1], stage, p, a.mb,
                     {key: {d: cupy.asarray(b) for d, b in box.layouts[name][i][0].source_shards(
                         arrays[(name, key, a.mb)], jobs[name][i].is_local).items()}
                      for i, key in enumerate(edge_keys[name])})
            continue
        got = box.recv(a.kind[-1], p, stage, a.mb)
        for i, key in enumerate(edge_keys[name]):
            lay, whole = box.layouts[name][i][0], arrays[(name, key, a.mb)]
            for d, buf in got[key].items():
                if not np.array_equal(cupy.asnumpy(buf), whole[tuple(slice(lo, hi) for lo, hi in lay.dst_boxes[d])]):
                    raise AssertionError(f"stage {stage}: {name} microbatch {a.mb} key {key!r} on device {d} differs "
                                         "from what was sent")
                checked += 1
    box.flush()
    return checked


def _on_threads(hosts: list[int], fn, timeout: float) -> list[int]:
    out: dict[int, int] = {}
    errors: dict[int, BaseException] = {}

    def body(h: int) -> None:
        try:
            out[h] = fn(h)
        except BaseException as e:  # noqa: BLE001 - reported below, every host's
            errors[h] = e
    threads = [threading.Thread(target=body, args=(h,), name=f"host {h}", daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        errors[-1] = TimeoutError(f"a host thread was still running after {timeout:g} s")
    if errors:
        raise AssertionError("; ".join(f"host {h}: {type(e).__name__}: {e}" for h, e in sorted(errors.items())))
    return [out[h] for h in hosts]
