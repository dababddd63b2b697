"""Coalescing: small jobs that travel the same way become one message.

A resharding between layouts no one chose can cut a tensor into a hundred thousand
pieces of a few KiB, one per (source device, destination device); a receiving host then
takes thousands of messages, and at tens of microseconds each that is the whole
transfer time. Pieces that go the same way (same kind, same candidate sending hosts,
same receiving hosts and device counts) are packed into flat buffers of at most
``bucket`` bytes (first-fit decreasing): one message, or one chunked chain, instead of
many, received in place or unpacked on arrival. Used for one array
(``planner.plan_resharding``: the pieces between the same two hosts) and for a pytree
(``tree.plan_resharding_tree``: pieces of many arrays). The cost model charges latency
per message and per chunk, so the effect of packing is predicted and simulated.

Large slices are not packed but may be streamed (``stream_jobs``): those that share a kind,
sending hosts and receiving hosts go as one chain or tree over their concatenation, so it
fills once, where the cost model says that pays.
"""
from __future__ import annotations

from ..errors import InvalidOptionError
from ..topology import ClusterSpec
from .admission import MAX_INFLIGHT_BYTES
from .kinds import PACKABLE_KINDS, transfer_kind
from .kinds.base import group_by_host
from .strategies import Job
from ..validation import is_int

AUTO_BUCKET_MIN = 64 << 10
AUTO_BUCKET_MAX = 64 << 20
PACKED_LATENCY_SHARE = 0.05
"""What a message's latency may cost of a packed bucket's transfer time: a packed bucket
is copied twice (packed, unpacked), and smaller ones let those copies overlap the wire."""
VECTORED_LATENCY_SHARE = 0.01
"""The same for a bucket that goes from one host to one other (``one_hop``) where the
transport sends it from where its parts lie and receives it where they belong
(``Backend.vectored``): no copy to overlap, no buffer to hold, nothing to balance, so a
bucket costs only its message, and a message costs the executor more than its latency
(a NIC's window admits the next message once an earlier one's slowest stripe ended: six
19 MiB messages two at a time took 19.1-21.0 ms over the raw transport, all posted at
once 17.8-18.4, one message of it all 17.1-18.3). Two processes on loopback, 40 Gbit/s
planned, 200 us, interleaved medians, 5 % against 1 %: 100 x 1 MiB 23.1-23.3 against
21.4-22.2 ms, 100 x 4 MiB 78.2-79.4 against 73.3-73.8 ms, 100 x 256 KiB 9.6-9.7 against
8.4-8.6 ms, 1,000 x 256 KiB alike (74.8-77.3 against 70.7-75.5 ms). Not for buckets with
a choice of sender or several receiving hosts, where the bucket is also the unit the
planner balances and chains: a weight sync to hosts that each need the whole model
(four emulated hosts, 400 Mbit/s) ran 1.5-5 % slower with every bucket at 1 % in four
of four interleaved pairs."""
STREAM_GAIN = 0.95
"""Large slices that travel the same way are streamed together only where the cost model
predicts the stream at most this fraction of their time apart."""


def bucket_within(bucket: int | None, max_inflight_bytes: int | None) -> int | None:
    """A bucket of at most half the memory budget (the next one is packed while the one
    before is on the wire); as asked without a budget, or without packing."""
    if bucket is None or max_inflight_bytes is None:
        return bucket
    return max(1, min(bucket, int(max_inflight_bytes) // 2))


def stream_bytes_within(max_inflight_bytes: int | None) -> int:
    """How large a stream of large slices may grow under a memory budget: half of it
    (the next one is read while the one before is on the wire); ``MAX_INFLIGHT_BYTES``
    without one. LPT balancing may add up to one slice beyond it."""
    return MAX_INFLIGHT_BYTES if max_inflight_bytes is None else max(1, int(max_inflight_bytes) // 2)


def auto_bucket_bytes(cluster: ClusterSpec, vectored: bool = False) -> int:
    """Large enough that a message's latency costs at most ``PACKED_LATENCY_SHARE`` of its
    transfer time on the slowest NIC (``VECTORED_LATENCY_SHARE`` where the transport
    gathers and scatters: ``vectored``), within [64 KiB, 64 MiB]."""
    rate = min(min(cluster.send_rate(h), cluster.recv_rate(h)) for h in range(cluster.num_hosts))
    share = VECTORED_LATENCY_SHARE if vectored else PACKED_LATENCY_SHARE
    return int(min(AUTO_BUCKET_MAX, max(AUTO_BUCKET_MIN, cluster.latency_s * rate / share)))


def check_bucket_bytes(bucket_bytes) -> None:
    """``bucket_bytes`` is ``"auto"``, None, or an int >= 0 (0: no packing); anything else
    (an array, a float, a bool) is refused by name before it is compared with anything."""
    if not (bucket_bytes is None or (isinstance(bucket_bytes, str) and bucket_bytes == "auto")
            or (is_int(bucket_bytes) and bucket_bytes >= 0)):
        raise InvalidOptionError(f"bucket_bytes must be 'auto', a positive integer or None, got {bucket_bytes!r}")


def bucket_option(bucket_bytes, cluster: ClusterSpec, vectored: bool = False) -> int | None:
    """The bucket size ``bucket_bytes`` asks for: ``"auto"`` (``auto_bucket_bytes``), a
    positive byte count, or None/0 for no packing; anything else is refused by name."""
    check_bucket_bytes(bucket_bytes)
    if bucket_bytes == "auto":
        return auto_bucket_bytes(cluster, vectored)
    return bucket_bytes or None


def one_hop(hosts: tuple[int, ...], geometry: tuple) -> bool:
    """Whether jobs from candidate sending ``hosts`` to receiving hosts ``geometry`` ((host,
    devices) pairs) go from one host to one other host: a bucket of them has no other
    sender to be balanced onto and no chain to be ordered in, so its size only sets how
    many messages there are."""
    return len(hosts) == 1 and len(geometry) == 1 and geometry[0][0] != hosts[0]


def pack_jobs(jobs: list[Job], job_leaf: list[int], bucket: int, cluster: ClusterSpec, chunks,
              stream_bytes: int = MAX_INFLIGHT_BYTES, one_hop_bucket: int | None = None):
    """First-fit-decreasing packing of small jobs that travel the same way, then the
    streams of large ones (``stream_jobs``, at most ``stream_bytes`` each); returns (jobs,
    job_leaf, members) where ``members[packed job]`` lists (job, leaf, None) of the jobs
    it carries as parts (their sender is the packed job's host). ``one_hop_bucket``: the
    bucket of jobs that go from one host to one other (``one_hop``), ``bucket`` where
    not given; elsewhere a bucket is also the unit the planner balances and orders."""
    groups: dict[tuple, list[int]] = {}
    keep: list[int] = []
    geometry_of: dict[tuple, tuple] = {}  # jobs share receiver tuples: 4,096 receivers each, thousands of jobs
    largest = max(bucket, one_hop_bucket or 0)

    def size_for(hosts: tuple, geometry: tuple) -> int:
        return one_hop_bucket if one_hop_bucket and one_hop(hosts, geometry) else bucket

    for i, j in enumerate(jobs):
        if j.kind not in PACKABLE_KINDS or j.nbytes >= largest:
            keep.append(i)
            continue
        geometry = geometry_of.get(j.receivers)
        if geometry is None:
            geometry = geometry_of[j.receivers] = tuple((h, len(d)) for h, d in
                                                        group_by_host(j.receivers, cluster).items())
        hosts = tuple(c.host for c in j.candidates)
        if j.nbytes >= size_for(hosts, geometry):
            keep.append(i)
            continue
        groups.setdefault((j.kind, hosts, geometry), []).append(i)
    new_jobs: list[Job] = [jobs[i] for i in keep]
    new_leaf: list[int] = [job_leaf[i] for i in keep]
    members: dict[int, list[tuple[Job, int, int | None]]] = {}  # packed job -> (job, leaf, sender host)s
    for (kind, hosts, geometry), idx in groups.items():
        size = size_for(hosts, geometry)
        if len(idx) == 1:  # nothing travels with it
            new_jobs.append(jobs[idx[0]])
            new_leaf.append(job_leaf[idx[0]])
            continue
        bins: list[list[int]] = []
        room: list[int] = []
        for i in sorted(idx, key=lambda i: -jobs[i].nbytes):
            for b, r in enumerate(room):
                if jobs[i].nbytes <= r:
                    bins[b].append(i)
                    room[b] -= jobs[i].nbytes
                    break
            else:
                bins.append([i])
                room.append(size - jobs[i].nbytes)
        for b in bins:
            if len(b) == 1:
                new_jobs.append(jobs[b[0]])
                new_leaf.append(job_leaf[b[0]])
                continue
            members[len(new_jobs)] = [(jobs[i], job_leaf[i], None) for i in b]
            new_jobs.append(_packed_job(kind, [jobs[i] for i in b], hosts, cluster, chunks))
            new_leaf.append(-1)
    return stream_jobs(new_jobs, new_leaf, members, cluster, chunks, stream_bytes)


def _packed_job(kind: str, parts: list[Job], hosts: tuple[int, ...], cluster: ClusterSpec, chunks) -> Job:
    """One job carrying ``parts`` back to back, from any of ``hosts``, to all their receivers."""
    total = sum(j.nbytes for j in parts)
    receivers = tuple(sorted({r for j in parts for r in j.receivers}, key=lambda d: (cluster.host_of(d), d)))
    # chunks split bytes, so a packed buffer's chunk count may go up to its byte count
    cands = tuple(transfer_kind(kind).candidate(total, total, s, fan_out_groups(parts, receivers, cluster), cluster,
                                                chunks) for s in hosts)
    return Job(-2, kind, receivers, total, (), cands)


def fan_out_groups(parts: list[Job], receivers: tuple[int, ...], cluster: ClusterSpec) -> dict:
    """The receiving hosts of a bucket as its cost sees them: each host with the devices
    of the part that has the most there. Every part lands on its own receivers (the
    executor writes a part where it belongs), so a host copies a chunk on to as many
    devices as one part has there, not to the union of the bucket's: a bucket whose parts
    each land on one device of the last host has no intra-host hop to pipeline, and
    its chunks would only add messages."""
    union = group_by_host(receivers, cluster)
    most: dict[int, int] = {}
    seen: set = set()
    for j in parts:
        if j.receivers in seen:
            continue
        seen.add(j.receivers)
        for h, devices in group_by_host(j.receivers, cluster).items():
            most[h] = max(most.get(h, 0), len(devices))
    return {h: devices[:most.get(h, 1)] for h, devices in union.items()}


def stream_jobs(jobs: list[Job], job_leaf: list[int], members: dict, cluster: ClusterSpec, chunks,
                stream_bytes: int = MAX_INFLIGHT_BYTES):
    """Slices too large for a bucket that share a kind, their candidate sending hosts and
    their receiving hosts (whatever devices they land on there: a layout change gives each
    slice other devices) move as one stream of at most ``stream_bytes``: one chain or
    double tree over their concatenation fills and drains once instead of once per slice,
    which is most of the time of one host to a hundred with a layout change. As many
    streams as there are candidate hosts at least, so the balancer may still spread them;
    only where the cost model predicts the streams at most ``STREAM_GAIN`` of the slices'
    time apart (a chain to one host gains nothing). Returns (jobs, job_leaf, members)."""
    groups: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):
        if i in members or j.kind not in PACKABLE_KINDS or j.deps:
            continue
        hosts = tuple(c.host for c in j.candidates)
        receiving = tuple(sorted({cluster.host_of(r) for r in j.receivers} - set(hosts)))
        if len(receiving) > 1:
            groups.setdefault((j.kind, hosts, receiving), []).append(i)
    streams: list[tuple[list[int], Job]] = []
    for (kind, hosts, _), idx in groups.items():
        if len(idx) < 2:
            continue
        total = sum(jobs[i].nbytes for i in idx)
        count = max(len(hosts), -(-total // stream_bytes))
        if count >= len(idx):
            continue
        bins: list[list[int]] = [[] for _ in range(count)]
        load = [0] * count
        for i in sorted(idx, key=lambda i: -jobs[i].nbytes):  # LPT: streams of about equal size
            b = load.index(min(load))
            bins[b].append(i)
            load[b] += jobs[i].nbytes
        made = [_packed_job(kind, [jobs[i] for i in b], hosts, cluster, chunks) for b in bins]
        apart = sum(min(c.duration for c in jobs[i].candidates) for i in idx)
        together = sum(min(c.duration for c in m.candidates) for m in made)
        if together <= STREAM_GAIN * apart:
            streams += list(zip(bins, made))
    if not streams:
        return jobs, job_leaf, members
    streamed = {i for b, _ in streams for i in b}
    new_jobs, new_leaf, new_members = [], [], {}
    for i, j in enumerate(jobs):
        if i not in streamed:
            if i in members:
                new_members[len(new_jobs)] = members[i]
            new_jobs.append(j)
            new_leaf.append(job_leaf[i])
    for b, job in streams:
        new_members[len(new_jobs)] = [(jobs[i], job_leaf[i], None) for i in b]
        new_jobs.append(job)
        new_leaf.append(-1)
    return new_jobs, new_leaf, new_members
