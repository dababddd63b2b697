"""The rules a host admits a plan's transfers by: how many it keeps in flight, and on
which NIC in which order. The executor (``runtime.executor``) runs by them and the
simulator (``sim.simulate``) plays plans by them, so both live here, once.

* A host keeps at most ``MAX_CONCURRENT`` of its transfers in flight.
* On each NIC (and intra-host link) a transfer holds, at most ``MAX_PER_RESOURCE`` of
  the transfers that hold it for long are in flight at once (per stream of the
  backend), taken in the plan's order there: the planner balanced and ordered each
  NIC's work as a sequence, and a second one admitted while the first is on the wire
  hides the per-transfer start-up (a chain's fill, a message's latency) without turning
  the sequence into a free-for-all.
* A transfer whose bytes take fewer than ``ORDERED_LATENCIES`` message latencies on the
  slowest NIC is latency-bound: its order on a NIC hardly matters, and overlapping it
  with others hides what it costs, so it is admitted outside the NIC windows (only the
  host's ``MAX_CONCURRENT`` bounds it). A receiving host that takes a hundred small
  messages from a hundred senders therefore pays about one latency per
  ``MAX_CONCURRENT`` of them, not one per message.
"""
from __future__ import annotations

MAX_INFLIGHT_BYTES = 256 * 2**20
"""Bytes of packing and unpacking buffers a host holds at once for the transfers in
flight, beyond the source and destination memory (a transfer larger than this runs when
nothing else is in flight); the planner streams slices together up to this size."""
MAX_CONCURRENT = 32
"""Transfers a host keeps in flight at once (each on a thread of its own)."""
MAX_PER_RESOURCE = 2
"""Transfers that hold a NIC for long that a host keeps in flight on any one NIC (or
intra-host link) at once, per stream of its backend (a message below the striping size
rides one stream, so one stream's worth would leave the others idle), in the plan's
order there."""
ORDERED_LATENCIES = 8
"""A transfer whose bytes take fewer than this many message latencies on the slowest NIC
is latency-bound and admitted outside the NIC windows."""


def latency_bound(nbytes: int, latency_s: float, min_rate: float | None) -> bool:
    """Whether a transfer of ``nbytes`` is latency-bound on NICs whose slowest rate is
    ``min_rate`` bytes/s with ``latency_s`` per message (no rate known: never)."""
    return bool(min_rate) and nbytes < ORDERED_LATENCIES * latency_s * min_rate
