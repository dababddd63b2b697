"""The generated orders of every schedule family, as digests, to keep them identical
across refactors of the generators: ``python tests/schedule_golden.py`` writes
``tests/data/schedule_orders.json`` (only when an order is meant to change);
tests/test_schedule_registry.py compares against it."""
import hashlib
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "schedule_orders.json"
STAGES = range(1, 7)
MICROBATCHES = range(1, 13)

ONE_CHUNK = ("gpipe", "1f1b", "eager-1f1b")
OWN_WGRAD = ("zb-h1",)
LOOP = ("interleaved-1f1b",)
V = ("zb-v", "dualpipev")


def variants(kind: str, S: int):
    """(label, generate's keyword options) of every variant of ``kind`` the grid covers."""
    if kind in ONE_CHUNK:
        yield "whole", {}
        yield "split", {"split_backward": True}
        for d in (1, 2):
            yield f"delay {d}", {"split_backward": True, "delay_wgrad": d}
        yield "delay per stage", {"split_backward": True, "delay_wgrad": [i % 3 for i in range(S)]}
        yield "chunks 1", {"chunks": 1}
    elif kind in LOOP:
        for c in (2, 3):
            yield f"x{c}", {"chunks": c}
            yield f"x{c} split", {"chunks": c, "split_backward": True}
            yield f"x{c} delay 1", {"chunks": c, "split_backward": True, "delay_wgrad": 1}
    else:  # own weight gradients (ZB-H1) and the V schedules: as they are
        yield "as is", {}
        if kind in V:
            yield "chunks 2", {"chunks": 2}


def outcome(kind: str, S: int, M: int, options: dict) -> str:
    """The schedule's name, placement and text, or the error class where it is refused."""
    from alpa_comm.errors import AlpaCommError
    from alpa_comm.pipeline import generate

    try:
        s = generate(kind, S, M, **options)
    except AlpaCommError as e:
        return f"refused: {type(e).__name__}"
    return f"{s.name}|{s.placement}|{s.to_text()}"


def digests() -> dict[str, str]:
    """(kind, variant, stages) -> digest of every microbatch count's outcome."""
    out = {}
    for kind in ONE_CHUNK + OWN_WGRAD + LOOP + V:
        for S in STAGES:
            for label, options in variants(kind, S):
                h = hashlib.sha256()
                for M in MICROBATCHES:
                    h.update(f"M={M}\n{outcome(kind, S, M, options)}\n".encode())
                out[f"{kind} | {label} | S={S}"] = h.hexdigest()[:16]
    return out


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(digests(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
