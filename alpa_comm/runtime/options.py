"""How a ``HostExecutor`` runs: everything beyond the host, its buffers, its backend and
its devices' hosts, as one frozen object (``ExecutorOptions``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..resharding.admission import MAX_CONCURRENT, MAX_INFLIGHT_BYTES
from ..validation import positive_int
from .backend import DEFAULT_TIMEOUT_S


def _limit(value, name: str, default: int) -> int:
    """``value`` (None: ``default``) as a positive int, or ``InvalidOptionError`` naming it
    (``validation.positive_int``: the package's one positive-integer check)."""
    return default if value is None else positive_int(value, name)


@dataclass(frozen=True)
class ExecutorOptions:
    """A ``HostExecutor``'s options (``HostExecutor(..., options=ExecutorOptions(...))``);
    the first two (the wait bound and the slowest NIC's rate) may be given by position:
    ``ExecutorOptions(timeout, min_rate, tag_base=...)``.

    Raises ``InvalidOptionError`` naming a limit that is not a positive integer."""

    timeout: float = DEFAULT_TIMEOUT_S
    """Seconds a wait may last beyond what its transfer's bytes need (``HostExecutor.context``)."""
    min_rate: Optional[float] = None
    """Bytes/s of the slowest NIC: lets big messages take their time."""
    tag_base: int = 0
    """Separates plans that run at the same time over one backend."""
    xp: object = None
    """The buffers' array module (CuPy for GPU memory); None: found from the buffers."""
    max_concurrent: Optional[int] = None
    """Transfers in flight at once on this host (None: ``admission.MAX_CONCURRENT``)."""
    max_inflight_bytes: Optional[int] = None
    """Bytes of buffers this host makes for the transfers in flight (None: ``MAX_INFLIGHT_BYTES``)."""
    max_per_resource: Optional[int] = None
    """Transfers in flight on one NIC (None: ``admission.MAX_PER_RESOURCE`` per stream)."""
    latency_s: float = 0.0
    """What one message costs beyond its bytes (the planner's figure)."""
    in_place: Optional[dict] = None
    """transfer id -> the view its bucket lands in (``Destinations.in_place``); None: found."""
    on_done: Optional[Callable] = None
    """Called with each transfer as it ends on this host (from whichever thread ran it), so a
    caller can use what arrived (``jax.reshard`` adopts a leaf whose writers ended)."""
    rendezvous: bool = True
    """A plan's large messages wait for their receives where the backend can
    (``Backend.rendezvous``: safe because every transfer's receives are posted once it is
    admitted); False for a caller that may wait for a send before its peer posts the
    receive (the pipeline trainer's mailbox)."""

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: the defaults are filled in once, here
        set_(self, "max_concurrent", _limit(self.max_concurrent, "max_concurrent", MAX_CONCURRENT))
        set_(self, "max_inflight_bytes", _limit(self.max_inflight_bytes, "max_inflight_bytes", MAX_INFLIGHT_BYTES))
        if self.max_per_resource is not None:
            positive_int(self.max_per_resource, "max_per_resource")
