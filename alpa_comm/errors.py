"""Project exceptions.

Every error a caller can cause or meet is an ``AlpaCommError``, and each one also
subclasses the built-in exception it replaces (``ValueError`` for a bad value,
``TypeError`` for an argument of the wrong kind, ``RuntimeError`` for a failure while
running, ``TimeoutError`` for a wait that ran out), so callers that only know the
standard library still catch it; the subclasses let tests and tools tell *which* kind
of input was wrong. Messages always name the offending value.

Input checks shared by several modules (a positive integer, a ``streams`` value, a
name from a list of choices) live in ``alpa_comm.validation``.
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


class InvalidArgumentError(AlpaCommError, ValueError):
    """Data that does not fit the call it is given to: an array of another shape than
    its plan, an array from another cluster, trees of different structure."""


class InvalidTypeError(AlpaCommError, TypeError):
    """An argument of a kind the function does not take (a trace of an object that has
    none, a byte range that is not a slice)."""


class UsageError(AlpaCommError, RuntimeError):
    """A call the current state does not allow: a harness started in a process that
    already imported what it replaces, a transfer kind registered twice."""


class CommunicationError(AlpaCommError, RuntimeError):
    """A transfer, a worker or a launched process failed; the message names the host(s)
    or rank(s) involved."""


class PartialUpdateError(CommunicationError):
    """A call receiving into previous arrays (``out=``) failed part of the way: on this
    process the leaves in ``updated`` hold the new values, those in ``unchanged`` their
    previous ones (no leaf holds a mix), and every array stays usable; calling again
    moves the tree anew."""

    def __init__(self, message: str, updated: list, unchanged: list):
        super().__init__(message)
        self.updated, self.unchanged = list(updated), list(unchanged)

    def __reduce__(self):  # raised in Ray workers too: pickled with its lists
        return type(self), (str(self), self.updated, self.unchanged)


class LostDataError(CommunicationError):
    """A plan without lost hosts (``plan_resharding_tree(lost_hosts=...)``) cannot be made:
    ``lost`` lists the slices (leaf path, index box) that live devices need and only the
    lost hosts held, named in the message; nothing was planned."""

    def __init__(self, message: str, lost: list):
        super().__init__(message)
        self.lost = list(lost)

    def __reduce__(self):
        return type(self), (str(self), self.lost)


class CommunicationTimeoutError(CommunicationError, TimeoutError):
    """A wait for a peer (a rendezvous key, a host's answer) ran out of time; the message
    names what was awaited and for how long."""


class InternalError(AlpaCommError, RuntimeError):
    """An invariant of the library itself broke (a bug, not a bad input): please report it."""


class MissingExtraError(AlpaCommError, ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs
    it (``alpa_comm._extras``). A ``ModuleNotFoundError`` too, so code that falls back
    when a module is absent still does."""
