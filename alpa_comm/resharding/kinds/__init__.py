"""The registry of transfer kinds: one module per way of moving bytes.

Every module in this package that defines a ``TransferKind`` subclass with a
``name`` is found at import time, so adding a kind touches one module. The
planner, the simulator, the executor, the CLI choices and the strategy lists
all look kinds up here instead of branching on strings.
"""
from __future__ import annotations

import importlib
import pkgutil

from ...errors import InvalidOptionError, UsageError
from .base import Candidate, TransferKind

_REGISTRY: dict[str, TransferKind] = {}


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _load() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    found = {}
    for cls in _subclasses(TransferKind):
        if cls.__dict__.get("name"):
            if cls.name in found:
                raise UsageError(f"transfer kind {cls.name!r} is defined twice ({found[cls.name].__class__.__qualname__} "
                                 f"and {cls.__qualname__})")
            found[cls.name] = cls()
    _REGISTRY.update(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


_load()

TRANSFER_KINDS: dict[str, TransferKind] = dict(_REGISTRY)
"""Every kind by name, in listing order."""

PER_TASK_STRATEGIES: tuple[str, ...] = tuple(n for n, k in TRANSFER_KINDS.items() if k.per_task_strategy)
"""Kinds a plan may use for every unit task (also the strategies a tree plan accepts)."""

PACKABLE_KINDS: tuple[str, ...] = tuple(n for n, k in TRANSFER_KINDS.items() if k.packable)


def transfer_kind(name: str) -> TransferKind:
    """The kind called ``name``; an unknown name raises an error that lists the known ones."""
    try:
        return TRANSFER_KINDS[name]
    except KeyError:
        raise InvalidOptionError(f"unknown transfer kind {name!r}; known kinds: {', '.join(TRANSFER_KINDS)}") from None


__all__ = ["Candidate", "PACKABLE_KINDS", "PER_TASK_STRATEGIES", "TRANSFER_KINDS", "TransferKind", "transfer_kind"]
