"""Alpa 0.2.3's own objects built from plain JSON, and Alpa's compiled task lists run on
NumPy buffers. Only for a harness process (``loader.load_package`` done first): every
class used here is Alpa's (``VirtualPhysicalMesh``, ``VirtualDistributedArray``,
``ReshardingTaskSpec``, ``CrossMeshCommunicator``, ``XlaShardedPipelineComputation``,
the ``Symbolic*ReshardingTask`` compilers); only the NCCL calls are replaced, by
copies between NumPy buffers paired the way NCCL pairs them.

A *side* is ``{"hosts": [...], "dph": n, "devices": [[local ids], ...] or None,
"sharding": ["N" | [chunks]], "mapping": [["S", axis] | ["R", replicas]]}``.
"""
from __future__ import annotations

import numpy as np

HOST_IP = "10.0.0.{}"


class Aval:
    """What Alpa reads of jax's ShapedArray."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class Var:
    """A jaxpr variable as Alpa's communicator uses it: hashable, with an ``aval``."""

    def __init__(self, name, shape, dtype="float32"):
        self.name, self.aval = name, Aval(shape, dtype)

    def __repr__(self):
        return self.name


class Worker:
    """A mesh host worker; compiling only uses its identity."""

    def __init__(self, host):
        self.host = host

    def __repr__(self):
        return f"Worker({self.host})"


def mesh_of(side):
    from alpa.device_mesh import VirtualPhysicalMesh

    hosts = side["hosts"]
    mesh = VirtualPhysicalMesh(host_ids=hosts, num_devices_per_host=side["dph"],
                               host_info=[{"NodeManagerAddress": HOST_IP.format(h)} for h in hosts],
                               devices=side.get("devices"))
    # Alpa launches one worker actor per host *per mesh*: two meshes sliced inside one host
    # have two workers there
    mesh.workers = [Worker(h) for h in hosts]
    return mesh


def spec_of(side):
    from jax.interpreters.pxla import Chunked, NoSharding, Replicated, ShardedAxis, ShardingSpec

    return ShardingSpec([NoSharding() if s == "N" else Chunked(s) for s in side["sharding"]],
                        [ShardedAxis(a) if k == "S" else Replicated(a) for k, a in side["mapping"]])


def array_of(mesh, shape, spec, dtype="float32"):
    from alpa.pipeline_parallel.resharding_tensor import VirtualDistributedArray

    return VirtualDistributedArray(device_mesh=mesh, aval=Aval(shape, dtype), sharding_spec=spec)


class Group:
    """Alpa's ``CollectiveGroup`` maps (device string -> local id, worker, rank), no NCCL."""

    def __init__(self, meshes):
        self.device_str_to_device_id_map, self.device_str_to_mesh_worker_map = {}, {}
        self.device_str_to_rank_map = {}
        rank = 0
        for mesh in meshes:
            for i, worker in enumerate(mesh.workers):
                for j, local in enumerate(mesh.devices[i]):
                    s = mesh.device_strs[i * mesh.num_devices_per_host + j]
                    self.device_str_to_device_id_map[s] = local
                    self.device_str_to_mesh_worker_map[s] = worker
                    self.device_str_to_rank_map[s] = (rank, local)
                rank += 1
        self.rank_host = [w.host for m in meshes for w in m.workers]


def values(shape, seed):
    """The tensor every check moves: distinct float32 values."""
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + 1000 * seed).reshape(shape)


def global_box(spec, device_str, offset) -> tuple:
    """The index box (start, stop per dim) in the whole tensor of ``offset`` inside the
    source tile of ``device_str``."""
    strs = spec.src.device_mesh.device_strs
    index = spec.src.indices[strs.index(device_str)]
    return tuple((int(i.start or 0) + int(o.start), int(i.start or 0) + int(o.stop)) for i, o in zip(index, offset))


def held(spec, x, device_str):
    """What ``device_str`` holds of ``x`` on either side of a task spec (None: neither)."""
    for array in (spec.src, spec.dst):
        strs = array.device_mesh.device_strs
        if device_str in strs:
            return x[array.indices[strs.index(device_str)]]
    return None


def compile_task(spec, src_mesh, dst_mesh):
    """Alpa's own compiler for the spec's strategy mode."""
    from alpa.pipeline_parallel.cross_mesh_resharding import (SymbolicBroadcastReshardingTask,
                                                              SymbolicReshardingTask)

    from alpa.global_env import global_config

    global_config.debug_with_pipeshard_runtime = True  # compile the task lists; put nothing on Ray workers
    cls = SymbolicBroadcastReshardingTask if spec.strategy.mode == "broadcast" else SymbolicReshardingTask
    return cls(spec, Group([src_mesh, dst_mesh]), src_mesh, dst_mesh)


def execute(task, spec, x):
    """Run a compiled task on NumPy buffers; returns (received buffers per destination
    device string, messages as (src host, dst host, bytes, what, to, where), the NCCL
    operations Alpa compiled: sends, or broadcast groups)."""
    if spec.strategy.mode == "broadcast":
        return _execute_broadcast(task, spec, x)
    return _execute_send_recv(task, spec, x)


def _device(host, local):
    return f"{HOST_IP.format(host)}:gpu:{local}"


def _execute_send_recv(task, spec, x):
    """NCCL p2p pairs sends and receives in order per (sender, receiver) device pair."""
    rank_host = task.collective_group.rank_host
    queues, messages = {}, []
    for worker, tasks in task.sender_tasks.items():
        for t in tasks:
            src = _device(worker.host, t.device_id)
            dst_host = rank_host[t.tile_spec.rank]
            piece = held(spec, x, src)[tuple(t.tile_spec.offset)].copy()
            queues.setdefault((src, _device(dst_host, t.tile_spec.gpu_idx)), []).append(piece)
            messages.append((worker.host, dst_host, piece.nbytes, src, _device(dst_host, t.tile_spec.gpu_idx),
                             global_box(spec, src, t.tile_spec.offset)))
    buffers = {}
    for worker, tasks in task.receiver_tasks.items():
        for t in tasks:
            dst = _device(worker.host, t.device_id)
            buf = buffers.setdefault(dst, np.full(t.shape, np.nan, np.float32))
            for ts in t.tile_specs:
                buf[tuple(ts.offset)] = queues[(_device(rank_host[ts.rank], ts.gpu_idx), dst)].pop(0)
    left = sum(len(q) for q in queues.values())
    if left:
        raise AssertionError(f"{left} sends were never received")
    return buffers, messages, len(messages)


def _execute_broadcast(task, spec, x):
    """One broadcast group per piece: its rank-0 device sends, every other member receives."""
    data, members = {}, {}
    for worker, groups in task.broadcast_tasks.items():
        for key, g in groups.items():
            for dev, rank, where in zip(g.devices_ids, g.devices_global_rank, g.tensor_slices):
                d = _device(worker.host, dev)
                if rank == 0:
                    data[key] = (worker.host, held(spec, x, d)[tuple(where)].copy())
                else:
                    members.setdefault(key, []).append((worker.host, d, g.recv_tile_shape, where))
    buffers, messages = {}, []
    for key, (src_host, piece) in data.items():
        # NCCL pipelines a broadcast along a chain of its ranks' hosts (sender first): each
        # receiving host's NIC takes the bytes once, each host but the last sends them on
        chain = [src_host] + [h for h in dict.fromkeys(h for h, *_ in members.get(key, ())) if h != src_host]
        for a, b in zip(chain, chain[1:]):
            messages.append((a, b, piece.nbytes, str(key), b, "hop"))
        for h, d, *_ in members.get(key, ()):  # receivers beside the sender: over the host's own links
            if h == src_host:
                messages.append((h, h, piece.nbytes, str(key), d, "local"))
        for _, d, shape, where in members.get(key, ()):
            buf = buffers.setdefault(d, np.full(shape, np.nan, np.float32))
            buf[tuple(where)] = piece
    return buffers, messages, len(data)


def check_delivery(spec, x, buffers) -> list[str]:
    """Destination devices whose buffer is not exactly their tile of ``x``."""
    dst = spec.dst
    wrong = []
    for i, d in enumerate(dst.device_mesh.device_strs):
        want = x[dst.indices[i]]
        got = buffers.get(d)
        if got is None or got.shape != want.shape or not np.array_equal(got, want):
            wrong.append(d)
    return wrong
