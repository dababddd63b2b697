"""One measured row of a benchmark run, and the error every runner raises when a
destination received wrong data."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from alpa_comm.errors import AlpaCommError


class VerificationError(AlpaCommError, RuntimeError):
    """A destination device received wrong data."""


@dataclass
class Result:
    """One method on one case: the timed runs (after a warm-up), their median, the
    physical lower bound and the simulator's prediction (NaN: not simulated)."""

    suite: str
    case: str
    method: str
    strategy: str
    loadbalance: str
    seconds: list[float]
    median_seconds: float
    lower_bound_seconds: float
    predicted_seconds: float
    nbytes: int
    verified: bool | None  # None: the signal strategy moves no data
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.nbytes * 8 / self.median_seconds / 1e9 if self.median_seconds > 0 else float("inf")


def digest(a: np.ndarray) -> str:
    """The hash a host worker's checksum of the same bytes equals (blake2b, 16 bytes)."""
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8).reshape(-1), digest_size=16).hexdigest()
