"""Strategies: how one unit task's bytes reach its destination devices.

A strategy turns a unit task into *jobs*: schedulable pieces of work, each with
one or more candidate sender hosts. A candidate carries the host-level
resources the job occupies (NIC send side ``tx``, receive side ``rx``, the
intra-host link) and its duration from the cost model. Load balancing (see
``loadbalance``) then picks one candidate per job and an order.

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

from ..cluster import ClusterSpec
from ..mesh import DeviceMesh
from ..spec import ShardingSpec
from . import cost_model as cm
from .unit_tasks import UnitTask

STRATEGIES = ("send_recv", "local_allgather", "global_allgather", "broadcast", "alpa", "signal")
"""Every strategy a plan may use (``alpa`` = Alpa 0.2.3's send/recv + local all-gather)."""

# Transfer kinds beyond the strategy names: a local copy and Alpa's follow-up all-gather.
LOCAL_COPY = "local_copy"
ALLGATHER = "allgather"
SIGNAL_BYTES = 1


def tx(host: int) -> int:
    """Resource key: the send side of ``host``'s NIC(s)."""
    return 3 * host


def rx(host: int) -> int:
    """Resource key: the receive side of ``host``'s NIC(s)."""
    return 3 * host + 1


def intra(host: int) -> int:
    """Resource key: ``host``'s intra-host link."""
    return 3 * host + 2


def describe_resource(key: int) -> str:
    host, kind = divmod(key, 3)
    return f"host{host}.{('tx', 'rx', 'intra')[kind]}"


class Candidate(NamedTuple):
    """One way to run a job: from ``host``, using ``resources`` for ``duration`` seconds."""

    host: int
    resources: tuple[int, ...]
    duration: float
    chunks: int = 1


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


def _group_by_host(devices: Sequence[int], cluster: ClusterSpec) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in sorted(devices):
        out.setdefault(cluster.host_of(d), []).append(d)
    return dict(sorted(out.items()))


def _chain_rates(sender_host: int, groups: dict[int, list[int]], cluster: ClusterSpec) -> list[float]:
    """Hop rates of a device chain: sender -> host1 devices -> host2 devices -> ..."""
    rates, prev = [], sender_host
    for h, devs in groups.items():
        rates.append(cluster.link_rate(prev, h))
        rates.extend([cluster.intra_rate] * (len(devs) - 1))
        prev = h
    return rates


def _ring_rates(groups: dict[int, list[int]], cluster: ClusterSpec) -> list[float]:
    """Edge rates of a host-major ring over all devices in ``groups``."""
    hosts = list(groups)
    rates = []
    for i, h in enumerate(hosts):
        rates.extend([cluster.intra_rate] * (len(groups[h]) - 1))
        nxt = hosts[(i + 1) % len(hosts)]
        rates.append(cluster.link_rate(h, nxt))
    return rates


def _ring_resources(hosts: Sequence[int]) -> tuple[int, ...]:
    if len(hosts) == 1:
        return (intra(hosts[0]),)
    return tuple(r for h in hosts for r in (tx(h), rx(h)))


def transfer_resources(kind: str, sender_host: int | None, receiver_hosts: Sequence[int]) -> tuple[int, ...]:
    """Host resources a transfer of ``kind`` holds for its whole duration.

    ``receiver_hosts`` are the distinct receiving hosts in chain order. The
    planner schedules with these and the simulator releases transfers in the
    plan's order on each of them, so both read the plan the same way.
    """
    hosts = list(receiver_hosts)
    if kind == LOCAL_COPY:
        return (intra(hosts[0]),)
    if kind in ("send_recv", "local_allgather"):
        return (tx(sender_host), rx(hosts[0]))
    if kind in ("broadcast", "signal"):
        return (tx(sender_host),) + tuple(rx(h) for h in hosts) + tuple(tx(h) for h in hosts[:-1])
    if kind == "global_allgather":
        return (tx(sender_host),) + tuple(dict.fromkeys(_ring_resources(hosts) + tuple(rx(h) for h in hosts)))
    if kind == ALLGATHER:
        return _ring_resources(hosts)
    raise ValueError(f"unknown transfer kind {kind!r}")


def _candidate(strategy: str, task: UnitTask, sender: int, groups: dict[int, list[int]],
               cluster: ClusterSpec, chunks: int | None) -> Candidate:
    lat = cluster.latency_s
    hosts = list(groups)
    receivers = [d for devs in groups.values() for d in devs]
    n = task.nbytes
    if strategy == "send_recv":  # one receiver device per job
        (h,) = hosts
        return Candidate(sender, transfer_resources(strategy, sender, hosts),
                         cm.p2p_time(n, cluster.link_rate(sender, h), lat))
    if strategy == "local_allgather":  # one receiver host per job
        (h,) = hosts
        b = len(receivers)
        send = b * lat + n / cluster.link_rate(sender, h)  # b parts of n/b bytes
        gather = cm.ring_allgather_time(n, [cluster.intra_rate] * b, lat)
        return Candidate(sender, transfer_resources(strategy, sender, hosts), send + gather)
    if strategy in ("broadcast", "signal"):
        rates = _chain_rates(sender, groups, cluster)
        if strategy == "signal":
            n, k = SIGNAL_BYTES, 1
        else:
            k = chunks if chunks is not None else cm.auto_chunks(n, rates, lat)
            k = max(1, min(k, task.num_elements))
        return Candidate(sender, transfer_resources(strategy, sender, hosts), cm.chain_time(n, rates, k, lat), k)
    if strategy == "global_allgather":
        parts = len(receivers)
        scatter = sum(len(devs) * (lat + n / parts / cluster.link_rate(sender, h)) for h, devs in groups.items())
        gather = cm.ring_allgather_time(n, _ring_rates(groups, cluster), lat)
        return Candidate(sender, transfer_resources(strategy, sender, hosts), scatter + gather)
    raise ValueError(f"no candidate model for strategy {strategy!r}")


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
            hosts = tuple(_group_by_host(devices, self.cluster))
            v = self.src[devices] = (hosts, frozenset(hosts))
        return v

    def dst_groups(self, devices: tuple[int, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
        v = self.dst.get(devices)
        if v is None:
            v = self.dst[devices] = tuple((h, tuple(d)) for h, d in _group_by_host(devices, self.cluster).items())
        return v


def jobs_for_task(task: UnitTask, strategy: str, cluster: ClusterSpec, chunks: int | None,
                  memo: JobMemo | None = None) -> list[Job]:
    """Jobs that deliver ``task`` to all its destination devices with ``strategy``.

    ``strategy`` here is a per-task strategy: ``alpa`` is expanded by the planner
    into ``send_recv`` on rewritten tasks plus all-gathers. ``memo`` (one per
    plan) caches host groupings and candidates.
    """
    memo = memo or JobMemo(cluster)
    src_hosts, src_set = memo.src_hosts(task.src_devices)
    groups = memo.dst_groups(task.dst_devices)
    jobs: list[Job] = []
    remote = groups
    if not src_set.isdisjoint(h for h, _ in groups):
        remote = tuple((h, d) for h, d in groups if h not in src_set)
        for h, devs in groups:
            if h in src_set:
                dur = len(devs) * cm.p2p_time(task.nbytes, cluster.intra_rate, cluster.latency_s)
                jobs.append(Job(task.id, LOCAL_COPY, devs, task.nbytes, task.index,
                                (Candidate(h, transfer_resources(LOCAL_COPY, h, (h,)), dur),)))
        if not remote:
            return jobs
    if strategy == "send_recv":
        parts = [((h, (d,)),) for h, devs in remote for d in devs]
    elif strategy == "local_allgather":
        parts = [(g,) for g in remote]
    else:
        parts = [remote]
    nbytes = SIGNAL_BYTES if strategy == "signal" else task.nbytes
    for part in parts:
        geometry = memo.geometry.get(part)
        if geometry is None:
            geometry = memo.geometry[part] = tuple((h, len(d)) for h, d in part)
        key = (strategy, task.nbytes, src_hosts, geometry, chunks)
        cands = memo.cands.get(key)
        if cands is None:  # (num_elements only clamps chunks; equal bytes mean equal elements here)
            g = {h: list(d) for h, d in part}
            cands = memo.cands[key] = tuple(_candidate(strategy, task, s, g, cluster, chunks) for s in src_hosts)
        receivers = part[0][1] if len(part) == 1 else tuple(d for _, devs in part for d in devs)
        jobs.append(Job(task.id, strategy, receivers, nbytes, task.index, cands))
    return jobs


def allgather_job(members: Sequence[int], index: tuple, nbytes: int, deps: Sequence[int],
                  cluster: ClusterSpec) -> Job:
    """Alpa's follow-up all-gather: members each hold 1/len(members) of ``index``."""
    groups = _group_by_host(members, cluster)
    hosts = list(groups)
    dur = cm.ring_allgather_time(nbytes, _ring_rates(groups, cluster), cluster.latency_s)
    return Job(-1, ALLGATHER, tuple(sorted(members)), nbytes, index,
               (Candidate(hosts[0], transfer_resources(ALLGATHER, None, hosts), dur),), tuple(deps))


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
