"""``gc_paused()``: the cyclic garbage collector held off for a stretch of work.

Two places want it. Planning allocates hundreds of thousands of small immutable tuples
and no cycles; the collector would rescan them all repeatedly (a third of the time on
25,000 tasks). A transfer's data path allocates few objects, but a collection that
starts while a bucket is being packed or a receive is about to be posted stalls the
wire for as long as it takes (a full pass over a training process's heap: tens of
milliseconds); held off, it runs after the call instead. Objects are still freed by
reference counting meanwhile; the collector runs as usual once the stretch ends.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Hold the cyclic collector off inside the ``with`` (nesting is harmless; a
    collector the caller had disabled stays disabled)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
