"""Schedule validation: structure first (each action once, local order, matching
SEND/RECV pairs), then a dry run that finds deadlocks."""
from __future__ import annotations

from .ir import Schedule, ScheduleError


def _where(stage: int, idx: int, a) -> str:
    return f"stage {stage}, action {idx} ({a})"


def validate(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` pointing at the first offending action."""
    S = schedule.num_stages
    M = schedule.num_microbatches
    if S == 0:
        raise ScheduleError("schedule has no stages")
    explicit_peers = any(a.peer is not None for s in schedule.stages for a in s)
    sends: dict[tuple, tuple[int, int]] = {}
    recvs: dict[tuple, tuple[int, int]] = {}
    for i, acts in enumerate(schedule.stages):
        seen: dict[tuple[str, int], int] = {}          # compute actions, and comm actions to the default peer
        comm: list[tuple[int, object, int]] = []        # (index, action, peer) of every comm action
        seen_comm: dict[tuple, int] = {}
        for idx, a in enumerate(acts):
            if a.kind.is_comm:
                peer = schedule.peer(i, a)
                if not 0 <= peer < S or peer == i:
                    raise ScheduleError(f"{_where(i, idx, a)}: peer stage {peer} does not exist")
                if (a.kind, a.mb, peer) in seen_comm:
                    raise ScheduleError(f"{_where(i, idx, a)}: {a} appears twice on this stage "
                                        f"(first at action {seen_comm[(a.kind, a.mb, peer)]})")
                seen_comm[(a.kind, a.mb, peer)] = idx
                comm.append((idx, a, peer))
                direction = a.kind.split("_")[1]
                key = (direction, a.mb, i, peer) if a.kind.is_send else (direction, a.mb, peer, i)
                (sends if a.kind.is_send else recvs)[key] = (i, idx)
                if a.peer is not None:
                    continue
            elif (a.kind, a.mb) in seen:
                raise ScheduleError(f"{_where(i, idx, a)}: {a} appears twice on this stage "
                                    f"(first at action {seen[(a.kind, a.mb)]})")
            seen[(a.kind, a.mb)] = idx
        for m in range(M):
            f = seen.get(("F", m))
            if f is None:
                raise ScheduleError(f"stage {i}: forward F{m} is missing")
            b, bi, bw = seen.get(("B", m)), seen.get(("BI", m)), seen.get(("BW", m))
            if b is not None and (bi is not None or bw is not None):
                raise ScheduleError(f"stage {i}: microbatch {m} has both B{m} and BI/BW")
            if b is None and (bi is None or bw is None):
                missing = "B" if bi is None and bw is None else ("BI" if bi is None else "BW")
                raise ScheduleError(f"stage {i}: backward {missing}{m} is missing")
            grad = b if b is not None else bi
            if grad < f:
                raise ScheduleError(f"{_where(i, grad, acts[grad])}: backward of microbatch {m} before its forward")
            if bw is not None and bw < bi:
                raise ScheduleError(f"{_where(i, bw, acts[bw])}: BW{m} before BI{m}")
            if not explicit_peers:  # a linear pipeline: every adjacent transfer must be there
                for kind, needed in (("RECV_F", i > 0), ("SEND_F", i < S - 1), ("RECV_B", i < S - 1),
                                     ("SEND_B", i > 0)):
                    if needed and (kind, m) not in seen:
                        rel, what = ("before", "F") if kind.endswith("F") and kind.startswith("RECV") else \
                            ("after", "F") if kind.endswith("F") else \
                            ("before", "backward") if kind.startswith("RECV") else ("after", "backward")
                        raise ScheduleError(f"stage {i}: {kind}{m} is missing (needed {rel} its {what})")
        for idx, a, _ in comm:  # every transfer sits on the right side of its compute action
            anchor = seen.get(("F", a.mb)) if a.kind.endswith("_F") else \
                (seen.get(("B", a.mb)) if ("B", a.mb) in seen else seen.get(("BI", a.mb)))
            if anchor is None:
                continue
            before = a.kind.is_recv
            if (before and idx > anchor) or (not before and idx < anchor):
                raise ScheduleError(f"{_where(i, idx, a)}: must come {'before' if before else 'after'} {acts[anchor]}")
    for key, (i, idx) in sends.items():
        if key not in recvs:
            a = schedule.stages[i][idx]
            raise ScheduleError(f"{_where(i, idx, a)}: no matching RECV_{key[0]}{key[1]} on stage {key[3]}")
    for key, (i, idx) in recvs.items():
        if key not in sends:
            a = schedule.stages[i][idx]
            raise ScheduleError(f"{_where(i, idx, a)}: no matching SEND_{key[0]}{key[1]} on stage {key[2]}")
    from .simulate import Costs, simulate_schedule  # noqa: PLC0415 - dry run for deadlocks

    simulate_schedule(schedule, Costs())
