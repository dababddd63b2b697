"""A page's included example equals its file (tools/sync_docs.py, whose docstring has the rules).

The syntax::

    <!-- include: examples/NAME.py -->
    <!-- skip: next "fragment: runs as several processes, tests/test_examples.py runs it" -->
    ```python
    ...the file's exact text...
    ```

PATH is relative to the repository root; the governed block is the first fenced block after
the marker (only blank and ``<!-- -->`` lines between) and must be ```python. A stale block
fails naming ``PAGE:LINE``; ``.venv/bin/python tools/sync_docs.py`` rewrites it.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNC = ROOT / "tools" / "sync_docs.py"
sys.path.insert(0, str(ROOT / "tools"))
import sync_docs  # noqa: E402  (tools/ is not a package)

PROGRAM = "import sys\n\nprint(sys.argv)\n"


def test_every_include_is_current():
    done = subprocess.run([sys.executable, str(SYNC), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"stale or broken includes:\n{done.stdout}{done.stderr}"


def test_the_tool_has_help():
    done = subprocess.run([sys.executable, str(SYNC), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--check" in done.stdout


def _tree(tmp_path: Path, block: str, path: str = "examples/prog.py") -> Path:
    (tmp_path / "examples").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "examples" / "prog.py").write_text(PROGRAM)
    page = tmp_path / "docs" / "page.md"
    page.write_text(f"# Page\n\n<!-- include: {path} -->\n<!-- skip: next \"fragment: x\" -->\n"
                    f"```python\n{block}```\n\nAfter.\n")
    return page


def test_check_lists_a_stale_include_and_the_sync_rewrites_it(tmp_path):
    page = _tree(tmp_path, "print('old')\n")
    argv = [sys.executable, str(SYNC), "--root", str(tmp_path)]
    check = subprocess.run(argv + ["--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1
    assert "docs/page.md:3: include examples/prog.py" in check.stdout and "line 5" in check.stdout
    assert "print('old')" in page.read_text()  # --check writes nothing
    assert subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    assert page.read_text() == (f"# Page\n\n<!-- include: examples/prog.py -->\n<!-- skip: next \"fragment: x\" -->\n"
                                f"```python\n{PROGRAM}```\n\nAfter.\n")
    assert subprocess.run(argv + ["--check"], capture_output=True, timeout=60).returncode == 0


def test_a_missing_file_or_block_is_an_error(tmp_path):
    page = _tree(tmp_path, PROGRAM, path="examples/gone.py")
    stale, errors = sync_docs.sync_page(page, tmp_path, write=False)
    assert stale == [] and errors == ["docs/page.md:3: include examples/gone.py: no such file"]
    page.write_text("<!-- include: examples/prog.py -->\n\nText.\n\n```python\nx = 1\n```\n")
    stale, errors = sync_docs.sync_page(page, tmp_path, write=False)
    assert stale == [] and len(errors) == 1 and "no ```python block follows" in errors[0]


def test_an_indented_include_keeps_its_indent(tmp_path):
    page = _tree(tmp_path, "")
    page.write_text("1. Run it:\n\n   <!-- include: examples/prog.py -->\n   ```python\n   old\n   ```\n")
    sync_docs.sync_page(page, tmp_path)
    assert page.read_text() == "1. Run it:\n\n   <!-- include: examples/prog.py -->\n   ```python\n" \
                               "   import sys\n\n   print(sys.argv)\n   ```\n"
    assert sync_docs.sync_page(page, tmp_path, write=False) == ([], [])
