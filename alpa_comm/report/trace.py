"""Chrome-trace JSON (opens in Perfetto / chrome://tracing) for everything that has a timeline.

One writer for the three sources: a simulated resharding plan (``sim.SimResult``),
a simulated pipeline schedule (``pipeline.PipelineResult``) and the measured steps
of a real training run (a list of per-host records from ``train.measure``).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InvalidTypeError
from ..pipeline.simulate import PipelineResult
from ..resharding.resources import describe_resource
from ..sim.simulate import SimResult


def chrome_trace(source) -> dict:
    """The trace of ``source``: a ``SimResult``, a ``PipelineResult`` or measured steps."""
    if isinstance(source, SimResult):
        events = _plan_events(source)
    elif isinstance(source, PipelineResult):
        events = _schedule_events(source)
    elif isinstance(source, (list, tuple)):
        events = _run_events(list(source))
    else:
        raise InvalidTypeError(f"no Chrome trace for a {type(source).__name__}: expected a SimResult, a PipelineResult "
                               "or a list of measured steps")
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(source, path: str | Path) -> Path:
    """Write ``chrome_trace(source)`` to ``path`` atomically (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(chrome_trace(source)))
    tmp.replace(path)
    return path


def _plan_events(result: SimResult) -> list[dict]:
    """A simulated plan: one process per host, one thread per host resource (send, receive, intra)."""
    events = []
    seen = set()
    for e in result.timeline:
        for res in e.resources:
            host, kind = divmod(res, 3)
            tid = kind
            if (host, tid) not in seen:
                seen.add((host, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": host, "tid": tid,
                               "args": {"name": describe_resource(res).split(".")[1]}})
                events.append({"ph": "M", "name": "process_name", "pid": host, "tid": tid,
                               "args": {"name": f"host {host}"}})
            events.append({"ph": "X", "name": f"{e.kind} task {e.task}", "cat": e.kind, "pid": host, "tid": tid,
                           "ts": e.start * 1e6, "dur": max(0.0, e.end - e.start) * 1e6,
                           "args": {"transfer": e.transfer, "bytes": e.nbytes}})
    return events


def _schedule_events(result: PipelineResult) -> list[dict]:
    """A simulated schedule: one process per stage, compute and outgoing transfers as threads."""
    ev = []
    for e in result.events:
        ev.append({"ph": "X", "name": f"{e.kind}{e.mb}", "cat": e.kind, "pid": e.stage, "tid": 0,
                   "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6})
    for t in result.transfers:
        ev.append({"ph": "X", "name": f"send {t.kind}{t.mb} -> stage {t.dst}", "cat": "transfer", "pid": t.src,
                   "tid": 1, "ts": t.start * 1e6, "dur": (t.end - t.start) * 1e6})
    stages = sorted({e.stage for e in result.events})
    for s in stages:
        ev.append({"ph": "M", "name": "process_name", "pid": s, "args": {"name": f"stage {s}"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": s, "tid": 0, "args": {"name": "compute"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": s, "tid": 1, "args": {"name": "outgoing transfers"}})
    return ev


def _run_events(steps: list[list[dict]]) -> list[dict]:
    """Measured pipeline steps (``train.measure`` records): per stage (pid), compute, RECV
    waits and transfers (tids)."""
    if not steps:
        return []
    t_origin = min(t0 for per_host in steps for rec in per_host for _, _, t0, *_ in rec["events"])
    events = []
    named = set()
    for per_host in steps:
        for rec in per_host:
            pid = rec["host"]
            if pid not in named:
                named.add(pid)
                events.append({"name": "process_name", "ph": "M", "pid": pid,
                               "args": {"name": f"stage {rec['stage']} (host {rec['host']})"}})
                for tid, label in ((0, "compute"), (1, "waiting for data"), (2, "transfers")):
                    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
            for kind, mb, t0, t1, *model_stage in rec["events"]:
                tid = 1 if kind.startswith("RECV") else 0  # UNPACK is busy time: on the compute row
                name = kind if mb < 0 else f"{kind}{mb}"
                if model_stage and model_stage[0] != rec["stage"]:  # virtual stages: the chunk's model stage
                    name += f" (model stage {model_stage[0]})"
                events.append({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": (t0 - t_origin) * 1e6,
                               "dur": max(0.0, t1 - t0) * 1e6, "cat": "wait" if tid else "compute"})
            for edge, mb, t0, t1 in rec["transfers"]:
                events.append({"name": f"{edge} mb{mb}", "ph": "X", "pid": pid, "tid": 2,
                               "ts": (t0 - t_origin) * 1e6, "dur": max(0.0, t1 - t0) * 1e6, "cat": "transfer"})
    return events
