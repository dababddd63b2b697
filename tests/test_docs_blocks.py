"""Every ```python block of README.md and docs/*.md runs under ``make test`` (Sybil).

The syntax a page uses, and what each form does:

- A fenced block whose info string is exactly ``python`` runs. Sybil's markdown parser
  (``sybil.parsers.markdown.PythonCodeBlockParser``) makes each page one collector and its
  blocks the items, with ids like ``README.md::line:22,column:1`` (the opening fence's
  line). They run in document order, in one namespace per page (a block sees what the
  page's earlier blocks imported and defined; ``__name__`` is ``"__main__"``), in a
  scratch working directory (a fresh temporary folder per page, removed after its last
  block, so relative output paths land there), with ``JAX_PLATFORMS=cpu`` (set for the
  page, restored after; a worker whose JAX was already started keeps its backend). No GPU,
  root or cluster: a block must be complete (its imports, or those of an earlier block of
  the page) and take a few seconds; each block is stopped after ``BLOCK_TIMEOUT`` seconds.
  A block that starts with ``>>>`` is a doctest: its outputs are compared too.
- ``<!-- skip: next "fragment: <why>" -->`` on its own line before a ```python block (only
  blank lines and other ``<!-- -->`` lines between) skips that block with the reason
  (``sybil.parsers.markdown.SkipParser``); ``test_every_python_block_compiles`` still
  compiles it, so a fragment must be valid Python. A skip marker must be ``next`` with a
  quoted, non-empty reason and stand before a ```python block: Sybil applies ``skip:
  next`` to the next *Python* block wherever it is, so one placed before a ```bash block
  would silently skip an unrelated block further down.
- Other info strings (``py``, ``python3``, ``pycon``, ``python title=x``) would never run:
  refused, so no block escapes by its spelling. ``bash``/plain blocks are
  tests/test_docs_commands.py's; ``<!-- include: -->`` is tests/test_docs_includes.py's;
  ``<!-- numbers-from: -->`` is tests/test_docs_numbers.py's.

Wiring: README.md and docs/ lie outside ``testpaths``, so when pytest collects this module
tests/conftest.py's ``pytest_collect_file`` also returns ``pages_collector(parent)``: a node
at this module's path holding one Sybil file node per page, so ``pytest
tests/test_docs_blocks.py`` and ``make test`` both run the pages (one page: ``-k jax.md``). Under ``--dist loadgroup``
a page's blocks carry ``xdist_group("docs-<page>")``: one worker runs a page from its first
block to its last, in order, in one namespace.
"""
from __future__ import annotations

import doctest
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_docs  # noqa: E402  (tools/ is not a package)

BLOCK_TIMEOUT = 120  # seconds; the convention asks for a few
SKIP = re.compile(r'^next\s+(?P<q>["\'])(?P<reason>.+)(?P=q)$')
PYTHON_LIKE = re.compile(r"^(py|python3?|pycon|ipython)\b", re.I)


def pages() -> list[Path]:
    return sync_docs.pages(ROOT)


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# --- running the blocks (Sybil) ---------------------------------------------------------

NO_CLUSTER = ("a ```python block of the docs may not start the emulated cluster (it runs under make test, "
              "beside the emulated-cluster tests): mark it <!-- skip: next \"fragment: <why>\" --> and run the "
              "program as a script under examples/")
_scratch: dict[int, tuple[str, str, str | None, object]] = {}


def enter_scratch(namespace: dict) -> None:
    """Sybil's per-page setup: a fresh working directory and CPU JAX for the page's blocks.
    Where the emulated cluster could start (root, as CI runs), a block that starts one
    fails at once with ``NO_CLUSTER`` instead of building it beside the emulated-cluster
    tests of the other worker."""
    from alpa_comm.runtime.emulated import netns

    def refuse() -> None:
        raise netns.EmulationUnavailable(NO_CLUSTER)

    folder = tempfile.mkdtemp(prefix="alpa-comm-docs-")
    _scratch[id(namespace)] = (os.getcwd(), folder, os.environ.get("JAX_PLATFORMS"), netns.check_available)
    netns.check_available = refuse
    os.chdir(folder)
    os.environ["JAX_PLATFORMS"] = "cpu"
    namespace["__name__"] = "__main__"


def leave_scratch(namespace: dict) -> None:
    """Sybil's per-page teardown: back where the worker was, the folder removed."""
    from alpa_comm.runtime.emulated import netns

    cwd, folder, platforms, check_available = _scratch.pop(id(namespace))
    netns.check_available = check_available
    os.chdir(cwd)
    if platforms is None:
        os.environ.pop("JAX_PLATFORMS", None)
    else:
        os.environ["JAX_PLATFORMS"] = platforms
    shutil.rmtree(folder, ignore_errors=True)


def docs_sybil():
    """The Sybil that reads a page: ```python blocks and skip markers, nothing else."""
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

    return Sybil(parsers=[PythonCodeBlockParser(), SkipParser()], patterns=["*.md"], path=str(ROOT),
                 setup=enter_scratch, teardown=leave_scratch)


def page_node_class():
    """Sybil's file node whose items report a skip at the block's own page:line (Sybil's
    skip raises ``unittest.SkipTest``, which pytest would place inside its unittest plugin)."""
    from unittest import SkipTest

    from sybil.integration.pytest import SybilFile, SybilItem

    class BlockItem(SybilItem):
        def runtest(self) -> None:
            try:
                super().runtest()
            except SkipTest as e:
                raise pytest.skip.Exception(str(e), _use_item_location=True) from None

    class PageFile(SybilFile):
        def collect(self):  # SybilFile.collect, making BlockItems
            for sybil in self.sybils:
                document = sybil.parse(self.path)
                self.documents.append(document)
                for example in document.examples():
                    yield BlockItem.from_parent(self, sybil=sybil, example=example)

    return PageFile


class DocPages(pytest.Collector):
    """One Sybil file node per page (README.md, docs/*.md), each kept on one xdist worker."""

    def collect(self):
        page_file = page_node_class()
        sybil = docs_sybil()
        for page in pages():
            node = page_file.from_parent(self, path=page, sybils=[sybil])
            node.add_marker(pytest.mark.xdist_group(f"docs-{page.name}"))
            node.add_marker(pytest.mark.timeout(BLOCK_TIMEOUT))
            yield node


def pages_collector(parent, file_path: Path):
    """What tests/conftest.py's ``pytest_collect_file`` returns for this module: the pages'
    node, or None where Sybil is not installed (``test_sybil_is_installed`` then fails)."""
    try:
        import sybil  # noqa: F401
    except ImportError:
        return None
    try:
        module = file_path.relative_to(parent.config.rootpath).as_posix()
    except ValueError:
        module = file_path.name
    return DocPages.from_parent(parent, name="docs-pages", path=file_path, nodeid=f"{module}::docs-pages")


def test_sybil_is_installed():
    try:
        import sybil  # noqa: F401
    except ImportError:
        pytest.fail("sybil is not installed, so README.md's and docs/*.md's blocks did not run: "
                    "pip install -e '.[dev]'")


def test_sybil_runs_every_python_block_this_module_sees():
    """Sybil's lexer and tools/sync_docs.py's scanner (used by the checks below) find the
    same ```python blocks, so every block that is compiled here is also run or skipped."""
    sybil = docs_sybil()
    for page in pages():
        mine = [f for f in sync_docs.fences(page.read_text().splitlines()) if f.is_python]
        seen = [ex.line for ex in sybil.parse(page).examples() if not isinstance(ex.parsed, tuple)]
        # a doctest block is one item per example, each at its own line inside the block
        owner = {line: next((f.line for f in mine if f.line <= line <= f.end + 1), None) for line in seen}
        assert sorted(set(owner.values())) == [f.line for f in mine], (
            f"{page_name(page)}: Sybil runs blocks at lines {sorted(seen)}, this module sees "
            f"{[f.line for f in mine]}")


# --- checks of every block, skipped ones included ---------------------------------------

def _compile_errors(name: str, fence: sync_docs.Fence) -> list[str]:
    """``name:line: message`` for a block that is not valid Python (doctest blocks: each
    example's source), with the page's own line numbers."""
    if fence.body.lstrip().startswith(">>>"):
        sources = [(fence.line + ex.lineno, ex.source)
                   for ex in doctest.DocTestParser().get_examples(fence.body)]
    else:
        sources = [(fence.line, fence.body)]
    errors = []
    for first, source in sources:
        try:
            compile("\n" * first + source, name, "exec", dont_inherit=True)
        except SyntaxError as e:
            errors.append(f"{name}:{e.lineno}: {e.msg} (the ```python block at line {fence.line})")
    return errors


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_every_python_block_compiles(page):
    name = page_name(page)
    errors = [e for f in sync_docs.fences(page.read_text().splitlines()) if f.is_python
              for e in _compile_errors(name, f)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_no_block_escapes_by_its_spelling(page):
    bad = [f"{page_name(page)}:{f.line}: ```{f.info} does not run; write ```python"
           for f in sync_docs.fences(page.read_text().splitlines())
           if not f.is_python and PYTHON_LIKE.match(f.info)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_skip_markers_say_why_and_stand_before_a_python_block(page):
    lines = page.read_text().splitlines()
    blocks = sync_docs.fences(lines)
    bad = []
    for marker in sync_docs.markers(lines, blocks):
        if marker.name != "skip":
            continue
        where = f"{page_name(page)}:{marker.line}: <!-- skip: {marker.argument} -->"
        fence = sync_docs.governed_fence(lines, blocks, marker.index)
        if not SKIP.match(marker.argument):
            bad.append(f'{where}: write <!-- skip: next "fragment: <why>" -->')
        elif fence is None or not fence.is_python:
            bad.append(f"{where}: no ```python block follows (only blank and <!-- --> lines may stand between)")
    assert not bad, "\n".join(bad)


def test_the_scanner_reads_fences_and_markers_as_sybil_does():
    lines = ["intro", "<!-- skip: next \"fragment: x\" -->", "```python", "a = 1", "```", "",
             "````markdown", "<!-- skip: next \"shown, not a marker\" -->", "```python", "b", "```", "````",
             "  ```python", "  c = 2", "  ```"]
    blocks = sync_docs.fences(lines)
    shown = "<!-- skip: next \"shown, not a marker\" -->\n```python\nb\n```\n"
    assert [(f.line, f.info, f.body) for f in blocks] == [(3, "python", "a = 1\n"), (7, "markdown", shown),
                                                           (13, "python", "c = 2\n")]
    assert [(m.line, m.name) for m in sync_docs.markers(lines, blocks)] == [(2, "skip")]
    assert sync_docs.governed_fence(lines, blocks, 1) == blocks[0]
    assert _compile_errors("x.md", sync_docs.Fence(9, 11, "python", "", "a = (\n")) == [
        "x.md:11: '(' was never closed (the ```python block at line 10)"]


def test_a_page_runs_in_a_scratch_folder_on_cpu_without_the_emulated_cluster():
    from alpa_comm.runtime.emulated import netns

    cwd, check, namespace = os.getcwd(), netns.check_available, {}
    enter_scratch(namespace)
    try:
        folder = os.getcwd()
        assert folder != cwd and os.environ["JAX_PLATFORMS"] == "cpu" and namespace["__name__"] == "__main__"
        with pytest.raises(netns.EmulationUnavailable, match="may not start the emulated cluster"):
            netns.check_available()  # what EmulatedNetwork.up calls first
    finally:
        leave_scratch(namespace)
    assert os.getcwd() == cwd and netns.check_available is check and not os.path.exists(folder)
