"""Every measured number README.md and docs/*.md quote comes from a committed results file.

The syntax: a line

    <!-- numbers-from: benchmarks/results/DIR/FILE[, benchmarks/results/DIR2/FILE2 ...] -->

stands before the table or paragraph that quotes the numbers (only blank and other
``<!-- -->`` lines between). Paths are relative to the repository root, comma-separated;
each must be a committed file inside the repository, else the test fails naming it. The
block it governs runs from its first line to the next blank line (a fenced block: to its
closing fence).

What is checked: every *decimal number* of the block, a number with a decimal point
(``1.04``, ``3.83x``, ``0.358 s``, ``8.6 %``, the ends of a range ``1.08-1.17x``,
``1,024.5``), must be one of the named files' numbers. Integers are not checked (in a
sentence or table they are mostly the configuration: hosts, stages, MiB); write a
measurement with its decimals to have it checked. Not read as the block's numbers: inline
code spans (commands and their options), link targets, ``<!-- -->`` comments, and versions
(``0.2.3``).

When a doc number equals a file's number: both are read as whole numbers (``1.2`` is not
found inside ``11.25``), signs ignored (a doc says "2.5 % slower" for a file's -2.5), and a
doc number with ``n`` decimals matches a file number that rounds to it at ``n`` decimals
(half up or half even): the same value written with more digits, so a page may quote
a raw JSON value ``1.0221864399319`` as ``1.02``, but never ``1.03``; trailing zeros
count as digits (``1.50`` matches ``1.5``). A number followed by ``%`` also matches a file's
fraction (``8.6 %`` and ``0.0861``). This is sound as a statement of value (the page says
what the file says, to fewer digits) but weak against a large file: a two-digit number
matches any value that rounds to it, so point at the smallest file that holds the numbers
(the results .md table rather than a long JSON). The failure names ``PAGE:LINE`` and the
number.
"""
from __future__ import annotations

import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_docs  # noqa: E402  (tools/ is not a package)

MARKER = "numbers-from"
# a decimal number: not part of a word, a version or a longer number; thousands separators allowed
DOC_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+\.\d+|\d+\.\d+)(?!\.?\d)(?P<percent>\s*%)?")
# a results file's numbers, read both ways where a comma could separate thousands or values
FILE_NUMBERS = [re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?!\d)"),
                re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?)(?!\d)")]
NOT_NUMBERS = [re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"<!--.*?-->")]


def quoted_numbers(line: str) -> list[tuple[str, bool]]:
    """(number as written, followed by %) of every decimal number of a doc line."""
    for pattern in NOT_NUMBERS:
        line = pattern.sub(" ", line)
    return [(m.group(1), bool(m.group("percent"))) for m in DOC_NUMBER.finditer(line)]


def _decimal(text: str) -> Decimal | None:
    try:
        return abs(Decimal(text.replace(",", "")))
    except InvalidOperation:
        return None


def numbers_in(text: str) -> frozenset:
    """Every number of a results file's text, as an absolute Decimal."""
    values = (_decimal(m.group(1)) for pattern in FILE_NUMBERS for m in pattern.finditer(text))
    return frozenset(v for v in values if v is not None and v.is_finite())


@lru_cache(maxsize=None)
def file_numbers(path: Path) -> frozenset:
    return numbers_in(path.read_text(errors="replace"))


def matches(quoted: str, percent: bool, values: frozenset) -> bool:
    """Whether a file holds the doc number (see the module docstring for the rule)."""
    value = _decimal(quoted)
    places = Decimal(1).scaleb(value.as_tuple().exponent)  # 1.04 -> 0.01
    for v in values:
        for candidate in (v, v.scaleb(2)) if percent else (v,):
            if any(candidate.quantize(places, rounding=r) == value for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)):
                return True
    return False


def governed_block(lines: list[str], blocks: list, index: int) -> list[int]:
    """Indices of the lines the marker at ``index`` governs."""
    start = sync_docs.next_content(lines, index)
    fence = next((f for f in blocks if f.start == start), None)
    if fence is not None:
        return list(range(fence.start, min(fence.end + 1, len(lines))))
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    return list(range(start, end))


def _sources(name: str, marker, root: Path) -> tuple[list[Path], list[str]]:
    """The marker's files, and a message for each that is missing or outside the repository."""
    where = f"{name}:{marker.line}: {MARKER}"
    paths, errors = [], []
    for part in (p.strip() for p in marker.argument.split(",")):
        path = (root / part).resolve()
        if not part or not path.is_relative_to(root.resolve()):
            errors.append(f"{where} names {part!r}: a path inside the repository, from its root")
        elif not path.is_file():
            errors.append(f"{where} names {part}, which does not exist")
        else:
            paths.append(path)
    return paths, errors


def check_page(page: Path, root: Path = ROOT) -> list[str]:
    """``PAGE:LINE: ...`` for every quoted number no named file holds, and every bad marker."""
    name = sync_docs._relative(page, root)
    lines = page.read_text().splitlines()
    blocks = sync_docs.fences(lines)
    problems = []
    for marker in sync_docs.markers(lines, blocks):
        if marker.name != MARKER:
            continue
        paths, errors = _sources(name, marker, root)
        problems += errors
        if errors:
            continue
        values = frozenset().union(*(file_numbers(p) for p in paths))
        quoted = [(i, q, pct) for i in governed_block(lines, blocks, marker.index)
                  for q, pct in quoted_numbers(lines[i])]
        if not quoted:
            problems.append(f"{name}:{marker.line}: {MARKER}: the block after it quotes no decimal number "
                            "(a misplaced marker?)")
        files = ", ".join(str(p.relative_to(root.resolve())) for p in paths)
        problems += [f"{name}:{i + 1}: {q}{' %' if pct else ''} is in none of {files}"
                     for i, q, pct in quoted if not matches(q, pct, values)]
    return problems


@pytest.mark.parametrize("page", sync_docs.pages(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_numbers_are_in_their_results_files(page):
    problems = check_page(page)
    assert not problems, "\n".join(problems)


def test_the_rule_for_a_number():
    values = numbers_in("ratio: 1.0221864399319, -2.5, 0.0861, 11.25, 1.5, 1,024.5, 2.7e-05\n")
    assert matches("1.02", False, values) and not matches("1.03", False, values)
    assert matches("2.5", False, values) and matches("1.50", False, values) and matches("1,024.5", False, values)
    assert matches("8.6", True, values) and not matches("8.6", False, values)
    assert not matches("1.2", False, values)  # not inside 11.25
    assert matches("0.000027", False, values)
    assert quoted_numbers("1.08-1.17x of the bound, 8.6 % and 0.358 s; `--size-mb 0.5`, Alpa 0.2.3, "
                          "[run](results/1.5/x.md), 16.7% at 512 hosts") == [
        ("1.08", False), ("1.17", False), ("8.6", True), ("0.358", False), ("16.7", True)]


def test_a_page_fails_naming_its_line_the_number_and_a_missing_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "r.md").write_text("| x | 1.04 | 3.83 |\n")
    page = tmp_path / "docs" / "p.md"
    page.write_text("Intro 9.99.\n\n<!-- numbers-from: r.md -->\n| a | b |\n|---|---|\n| 1.04x | 3.84x |\n\n"
                    "Later 7.77, unchecked.\n\n<!-- numbers-from: r.md, gone.md -->\nThe 1.04.\n\n"
                    "<!-- numbers-from: r.md -->\n\nNo decimals here, 4 hosts.\n")
    assert check_page(page, tmp_path) == [
        "docs/p.md:6: 3.84 is in none of r.md",
        "docs/p.md:10: numbers-from names gone.md, which does not exist",
        "docs/p.md:13: numbers-from: the block after it quotes no decimal number (a misplaced marker?)"]
