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
        seen: dict[tuple[str, int], int] = {}
        for idx, a in enumerate(acts):
            if (a.kind, a.mb) in seen and a.peer is None:
                raise ScheduleError(f"{_where(i, idx, a)}: {a} appears twice on this stage "
                                    f"(first at action {seen[(a.kind, a.mb)]})")
            seen[(a.kind, a.mb)] = idx
            if a.kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B"):
                peer = schedule.peer(i, a)
                if not 0 <= peer < S or peer == i:
                    raise ScheduleError(f"{_where(i, idx, a)}: peer stage {peer} does not exist")
                direction = a.kind.split("_")[1]
                key = (direction, a.mb, i, peer) if a.kind.startswith("SEND") else (direction, a.mb, peer, i)
                (sends if a.kind.startswith("SEND") else recvs)[key] = (i, idx)
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
            checks = [("RECV_F", f, "before", "F"), ("SEND_F", f, "after", "F"),
                      ("RECV_B", grad, "before", "backward"), ("SEND_B", grad, "after", "backward")]
            for kind, anchor, rel, what in checks:
                idx = seen.get((kind, m))
                if idx is None:
                    if not explicit_peers and ((kind == "RECV_F" and i > 0) or (kind == "SEND_F" and i < S - 1)
                                               or (kind == "RECV_B" and i < S - 1) or (kind == "SEND_B" and i > 0)):
                        raise ScheduleError(f"stage {i}: {kind}{m} is missing (needed {rel} its {what})")
                    continue
                if (rel == "before" and idx > anchor) or (rel == "after" and idx < anchor):
                    raise ScheduleError(f"{_where(i, idx, acts[idx])}: must come {rel} {acts[anchor]}")
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
