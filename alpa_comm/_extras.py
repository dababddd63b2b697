"""Optional dependencies: which extra of setup.cfg installs each, and one way to import
them that names the extra when one is missing.

The planner, simulator and schedules need only NumPy; everything else is optional and
imported where it is used. When such an import fails, a user should learn which extra
to install rather than read a traceback: ``require`` imports a module or raises
``MissingExtraError`` naming its extra, and ``missing_extra`` turns a
``ModuleNotFoundError`` raised anywhere below into one (the CLI's single error path
uses it, so every command ends in one line and exit code 2).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from .errors import MissingExtraError

EXTRAS = {
    "plot": "PNG charts",
    "jax": "alpa_comm.jax, the models and the trainer (its checkpoints too)",
    "runtime": "host workers on Ray with gloo transfers: Cluster, bench, train on a cluster",
    "train": "the trainer on host workers: jax and the runtime together",
    "alpa": "Alpa 0.2.3's own code: the Alpa baselines of --alpa-baseline code",
    "gpu": "the NCCL backend on GPUs",
}
"""Each extra of setup.cfg that this package names in an error, and what it is for."""

EXTRA_OF = {
    "matplotlib": "plot",
    "jax": "jax",
    "jaxlib": "jax",
    "optax": "jax",
    "orbax": "jax",
    "ray": "runtime",
    "torch": "runtime",
    "msgpack": "alpa",
    "cupy": "gpu",
}
"""Top-level optional module -> the extra that installs it (tests/test_extras.py checks
that each extra here lists the module's distribution in setup.cfg)."""

DISTRIBUTION = {"cupy": "cupy-cuda12x", "jaxlib": "jax", "orbax": "orbax-checkpoint"}
"""Where the distribution that brings a module is named apart from it (jax brings jaxlib)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` into the environment of a source checkout."""
    return f"pip install -e '.[{extra}]'"


def missing_error(module: str, extra: str | None = None) -> MissingExtraError:
    """The error for an absent ``module`` (top-level name): what it is for and the extra
    to install; ``extra`` overrides the module's own (a command that needs several
    extras names the one that brings them all)."""
    top = module.split(".")[0]
    extra = extra or EXTRA_OF[top]
    return MissingExtraError(f"{top} is not installed (needed for {EXTRAS[extra]}): install the extra "
                             f"{extra!r}: {install_hint(extra)}", name=top)


def missing_extra(exc: BaseException, extra: str | None = None) -> MissingExtraError | None:
    """``exc`` as a ``MissingExtraError`` when it says that an optional module itself is
    absent, else None. A missing *submodule* of an installed package (an API that moved
    between versions) is not a missing extra and stays what it is."""
    if isinstance(exc, MissingExtraError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top not in EXTRA_OF or (exc.name != top and _installed(top)):
        return None
    return missing_error(top, extra)


def require(module: str, extra: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``, or ``MissingExtraError`` naming the extra
    that installs it when the module's package is absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        err = missing_extra(e, extra)
        if err is None:
            raise
        raise err from None


def check(*modules: str, extra: str | None = None) -> None:
    """Raise ``MissingExtraError`` for the first of ``modules`` that is not installed,
    without importing any (a command checks what it will need before long work starts)."""
    for module in modules:
        if not _installed(module):
            raise missing_error(module, extra)


def _installed(module: str) -> bool:
    module = module.split(".")[0]
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
