"""Every command shown in README.md and docs/ that needs neither root nor a cluster runs as
written and exits 0 (in a scratch folder, so relative output paths land there).

A command is a line of a code block, or an inline code span, that starts with
``alpa-comm`` or ``python benchmarks/``. Optional parts in brackets are dropped and
``a|b|c`` alternatives take the first, so a synopsis line runs in its plain form; lines
with placeholders (``...``, ``<name>``, ``DIR``) and bare command names (a reference, not
a command) are not commands. ``sudo`` lines, ``bench``, ``cluster`` and trainer runs on
a Ray or emulated cluster need root or a cluster and are left to their own tests.

A command that needs root is written ``sudo .venv/bin/alpa-comm ...`` or ``sudo
.venv/bin/python benchmarks/...``: sudo resets PATH, so it does not see the venv's scripts
(and its ``python`` is the system's, without the package). Such a line is recognised as
a command (and left to its own tests, as above); a bare ``sudo alpa-comm`` or ``sudo
python ...`` line, in a code block or an inline code span, fails
``test_sudo_commands_name_the_venv`` with its ``PAGE:LINE``.

Commands that take minutes at their shown size run at CI size: the shown line with
``CI_SIZED``'s options appended (argparse keeps the last value), so every shown option
is still parsed and used, on the cluster the line names (the trainer's default: a local
Ray cluster of host workers). Two shown lines that differ only in values ``CI_SIZED``
overrides (``--repeat 9``, ``--repeat 15``) run once.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import local_ray_marks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_docs  # noqa: E402  (tools/ is not a package; it reads a page's fenced blocks)
PLACEHOLDERS = ("...", "<", "DIR", "ADDR", "/simulate")
NEEDS_A_CLUSTER = re.compile(r"alpa-comm (bench|cluster)\b|--cluster (local|emulated|ray)|^sudo|runtime_1_to_m"
                             r"|allreduce|train_pipeline|gpu_check|alpa_nm_suite"
                             r"|scale_fuzz"  # minutes of planning: tests/test_scale_fuzz.py runs it CI-sized
                             r"|predictor_check")  # reads committed results: tests/test_predictor_check.py runs it


CI_SIZED = [  # (pattern of the argv, options appended)
    (re.compile(r"benchmarks/sim_scale\.py"), ["--hosts", "64"]),  # the 1,024-host rows: 84 s
    (re.compile(r"benchmarks/split_backward\.py"), ["--repeat", "2", "--width", "32"]),
    (re.compile(r"benchmarks/planner_speed\.py"), ["--repeat", "1"]),
    (re.compile(r"benchmarks/compute_on_zeros\.py"), ["--repeat", "1", "--width", "32"]),
    (re.compile(r"benchmarks/user_script\.py"), ["--max-total-mib", "2", "--repeat", "1"]),  # the sweep: minutes
    (re.compile(r"benchmarks/fixed_costs\.py"), ["--points", "10x16,20x16", "--repeat", "1"]),
    (re.compile(r"benchmarks/frontier_sync\.py"), ["--tiny"]),  # six frontier models planned cold: a minute
    (re.compile(r"alpa_comm\.cli train\b"),  # auto's calibration and trial rounds at the default size: a minute
     ["--stages", "2", "--width", "16", "--seq", "8", "--microbatches", "4", "--steps", "2"]),
]


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(sudo )?(\.venv/bin/)?(alpa-comm|python benchmarks/)")
# sudo, its options and variables, then a name its PATH does not hold (a venv script or python)
BARE_SUDO = re.compile(r"^sudo\s+(?:-\S+\s+)*(?:env\s+)?(?:(?!PATH=)\w+=\S*\s+)*(alpa-comm|python[\d.]*)(?:\s|$)")


def commands_in(text: str) -> list[str]:
    """Every command line a page's text shows, continuation lines joined."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`((?:sudo )?(?:\.venv/bin/)?(?:alpa-comm|python benchmarks/)[^`]*)`", text)
    out = []
    for line in lines:
        line = re.split(r"\s#\s|\s{2,}#", line)[0].strip()
        if COMMAND.match(line):
            out.append(" ".join(line.split()))
    return out


def shown_commands() -> list[tuple[str, str]]:
    """(document, command line) of every command the docs show."""
    return list(dict.fromkeys((md.name, line) for md in PAGES for line in commands_in(md.read_text())))


def bare_sudo_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line, command) of every ``sudo alpa-comm`` / ``sudo python`` a page shows,
    on a code block's line or in an inline code span."""
    lines = text.splitlines()
    in_block = {i for f in sync_docs.fences(lines) for i in range(f.start + 1, f.end)}
    out = []
    for i, line in enumerate(lines):
        shown = [line.strip().removeprefix("$ ")] if i in in_block else re.findall(r"`([^`]+)`", line)
        out += [(i + 1, s) for s in shown if BARE_SUDO.match(s.strip())]
    return out


def runnable(line: str) -> list[str] | None:
    """The argv to run for a shown line, or None where it is not a runnable command here."""
    if any(p in line for p in PLACEHOLDERS) or NEEDS_A_CLUSTER.search(line):
        return None
    line = re.sub(r"\[[^\]]*\]", " ", line)  # optional parts
    words = [w.split("|")[0] for w in shlex.split(line)]
    words = [w for w in words if w]
    if words[0].endswith("alpa-comm"):
        if len(words) < 3 and words[1:] != ["--help"]:
            return None  # "alpa-comm plan": a reference to the command, not a command line
        return ci_sized([sys.executable, "-m", "alpa_comm.cli", *words[1:]])
    return ci_sized([sys.executable, str(ROOT / words[1]), *words[2:]])


def _ci_options(argv: list[str]) -> list[str]:
    """The options of the first ``CI_SIZED`` pattern ``argv`` matches (none for ``--help``)."""
    if "--help" in argv:
        return []
    line = " ".join(argv)
    return next((extra for pattern, extra in CI_SIZED if pattern.search(line)), [])


def ci_sized(argv: list[str]) -> list[str]:
    """``argv`` with its CI-size options appended."""
    return argv + _ci_options(argv)


def _overridden(argv: list[str]) -> tuple:
    """``argv`` less every option ``CI_SIZED`` sets for it, with its value: what two shown
    lines must share to run the same."""
    names = set(_ci_options(argv)[::2])
    out, words = [], iter(argv)
    for w in words:
        if w in names:
            next(words, None)
        else:
            out.append(w)
    return tuple(out)


def _unique(found):
    """Each command once: shown in two documents, or twice with only values ``CI_SIZED``
    overrides differing (the runs would be the same)."""
    seen, out = set(), []
    for doc, line, argv in found:
        key = _overridden(argv)
        if key not in seen:
            seen.add(key)
            out.append((doc, line, argv))
    return out


COMMANDS = _unique((doc, line, argv) for doc, line in shown_commands() if (argv := runnable(line)))


def test_the_docs_show_runnable_commands():
    assert len(COMMANDS) >= 12, COMMANDS
    missing = [line for _, line, argv in COMMANDS if argv[1] != "-m" and not Path(argv[1]).exists()]
    assert not missing, f"docs show scripts that do not exist: {missing}"


def test_sudo_commands_name_the_venv():
    bad = [f"{md.relative_to(ROOT)}:{n}: {line!r}: sudo does not see the venv's scripts; write "
           f"'sudo .venv/bin/{line.split(maxsplit=1)[1]}'"
           for md in PAGES for n, line in bare_sudo_lines(md.read_text())]
    assert not bad, "\n".join(bad)


def test_a_sudo_command_is_recognised_and_left_to_its_own_tests():
    text = ("```bash\nsudo .venv/bin/alpa-comm bench --suite n-to-m --size-mb 16\n"
            "sudo .venv/bin/python benchmarks/emulated_hosts.py --hosts 16\nsudo alpa-comm schedule --help\n"
            "sudo -E python benchmarks/emulated_hosts.py\n```\nRun `sudo python3 benchmarks/x.py` or "
            "`sudo make demo`; `sudo env PATH=$PATH alpa-comm bench` keeps PATH.\n")
    shown = commands_in(text)
    assert shown[:2] == ["sudo .venv/bin/alpa-comm bench --suite n-to-m --size-mb 16",
                         "sudo .venv/bin/python benchmarks/emulated_hosts.py --hosts 16"]
    assert all(runnable(line) is None for line in shown)
    assert bare_sudo_lines(text) == [(4, "sudo alpa-comm schedule --help"),
                                     (5, "sudo -E python benchmarks/emulated_hosts.py"),
                                     (7, "sudo python3 benchmarks/x.py")]
    assert runnable(".venv/bin/alpa-comm schedule --help")[1:] == ["-m", "alpa_comm.cli", "schedule", "--help"]


def starts_local_ray(argv: list[str]) -> bool:
    """The trainer's default cluster is a local Ray cluster of host workers."""
    return argv[1:4] == ["-m", "alpa_comm.cli", "train"] and "inprocess" not in argv


@pytest.mark.parametrize("doc,line,argv", [pytest.param(*c, marks=local_ray_marks() if starts_local_ray(c[2]) else ())
                                           for c in COMMANDS], ids=[f"{d}: {line[:70]}" for d, line, _ in COMMANDS])
def test_a_shown_command_runs_as_written(tmp_path, doc, line, argv):
    (tmp_path / "my_schedule.txt").write_text("stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1\n"
                                              "stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1\n")
    env = {k: v for k, v in os.environ.items() if k != "ALPA_COMM_PLAN_CACHE"}
    env["PYTHONPATH"] = str(ROOT)
    before = committed_results()
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{doc}: {line}\n{done.stderr[-2000:]}"
    changed = sorted(p for p, stamp in committed_results().items() if before.get(p) != stamp)
    assert not changed, (f"{doc}: {line} rewrote committed results {changed}: a script's default --out must be "
                         "relative to the working directory (the test runs it in a scratch folder)")


def committed_results() -> dict:
    """(size, mtime) of every file under benchmarks/results: what the docs' numbers are checked against."""
    return {str(p.relative_to(ROOT)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in (ROOT / "benchmarks/results").rglob("*") if p.is_file()}
