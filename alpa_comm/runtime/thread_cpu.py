"""CPU seconds this process's threads have used, summed by thread name.

Why: a transfer's CPU is spent on several threads (the caller's Python threads, a
transport's own I/O thread), and which one grows tells what to fix. On the emulated
cluster gloo's I/O thread (``gloo_tcp_loop``) spent 1.5 ms per MB moved at 400 Mbit/s
and 3.8 ms at 100 Mbit/s (``benchmarks/transport_cpu.py``): it wakes for what each paced
burst brings, so its cost follows time, not bytes. Python's own threads all carry
the process's name (3.11 does not name OS threads) unless they name themselves
(``name_os_thread``: ``TcpBackend``'s I/O threads, the executor's and the training
mailbox's transfer threads do). Linux only (``/proc``); elsewhere an
empty dict.
"""
from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) as the kernel sees it, so
    ``thread_cpu_seconds`` tells it apart from the process's other Python threads.
    Linux only; a no-op elsewhere or where ``prctl`` is unavailable."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def thread_cpu_seconds() -> dict[str, float]:
    """Thread name -> CPU seconds of this process's live threads (threads that ended are
    not counted: take differences over a span where the threads of interest live
    throughout). From ``schedstat`` (nanoseconds on a CPU) where the kernel has it, else
    from ``stat`` (user + system in clock ticks, 10 ms: too coarse for one transfer)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            seconds = _schedstat_seconds(tid)
            if seconds is None:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
                seconds = (int(fields[11]) + int(fields[12])) / tick
        except OSError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + seconds
    return out


def _schedstat_seconds(tid: str) -> float | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Per thread name, the CPU seconds spent between two ``thread_cpu_seconds`` calls
    (names with none left out)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}
