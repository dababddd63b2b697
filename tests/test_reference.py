"""docs/cli.md and docs/api.md are what tools/gen_reference.py makes from the argument
parser and the docstrings now: a changed option, signature or docstring fails here
until the pages are generated again (the message gives the command)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_reference  # noqa: E402  (tools/ is not a package)

OPTIONAL = "jax,jaxlib,optax,ray,torch,matplotlib,cupy,msgpack"


def test_the_committed_pages_are_current():
    stale = gen_reference.stale()
    assert not stale, "; ".join(f"{p.relative_to(ROOT)} is stale: run {gen_reference.COMMAND}" for p in stale)


def test_every_command_and_option_is_on_the_cli_page():
    import argparse

    from alpa_comm.cli import build_parser

    page = gen_reference.cli_page()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert f"\n## alpa-comm {name}\n" in page
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page, f"alpa-comm {name} {flag}"
            if action.help and not isinstance(action, argparse._HelpAction):
                assert gen_reference._cell(action.help) in page


def test_every_exported_name_is_on_the_api_page():
    import alpa_comm
    import alpa_comm.jax

    page = gen_reference.api_page()
    for module in (alpa_comm, alpa_comm.jax):
        for name in [*module.__all__, *gen_reference.LAZY.get(module.__name__, ())]:
            assert f"\n### `{module.__name__}.{name}`\n" in page


def test_the_pages_need_no_optional_extra(tmp_path):
    """Made without jax (or any other extra) installed, the pages are the same, and
    nothing imported jax to make them."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nfor n in os.environ['HIDE_MODULES'].split(','):\n    sys.modules[n] = None\n")
    code = ("import sys; sys.path.insert(0, 'tools'); import gen_reference as g; "
            "sys.stdout.write(g.cli_page() + g.api_page()); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'jax' and sys.modules[m] is not None]")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HIDE_MODULES": OPTIONAL}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == gen_reference.cli_page() + gen_reference.api_page()


def test_check_names_the_stale_page_and_the_command(tmp_path, monkeypatch, capsys):
    page = tmp_path / "cli.md"
    page.write_text("old\n")
    monkeypatch.setattr(gen_reference, "PAGES", {page: gen_reference.cli_page})
    assert gen_reference.main(["--check"]) == 1
    assert capsys.readouterr().err == f"{page} is stale: run .venv/bin/python tools/gen_reference.py\n"
    assert page.read_text() == "old\n"  # --check writes nothing
    assert gen_reference.main([]) == 0
    assert page.read_text() == gen_reference.cli_page()
    assert gen_reference.main(["--check"]) == 0


@pytest.mark.parametrize("page", ["cli.md", "api.md"])
def test_the_pages_hold_no_python_block_and_no_runnable_command(page):
    """They are reference, not examples: no ```python block for Sybil to run and no
    ``alpa-comm ...`` code span that tests/test_docs_commands.py would take for a command."""
    import re

    text = (ROOT / "docs" / page).read_text()
    assert "```python" not in text
    spans = re.findall(r"`((?:sudo )?(?:\.venv/bin/)?alpa-comm[^`]*)`", text)
    assert all(len(s.split()) < 3 or re.search(r"alpa-comm (bench|cluster)\b", s) for s in spans), spans
