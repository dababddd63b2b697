"""Strategies: how one unit task's bytes reach its destination devices.

A strategy turns a unit task into *jobs*: schedulable pieces of work, each with
one or more candidate sender hosts. A candidate carries the host resources the
job occupies (see ``resources``) and its duration from the cost model; both come
from the job's transfer kind (``kinds/``, one module per kind). Load balancing
(see ``loadbalance``) then picks one candidate per job and an order.

Rules shared by every strategy:

* destination devices on a host that already holds a replica of the slice are
  served by an intra-host copy from that replica (``local_copy``): heavy
  traffic stays on the fast link and never touches a NIC;
* the remaining ("remote") receivers are grouped by host, hosts ascending, and
  served by the strategy from one source host.

Alpa's own baseline (``alpa``) is send/recv after Alpa's local-allgather
rewrite of the destination spec (see ``alpa_local_allgather_spec``); each
rewritten piece is sent once (Alpa 0.2.3 re-sends multi-piece tiles m^2 times;
we do not copy that defect).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from ..mesh import DeviceMesh
from ..spec import ShardingSpec
from ..topology import ClusterSpec
from .kinds import PER_TASK_STRATEGIES, Candidate, transfer_kind
from .kinds.base import group_by_host, ring_allgather_seconds
from .resources import ring_resources
from .unit_tasks import UnitTask

ALPA = "alpa"
"""Alpa 0.2.3's baseline: send/recv after its local-allgather rewrite, then all-gathers."""

AUTO = "auto"
"""Plan with every per-task kind that moves data and keep the fastest predicted plan."""

STRATEGIES: tuple[str, ...] = PER_TASK_STRATEGIES + (ALPA, AUTO)
"""Every strategy a plan may use: each per-task transfer kind, ``alpa`` and ``auto``."""


def auto_candidates() -> tuple[str, ...]:
    """The strategies ``auto`` chooses among: every per-task kind that moves data."""
    return tuple(s for s in PER_TASK_STRATEGIES if transfer_kind(s).carries_data)

LOCAL_COPY = "local_copy"
ALLGATHER = "allgather"
"""Kinds the planner adds itself: an intra-host copy, and Alpa's follow-up all-gather."""


def carries_data(strategy: str) -> bool:
    """Whether a plan with ``strategy`` delivers the array's data (``signal`` does not)."""
    return strategy in (ALPA, AUTO) or transfer_kind(strategy).carries_data


def lower_bound_payload(strategy: str) -> int | None:
    """Bytes per slice the lower bound should count: None (the slice's own) unless the
    strategy only times the protocol (``signal``: one byte)."""
    if strategy in (ALPA, AUTO):
        return None
    kind = transfer_kind(strategy)
    return None if kind.carries_data else kind.wire_bytes(1)


class Job(NamedTuple):
    """A schedulable piece of a unit task: its receivers and candidate senders.

    ``deps`` are indices of jobs that must finish first (only Alpa's follow-up
    all-gathers have any). ``task`` is -1 for such an all-gather.
    """

    task: int
    kind: str
    receivers: tuple[int, ...]
    nbytes: int
    index: tuple
    candidates: tuple[Candidate, ...]
    deps: tuple[int, ...] = ()


class JobMemo:
    """Per-plan memo of host groupings and candidates: a large resharding repeats
    the same device sets and host geometry thousands of times."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        self.src: dict[tuple, tuple[tuple[int, ...], frozenset]] = {}
        self.dst: dict[tuple, tuple[tuple[int, tuple[int, ...]], ...]] = {}
        self.geometry: dict[tuple, tuple] = {}
        self.cands: dict[tuple, tuple[Candidate, ...]] = {}

    def src_hosts(self, devices: tuple[int, ...]) -> tuple[tuple[int, ...], frozenset]:
        v = self.src.get(devices)
        if v is None:
            hosts = tuple(group_by_host(devices, self.cluster))
            v = self.src[devices] = (hosts, frozenset(hosts))
        return v

    def dst_groups(self, devices: tuple[int, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
        v = self.dst.get(devices)
        if v is None:
            v = self.dst[devices] = tuple((h, tuple(d)) for h, d in group_by_host(devices, self.cluster).items())
        return v


def jobs_for_task(task: UnitTask, strategy: str, cluster: ClusterSpec, chunks: int | None,
                  memo: JobMemo | None = None) -> list[Job]:
    """Jobs that deliver ``task`` to all its destination devices with ``strategy``.

    ``strategy`` here is a per-task strategy: ``alpa`` is expanded by the planner
    into ``send_recv`` on rewritten tasks plus all-gathers. ``memo`` (one per
    plan) caches host groupings and candidates.
    """
    memo = memo or JobMemo(cluster)
    kind = transfer_kind(strategy)
    src_hosts, src_set = memo.src_hosts(task.src_devices)
    groups = memo.dst_groups(task.dst_devices)
    jobs: list[Job] = []
    remote = groups
    if not src_set.isdisjoint(h for h, _ in groups):
        remote = tuple((h, d) for h, d in groups if h not in src_set)
        for h, devs in groups:
            if h in src_set:
                copy = transfer_kind(LOCAL_COPY).candidate(task.nbytes, task.num_elements, h, {h: list(devs)},
                                                           cluster, None)
                jobs.append(Job(task.id, LOCAL_COPY, devs, task.nbytes, task.index, (copy,)))
        if not remote:
            return jobs
    nbytes = kind.wire_bytes(task.nbytes)
    for part in kind.split_receivers(remote):
        geometry = memo.geometry.get(part)
        if geometry is None:
            geometry = memo.geometry[part] = tuple((h, len(d)) for h, d in part)
        key = (strategy, task.nbytes, src_hosts, geometry, chunks)
        cands = memo.cands.get(key)
        if cands is None:  # (num_elements only clamps chunks; equal bytes mean equal elements here)
            g = {h: list(d) for h, d in part}
            cands = memo.cands[key] = tuple(kind.candidate(task.nbytes, task.num_elements, s, g, cluster, chunks)
                                            for s in src_hosts)
        receivers = part[0][1] if len(part) == 1 else tuple(d for _, devs in part for d in devs)
        jobs.append(Job(task.id, strategy, receivers, nbytes, task.index, cands))
    return jobs


def allgather_job(members: Sequence[int], index: tuple, nbytes: int, deps: Sequence[int],
                  cluster: ClusterSpec) -> Job:
    """Alpa's follow-up all-gather: members each hold 1/len(members) of ``index``."""
    groups = group_by_host(members, cluster)
    hosts = list(groups)
    return Job(-1, ALLGATHER, tuple(sorted(members)), nbytes, index,
               (Candidate(hosts[0], ring_resources(hosts), ring_allgather_seconds(nbytes, groups, cluster)),),
               tuple(deps))


# ----------------------------------------------------------------- Alpa's rewrite
def alpa_local_allgather_spec(spec: ShardingSpec, mesh: DeviceMesh, shape: Sequence[int]
                              ) -> tuple[ShardingSpec, int | None]:
    """Alpa 0.2.3's ``_rewrite_allgather_spec`` in our notation.

    When the destination spec leaves exactly one mesh dim (of size > 1)
    replicated and the mesh's host dim (dim 0) is split at least as many ways as
    the mesh has hosts, Alpa splits the tensor further along that replicated
    dim (adding gcd(replicas, local length) chunks to tensor dims in order), so
    each device receives a distinct piece, then all-gathers along that dim.
    Returns (spec to send, replicated mesh dim) or (spec, None) when Alpa would
    not rewrite. (Alpa asserts on two or more replicated dims; we fall back to
    plain send/recv there.)
    """
    mshape = mesh.shape
    used = set(spec.used_mesh_dims)
    replicated = [m for m in range(len(mshape)) if m not in used and mshape[m] > 1]
    if len(replicated) != 1:
        return spec, None
    node_chunk = 1
    for d in spec.dims:
        if 0 in d:
            node_chunk = math.prod(mshape[m] for m in d)
    if node_chunk < len(mesh.hosts):
        return spec, None
    (mdim,) = replicated
    replicas = mshape[mdim]
    parts = spec.num_shards(mshape)
    dims = [list(d) for d in spec.dims]
    for t, length in enumerate(shape):
        new = math.gcd(replicas, length // parts[t])
        if new == 1:
            continue
        if new != mshape[mdim]:
            # Alpa adds a chunk smaller than the mesh dim (partial split). Our
            # notation splits over whole mesh dims only: keep plain send/recv.
            return spec, None
        dims[t].append(mdim)
        replicas //= new
        break
    if replicas != 1:
        return spec, None
    return ShardingSpec(tuple(tuple(d) for d in dims)), mdim
