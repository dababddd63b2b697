#!/usr/bin/env python3
"""Keep the examples README.md and docs/*.md include equal to their files.

A page shows a script (a multi-process program under examples/, which
tests/test_examples.py runs) as::

    <!-- include: examples/NAME.py -->
    <!-- skip: next "fragment: runs as several processes, tests/test_examples.py runs it" -->
    ```python
    ...the file's exact text...
    ```

The marker's path is relative to the repository root. The block it governs is the first
fenced block after it, with nothing but blank lines and other ``<!-- ... -->`` lines (the
skip marker) in between; that block must be a ```python block. ``sync_docs.py`` rewrites
each such block to the file's exact text (indented as the fence is, a final newline added
where the file lacks one); ``--check`` rewrites nothing and exits 1 listing every stale
include (tests/test_docs_includes.py runs it). A marker whose file does not exist, or that
no ```python block follows, is reported as ``PAGE:LINE: ...`` and exits 1 either way.

The page scanner here (fenced blocks, ``<!-- name: argument -->`` markers, the block a
marker governs) is shared by tests/test_docs_blocks.py and tests/test_docs_numbers.py, so
the three read a page the same way.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<name>[a-z][a-z-]*)\s*:\s*(?P<argument>.*?)\s*-->\s*$")
COMMENT = re.compile(r"^\s*<!--.*-->\s*$")


@dataclass(frozen=True)
class Fence:
    """A fenced code block: ``start`` and ``end`` are the 0-based indices of its opening and
    closing fence lines (``end`` is the page's line count when it is never closed)."""
    start: int
    end: int
    info: str
    indent: str
    body: str

    @property
    def line(self) -> int:
        """The opening fence's 1-based line number, as an editor (and Sybil) shows it."""
        return self.start + 1

    @property
    def is_python(self) -> bool:
        """Sybil's markdown parser runs a block whose whole info string is ``python``."""
        return self.info == "python"


@dataclass(frozen=True)
class Marker:
    """A ``<!-- name: argument -->`` line outside any fenced block (index 0-based)."""
    index: int
    name: str
    argument: str

    @property
    def line(self) -> int:
        return self.index + 1


def _closes(line: str, fence: str) -> bool:
    """CommonMark's rule: the same character, at least as long, nothing after it."""
    stripped = line.strip()
    return (stripped[:1] == fence[0] and set(stripped) == {fence[0]} and len(stripped) >= len(fence))


def _dedent(lines: List[str], indent: str) -> List[str]:
    return [ln[len(indent):] if ln.startswith(indent) else ln.lstrip(" \t") for ln in lines]


def fences(lines: List[str]) -> List[Fence]:
    """Every fenced block of a page, in order (a fence inside another block is its text)."""
    out, i = [], 0
    while i < len(lines):
        m = OPENING.match(lines[i])
        if m is None or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], m.group("fence"))), len(lines))
        body = _dedent(lines[i + 1:end], m.group("indent"))
        out.append(Fence(i, end, m.group("info").strip(), m.group("indent"),
                         "".join(ln + "\n" for ln in body)))
        i = end + 1
    return out


def inside_fence(blocks: List[Fence]) -> set:
    """Indices of lines that belong to a fenced block (its fences included)."""
    return {i for f in blocks for i in range(f.start, f.end + 1)}


def markers(lines: List[str], blocks: Optional[List[Fence]] = None) -> List[Marker]:
    """Every ``<!-- name: argument -->`` line outside fenced blocks: an example of the
    convention shown inside a code block is not a marker."""
    skip = inside_fence(fences(lines) if blocks is None else blocks)
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if m and i not in skip:
            out.append(Marker(i, m.group("name"), m.group("argument")))
    return out


def next_content(lines: List[str], index: int) -> int:
    """The index of the first line after ``index`` that is neither blank nor an HTML
    comment line (``len(lines)`` when there is none)."""
    j = index + 1
    while j < len(lines) and (not lines[j].strip() or COMMENT.match(lines[j])):
        j += 1
    return j


def governed_fence(lines: List[str], blocks: List[Fence], index: int) -> Optional[Fence]:
    """The fenced block the marker at ``index`` stands before, or None."""
    j = next_content(lines, index)
    return next((f for f in blocks if f.start == j), None)


def page_text(lines: List[str], trailing_newline: bool) -> str:
    return "\n".join(lines) + ("\n" if trailing_newline else "")


def file_text(path: Path) -> str:
    """An included file's text as a block holds it: with a final newline."""
    text = path.read_text()
    return text if text.endswith("\n") else text + "\n"


def _indented(text: str, indent: str) -> str:
    return "".join((indent + ln if ln.strip() else ln) + "\n" for ln in text.splitlines())


def sync_page(page: Path, root: Path = ROOT, write: bool = True) -> Tuple[List[str], List[str]]:
    """(stale, errors) of one page, each ``PAGE:LINE: ...``; with ``write`` the stale
    blocks are rewritten. Paths in messages are relative to ``root``."""
    name = _relative(page, root)
    text = page.read_text()
    lines = text.splitlines()
    blocks = fences(lines)
    stale, errors, replacements = [], [], []
    for marker in markers(lines, blocks):
        if marker.name != "include":
            continue
        where = f"{name}:{marker.line}: include {marker.argument}"
        target = (root / marker.argument).resolve()
        fence = governed_fence(lines, blocks, marker.index)
        if not marker.argument or not target.is_file():
            errors.append(f"{where}: no such file")
        elif fence is None or not fence.is_python:
            errors.append(f"{where}: no ```python block follows the marker (only blank and <!-- --> lines may)")
        elif fence.body != file_text(target):
            stale.append(f"{where}: the block at line {fence.line} differs from the file")
            replacements.append((fence, _indented(file_text(target), fence.indent)))
    if write and replacements:
        for fence, new in sorted(replacements, key=lambda r: -r[0].start):
            lines[fence.start + 1:fence.end] = new.splitlines()
        page.write_text(page_text(lines, text.endswith("\n")))
    return stale, errors


def _relative(page: Path, root: Path) -> str:
    try:
        return str(page.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(page)


def pages(root: Path = ROOT) -> List[Path]:
    """The pages the convention covers: README.md and docs/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/sync_docs.py",
        description="Rewrite every ```python block that follows an '<!-- include: PATH -->' marker in "
                    "README.md and docs/*.md to PATH's exact text (PATH relative to the repository root).")
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; list the stale includes and exit 1 if there are any")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: %(default)s)")
    parser.add_argument("pages", nargs="*", type=Path, help="pages to sync (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    chosen = args.pages or pages(args.root)
    stale, errors = [], []
    for page in chosen:
        s, e = sync_page(page, args.root, write=not args.check)
        stale += s
        errors += e
    for line in errors:
        print(line, file=sys.stderr)
    if args.check:
        for line in stale:
            print(line)
        if stale:
            print(f"{len(stale)} stale include(s): run .venv/bin/python tools/sync_docs.py", file=sys.stderr)
        return 1 if stale or errors else 0
    for line in stale:
        print(line.replace("differs from the file", "rewritten"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
