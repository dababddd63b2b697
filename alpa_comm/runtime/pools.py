"""Thread pools the runtime keeps between calls, per calling thread.

Starting a thread costs about a millisecond and a cached small reshard a few, so the
executor's transfer threads and its packing thread (and ``alpa_comm.jax``'s placing
thread) are made once and kept. Kept per calling thread (a ``threading.local``), so
executors that run side by side in one process (hosts as threads, a pipeline's stages)
never wait for each other's threads.

Python 3.8 (Alpa's workers import ``runtime/``): ``ThreadPoolExecutor.shutdown`` takes
no ``cancel_futures`` there, so ``shutdown_now`` cancels the futures it is given itself.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable

from .thread_cpu import name_os_thread

_PREFIX = "alpa-comm-"


class _KeptPools(threading.local):
    """The calling thread's pools by key."""

    def __init__(self):
        self.pools: dict = {}


_KEPT = _KeptPools()


def _os_name(prefix: str) -> str:
    """The short name the OS shows for a pool's threads (``alpa-comm-pack`` -> ``pack``)."""
    return prefix[len(_PREFIX):] if prefix.startswith(_PREFIX) else prefix


def kept_threads(key, workers: int, prefix: str) -> ThreadPoolExecutor:
    """The calling thread's own pool ``key`` of ``workers`` threads, kept between runs."""
    pools = _KEPT.pools
    if key not in pools:
        pools[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix,
                                        initializer=name_os_thread, initargs=(_os_name(prefix),))
    return pools[key]


def transfer_threads(limit: int) -> ThreadPoolExecutor:
    """The threads that run transfers a host must react to (a chain's middle, a ring)."""
    return kept_threads(limit, limit, "alpa-comm-transfer")


def packing_thread() -> ThreadPoolExecutor:
    """A thread started afresh each call would delay a sync's first bucket by its start-up."""
    return kept_threads("pack", 1, "alpa-comm-pack")


def shutdown_now(pool: ThreadPoolExecutor, futures: Iterable[Future] = ()) -> None:
    """``pool.shutdown(wait=False, cancel_futures=True)`` as Python 3.8 can say it: the
    ``futures`` not yet started are cancelled, and the pool's threads end once what runs
    on them has ended."""
    for f in futures:
        f.cancel()
    pool.shutdown(wait=False)


def drop_threads(pool: ThreadPoolExecutor, futures: Iterable[Future] = ()) -> None:
    """After a failure: forget ``pool`` (the next run of this thread gets fresh threads),
    cancel its ``futures`` not yet started; those still running end within their own
    timeouts on the old threads."""
    pools = _KEPT.pools
    for k, v in list(pools.items()):
        if v is pool:
            del pools[k]
    shutdown_now(pool, futures)
