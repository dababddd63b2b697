"""The ``alpa-comm`` command line: one module per group of commands.

Sub-commands take the same mesh/spec/strategy vocabulary as the Python API;
bad input ends with exit code 2 and a message naming the offending value.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import AlpaCommError
from . import cluster, resharding, schedule

COMMAND_MODULES = (resharding, schedule, cluster)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="alpa-comm", description="alpa-comm: plan, simulate and run cross-mesh "
                                                                   "resharding; schedule and train pipelines.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (AlpaCommError, ValueError, RuntimeError) as e:
        print(f"alpa-comm {args.command}: error: {e}", file=sys.stderr)
        return 2
