"""Schedule validation: structure first (each action once, local order, matching
SEND/RECV pairs), then a dry run that finds deadlocks."""
from __future__ import annotations

from .grid import schedule_error
from .ir import Schedule, ScheduleError


def reject_virtual(schedule: Schedule, runner: str = "this runner") -> None:
    """For runners that keep one model chunk per stage (Alpa's clock table): a schedule
    over virtual stages (``interleaved-1f1b``, ``zb-v``, ``dualpipev``) is refused, naming
    it, rather than run wrong. The in-process runner (``train.local_pipeline.run_schedule``)
    and the distributed trainer (``train.distributed``) run them."""
    if schedule.virtual:
        raise ScheduleError(f"schedule {schedule.name!r} has {schedule.num_chunks} model chunks per stage "
                            f"(virtual stages): {runner} runs one chunk per stage so far; the in-process "
                            "runner, simulator, validator and memory model take it")


def _where(stage: int, idx: int, a) -> str:
    return f"stage {stage}, action {idx} ({a})"


def validate(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` pointing at the first offending action."""
    S = schedule.num_stages
    M = schedule.num_microbatches
    C = schedule.num_chunks
    if S == 0:
        raise ScheduleError("schedule has no stages")
    explicit_peers = any(a.peer is not None for s in schedule.stages for a in s)
    V = schedule.num_virtual_stages
    sends: dict[tuple, tuple[int, int]] = {}
    recvs: dict[tuple, tuple[int, int]] = {}
    seen_all: list[dict] = []
    for i, acts in enumerate(schedule.stages):
        seen: dict[tuple[str, int, int], int] = {}     # compute actions, and comm actions to the default peer
        comm: list[tuple[int, object, int]] = []        # (index, action, peer) of every comm action
        seen_comm: dict[tuple, int] = {}
        for idx, a in enumerate(acts):
            if a.chunk >= C:
                raise schedule_error(schedule, f"{_where(i, idx, a)}: chunk {a.chunk} does not exist ({C} per stage)",
                                     (i, idx))
            if a.peer_chunk and (a.peer is None or a.peer_chunk >= C):
                raise schedule_error(schedule, f"{_where(i, idx, a)}: " + (
                    "a peer chunk needs an explicit peer stage" if a.peer is None
                    else f"peer chunk {a.peer_chunk} does not exist ({C} per stage)"), (i, idx))
            if a.kind.is_comm:
                peer = schedule.peer(i, a)
                if not 0 <= peer < S or peer == i:
                    raise schedule_error(schedule, f"{_where(i, idx, a)}: peer stage {peer} does not exist", (i, idx))
                key = schedule.transfer_key(i, a)  # one per transfer: model stages tell apart two to one peer
                if (a.kind, key) in seen_comm:
                    first = seen_comm[(a.kind, key)]
                    raise schedule_error(schedule, f"{_where(i, idx, a)}: {a} appears twice on this stage "
                                         f"(first at action {first})", (i, first), (i, idx))
                seen_comm[(a.kind, key)] = idx
                comm.append((idx, a, peer))
                (sends if a.kind.is_send else recvs)[key] = (i, idx)
                if a.peer is not None:
                    continue
            elif (a.kind, a.mb, a.chunk) in seen:
                first = seen[(a.kind, a.mb, a.chunk)]
                raise schedule_error(schedule, f"{_where(i, idx, a)}: {a} appears twice on this stage "
                                     f"(first at action {first})", (i, first), (i, idx))
            seen[(a.kind, a.mb, a.chunk)] = idx
        seen_all.append(seen)
        for c in range(C):
            v = schedule.virtual_stage(i, c)
            tag = f".{c}" if c else ""
            for m in range(M):
                f = seen.get(("F", m, c))
                if f is None:
                    raise schedule_error(schedule, f"stage {i}: forward F{m}{tag} is missing", (i, None))
                b, bi, bw = seen.get(("B", m, c)), seen.get(("BI", m, c)), seen.get(("BW", m, c))
                if b is not None and (bi is not None or bw is not None):
                    raise schedule_error(schedule, f"stage {i}: microbatch {m}{tag} has both B and BI/BW", (i, b))
                if b is None and (bi is None or bw is None):
                    missing = "B" if bi is None and bw is None else ("BI" if bi is None else "BW")
                    raise schedule_error(schedule, f"stage {i}: backward {missing}{m}{tag} is missing", (i, None))
                grad = b if b is not None else bi
                if grad < f:
                    raise schedule_error(schedule, f"{_where(i, grad, acts[grad])}: backward of microbatch {m}{tag} "
                                         "before its forward", (i, grad), (i, f))
                if bw is not None and bw < bi:
                    raise schedule_error(schedule, f"{_where(i, bw, acts[bw])}: BW{m}{tag} before BI{m}{tag}",
                                         (i, bw), (i, bi))
                if explicit_peers:
                    continue
                # a linear pipeline of model stages: every transfer to a neighbour on another stage
                before = schedule.place(v - 1)[0] if v > 0 else None
                after = schedule.place(v + 1)[0] if v < V - 1 else None
                for kind, neighbour in (("RECV_F", before), ("SEND_F", after), ("RECV_B", after),
                                        ("SEND_B", before)):
                    if neighbour is not None and neighbour != i and (kind, m, c) not in seen:
                        rel, what = ("before", "F") if kind.endswith("F") and kind.startswith("RECV") else \
                            ("after", "F") if kind.endswith("F") else \
                            ("before", "backward") if kind.startswith("RECV") else ("after", "backward")
                        raise schedule_error(schedule, f"stage {i}: {kind}{m}{tag} is missing (needed {rel} its "
                                             f"{what})", (i, f if what == "F" else grad))
        for idx, a, _ in comm:  # every transfer sits on the right side of its compute action
            anchor = seen.get(("F", a.mb, a.chunk)) if a.kind.endswith("_F") else \
                (seen.get(("B", a.mb, a.chunk)) if ("B", a.mb, a.chunk) in seen else seen.get(("BI", a.mb, a.chunk)))
            if anchor is None:
                continue
            before = a.kind.is_recv
            if (before and idx > anchor) or (not before and idx < anchor):
                raise schedule_error(schedule, f"{_where(i, idx, a)}: must come {'before' if before else 'after'} "
                                     f"{acts[anchor]}", (i, idx), (i, anchor))
    if schedule.virtual:
        _check_local_handoffs(schedule, seen_all, M)
    for key, (i, idx) in sends.items():
        if key not in recvs:
            a = schedule.stages[i][idx]
            raise schedule_error(schedule, f"{_where(i, idx, a)}: no matching RECV_{key[0]}{key[1]} on stage {key[3]}",
                                 (i, idx), (key[3], None))
    for key, (i, idx) in recvs.items():
        if key not in sends:
            a = schedule.stages[i][idx]
            raise schedule_error(schedule, f"{_where(i, idx, a)}: no matching SEND_{key[0]}{key[1]} on stage {key[2]}",
                                 (i, idx), (key[2], None))
    from .simulate import Costs, simulate_schedule  # noqa: PLC0415 - dry run for deadlocks

    simulate_schedule(schedule, Costs())


def _check_local_handoffs(schedule: Schedule, seen_all: list[dict], M: int) -> None:
    """Neighbouring model stages on one stage (a V's turn) hand over in its own order:
    the later model stage's forward after the earlier one's, its backward before."""
    for v in range(schedule.num_virtual_stages - 1):
        (i, c), (j, d) = schedule.place(v), schedule.place(v + 1)
        if i != j:
            continue
        seen = seen_all[i]
        for m in range(M):
            if seen[("F", m, d)] < seen[("F", m, c)]:
                raise schedule_error(schedule, f"stage {i}: F{m}.{d} before F{m}.{c}, whose output it takes",
                                     (i, seen[("F", m, d)]), (i, seen[("F", m, c)]))
            grad_c = seen.get(("B", m, c), seen.get(("BI", m, c)))
            grad_d = seen.get(("B", m, d), seen.get(("BI", m, d)))
            if grad_c < grad_d:
                raise schedule_error(schedule, f"stage {i}: the backward of microbatch {m} chunk {c} before chunk "
                                     f"{d}'s, whose input gradient it takes", (i, grad_c), (i, grad_d))
