"""Input checks shared by the planner, the runtime and the JAX layer.

Each check is written once so that the same bad value is named the same way, with the
same error class, wherever it enters: ``streams=9`` is an ``InvalidOptionError``
from ``Cluster``, from a process group and from a TCP backend alike. A check returns
the value it accepted, so a caller can validate and bind in one line::

    >>> from alpa_comm.validation import positive_int
    >>> positive_int(4, "chunks")
    4
    >>> positive_int(0, "chunks")
    Traceback (most recent call last):
    ...
    alpa_comm.errors.InvalidOptionError: chunks must be a positive integer, got 0

Pure Python, and no syntax or library call newer than 3.8: the runtime that Alpa's
workers import uses it.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Type

from .errors import AlpaCommError, InvalidOptionError

MAX_STREAMS = 8
"""Most TCP connections (gloo devices, sockets) between one pair of hosts."""


def is_int(value: Any) -> bool:
    """A Python ``int`` that is not a ``bool`` (``True`` is an ``int`` to Python, and a
    count of ``True`` is always a mistake)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any, name: str, error: Type[AlpaCommError] = InvalidOptionError) -> int:
    """``value`` if it is an int >= 1; else ``error`` naming ``name`` and the value.

    Raises:
        error (default ``InvalidOptionError``): not an int, a bool, or < 1.
    """
    if not is_int(value) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(value: Any, name: str, error: Type[AlpaCommError] = InvalidOptionError) -> int:
    """``value`` if it is an int >= 0; else ``error`` naming ``name`` and the value."""
    if not is_int(value) or value < 0:
        raise error(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _finite_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def positive_number(value: Any, name: str, error: Type[AlpaCommError] = InvalidOptionError,
                    unit: str = "") -> float:
    """``value`` if it is a finite real number > 0 (not a bool); else ``error`` naming
    ``name`` and the value (``unit``, e.g. ``"Gbit/s"``, is said in the message)."""
    if not (_finite_real(value) and value > 0):
        what = f"a positive number of {unit}" if unit else "a positive number"
        raise error(f"{name} must be {what}, got {value!r}")
    return value


def non_negative_number(value: Any, name: str, error: Type[AlpaCommError] = InvalidOptionError,
                        unit: str = "") -> float:
    """``value`` if it is a finite real number >= 0 (not a bool); else ``error`` naming
    ``name`` and the value."""
    if not (_finite_real(value) and value >= 0):
        what = f"a number of {unit} >= 0" if unit else "a number >= 0"
        raise error(f"{name} must be {what}, got {value!r}")
    return value


def check_streams(streams: Any, allow_auto: bool = False) -> Any:
    """A ``streams`` value (TCP connections per pair of hosts): an int in
    ``[1, MAX_STREAMS]``, or ``"auto"`` where ``allow_auto``.

    Raises:
        InvalidOptionError: any other value, named.
    """
    if allow_auto and streams == "auto":
        return streams
    if not is_int(streams) or not 1 <= streams <= MAX_STREAMS:
        choices = "'auto' or an integer" if allow_auto else "an integer"
        raise InvalidOptionError(f"streams must be {choices} in [1, {MAX_STREAMS}], got {streams!r}")
    return streams


def is_choice(value: Any, choices: Iterable[Any]) -> bool:
    """``value`` is one of ``choices``; a value that cannot be compared with them (an
    unhashable one, a numpy array compared element-wise) is simply not."""
    try:
        return any(value == c and isinstance(value, type(c)) for c in choices)
    except (TypeError, ValueError):
        return False


def one_of(value: Any, choices: Iterable[Any], what: str, error: Type[AlpaCommError] = InvalidOptionError) -> Any:
    """``value`` if it is one of ``choices``; else ``error``: ``unknown <what> <value>;
    choose one of <choices>``."""
    choices = list(choices)
    if not is_choice(value, choices):
        raise error(f"unknown {what} {value!r}; choose one of {', '.join(map(str, choices))}")
    return value
