"""Worker-side half of the Alpa adapter.

Alpa creates its ``MeshHostWorker`` actors from the module attribute
``alpa.device_mesh.MeshHostWorker``; ``alpa.configure`` points it at the
subclass defined here. Ray pickles an importable class by reference, so every
actor process imports this module to rebuild the class — and this import is
what applies ``worker_patches()`` in that process, where driver-side patches
never reach. Importing it needs Alpa; nothing else in alpa_comm imports it.
"""
from __future__ import annotations

import importlib
import os

WORKER_MARK = "ALPA_COMM_WORKER_PATCHED"


def worker_patches() -> None:
    """Patches every Alpa worker process needs; idempotent. Today it marks the process
    (``alpa_comm_status`` reports it) so a user can check the hook reached the actors."""
    os.environ[WORKER_MARK] = "1"


def _build():
    base = importlib.import_module("alpa.device_mesh").MeshHostWorker
    base = getattr(base, "_alpa_comm_base", base)  # in the driver the attribute may already be ours

    class AlpaCommMeshHostWorker(base):
        _alpa_comm_base = base

        def __init__(self, *args, **kwargs):
            worker_patches()
            super().__init__(*args, **kwargs)

        def alpa_comm_status(self) -> dict:
            return {"pid": os.getpid(), "patched": os.environ.get(WORKER_MARK) == "1"}

    AlpaCommMeshHostWorker.__module__ = __name__
    AlpaCommMeshHostWorker.__qualname__ = "AlpaCommMeshHostWorker"
    return AlpaCommMeshHostWorker


AlpaCommMeshHostWorker = _build()
worker_patches()


def subclass(base):
    """The class Alpa should instantiate (built once, on the original ``base``)."""
    return AlpaCommMeshHostWorker
