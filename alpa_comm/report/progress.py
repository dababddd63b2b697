"""Progress of long work: a ``tqdm`` bar on a terminal, plain lines in a log.

A bar redrawn with carriage returns fills a log file (CI, ``nohup``, ``tee``)
with thousands of partial lines; when the stream is not a terminal we write one
ordinary line at most every ``LOG_EVERY_S`` seconds, and always the last one.
"""
from __future__ import annotations

import sys
import time

LOG_EVERY_S = 10.0


class Progress:
    """``step(what)`` after each unit of work, ``close()`` at the end (or use ``with``)."""

    def __init__(self, total: int, desc: str = "", stream=None, unit: str = "step", enabled: bool = True,
                 initial: int = 0):
        """``initial``: units already done before this process (a resumed run counts on from them)."""
        self.stream = sys.stderr if stream is None else stream
        self.total, self.desc, self.done, self.enabled = total, desc, initial, enabled
        self.t0 = self._last = time.monotonic()
        self.bar = None
        isatty = getattr(self.stream, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm  # noqa: PLC0415 - only for interactive output

            self.bar = tqdm(total=total, desc=desc or None, file=self.stream, unit=unit, dynamic_ncols=True,
                            leave=True, initial=initial)

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(what[:60], refresh=False)
            self.bar.update(1)
            return
        now = time.monotonic()
        if now - self._last >= LOG_EVERY_S or self.done == self.total:
            self._last = now
            head = f"{self.desc}: " if self.desc else ""
            print(f"{head}{self.done}/{self.total} ({100 * self.done / max(1, self.total):.0f} %, "
                  f"{now - self.t0:.0f} s) {what}", file=self.stream, flush=True)

    __call__ = step

    def note(self, message: str) -> None:
        """One line between the updates (a checkpoint saved, a run resumed), above a bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
