"""Run ``fn(rank)`` for ranks 0..n-1 on threads of this process: ``run_ranks`` raises the
errors and returns the results; ``rank_errors`` returns each rank's error (None where
none) and fails if a rank is still running after the timeout; ``exchange_in_opposite_orders``
checks that two backends match messages by tag, not posting order."""
import threading

import numpy as np


def _on_threads(n, fn, timeout):
    out, errors = [None] * n, [None] * n

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - returned to the caller
            errors[r] = e
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out, errors, any(t.is_alive() for t in threads)


def run_ranks(n, fn, timeout=30):
    out, errors, _ = _on_threads(n, fn, timeout)
    errors = [e for e in errors if e is not None]
    assert not errors, errors
    return out


def rank_errors(n, fn, timeout=20):
    _, errors, hung = _on_threads(n, fn, timeout)
    assert not hung, "a rank hung"
    return errors


def exchange_in_opposite_orders(a, b, sizes, rng, timeout=20):
    """Messages of ``sizes`` random bytes from backend ``a`` (host 0) to ``b`` (host 1),
    tagged by position, the receives posted in the opposite order of the sends (tags, not
    order, must match them); returns (sent, received) once all are done."""
    sent = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    got = [np.zeros(n, np.uint8) for n in sizes]
    recvs = [b.irecv(g, 0, tag) for tag, g in reversed(list(enumerate(got)))]
    sends = [a.isend(s, 1, tag) for tag, s in enumerate(sent)]
    for h in sends + recvs:
        h.wait(timeout)
    return sent, got
