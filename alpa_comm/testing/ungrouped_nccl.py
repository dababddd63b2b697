"""The NCCL backend as it was before the model caught it, kept to show that the model
catches it (``tests/test_nccl_model.py``, ``tests/test_nccl_model_remote.py``): every send
and receive launched at once, in a group of its own, on the backend's one stream, so a
ring step that sends and then receives deadlocks and a chain's middle host stores and
forwards. Never use it for data."""
from __future__ import annotations

from ..runtime.backend import Handle, NcclBackend


def ungrouped(base: type = NcclBackend) -> type:
    """``base`` (``NcclBackend`` or ``NcclSubgroupBackend``) launching each operation alone."""

    class Ungrouped(base):
        def _post(self, kind, buf, peer, what):
            op = [kind, buf, peer, None]
            with self._lock:
                self._pending.append(op)
                self._launch_through(op)
            return Handle(lambda timeout: self._wait_event(op[3], timeout, f"{what} host {peer}"),
                          f"{what} host {peer}")
    Ungrouped.__name__ = f"Ungrouped{base.__name__}"
    return Ungrouped
