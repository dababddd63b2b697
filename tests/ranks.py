"""Run ``fn(rank)`` for ranks 0..n-1 on threads of this process: ``run_ranks`` raises the
errors and returns the results; ``rank_errors`` returns each rank's error (None where
none) and fails if a rank is still running after the timeout."""
import threading


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
