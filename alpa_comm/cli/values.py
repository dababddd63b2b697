"""Argument value types for ``alpa-comm``: numbers and paths checked when the command
line is parsed, so a mistake ends in one line naming the option and the value as
typed (argparse adds "argument --name:"), before any long work starts.

Each factory returns a callable for argparse's ``type=``; its ``__name__`` is what
argparse would print for a value it could not convert, so it reads as a phrase.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

MAX_COUNT = 1 << 40
"""No count of hosts, devices, steps, ... is this large: a typo, not a plan."""


def _named(fn, name: str):
    fn.__name__ = name
    return fn


def count(minimum: int = 1, maximum: int = MAX_COUNT):
    """An integer in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        if v > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {text!r}")
        return v
    return _named(parse, "integer")


def auto_or_count(minimum: int = 1, maximum: int = MAX_COUNT):
    """``auto`` (kept as the text) or an integer in [minimum, maximum]."""
    whole = count(minimum, maximum)

    def parse(text: str):
        return text if text == "auto" else whole(text)
    return _named(parse, "auto or integer")


def number(minimum: float = 0.0, *, exclusive: bool = False, maximum: float = math.inf, allow_inf: bool = False):
    """A finite float above ``minimum`` (``exclusive``: strictly), at most ``maximum``;
    ``allow_inf`` also accepts 'inf' (an ideal link)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if v < minimum or (exclusive and v == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if exclusive else '>='} {minimum:g}, got {text!r}")
        if v > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {text!r}")
        return v
    return _named(parse, "number")


def _writable_dir(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` (itself included), if it is a writable directory."""
    for p in (path, *path.parents):
        if p.exists():
            return p if p.is_dir() and os.access(p, os.W_OK | os.X_OK) else None
    return None


def output_file(text: str) -> str:
    """A file the command will write: not a directory, in a folder that exists and is writable."""
    if not text:
        raise argparse.ArgumentTypeError("must name a file, got ''")
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"is a directory, not a file: {text!r}")
    if p.exists() and not p.is_file():
        raise argparse.ArgumentTypeError(f"is not a regular file: {text!r}")
    parent = p.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(parent)!r} does not exist (for {text!r})")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r} (permission denied)")
    return str(p)


output_file.__name__ = "file path"


def output_dir(text: str) -> str:
    """A folder the command will write into (created with its parents if missing)."""
    if not text:
        raise argparse.ArgumentTypeError("must name a folder, got ''")
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"is a file, not a folder: {text!r}")
    if _writable_dir(p) is None:
        raise argparse.ArgumentTypeError(f"cannot create or write folder {text!r}")
    return str(p)


output_dir.__name__ = "folder path"


def input_file(text: str) -> str:
    """A file the command will read."""
    p = Path(text).expanduser()
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"is a directory, not a file: {text!r}")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return str(p)


input_file.__name__ = "file path"


def png_path(text: str) -> str:
    """An output PNG: '.png' is added when missing, so the path printed is the path written."""
    path = output_file(text)
    return path if path.lower().endswith(".png") else output_file(path + ".png")


png_path.__name__ = "file path"


_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")


def nic_rate(text: str) -> str:
    """An emulated NIC rate as ``tc`` reads it (``400mbit``, ``1gbit``), or ``none`` (unshaped)."""
    t = text.strip().lower()
    m = _RATE.match(t)
    if t != "none" and (not m or float(m.group(1)) <= 0):
        raise argparse.ArgumentTypeError(f"must be a rate such as 400mbit or 1gbit, or none, got {text!r}")
    return t


nic_rate.__name__ = "rate"


_USER_MODEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def model_name(text: str) -> str:
    """``gpt``, ``utransformer`` or ``package.module:function`` (a model of your own,
    imported when the model is built)."""
    if text in ("gpt", "utransformer") or _USER_MODEL.match(text):
        return text
    raise argparse.ArgumentTypeError(f"must be gpt, utransformer or package.module:function, got {text!r}")


model_name.__name__ = "model name"
