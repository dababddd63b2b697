"""Run ``fn(rank)`` for ranks 0..n-1 on threads of this process, the first error raised."""
import threading


def run_ranks(n, fn, timeout=30):
    out, errors = [None] * n, []

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return out
