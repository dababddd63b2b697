"""What every transfer kind answers, and the host geometry they share.

A *transfer kind* is one way of moving a slice's bytes from a sending device to
its receiving devices (one point-to-point message, a chunk-pipelined chain, a
scatter plus ring all-gather, ...). Everything the library knows about a kind
lives on its ``TransferKind`` subclass, one module each in this package:

* ``candidate``: its duration from the cost model, and the host resources it
  holds, for the planner's load balancer;
* ``closed_form``: the paper's formula (ideal links, no latency);
* ``host_flows`` and ``phases``: the bytes it puts on NICs, and how the flow
  simulator plays it;
* ``run``: how a host executes it, written once against the small set of
  primitives a ``runtime.context.TransferContext`` offers (send, receive, wait,
  read a slice, write a slice). Only NumPy is used here, so planning stays free
  of jax, ray, torch and cupy; the executor supplies the backend.

Adding a kind is adding one module beside this one: ``kinds/__init__`` finds it.
"""
from __future__ import annotations

from typing import Callable, ClassVar, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ...bounds import even_bounds
from ...errors import InvalidOptionError
from ...topology import ClusterSpec
from .. import cost_model
from ..resources import intra_link, nic_receive, nic_send

# Annotations name ``TransferContext`` (``runtime.context``: one transfer's primitives,
# what ``post``/``run`` are handed) and ``Transfer`` (``resharding.plan``) without
# importing them: the runtime and the plan import the kinds, and a kind needs neither
# module to run (planning stays pure).

Phase = Tuple[float, List[Tuple[float, Tuple[int, ...]]]]  # typing forms: aliases run on Python 3.8
"""(fixed delay in seconds, [(bytes, resource keys the flow crosses), ...])."""

HostGroups = Dict[int, List[int]]
"""Receiving devices grouped by host, hosts in chain order."""


class Posted(NamedTuple):
    """One host's part of a transfer, posted without blocking (``TransferKind.post``): the
    handles to wait for, then ``finish`` (unpacking, intra-host copies) once they are done."""

    handles: list
    finish: Callable[[], None] | None = None


def finish_posted(ex: "TransferContext", posted: Posted) -> None:
    """Wait for a posted part and finish it (what ``run`` does for a postable host)."""
    ex.wait(posted.handles)
    if posted.finish is not None:
        posted.finish()


class Candidate(NamedTuple):
    """One way to run a job: from ``host``, using ``resources`` for ``duration`` seconds."""

    host: int
    resources: tuple[int, ...]
    duration: float
    chunks: int = 1


class TransferKind:
    """Base of every transfer kind; subclasses set the class attributes and override
    what differs. A subclass with a ``name`` registers itself."""

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100
    """Position in listings (strategy choices, tables)."""
    per_task_strategy: ClassVar[bool] = True
    """A user may ask ``plan_resharding`` to move every unit task this way."""
    packable: ClassVar[bool] = False
    """Jobs of this kind may be coalesced into one flat buffer (tree plans)."""
    carries_data: ClassVar[bool] = True
    """False for kinds that only time the protocol (``signal``)."""
    rotates_shared_receivers: ClassVar[bool] = False
    """Its transfers pass the receiving hosts in the order ``receivers`` lists them (a
    chain, trees over that order): transfers with the same receiving hosts then start at
    different ones (``planner.rotate_shared_chains``), so no host heads all of them."""
    receives_into_scratch: ClassVar[bool] = False
    """Every receiving host takes the whole slice into scratch memory first (the
    all-gathers, rotated chains); the others receive in place where the first local
    receiver's region is contiguous (``receive_buffer``). The executor counts that
    scratch against its memory budget."""
    groups_jobs: ClassVar[bool] = False
    """True for kinds that merge many unit tasks' jobs into one transfer (``combine``)."""
    auto_min_hosts: ClassVar[int] = 1
    """``auto`` tries this kind only where some task has at least this many receiving
    hosts: below that it plans as a chain (``broadcast``) would."""

    # ------------------------------------------------------------- planning
    def busy_fraction(self, t: "Transfer", host_of, rate: float | None, latency_s: float) -> float | None:
        """The share of its time this transfer keeps each NIC it holds busy at ``rate``
        (its bytes' time over its whole time, fill and per-message latencies included),
        where that decides whether it shares a NIC (``admission.window_units``); None for
        the kinds the plain window suits."""
        return None

    def wire_bytes(self, nbytes: int) -> int:
        """Bytes one job of ``nbytes`` puts on the wire."""
        return nbytes

    def split_receivers(self, remote: tuple[tuple[int, tuple[int, ...]], ...]) -> list[tuple]:
        """How a unit task's remote receivers ((host, devices), ...) split into jobs
        served by one sender each; by default one job for all of them."""
        return [remote]

    def jobs_per_task(self, hosts: int, devices: int) -> int:
        """How many jobs ``split_receivers`` makes of a task with remote receivers on
        ``hosts`` hosts (``devices`` devices in all): what planning this kind costs."""
        return 1

    def resources(self, sender_host: int | None, receiver_hosts: Sequence[int]) -> tuple[int, ...]:
        """Resource keys a transfer holds for its whole duration (receiving hosts in chain order)."""
        raise NotImplementedError

    def duration(self, nbytes: int, num_elements: int, sender_host: int, groups: HostGroups,
                 cluster: ClusterSpec, chunks: int | None) -> tuple[float, int]:
        """(seconds, chunks) of one job from the cost model."""
        raise NotImplementedError

    def candidate(self, nbytes: int, num_elements: int, sender_host: int, groups: HostGroups,
                  cluster: ClusterSpec, chunks: int | None) -> Candidate:
        seconds, k = self.duration(nbytes, num_elements, sender_host, groups, cluster, chunks)
        return Candidate(sender_host, self.resources(sender_host, list(groups)), seconds, k)

    def combine(self, jobs: list, job_leaf: list[int], members: dict, cluster: ClusterSpec):
        """Merge jobs of this kind into group jobs after per-task planning: returns
        (jobs, job_leaf, members) where ``members[new job]`` lists (job, leaf, sender
        host) of the unit tasks it carries as parts. Most kinds keep every job."""
        return jobs, job_leaf, members

    def transfer_resources(self, t: "Transfer", cluster: ClusterSpec) -> tuple[int, ...]:
        """Resource keys a planned transfer holds (the simulator releases transfers in
        plan order on each of them)."""
        sender = None if t.sender is None else cluster.host_of(t.sender)
        return self.resources(sender, receiving_hosts(t, cluster.host_of))

    def closed_form(self, t: float, hosts: int, devices: int, chunks: int = 1) -> float:
        """The paper's time for one slice (t = one NIC copy) to ``hosts`` x ``devices``."""
        raise InvalidOptionError(f"no closed form for transfer kind {self.name!r}")

    # ----------------------------------------------------------- simulation
    def host_flows(self, t: "Transfer", cluster: ClusterSpec) -> list[tuple[int, int, int]]:
        """(sending host, receiving host, bytes) of every NIC crossing; by default a host
        chain from the sender through the receivers' hosts."""
        flows, prev = [], cluster.host_of(t.sender)
        for r in t.receivers:
            h = cluster.host_of(r)
            if h != prev:
                flows.append((prev, h, t.nbytes))
            prev = h
        return flows

    def phases(self, t: "Transfer", cluster: ClusterSpec) -> list[Phase]:
        """How the flow simulator plays one transfer: phases run one after another."""
        raise NotImplementedError

    # ------------------------------------------------------------- execution
    def post(self, ex: "TransferContext", t: "Transfer", tag0: int) -> Optional[Posted]:
        """This host's part of ``t`` posted at once, where it only sends and receives
        (nothing it forwards waits on an arrival): the executor then posts it from its
        dispatching thread and collects it later, with no thread of its own. None where
        this host must react to arrivals (a chain's middle, a ring): ``run`` then runs it
        on a thread."""
        return None

    def run(self, ex: "TransferContext", t: "Transfer", tag0: int) -> None:
        """This host's part of ``t`` (tags ``tag0`` .. ``tag0 + 1023`` are the transfer's)."""
        posted = self.post(ex, t, tag0)
        if posted is None:
            raise NotImplementedError
        finish_posted(ex, posted)

    def __repr__(self) -> str:
        return f"<transfer kind {self.name}>"


# ------------------------------------------------------------------ geometry
def receiving_hosts(t: "Transfer", host_of, exclude: int | None = None) -> list[int]:
    """Hosts of ``t``'s receivers in the order the receivers list them (chain order),
    each once, without ``exclude`` (the sender's host, which needs no network hop)."""
    return [h for h in dict.fromkeys(host_of(r) for r in t.receivers) if h != exclude]


def group_by_host(devices: Sequence[int], cluster: ClusterSpec) -> HostGroups:
    """Devices grouped by host, hosts and devices ascending."""
    out: HostGroups = {}
    for d in sorted(devices):
        out.setdefault(cluster.host_of(d), []).append(d)
    return dict(sorted(out.items()))


def groups_in_order(devices: Sequence[int], host_of) -> HostGroups:
    """Devices grouped by host, hosts in the order the devices list them (chain order)."""
    out: HostGroups = {}
    for d in devices:
        out.setdefault(host_of(d), []).append(d)
    return out


def chain_rates(sender_host: int, groups: HostGroups, cluster: ClusterSpec) -> list[float]:
    """Hop rates of a chain through the receiving hosts: one network hop per host, then
    one intra-host hop where the last host has several devices.

    Every byte crosses into a host once; the host forwards each chunk to the next host
    as it arrives and copies it to its other devices beside that (the executor's
    broadcast), so a host's fan-out is off the chain's critical path except at the
    last host."""
    rates, prev = [], sender_host
    for h in groups:
        rates.append(cluster.link_rate(prev, h))
        prev = h
    if groups and len(groups[prev]) > 1:
        rates.append(cluster.intra_rate)
    return rates


def ring_rates(groups: HostGroups, cluster: ClusterSpec) -> list[float]:
    """Edge rates of a host-major ring over all devices in ``groups``."""
    hosts = list(groups)
    rates = []
    for i, h in enumerate(hosts):
        rates.extend([cluster.intra_rate] * (len(groups[h]) - 1))
        rates.append(cluster.link_rate(h, hosts[(i + 1) % len(hosts)]))
    return rates


def ring_links(groups: HostGroups) -> tuple[int, ...]:
    """Resource keys a device ring crosses (for the simulator's flows)."""
    hosts = list(groups)
    if len(hosts) == 1:
        return (intra_link(hosts[0]),)
    links = []
    for i, h in enumerate(hosts):
        links += [nic_send(h), nic_receive(hosts[(i + 1) % len(hosts)])]
        if len(groups[h]) > 1:
            links.append(intra_link(h))
    return tuple(links)


def ring_flows(members: Sequence[int], nbytes: int, cluster: ClusterSpec) -> list[tuple[int, int, int]]:
    """NIC crossings of a ring all-gather among ``members`` (each ends with all ``nbytes``)."""
    n = len(members)
    hosts = [cluster.host_of(m) for m in members]
    pairs = zip(hosts, hosts[1:] + hosts[:1])
    return [(a, b, nbytes * (n - 1) // n) for a, b in pairs if a != b]


def ring_allgather_seconds(nbytes: int, groups: HostGroups, cluster: ClusterSpec) -> float:
    return cost_model.ring_allgather_time(nbytes, ring_rates(groups, cluster), cluster.latency_s)


def chunk_bounds(t: "Transfer", nbytes: int, k: int) -> list[int]:
    """Byte bounds of ``t``'s ``k`` chunks, the same on every host: equal chunks, or for a
    ramped coalesced transfer (``Transfer.ramp``) up to ``k`` chunks that double in size
    from 1/(2^k - 1) of it, each ending on a part boundary: the sender's first message
    leaves once a few parts are packed, and packing stays ahead of the wire from then on."""
    if not (t.ramp and t.parts and k > 1):
        return even_bounds(0, nbytes, k)
    ends = np.cumsum([p.nbytes for p in t.parts])
    cuts = {0, nbytes}
    for j in range(1, k):
        target = nbytes * (2**j - 1) / (2**k - 1)
        at = int(ends[min(int(np.searchsorted(ends, target)), len(ends) - 1)])
        cuts.add(min(at, nbytes))
    return sorted(cuts)


# ---------------------------------------------------------- receiving hosts
def receive_buffer(ex: "TransferContext", t: "Transfer", nbytes: int, data: bool = True):
    """(flat buffer, this host's receiving devices, their flat targets) for a host that
    takes ``t`` in chunks and forwards them (chains, trees).

    The buffer is the first local device's own region when that is contiguous (for a
    coalesced transfer: its parts' regions when they lie back to back), so the bytes
    land in place; the caller copies each chunk on to the other targets as it
    arrives, so intra-host copies overlap the network instead of following it."""
    mine = ex.local_receivers(t) if data and not t.parts else []
    targets = [ex.flat_target(r, t.index) for r in mine]
    in_place = ex.bucket_target(t) if data and t.parts else None
    flat = (targets[0] if targets and targets[0] is not None
            else in_place if in_place is not None else ex.empty_bytes(nbytes))
    return flat, mine, targets


def fan_out(flat: np.ndarray, targets: list, lo: int, hi: int) -> None:
    """Copy bytes [lo, hi) that just arrived in ``flat`` on to this host's other devices."""
    for tgt in targets:
        if tgt is not None and tgt is not flat:
            tgt[lo:hi] = flat[lo:hi]


def run_side_by_side(tasks: Sequence[Callable[[], list]]) -> list:
    """Run ``tasks`` at once (the first in this thread, the others in threads of their own)
    and return their results concatenated, in task order; the first error raised by any is
    raised here after all have ended (each bounds its own waits, so all end). For the
    parts of one transfer that must progress independently, e.g. a double tree's two
    trees on a host that forwards in one and receives in the other."""
    import threading  # noqa: PLC0415 - only executing hosts need it

    results: list = [None] * len(tasks)
    errors: list = []

    def one(i: int) -> None:
        try:
            results[i] = tasks[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True, name="alpa-comm-side")
               for i in range(1, len(tasks))]
    for th in threads:
        th.start()
    one(0)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return [x for r in results for x in r]


def store_received(ex: "TransferContext", t: "Transfer", flat: np.ndarray, mine: list[int], targets: list,
                   data: bool = True) -> None:
    """Finish what ``receive_buffer`` started: unpack a coalesced transfer, and write the
    devices whose region was not contiguous."""
    if t.parts and data:
        ex.deliver(t, flat)
    for r, tgt in zip(mine, targets):
        if tgt is None:
            ex.write(r, t.index, flat)
