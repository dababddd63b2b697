"""Project exceptions.

Every bad input raises a subclass of ``ValueError`` so callers that only know
the standard library can still catch it; the subclasses let tests and tools
tell *which* kind of input was wrong. Messages always name the offending value.
"""


class AlpaCommError(Exception):
    """Base of every alpa_comm error."""


class InvalidSpecError(AlpaCommError, ValueError):
    """A sharding spec that cannot be parsed or does not fit a tensor or mesh."""


class InvalidMeshError(AlpaCommError, ValueError):
    """A device mesh that is malformed, overlaps another, or misses the cluster."""


class InvalidClusterError(AlpaCommError, ValueError):
    """A cluster description with impossible values."""


class InvalidOptionError(AlpaCommError, ValueError):
    """An unknown strategy, load-balance mode, dtype or other option value."""
