"""One order of a schedule's transfers that every stage can keep, for a transport that
matches messages in issue order (NCCL) instead of by tag.

Over a tagged transport (gloo, TCP) a stage posts all its receives at once and each
transfer finds its match whatever the order. NCCL pairs a host's sends to a peer with the
peer's receives in the order both issued them, and a stream runs one launch at a time, so
the hosts must issue their transfers in one agreed order. ``transfer_order`` gives it: a
total order of the schedule's transfers (SEND/RECV pairs) in which every stage's receives
come before the sends its action list places after them. A host then runs the transfers it
takes part in one after another in that order, and none can wait on another in a cycle:

the earliest unfinished transfer X has, on each host taking part, every earlier transfer
finished; its sender's action list reaches ``SEND X`` because every ``RECV`` before that
action is an earlier transfer (the order puts it first); so every host of X runs it, and
it ends. Induction.

Pure: schedule IR in, transfer keys (``Schedule.transfer_key``) out.
"""
from __future__ import annotations

import heapq

from .edges import edge_name
from .ir import Schedule, ScheduleError

TransferKey = tuple  # (direction "F"/"B", microbatch, source stage, destination stage, model-stage edge or None)


def transfer_order(schedule: Schedule) -> list[TransferKey]:
    """Every transfer of ``schedule`` once, in an order in which each stage's receives come
    before the sends that follow them in its action list; among transfers free to go next,
    the one whose SEND comes earliest in its stage's list (data made first goes first), then
    the one whose RECV does. Raises ``ScheduleError`` when the schedule's sends and receives
    wait on each other in a cycle (no order exists), naming the transfers left."""
    send_at: dict[TransferKey, int] = {}
    recv_at: dict[TransferKey, int] = {}
    after: dict[TransferKey, list[TransferKey]] = {}
    waits: dict[TransferKey, int] = {}
    for stage, actions in enumerate(schedule.stages):
        received: list[TransferKey] = []
        for pos, a in enumerate(actions):
            if not a.kind.is_comm:
                continue
            key = schedule.transfer_key(stage, a)
            if a.kind.is_recv:
                _once(recv_at, key, pos, stage, a)
                received.append(key)
            else:
                _once(send_at, key, pos, stage, a)
                for r in received:  # the send waits for every receive before it on this stage
                    after.setdefault(r, []).append(key)
                    waits[key] = waits.get(key, 0) + 1
    unmatched = set(send_at) ^ set(recv_at)
    if unmatched:
        raise ScheduleError(f"transfers without both a SEND and a RECV: {sorted(unmatched, key=repr)[:4]}")

    def rank(key: TransferKey) -> tuple:
        return send_at[key], recv_at[key], repr(key)

    ready = [(rank(k), k) for k in send_at if not waits.get(k)]
    heapq.heapify(ready)
    order: list[TransferKey] = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for nxt in after.get(key, ()):
            waits[nxt] -= 1
            if not waits[nxt]:
                heapq.heappush(ready, (rank(nxt), nxt))
    if len(order) < len(send_at):
        left = sorted((k for k in send_at if waits.get(k)), key=rank)
        raise ScheduleError(f"the schedule's sends and receives wait on each other in a cycle: no transfer order "
                            f"exists for {[_name(k) for k in left[:6]]}")
    return order


def _once(at: dict, key: TransferKey, pos: int, stage: int, a) -> None:
    if key in at:
        raise ScheduleError(f"stage {stage}: {a} appears twice")
    at[key] = pos


def _name(key: TransferKey) -> str:
    direction, mb, src, dst, _ = key
    return f"{edge_name(direction, src, dst)} microbatch {mb}"
