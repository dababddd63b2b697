"""Plans kept on disk, so a job that starts a new process every step plans once.

``DiskPlanStore(directory)`` is a ``resharding.cache.PlanStore``: one file per plan,
named by ``cache.entry_name`` (a digest of every planning input and the package
version). Files are written to a temporary name and renamed, so a reader never sees
half a plan and two processes writing the same plan both leave a whole one. A file
that cannot be read (truncated, from another Python) counts as a miss.

Plans are stored with ``pickle``: point the store only at a directory you own, as
loading a pickle runs code its writer chose.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

from ..errors import InvalidOptionError
from ..resharding.cache import PLAN_CACHE, PlanCache

SUFFIX = ".plan.pickle"


class DiskPlanStore:
    """Plans as files in ``directory`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise InvalidOptionError(f"plan cache directory {str(self.directory)!r} is a file, not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidOptionError(f"cannot create plan cache directory {str(self.directory)!r}: "
                                     f"{e.strerror or e}") from None

    def path(self, name: str) -> Path:
        return self.directory / f"{name}{SUFFIX}"

    def load(self, name: str):
        try:
            with open(self.path(name), "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss, replanned and rewritten
            return None

    def save(self, name: str, plan) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path(name))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.directory.glob(f"*{SUFFIX}"))


def use_disk_plan_cache(directory: str | os.PathLike, cache: PlanCache = PLAN_CACHE) -> DiskPlanStore:
    """Back ``cache`` (default: the process's) with plans on disk in ``directory``."""
    store = DiskPlanStore(directory)
    cache.store = store
    return store
