"""Host resources a transfer occupies: each host's NIC send side, NIC receive side and
intra-host link, as small integer keys.

The planner schedules jobs on these keys, the simulator turns them into links of
its fluid network and the trace draws one row per key, so all three read a plan
the same way. Keys are ``3 * host + side`` so that a key tells its host and side
by ``divmod`` without a lookup table (plans hold tens of thousands of them).
"""
from __future__ import annotations

from typing import Sequence

SEND, RECEIVE, INTRA = 0, 1, 2
SIDE_NAMES = ("send", "receive", "intra")


def nic_send(host: int) -> int:
    """Key of the send side of ``host``'s NIC(s)."""
    return 3 * host + SEND


def nic_receive(host: int) -> int:
    """Key of the receive side of ``host``'s NIC(s)."""
    return 3 * host + RECEIVE


def intra_link(host: int) -> int:
    """Key of ``host``'s intra-host link (NVLink-class)."""
    return 3 * host + INTRA


def host_and_side(key: int) -> tuple[int, int]:
    """(host, side) of a resource key; side is ``SEND``, ``RECEIVE`` or ``INTRA``."""
    return divmod(key, 3)


def describe_resource(key: int) -> str:
    host, side = host_and_side(key)
    return f"host{host}.{SIDE_NAMES[side]}"


def ring_resources(hosts: Sequence[int]) -> tuple[int, ...]:
    """Keys a host-level ring over ``hosts`` holds (the intra-host link when it is one host)."""
    if len(hosts) == 1:
        return (intra_link(hosts[0]),)
    return tuple(r for h in hosts for r in (nic_send(h), nic_receive(h)))
