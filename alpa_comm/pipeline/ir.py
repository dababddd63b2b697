"""Schedule IR: per stage (one stage per mesh), an ordered list of actions.

Compute actions: ``F`` (forward), ``B`` (full backward), ``BI`` (input
gradient), ``BW`` (weight gradient). Communication actions: ``SEND_F`` /
``RECV_F`` (activations to / from the next stage) and ``SEND_B`` / ``RECV_B``
(gradients to / from the previous stage). Every action names its microbatch.
A SEND is asynchronous (the stage goes on while its link carries it); a RECV
blocks until the data has arrived.

Text form, one line per stage, actions written kind then microbatch::

    stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 ...
    stage 1: RECV_F0 F0 B0 SEND_B0 ...

A communication action may name its peer stage explicitly (``SEND_F3@2``) for
skip connections; without it the peer is the adjacent stage. With virtual stages an
explicit peer also names the peer's chunk (``SEND_F3@2.1``: to chunk 1 of stage 2;
chunk 0 is written bare), so a skip transfer says which two model stages it joins.

Virtual stages: a stage (a mesh) may hold several model chunks. An action then names
its chunk after the microbatch (``F3.1``: microbatch 3 of chunk 1; chunk 0 is written
bare). ``placement`` says which model stage (virtual stage) chunk ``c`` of stage ``i``
is: ``loop`` (interleaved 1F1B: ``c * S + i``) or ``v`` (two chunks in a V: ``i`` and
``2S - 1 - i``, so the turn at the last stage stays on one mesh). Without chunks every
stage is its own model stage, as before. The adjacent peer of a chunk's transfer is the
stage holding the neighbouring model stage; the text form starts with
``placement: v`` when it is not ``loop``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from ..errors import AlpaCommError

def edge_name(direction: str, src: int, dst: int) -> str:
    """The name of the edge ``direction`` ("F" or "B") from model stage ``src`` to ``dst``:
    "F:0->1". Measured edge times, plans and the trainer's mailbox are keyed by it."""
    return f"{direction}:{src}->{dst}"


class ActionKind(str, Enum):
    """What an action does. A ``str`` enum: it compares, hashes and serializes as its
    text (``ActionKind.F == "F"``), so schedules written as text need no translation."""

    F = "F"
    B = "B"
    BI = "BI"
    BW = "BW"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def is_compute(self) -> bool:
        return not self.is_comm

    @property
    def is_comm(self) -> bool:
        return self.is_send or self.is_recv

    @property
    def is_send(self) -> bool:
        return self.value.startswith("SEND_")

    @property
    def is_recv(self) -> bool:
        return self.value.startswith("RECV_")

    @property
    def is_backward(self) -> bool:
        """Backward compute or gradient traffic (as opposed to forward activations)."""
        return self in (ActionKind.B, ActionKind.BI, ActionKind.BW) or self.value.endswith("_B")


COMPUTE = tuple(k.value for k in ActionKind if k.is_compute)
COMM = tuple(k.value for k in ActionKind if k.is_comm)
KINDS = COMPUTE + COMM
_ACTION = re.compile(r"^(" + "|".join(sorted(KINDS, key=len, reverse=True))
                     + r")(\d+)(?:\.(\d+))?(?:@(\d+)(?:\.(\d+))?)?$")
PLACEMENTS = ("loop", "v")
"""How chunk ``c`` of stage ``i`` (of ``S``) maps to a model stage: ``loop`` c*S + i, ``v``
i for chunk 0 and 2S-1-i for chunk 1."""


def model_stage(placement: str, num_stages: int, stage: int, chunk: int = 0) -> int:
    """The model stage (virtual stage) that chunk ``chunk`` of ``stage`` is, of ``num_stages``
    stages placed by ``placement``: the one map the generators' lowering and ``Schedule``
    share."""
    if placement == "v":
        return stage if chunk == 0 else 2 * num_stages - 1 - stage
    return chunk * num_stages + stage


def stage_of(placement: str, num_stages: int, virtual_stage: int) -> int:
    """The stage holding model stage ``virtual_stage`` (``model_stage``'s inverse)."""
    return place(placement, num_stages, virtual_stage)[0]


def place(placement: str, num_stages: int, virtual_stage: int) -> tuple[int, int]:
    """(stage, chunk) holding model stage ``virtual_stage``."""
    S = num_stages
    if placement == "v":
        return (virtual_stage, 0) if virtual_stage < S else (2 * S - 1 - virtual_stage, 1)
    return virtual_stage % S, virtual_stage // S


_LINE = re.compile(r"^\s*stage\s+(\d+)\s*:(.*)$")
_PLACEMENT_LINE = re.compile(r"^\s*placement\s*:\s*(\S+)\s*$")


class ScheduleError(AlpaCommError, ValueError):
    """A schedule that is malformed or cannot run; names the stage and action. From the
    validator it also carries ``grid``: the schedule drawn around the failing action(s),
    marked (``validate.draw_grid``; shown under the traceback as a note)."""

    grid: "str | None" = None


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    mb: int
    peer: int | None = None  # explicit peer stage of a SEND/RECV (None: adjacent)
    chunk: int = 0           # which of the stage's model chunks (virtual stages)
    peer_chunk: int = 0      # with an explicit peer: which of the peer's chunks

    def __post_init__(self):
        if not isinstance(self.kind, ActionKind):
            try:
                object.__setattr__(self, "kind", ActionKind(self.kind))
            except ValueError:
                raise ScheduleError(f"unknown action kind {self.kind!r}; known: {', '.join(KINDS)}") from None

    def __str__(self) -> str:
        return (f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")
                + ("" if self.peer is None else f"@{self.peer}" + (f".{self.peer_chunk}" if self.peer_chunk else "")))

    @property
    def is_compute(self) -> bool:
        return self.kind.is_compute

    @classmethod
    def parse(cls, token: str, where: str = "") -> "Action":
        m = _ACTION.match(token.strip().upper())
        if not m:
            raise ScheduleError(f"cannot parse action {token!r}{where}: expected e.g. F3, BI3, BW3, SEND_F3, RECV_B3, "
                                "F3.1 (chunk 1), SEND_F3@2 (to stage 2), SEND_F3.1@2.1 (chunk 1 to stage 2's chunk 1)")
        if m.group(4) is not None and m.group(1) not in COMM:
            raise ScheduleError(f"action {token!r}{where}: only SEND/RECV actions take a peer stage")
        return cls(m.group(1), int(m.group(2)), None if m.group(4) is None else int(m.group(4)),
                   int(m.group(3) or 0), int(m.group(5) or 0))


@dataclass(frozen=True)
class Schedule:
    """Actions per stage, plus the name of the generator (or 'custom')."""

    stages: tuple[tuple[Action, ...], ...]
    name: str = "custom"
    placement: str = "loop"

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ScheduleError(f"unknown placement {self.placement!r}; choose one of {', '.join(PLACEMENTS)}")
        if self.placement == "v" and self.num_chunks > 2:
            raise ScheduleError(f"placement 'v' holds two chunks per stage, the schedule names {self.num_chunks}")

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_chunks(self) -> int:
        """Model chunks per stage (1 without virtual stages; a V always has 2)."""
        chunks = max((a.chunk for s in self.stages for a in s), default=0) + 1
        return max(chunks, 2) if self.placement == "v" else chunks

    @property
    def virtual(self) -> bool:
        """Whether stages hold several model chunks (virtual stages)."""
        return self.num_chunks > 1

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.num_chunks

    def virtual_stage(self, stage: int, chunk: int = 0) -> int:
        """The model stage that chunk ``chunk`` of ``stage`` is."""
        return model_stage(self.placement, self.num_stages, stage, chunk)

    def place(self, virtual_stage: int) -> tuple[int, int]:
        """(stage, chunk) holding model stage ``virtual_stage``."""
        return place(self.placement, self.num_stages, virtual_stage)

    def transfer_key(self, stage: int, a: Action) -> tuple:
        """What a SEND and its RECV share: (direction, microbatch, source stage,
        destination stage, edge). Without chunks the edge is None; with them it is the
        model-stage boundary an adjacent transfer crosses (``v`` for ``v -> v + 1``) and,
        for an explicit peer (a skip), the (source, destination) model stages, so two
        transfers between the same stages for one microbatch never share a key."""
        direction = a.kind.value[-1]
        peer = self.peer(stage, a)
        src, dst = (stage, peer) if a.kind.is_send else (peer, stage)
        edge = None
        if self.virtual:
            v = self.virtual_stage(stage, a.chunk)
            if a.peer is None:
                edge = v if a.kind in (ActionKind.SEND_F, ActionKind.RECV_B) else v - 1
            else:
                w = self.peer_virtual_stage(stage, a)
                edge = (v, w) if a.kind.is_send else (w, v)
        return direction, a.mb, src, dst, edge

    def peer_virtual_stage(self, stage: int, a: Action) -> int:
        """The model stage at the other end of ``a`` (a SEND/RECV of ``stage``): the
        neighbouring model stage, or the explicit peer's chunk ``a.peer_chunk``.
        Without chunks it is ``peer(stage, a)``."""
        if a.peer is not None:
            return self.virtual_stage(a.peer, a.peer_chunk)
        v = self.virtual_stage(stage, a.chunk)
        return v + 1 if a.kind in (ActionKind.SEND_F, ActionKind.RECV_B) else v - 1

    def send_edge(self, stage: int, a: Action) -> str:
        """The model-stage edge (``edge_name``) that SEND ``a`` of ``stage`` crosses."""
        return edge_name(a.kind.value[-1], self.virtual_stage(stage, a.chunk), self.peer_virtual_stage(stage, a))

    @property
    def num_microbatches(self) -> int:
        mbs = {a.mb for s in self.stages for a in s}
        return max(mbs) + 1 if mbs else 0

    @property
    def split_backward(self) -> bool:
        return any(a.kind in ("BI", "BW") for s in self.stages for a in s)

    def peer(self, stage: int, a: Action) -> int:
        if a.peer is not None:
            return a.peer
        if self.virtual:
            v = self.virtual_stage(stage, a.chunk)
            return self.place(v + 1 if a.kind in ("SEND_F", "RECV_B") else v - 1)[0]
        return stage + 1 if a.kind in ("SEND_F", "RECV_B") else stage - 1

    # ------------------------------------------------------------ text form
    def to_text(self) -> str:
        head = "" if self.placement == "loop" else f"placement: {self.placement}\n"
        return head + "\n".join(f"stage {i}: " + " ".join(map(str, acts)) for i, acts in enumerate(self.stages)) + "\n"

    @classmethod
    def from_text(cls, text: str, name: str = "custom") -> "Schedule":
        stages: dict[int, tuple[Action, ...]] = {}
        placement = "loop"
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            p = _PLACEMENT_LINE.match(line)
            if p and not stages:
                placement = p.group(1)
                continue
            m = _LINE.match(line)
            if not m:
                raise ScheduleError(f"line {lineno}: expected 'stage <i>: <actions>', got {line.strip()!r}")
            i = int(m.group(1))
            if i in stages:
                raise ScheduleError(f"line {lineno}: stage {i} appears twice")
            stages[i] = tuple(Action.parse(tok, f" (line {lineno}, stage {i})") for tok in m.group(2).split())
        if sorted(stages) != list(range(len(stages))):
            raise ScheduleError(f"stages must be numbered 0..{len(stages) - 1}, got {sorted(stages)}")
        return cls(tuple(stages[i] for i in range(len(stages))), name, placement)

    def to_json(self) -> str:
        d = {"name": self.name, "stages": [[str(a) for a in s] for s in self.stages]}
        if self.placement != "loop":
            d["placement"] = self.placement
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        """The JSON form ``to_json`` writes: {"name": ..., "stages": [["F0", "B0", ...], ...]}."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
        shape = 'expected {"stages": [["F0", "B0", ...], ...]}'
        if not isinstance(d, dict) or "stages" not in d:
            raise ScheduleError(f"{shape}, got {_brief(d)}")
        stages = d["stages"]
        if not isinstance(stages, list) or not stages:
            raise ScheduleError(f"'stages' must be a non-empty list of stages, got {_brief(stages)}")
        for i, s in enumerate(stages):
            if not isinstance(s, list) or not all(isinstance(t, str) for t in s):
                raise ScheduleError(f"stage {i} must be a list of action strings such as \"F0\", got {_brief(s)}")
        name = d.get("name", "custom")
        return cls(tuple(tuple(Action.parse(t, f" (stage {i})") for t in s) for i, s in enumerate(stages)),
                   name if isinstance(name, str) else "custom", str(d.get("placement", "loop")))


def _brief(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def actions(text: Iterable[str]) -> tuple[Action, ...]:
    return tuple(Action.parse(t) for t in text)
