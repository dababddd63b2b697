"""A missing optional dependency ends in one line that names the extra to install (exit
code 2 from the CLI, ``MissingExtraError`` from the API), and root missing for the
emulated cluster in one line with the sudo command line to run.

A module is hidden from a fresh interpreter by a ``sitecustomize`` that sets
``sys.modules[name] = None`` (what an uninstalled package looks like to ``import``:
``ModuleNotFoundError`` naming it), so these run in the dev venv that has every extra.
"""
import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alpa_comm import AlpaCommError, _extras
from alpa_comm.cli import main, needs
from alpa_comm.errors import MissingExtraError

REPO = Path(__file__).resolve().parent.parent
ONE_CASE = ["--shape", "64,64", "--src-mesh", "1x2@0", "--src-spec", "S0R", "--dst-mesh", "1x2@1", "--dst-spec", "RS0"]

HIDER = """import os, sys
for _name in os.environ.get("HIDE_MODULES", "").split(","):
    if _name:
        sys.modules[_name] = None
"""


@pytest.fixture(scope="module")
def hider(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hider")
    (folder / "sitecustomize.py").write_text(HIDER)
    return folder


def run_hidden(hider, hidden: str, code_or_argv, cwd) -> subprocess.CompletedProcess:
    """``alpa-comm ARGV`` (a list) or ``python -c CODE`` (a str) with ``hidden`` absent."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hider), str(REPO)]), "HIDE_MODULES": hidden}
    cmd = ([sys.executable, "-c", code_or_argv] if isinstance(code_or_argv, str)
           else [sys.executable, "-m", "alpa_comm.cli", *code_or_argv])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def extras_in_setup_cfg() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return {name: [re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0] for line in value.splitlines() if line.strip()]
            for name, value in cfg["options.extras_require"].items()}


# ---------------------------------------------------------------- the one map
def test_every_mapped_module_is_installed_by_its_extra():
    extras = extras_in_setup_cfg()
    for module, extra in _extras.EXTRA_OF.items():
        assert extra in extras, f"{module} -> {extra!r}, which setup.cfg does not define"
        dist = _extras.DISTRIBUTION.get(module, module)
        assert dist in extras[extra], f"setup.cfg's extra {extra!r} does not install {dist} (for {module})"
        assert extra in _extras.EXTRAS, f"{extra!r} has no line saying what it is for"


def test_every_named_extra_exists_and_dev_brings_all_but_the_gpu():
    extras = extras_in_setup_cfg()
    assert set(_extras.EXTRAS) <= set(extras)
    for module, extra in _extras.EXTRA_OF.items():
        if extra != "gpu":
            assert _extras.DISTRIBUTION.get(module, module) in extras["dev"], f"dev misses {module}"
    assert set(extras["runtime"]) | set(extras["jax"]) <= set(extras["train"])


def test_what_running_alpas_code_needs_is_the_alpa_extra():
    """The harness that runs Alpa 0.2.3's own code imports, beyond the base install, only
    what the ``alpa`` extra brings (its other imports are stand-ins or Alpa's files)."""
    from alpa_comm.integrations.alpa_harness import loader

    harness = Path(loader.__file__).parent
    outside = set()
    for path in harness.glob("*.py"):
        for m in re.finditer(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", path.read_text(), re.M):
            outside.add(m.group(1))
    optional = {m for m in outside if m in _extras.EXTRA_OF}
    assert optional <= {"jax"}, optional  # jax: only pxla's names, which the harness stands in for
    assert "msgpack" in extras_in_setup_cfg()["alpa"]


def test_message_names_the_module_the_extra_and_the_install_command():
    e = _extras.missing_error("matplotlib.pyplot")
    assert isinstance(e, AlpaCommError) and isinstance(e, ModuleNotFoundError) and e.name == "matplotlib"
    assert str(e) == ("matplotlib is not installed (needed for PNG charts): install the extra 'plot': "
                      "pip install -e '.[plot]'")
    assert "'train'" in str(_extras.missing_error("ray", extra="train"))


def test_a_missing_submodule_of_an_installed_package_is_not_a_missing_extra():
    assert _extras.missing_extra(ModuleNotFoundError("No module named 'jax._src.gone'", name="jax._src.gone")) is None
    assert _extras.missing_extra(ModuleNotFoundError("No module named 'zzz'", name="zzz")) is None
    assert _extras.missing_extra(ImportError("cannot import name 'x' from 'jax'", name="jax")) is None
    assert isinstance(_extras.missing_extra(ModuleNotFoundError("no", name="cupy")), MissingExtraError)


def test_require_returns_the_module_and_check_imports_nothing():
    import numpy

    assert _extras.require("numpy") is numpy
    _extras.check("numpy", "matplotlib")
    with pytest.raises(ModuleNotFoundError):  # not an optional module: left as it is
        _extras.require("alpa_comm_no_such_module")


# ------------------------------------------------------------ every command
CLI_CASES = [
    ("matplotlib", ["simulate", *ONE_CASE, "--png", "out.png"], "plot"),
    ("matplotlib", ["simulate", "--suite", "n-to-m", "--out", "sim", "--alpa-baseline", "model"], "plot"),
    ("msgpack", ["plan", "--suite", "n-to-m"], "alpa"),
    ("msgpack", ["simulate", "--suite", "n-to-m"], "alpa"),
    ("matplotlib", ["schedule", "--png", "s.png"], "plot"),
    ("matplotlib", ["schedule", "--compare", "--png", "s.png"], "plot"),
    ("jax", ["train", "--cluster", "inprocess", "--steps", "1"], "jax"),
    ("optax", ["train", "--cluster", "inprocess", "--steps", "1"], "jax"),
    ("matplotlib", ["train", "--cluster", "inprocess", "--steps", "1", "--out", "t"], "plot"),
    ("ray", ["train", "--cluster", "local", "--steps", "1"], "train"),
    ("torch", ["train", "--cluster", "local", "--steps", "1"], "train"),
    ("torch", ["bench", "--cluster", "local", "--size-mb", "1"], "runtime"),
    ("ray", ["bench", "--cluster", "local", "--size-mb", "1"], "runtime"),
    ("matplotlib", ["bench", "--cluster", "local", "--size-mb", "1"], "plot"),
    ("jax", ["bench", "--mode", "processes", "--suite", "weight-sync", "--cluster", "local"], "jax"),
    ("ray", ["cluster", "up"], "runtime"),
]


@pytest.mark.parametrize("hidden,argv,extra", CLI_CASES, ids=[f"{a[0]}-{h}" for h, a, _ in CLI_CASES])
def test_cli_names_the_extra_in_one_line_and_exits_2(hider, tmp_path, hidden, argv, extra):
    done = run_hidden(hider, hidden, argv, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0] == (f"alpa-comm {argv[0]}: error: {hidden} is not installed (needed for "
                        f"{_extras.EXTRAS[extra]}): install the extra {extra!r}: pip install -e '.[{extra}]'"
                        + (" (or --alpa-baseline model: alpa_comm's model of Alpa)" if extra == "alpa" else ""))
    assert not list(tmp_path.iterdir()), "nothing is written before the check"


def test_an_import_deep_inside_a_command_reaches_the_same_one_line(monkeypatch, capsys):
    """Where no command checked first, the CLI's error path still names the extra."""
    from alpa_comm.cli import resharding

    def fails(args):
        raise ModuleNotFoundError("No module named 'cupy'", name="cupy")

    monkeypatch.setattr(resharding, "cmd_plan", fails)
    assert main(["plan", *ONE_CASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["alpa-comm plan: error: cupy is not installed (needed for the NCCL backend on GPUs): "
                   "install the extra 'gpu': pip install -e '.[gpu]'"]


def test_an_import_error_that_is_no_missing_extra_stays_an_internal_error(monkeypatch, capsys):
    from alpa_comm.cli import resharding

    def fails(args):
        raise ModuleNotFoundError("No module named 'jax._src.gone'", name="jax._src.gone")

    monkeypatch.setattr(resharding, "cmd_plan", fails)
    assert main(["plan", *ONE_CASE]) == 1
    assert "internal error: ModuleNotFoundError" in capsys.readouterr().err


# ------------------------------------------------------------ the public API
API_CASES = [
    ("ray", "import alpa_comm; alpa_comm.Cluster.local(2, 1)", "runtime"),
    ("matplotlib", "from alpa_comm.report.charts import loss_png; loss_png([1.0, 0.5], 'l.png', 't')", "plot"),
    ("matplotlib", "from alpa_comm.pipeline import Costs, simulate_schedule, generate\n"
                   "from alpa_comm.report.schedule_pictures import timeline_png\n"
                   "r = simulate_schedule(generate('1f1b', 2, 2), Costs(1, 2, 0.5))\n"
                   "timeline_png([('x', r, 2)], 's.png')", "plot"),
    ("torch", "from alpa_comm.runtime.backend import GlooBackend; GlooBackend(0, 1, '127.0.0.1', 1)", "runtime"),
    ("cupy", "from alpa_comm.runtime.backend import NcclBackend; NcclBackend(0, 1, b'')", "gpu"),
]


@pytest.mark.parametrize("hidden,code,extra", API_CASES, ids=[c[0] + str(i) for i, c in enumerate(API_CASES)])
def test_api_raises_missing_extra_error(hider, tmp_path, hidden, code, extra):
    wrapped = ("from alpa_comm.errors import MissingExtraError\n"
               "try:\n" + "".join(f"    {line}\n" for line in code.splitlines())
               + "except MissingExtraError as e:\n    print(e.name, '|', e)\n")
    done = run_hidden(hider, hidden, wrapped, tmp_path)
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.strip().partition(" | ")
    assert name == hidden and f"install the extra {extra!r}" in message, done.stdout


# ------------------------------------------------------------------- root
ROOT_CASES = [
    (["bench", "--cluster", "emulated", "--size-mb", "1"], "--cluster emulated needs root", ", or use --cluster local"),
    (["bench", "--size-mb", "1"], "--cluster emulated needs root", ", or use --cluster local"),  # the default
    (["train", "--cluster", "emulated", "--steps", "1"], "--cluster emulated needs root", ", or use --cluster local"),
    (["cluster", "up", "--hosts", "2"], "'up' needs root", ""),
]


@pytest.mark.parametrize("argv,what,instead", ROOT_CASES, ids=lambda v: "-".join(v) if isinstance(v, list) else "")
def test_without_root_one_line_gives_the_sudo_command(monkeypatch, capsys, argv, what, instead):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "executable", str(REPO / ".venv" / "bin" / "python"))
    if not (REPO / ".venv" / "bin" / "alpa-comm").exists():
        pytest.skip("no .venv/bin/alpa-comm in this checkout")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"error: {what} (network namespaces and tc): run sudo .venv/bin/alpa-comm {' '.join(argv)}" in err[0]
    assert (instead in err[0]) if instead else err[0].endswith(" ".join(argv))


def test_sudo_command_without_the_script_runs_the_module(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.chdir(tmp_path)
    assert needs.sudo_command(["cluster", "down"]) == "sudo bin/python -m alpa_comm.cli cluster down"
    assert needs.sudo_command(["plan", "--src-spec", "S0 R"]).endswith("plan --src-spec 'S0 R'")


def test_the_venvs_script_runs_without_the_venv_on_path(tmp_path):
    """What ``sudo .venv/bin/alpa-comm`` relies on: sudo resets PATH and the environment,
    and the script still runs (its interpreter is in its first line; what it starts, it
    starts with that interpreter)."""
    script = Path(sys.executable).with_name("alpa-comm")
    if not script.exists():
        pytest.skip("alpa-comm is not installed as a script beside this interpreter")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", str(tmp_path))}
    done = subprocess.run([str(script), "schedule", "--stages", "2", "--microbatches", "2"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "iteration time" in done.stdout


def sudo_lines() -> list[tuple[str, str]]:
    """(page, line) of every sudo command README.md and docs/*.md show (code lines and
    inline code spans)."""
    out = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        lines = [ln for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for ln in block.splitlines()]
        lines += re.findall(r"`(sudo [^`]*)`", text)
        out += [(page.name, ln.strip()) for ln in lines if ln.strip().startswith("sudo ")]
    return out


def test_docs_run_sudo_with_the_venvs_own_paths():
    """sudo resets PATH, so ``sudo alpa-comm`` or ``sudo python`` would not find the venv's
    programs: a page writes ``sudo .venv/bin/alpa-comm``, ``sudo .venv/bin/python`` or a
    make target (which knows the path)."""
    ok = re.compile(r"^sudo (\w+=\S+ )*(\.venv/bin/(alpa-comm|python)\b|make\b)")
    bad = [f"{page}: {line}" for page, line in sudo_lines() if not ok.match(line)]
    assert not bad, "write sudo .venv/bin/... (sudo does not see the venv's scripts):\n" + "\n".join(bad)
