"""A small real corpus that needs no download: the text of Python's own standard
library, as bytes (vocabulary 256)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UsageError


def stdlib_corpus(max_bytes: int = 2 << 20) -> np.ndarray:
    """Bytes of the standard library's .py files (sorted by path, so runs repeat)."""
    root = Path(os.__file__).parent
    out, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        out.append(np.frombuffer(data, np.uint8))
        total += len(data)
        if total >= max_bytes:
            break
    if not out:
        raise UsageError(f"no Python sources found under {root}")
    return np.concatenate(out)[:max_bytes]


def batches(corpus: np.ndarray, num_microbatches: int, microbatch: int, seq: int, seed: int = 0, rng=None):
    """Endless training steps: each a list of microbatches {tokens, targets} of random windows.
    ``rng`` (a NumPy ``Generator``; default: one seeded with ``seed``) draws them, so a caller
    that keeps it can save and restore the stream's position (``DataStream``)."""
    rng = np.random.default_rng(seed) if rng is None else rng
    while True:
        step = []
        for _ in range(num_microbatches):
            starts = rng.integers(0, len(corpus) - seq - 1, microbatch)
            win = np.stack([corpus[s:s + seq + 1] for s in starts]).astype(np.int32)
            step.append({"tokens": win[:, :-1], "targets": win[:, 1:]})
        yield step


def synthetic(num_microbatches: int, microbatch: int, seq: int, seed: int = 0, vocab: int = 256, rng=None):
    """Endless steps of uniformly random tokens (benchmarks: no corpus, same shapes); ``rng``
    as in ``batches``."""
    rng = np.random.default_rng(seed) if rng is None else rng
    while True:
        step = []
        for _ in range(num_microbatches):
            win = rng.integers(0, vocab, (microbatch, seq + 1), dtype=np.int32)
            step.append({"tokens": win[:, :-1], "targets": win[:, 1:]})
        yield step


class DataStream:
    """A deterministic stream of training steps whose position can be saved and restored:
    ``next(stream)`` draws a step, ``state()`` is the steps drawn and the generator's
    state (JSON-able), and a stream made with that state draws exactly the steps an
    uninterrupted one would draw next (a resumed run sees the batches it would have seen,
    without replaying the ones before)."""

    def __init__(self, make, seed: int, state: dict | None = None):
        """``make(rng)``: the endless generator of steps drawing from ``rng``."""
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        if state is not None:
            self.rng.bit_generator.state = state["rng"]
            self.steps = int(state["steps"])
        self._steps = make(self.rng)

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        step = next(self._steps)  # a generator draws a whole step and stops at its yield
        self.steps += 1
        return step

    def state(self) -> dict:
        return {"steps": self.steps, "rng": self.rng.bit_generator.state}
