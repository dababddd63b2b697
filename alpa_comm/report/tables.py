"""Tables for terminals and markdown files (one formatter for every command)."""
from __future__ import annotations

from typing import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence], markdown: bool = True) -> str:
    """Align ``rows`` under ``headers``; markdown pipes unless ``markdown=False``."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        parts = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts)

    out = [line(cells[0])]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)
