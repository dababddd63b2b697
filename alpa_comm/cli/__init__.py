"""The ``alpa-comm`` command line: one module per group of commands.

Sub-commands take the same mesh/spec/strategy vocabulary as the Python API. One
error path for every command: a user mistake (a bad value, a path that cannot be
written, an option that does nothing in the chosen mode, an optional dependency that
is not installed, root missing for the emulated cluster) ends in one line on stderr
that names the option and the value as typed (or the extra to install, or the sudo
command line), exit code 2; an unexpected
failure ends in one line plus the file holding its traceback, exit code 1; a
closed pipe (``alpa-comm ... | head``) ends quietly.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

from .._extras import missing_extra
from ..errors import AlpaCommError
from . import cluster, resharding, schedule

COMMAND_MODULES = (resharding, schedule, cluster)
USAGE_ERROR = 2
INTERNAL_ERROR = 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (no usage block) that points at
    ``--help``, and options are never abbreviated (so the given ones are known)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="alpa-comm", description="alpa-comm: plan, simulate and run cross-mesh "
                                                         "resharding; schedule and train pipelines.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """``dest`` of every option written on the command line (``--x v`` or ``--x=v``)."""
    words = {w.split("=", 1)[0] for w in argv if w.startswith("-")}
    dests = set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif words & set(action.option_strings):
                dests.add(action.dest)
    return dests


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad command line (2, its one line already printed)
        return e.code if isinstance(e.code, int) else USAGE_ERROR
    args.given = given_options(parser, argv)
    args.argv = argv
    prog = f"alpa-comm {args.command}"
    try:
        return args.func(args)
    except BrokenPipeError:  # before OSError, which it is
        return _quiet_broken_pipe()
    except (AlpaCommError, ValueError, OSError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return USAGE_ERROR
    except ImportError as e:  # an optional module missing deep down: the extra that brings it
        missing = missing_extra(e)
        if missing is None:
            return _internal_error(prog, e)
        print(f"{prog}: error: {_one_line(missing)}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns a bug into one line and a file
        return _internal_error(prog, e)


def _internal_error(prog: str, e: BaseException) -> int:
    path = _save_traceback(prog)
    print(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (traceback in {path}; "
          "please report it)", file=sys.stderr)
    return INTERNAL_ERROR


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.strerror}: {e.filename!r}"
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _quiet_broken_pipe() -> int:
    """The reader went away: point stdout at /dev/null so the interpreter's final flush
    does not complain, and stop without a message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _save_traceback(prog: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f"alpa-comm-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".traceback.txt")
    with os.fdopen(fd, "w") as f:
        f.write(f"{prog} {' '.join(sys.argv[1:])}\n\n")
        traceback.print_exc(file=f)
    return path
