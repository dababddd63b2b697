"""The README stays a front door whose numbers come from committed results.

Its headline table is what tools/headline.py computes from benchmarks/results/; any
other measured number sits in a ``<!-- numbers-from: FILE[, FILE] -->`` block (whose
numbers tests/test_docs_numbers.py finds in those files, as on every page); and the page
stays short enough to read before the first call.
"""
import functools
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_BYTES = 8 * 1024

NUMBERS_FROM = re.compile(r"<!-- numbers-from: [^>]*-->\n.*?(?:\n\n|\Z)", re.S)
"""A numbers-from marker and the block it covers: up to the next blank line."""
NOT_MEASURED = re.compile(r"(?:Python|Alpa|jax|arXiv|[<>=]=?)\s*\d+(?:\.\d+)+|\b\d+\.\d+\.\d+\b")
"""Versions (Python >= 3.10, Alpa 0.2.3) and the paper's arXiv id: numbers nobody measured."""
MEASURED = re.compile(r"\d+(?:\.\d+)?\s*(?:x\b|%)|\b\d+\.\d+\b")
"""A ratio (1.35x), a share (12 %) or any other decimal: what a run measures."""


@functools.lru_cache(maxsize=None)
def headline():
    """tools/headline.py as a module (tools/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("headline", ROOT / "tools" / "headline.py")
    module = sys.modules["headline"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def without_code(text: str) -> str:
    """Prose only: fenced blocks and inline code hold commands and example values."""
    return re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def test_headline_block_is_what_the_results_files_give():
    h = headline()
    assert h.readme_block(README.read_text()) == h.table(), (
        "README.md's headline table differs from the results files: run .venv/bin/python tools/headline.py --write")


def test_readme_is_under_8_kb():
    size = len(README.read_bytes())
    assert size < MAX_BYTES, f"README.md is {size} bytes; keep it under {MAX_BYTES} (details belong in docs/)"


def test_every_measured_number_outside_the_headline_is_sourced():
    h = headline()
    text = README.read_text()
    text = text[:text.index(h.START)] + text[text.index(h.END) + len(h.END):]
    prose = without_code(NUMBERS_FROM.sub("", text))
    stray = MEASURED.findall(NOT_MEASURED.sub("", prose))
    assert not stray, (f"README.md quotes {stray} outside the headline table and any <!-- numbers-from: ... --> "
                       "block: put it in the table (tools/headline.py) or name the results file it comes from")


def options(command: str) -> dict:
    words = shlex.split(command)
    return {w: v for w, v in zip(words, words[1:]) if w.startswith("--")}


@pytest.mark.parametrize("row", headline().ROWS, ids=lambda row: row.results)
def test_each_headline_command_is_the_one_its_run_recorded(row):
    """A row's command writes its results folder, with the sizes the run recorded."""
    saved = json.loads(row.json_file().read_text())
    got = options(row.command)
    assert got["--out"] == f"benchmarks/results/{row.results}"
    if "cluster" in saved:  # alpa-comm bench
        recorded = saved["cluster"]
        want = {"--repeat": str(recorded["repeat"]), "--size-mb": f"{recorded['size_mb']:g}"}
        if "--nic" in got:
            want["--nic"] = recorded["nic"]
    else:  # benchmarks/train_pipeline.py
        recorded = saved["args"]
        want = {"--steps": str(recorded["steps"]), "--repeats": str(recorded["repeats"]),
                "--models": ",".join(saved["models"])}
    assert {k: got.get(k) for k in want} == want, f"{row.command} is not how {row.results} was run"
