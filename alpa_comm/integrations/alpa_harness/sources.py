"""The real sources the harness runs: Alpa 0.2.3's wheel and jax 0.3.22's Python source,
fetched from the package registry once (``pip download --no-deps``) into a cache.

Nothing here is vendored: the files come from PyPI as their authors published them.
Where the registry cannot be reached, ``SourcesUnavailable`` says so, and the tests that
need the sources skip with that reason.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

from ...errors import AlpaCommError

ALPA = "alpa==0.2.3"
JAX = "jax==0.3.22"


class SourcesUnavailable(AlpaCommError, RuntimeError):
    """The package registry could not give us a source we need."""


def cache_dir() -> Path:
    """``$ALPA_COMM_CACHE``, else ``~/.cache/alpa_comm``."""
    return Path(os.environ.get("ALPA_COMM_CACHE") or Path.home() / ".cache" / "alpa_comm")


@contextlib.contextmanager
def _cache_filled_by_one():
    """Hold the cache's lock: two processes filling it at once (two test workers, two of a
    user's runs) would each see the other's half-downloaded file or half-unpacked folder."""
    import fcntl  # POSIX only, like the rest of the harness

    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "w")
    except OSError as e:
        raise SourcesUnavailable(f"cannot fill the cache {folder} ($ALPA_COMM_CACHE): {e}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _filled_once(cached: Callable[[], Path | None], fill: Callable[[], Path]) -> Path:
    """``cached()``, else ``fill()`` under the cache's lock unless another process filled it
    meanwhile. Reading needs no lock: every fill renames its result into place whole."""
    found = cached()
    if found:
        return found
    with _cache_filled_by_one():
        return cached() or fill()


def download(requirement: str, suffix: str) -> Path:
    """The file ``pip download --no-deps requirement`` gives (cached), ending in ``suffix``."""
    pattern = f"{requirement.replace('==', '-')}*{suffix}"
    folder = cache_dir() / "downloads"

    def cached() -> Path | None:
        found = sorted(folder.glob(pattern)) if folder.is_dir() else []
        return found[0] if found else None

    def fill() -> Path:  # into a scratch folder, then renamed into ``downloads/``
        scratch = cache_dir() / "downloads.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(scratch), "-q"]
        if suffix.endswith(".tar.gz"):  # the source distribution, not a wheel
            cmd += ["--no-binary", requirement.split("==")[0]]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise SourcesUnavailable(f"pip download {requirement} took over 300 s") from None
        found = sorted(scratch.glob(pattern)) if scratch.is_dir() else []
        if done.returncode != 0 or not found:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourcesUnavailable(f"pip download {requirement} failed: {last}")
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / found[0].name
        os.replace(found[0], target)
        shutil.rmtree(scratch, ignore_errors=True)
        return target

    return _filled_once(cached, fill)


def jax_pxla_source() -> str:
    """The text of jax 0.3.22's ``jax/interpreters/pxla.py`` (read from its sdist)."""
    sdist = download(JAX, ".tar.gz")
    with tarfile.open(sdist) as tar:
        member = tar.extractfile("jax-0.3.22/jax/interpreters/pxla.py")
        if member is None:
            raise SourcesUnavailable(f"{sdist.name} has no jax/interpreters/pxla.py")
        return member.read().decode()


def alpa_root() -> Path:
    """A folder holding Alpa 0.2.3's ``alpa`` package, unpacked from its wheel once."""
    wheel = download(ALPA, ".whl")
    target = cache_dir() / "alpa-0.2.3"

    def cached() -> Path | None:
        return target if (target / "alpa" / "pipeline_parallel" / "cross_mesh_resharding.py").exists() else None

    def fill() -> Path:
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)  # whole or absent: a reader never sees half a package
        return target

    return _filled_once(cached, fill)
