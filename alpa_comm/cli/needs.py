"""What a command needs before it starts: optional modules, named by the extra that
installs them, and root for the emulated cluster.

Each command checks these first, so a missing piece ends in one line and exit code 2
within a second instead of a traceback after minutes of work (a benchmark's PNG is
drawn last). Imports that fail later all the same reach the same one-line path through
``alpa_comm._extras.missing_extra`` in ``alpa_comm.cli.main``.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from .. import _extras
from ..errors import AlpaCommError, MissingExtraError

EMULATED = "emulated"


def modules(*names: str, extra: str | None = None) -> None:
    """Every one of ``names`` installed, else ``MissingExtraError`` naming the extra
    (``extra``: one that brings them all, for a command that needs several)."""
    _extras.check(*names, extra=extra)


def bench(module: str):
    """``alpa_comm_bench.<module>``, the benchmark package's runner a command drives,
    imported only when that command runs (the library never imports the benchmarks);
    one line if the package is missing (it installs with alpa_comm)."""
    import importlib  # noqa: PLC0415

    try:
        return importlib.import_module(f"alpa_comm_bench.{module}")
    except ModuleNotFoundError as e:
        if e.name not in ("alpa_comm_bench", f"alpa_comm_bench.{module}"):
            raise
        raise AlpaCommError("this command runs the benchmark package alpa_comm_bench, which is not importable: "
                            "reinstall alpa_comm (pip install -e . in a checkout)") from None


def png(wanted) -> None:
    """matplotlib, where the command will draw a PNG (``wanted`` true)."""
    if wanted:
        modules("matplotlib")


def alpa_code() -> None:
    """What running Alpa 0.2.3's own code needs beyond the base install, with the way
    round it in the same line."""
    try:
        modules("msgpack")
    except MissingExtraError as e:
        raise MissingExtraError(f"{e} (or --alpa-baseline model: alpa_comm's model of Alpa)", name=e.name) from None


def root(args, what: str, instead: str = "") -> None:
    """Root, for a command that builds or removes the emulated cluster; the message
    gives the command line to run again under sudo (and ``instead``, a way without)."""
    if os.geteuid() == 0:
        return
    raise AlpaCommError(f"{what} needs root (network namespaces and tc): run "
                        f"{sudo_command(getattr(args, 'argv', []))}" + (f", or {instead}" if instead else ""))


def sudo_command(argv: list[str]) -> str:
    """This command line again under sudo, with the ``alpa-comm`` of this environment
    (its path relative to the working directory where it lies inside it): sudo resets
    PATH, so a bare ``alpa-comm`` would not be found."""
    script = Path(sys.executable).with_name("alpa-comm")
    if script.exists():
        program = [_short(script)]
    else:  # not installed as a script: the module runs the same command
        program = [_short(Path(sys.executable)), "-m", "alpa_comm.cli"]
    return shlex.join(["sudo", *program, *argv])


def _short(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (the form the
    docs show: ``.venv/bin/alpa-comm``), else absolute."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())
