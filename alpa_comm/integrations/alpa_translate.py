"""Translation between Alpa 0.2.3's data formats and alpa_comm's — without importing Alpa.

Everything here takes Alpa's objects by duck typing (their field names); it is tested
on Alpa 0.2.3's real classes (``alpa_harness``).

* Device strings: Alpa names a device ``"<host ip>:<type>:<local id>"``
  (``device_id_to_str``); ``DeviceStrings`` maps them to our global ids.
* Sharding specs: ``ShardingSpec.from_alpa`` / ``to_alpa`` (in ``alpa_comm.spec``), on
  the logical mesh each spec is written for (``ShardingSpec.alpa_mesh_shape``: Alpa's
  auto-sharding drops untiled dims, ``[Replicated(8)]`` on a 2x4 mesh).
* A ``ReshardingTaskSpec`` (``src``/``dst`` arrays with ``device_mesh``,
  ``sharding_spec``, ``aval``; ``dst_tile_to_src_tiles_map``) becomes the
  inputs of ``plan_resharding``; our plan becomes Alpa's ``per_spec_plans`` and
  ``order`` in both modes ("sendrecv": ``[n_dst_replicas, n_src_pieces]``
  sender strings with ``(i, k, j)`` order tuples; "broadcast": ``[n_src_pieces]``
  with ``(i, j)``). One send/recv entry per (tile, receiver): Alpa's compiler sends
  every piece of the tile for each entry, so each piece reaches each receiver once.
* Our pipeline ``Schedule`` becomes Alpa's clock table: per clock, per mesh,
  ``(microbatch, stage)`` or None, forward stage of mesh i = i, backward
  stage = 2S-1-i, a split-off weight-gradient stage where one exists (index 2S and
  up), apply-grad tasks in a final clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..dtypes import dtype_name
from ..errors import AlpaCommError, InvalidMeshError
from ..mesh import DeviceMesh
from ..pipeline import Costs, Schedule, simulate_schedule
from ..pipeline.validate import reject_virtual
from ..placement import Resharding, ReshardingFields
from ..resharding.plan import ReshardingPlan
from ..resharding.strategies import ALLGATHER
from ..spec import Box, ShardingSpec
from ..topology import ClusterSpec


class TranslationError(AlpaCommError, ValueError):
    """Alpa data that alpa_comm cannot represent, or a plan that does not match it."""


# ------------------------------------------------------------------ devices
def device_str(host_ip: str, local_id: int, device_type: str = "gpu") -> str:
    return f"{host_ip}:{device_type}:{local_id}"


def parse_device_str(s: str) -> tuple[str, str, int]:
    try:
        ip, kind, local = s.rsplit(":", 2)
        return ip, kind, int(local)
    except ValueError:
        raise TranslationError(f"cannot read Alpa device string {s!r}: expected '<host ip>:<type>:<local id>'") \
            from None


class DeviceStrings:
    """Alpa device strings <-> our global device ids (host index x devices_per_host + local id)."""

    def __init__(self, host_ips: Sequence[str], devices_per_host: int, device_type: str = "gpu"):
        self.host_ips = list(dict.fromkeys(host_ips))
        self.index = {ip: i for i, ip in enumerate(self.host_ips)}
        self.devices_per_host, self.device_type = devices_per_host, device_type

    @classmethod
    def for_meshes(cls, *meshes) -> "DeviceStrings":
        """From Alpa meshes, hosts in mesh order. Works on every mesh class Alpa passes
        around: ``VirtualPhysicalMesh`` at compile time (``host_info``, per-host
        ``devices``) and ``DistributedPhysicalDeviceMesh`` at run time (``host_ips``).
        Devices per host is what the meshes' local ids need, so two meshes sliced inside
        one host (local ids 0,1 and 2,3) stay apart."""
        ips = [ip for m in meshes for ip in mesh_host_ips(m)]
        locals_ = [d for m in meshes for per_host in mesh_local_devices(m) for d in per_host]
        return cls(ips, max([int(m.num_devices_per_host) for m in meshes] + [d + 1 for d in locals_]))

    def to_id(self, s: str) -> int:
        ip, _, local = parse_device_str(s)
        if ip not in self.index:
            raise TranslationError(f"device {s!r} is on host {ip}, which is in none of the meshes")
        if not 0 <= local < self.devices_per_host:
            raise TranslationError(f"device {s!r}: local id {local} is not below {self.devices_per_host}")
        return self.index[ip] * self.devices_per_host + local

    def to_str(self, device: int) -> str:
        host, local = divmod(int(device), self.devices_per_host)
        return device_str(self.host_ips[host], local, self.device_type)

    def mesh(self, alpa_mesh, shape: Sequence[int] | None = None) -> DeviceMesh:
        """Our ``DeviceMesh`` for an Alpa mesh: hosts x devices (or ``shape``, host-major)."""
        ips, local = mesh_host_ips(alpa_mesh), mesh_local_devices(alpa_mesh)
        ids = [self.index[ip] * self.devices_per_host + d for ip, per_host in zip(ips, local) for d in per_host]
        shape = tuple(shape) if shape is not None else (len(ips), int(alpa_mesh.num_devices_per_host))
        if int(np.prod(shape)) != len(ids):
            raise InvalidMeshError(f"logical mesh shape {shape} does not hold the {len(ids)} devices of the Alpa mesh")
        return DeviceMesh(np.array(ids).reshape(shape), self.devices_per_host)


def mesh_host_ips(alpa_mesh) -> list[str]:
    """Host addresses of an Alpa mesh: ``host_ips`` (physical meshes) or each host's
    ``NodeManagerAddress`` in ``host_info`` (``VirtualPhysicalMesh``, what the compiler has)."""
    ips = getattr(alpa_mesh, "host_ips", None)
    if ips is not None:
        return list(ips)
    info = getattr(alpa_mesh, "host_info", None)
    if info is None:
        raise TranslationError(f"cannot tell the hosts of Alpa mesh {alpa_mesh!r}: it has neither host_ips nor "
                               "host_info")
    return [h["NodeManagerAddress"] for h in info]


def mesh_local_devices(alpa_mesh) -> list[list[int]]:
    """Local device ids per host: ``devices`` where Alpa keeps them (a mesh sliced inside a
    host uses, e.g., GPUs 2 and 3), else 0 .. num_devices_per_host - 1."""
    devices = getattr(alpa_mesh, "devices", None)
    n = len(mesh_host_ips(alpa_mesh))
    if isinstance(devices, (list, tuple)) and len(devices) == n and all(isinstance(d, (list, tuple)) for d in devices):
        return [[int(x) for x in d] for d in devices]
    return [list(range(int(alpa_mesh.num_devices_per_host))) for _ in range(n)]


# ------------------------------------------------------------ task specs
@dataclass(frozen=True)
class PlanInputs(ReshardingFields):
    """One Alpa resharding task as the planner's inputs, with the device-string map."""

    resharding: Resharding
    strings: DeviceStrings


    def cluster(self, nic_gbps: float = 10.0, **kw) -> ClusterSpec:
        return ClusterSpec(num_hosts=len(self.strings.host_ips), devices_per_host=self.strings.devices_per_host,
                           nic_send_gbps=nic_gbps, **kw)


def inputs_from_task_spec(spec) -> PlanInputs:
    """The planner's inputs for an Alpa ``ReshardingTaskSpec`` (its ``src``/``dst`` arrays).

    ``dst`` carries the spec the network must deliver (Alpa's rewritten one when
    its local all-gather is on); planning it with our strategies is what
    replaces Alpa's strategy generation."""
    strings = DeviceStrings.for_meshes(spec.src.device_mesh, spec.dst.device_mesh)
    # the logical mesh each spec is written for (pxla orders the mesh's devices row-major over it)
    src_shape = ShardingSpec.alpa_mesh_shape(spec.src.sharding_spec)
    dst_shape = ShardingSpec.alpa_mesh_shape(spec.dst.sharding_spec)
    move = Resharding.between(tuple(int(n) for n in spec.src.aval.shape), dtype_name(np.dtype(spec.src.aval.dtype)),
                              strings.mesh(spec.src.device_mesh, src_shape),
                              ShardingSpec.from_alpa(spec.src.sharding_spec, src_shape),
                              strings.mesh(spec.dst.device_mesh, dst_shape),
                              ShardingSpec.from_alpa(spec.dst.sharding_spec, dst_shape))
    return PlanInputs(move, strings)


def tileslice_box(tileslice) -> Box:
    """Global index box of an Alpa ``TileSlice``: its tile's indices plus its offset.
    (``TileSlice`` subclasses ``Tile``: the indices are its own, not a ``.tile``'s.)"""
    return tuple((int(t.start) + int(o.start), int(t.start) + int(o.stop))
                 for t, o in zip(tileslice.indices, tileslice.offset))


def _assignments(transfers) -> tuple[dict, dict]:
    """(box, receiver) -> (sender, transfer start, transfer id), and box -> first sender."""
    by_pair: dict[tuple, tuple[int, float, int]] = {}
    first: dict[Box, tuple[float, int, int]] = {}
    for t in transfers:
        if t.kind == ALLGATHER:
            continue
        for r in t.receivers:
            by_pair[(t.index, r)] = (t.sender, t.start, t.id)
        if t.index not in first or (t.start, t.id) < first[t.index][:2]:
            first[t.index] = (t.start, t.id, t.sender)
    return by_pair, {b: v[2] for b, v in first.items()}


def plan_to_strategy(plan, spec, strings: DeviceStrings, mode: str):
    """Our plan (a ``ReshardingPlan``, or the transfers of one tensor of a tree plan) as
    Alpa's (per_spec_plans, order) for ``mode`` "sendrecv" or "broadcast"."""
    if mode not in ("sendrecv", "broadcast"):
        raise TranslationError(f"unknown Alpa resharding mode {mode!r}; choose 'sendrecv' or 'broadcast'")
    by_pair, first = _assignments(plan.transfers if isinstance(plan, ReshardingPlan) else plan)
    per_spec_plans, keyed = [], []
    for i, (dst_tile, src_tileslices, _) in enumerate(spec.dst_tile_to_src_tiles_map):
        boxes = [tileslice_box(ts) for ts in src_tileslices]
        receivers = [strings.to_id(s) for s in dst_tile.replica_device_strs]
        if mode == "broadcast":
            row = np.empty(len(boxes), dtype=object)
            for j, box in enumerate(boxes):
                if box not in first:
                    raise TranslationError(f"the plan moves no slice {box} (dst tile {i}, piece {j})")
                row[j] = strings.to_str(first[box])
                start = min(by_pair[(box, r)][1] for r in receivers)
                keyed.append(((start, i, j), (i, j)))
            per_spec_plans.append(row)
            continue
        table = np.empty((len(receivers), len(boxes)), dtype=object)
        for k, r in enumerate(receivers):
            first_start = None
            for j, box in enumerate(boxes):
                if (box, r) not in by_pair:
                    raise TranslationError(f"the plan does not deliver slice {box} to device {strings.to_str(r)}")
                sender, start, tid = by_pair[(box, r)]
                table[k, j] = strings.to_str(sender)
                first_start = min(first_start or (start, tid), (start, tid))
            # Alpa's _compile_send_recv_tasks sends every piece of receiver k's tile for each
            # (i, k, j) entry (it ignores j): one entry per (tile, receiver) sends each piece once
            keyed.append(((*first_start, i, k), (i, k, 0)))
        per_spec_plans.append(table)
    order = [o for _, o in sorted(keyed)]
    return per_spec_plans, order


# ---------------------------------------------------------------- schedules
def schedule_to_clocks(schedule: Schedule, apply_grad_placement: dict[int, int] | None = None,
                       weight_stages: dict[int, int] | None = None) -> list[list]:
    """Alpa's clock table for ``schedule``: every compute action takes one clock.

    Alpa has one backward task per stage: ``BI m`` becomes the backward task. Where
    the backward of mesh ``i`` was split into two computations (``weight_stages``:
    mesh -> the stage index of its weight-gradient computation, see
    ``alpa_weight_delay``), ``BW m`` is that stage's task, at its place in the schedule
    (the delay rule); elsewhere it is folded into the backward task. The order of
    forwards and backwards — the eager warm-up — is kept exactly.
    """
    reject_virtual(schedule, "Alpa's clock table (one stage per mesh)")
    S = schedule.num_stages
    weight_stages = weight_stages or {}
    kept = Schedule(tuple(tuple(a for a in s if a.kind != "BW" or i in weight_stages)
                          for i, s in enumerate(schedule.stages)), schedule.name)
    res = simulate_schedule(kept, Costs(t_fwd=1.0, t_bwd=1.0, t_comm=0.0, t_bi=1.0, t_bw=1.0))
    clocks: list[list] = [[None] * S for _ in range(int(round(res.iteration_time)))]
    for e in res.events:
        if e.end == e.start:
            continue
        c = int(round(e.start))
        if e.kind == "F":
            stage = e.stage
        elif e.kind == "BW":
            stage = weight_stages[e.stage]
        else:
            stage = 2 * S - 1 - e.stage
        if clocks[c][e.stage] is not None:
            raise TranslationError(f"clock {c} holds two tasks on mesh {e.stage}")
        clocks[c][e.stage] = (e.mb, stage)
    last = [None] * S
    for stage_idx, mesh in (apply_grad_placement or {}).items():
        last[mesh] = (schedule.num_microbatches - 1, stage_idx)
    clocks.append(last)
    return clocks


def validate_clocks(clocks: list[list], num_meshes: int, num_microbatches: int,
                    weight_stages: dict[int, int] | None = None) -> None:
    """Every (microbatch, stage) once, after what it depends on (previous forward stage;
    next mesh's backward and its own forward for a backward; for a weight-gradient
    stage, its own backward, and its previous microbatch: the accumulator chains)."""
    weight_stages = weight_stages or {}
    mesh_of_weight = {stage: mesh for mesh, stage in weight_stages.items()}
    done: dict[tuple[int, int], int] = {}
    for c, row in enumerate(clocks[:-1]):
        if len(row) != num_meshes:
            raise TranslationError(f"clock {c} has {len(row)} entries for {num_meshes} meshes")
        for mesh, task in enumerate(row):
            if task is None:
                continue
            mb, stage = task
            if (mb, stage) in done:
                raise TranslationError(f"task {task} appears twice (clocks {done[(mb, stage)]} and {c})")
            need = []
            if stage in mesh_of_weight:
                if mesh_of_weight[stage] != mesh:
                    raise TranslationError(f"clock {c}: weight-gradient stage {stage} on mesh {mesh}")
                need.append((mb, 2 * num_meshes - 1 - mesh))
                if mb > 0:
                    need.append((mb - 1, stage))
            elif stage < num_meshes:
                if stage != mesh:
                    raise TranslationError(f"clock {c}: forward stage {stage} on mesh {mesh}")
                if stage > 0:
                    need.append((mb, stage - 1))
            else:
                if stage != 2 * num_meshes - 1 - mesh:
                    raise TranslationError(f"clock {c}: backward stage {stage} on mesh {mesh}")
                need.append((mb, mesh))
                if mesh < num_meshes - 1:
                    need.append((mb, stage - 1))
            for n in need:
                if done.get(n, c) >= c:
                    raise TranslationError(f"clock {c}: task {task} runs before {n} it depends on")
            done[(mb, stage)] = c
    stages = list(range(2 * num_meshes)) + sorted(mesh_of_weight)
    missing = [(mb, s) for mb in range(num_microbatches) for s in stages if (mb, s) not in done]
    if missing:
        raise TranslationError(f"tasks {missing[:4]} never run")
