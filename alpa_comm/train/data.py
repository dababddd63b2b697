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


def batches(corpus: np.ndarray, num_microbatches: int, microbatch: int, seq: int, seed: int = 0):
    """Endless training steps: each a list of microbatches {tokens, targets} of random windows."""
    rng = np.random.default_rng(seed)
    while True:
        step = []
        for _ in range(num_microbatches):
            starts = rng.integers(0, len(corpus) - seq - 1, microbatch)
            win = np.stack([corpus[s:s + seq + 1] for s in starts]).astype(np.int32)
            step.append({"tokens": win[:, :-1], "targets": win[:, 1:]})
        yield step


def synthetic(num_microbatches: int, microbatch: int, seq: int, seed: int = 0, vocab: int = 256):
    """Endless steps of uniformly random tokens (benchmarks: no corpus, same shapes)."""
    rng = np.random.default_rng(seed)
    while True:
        step = []
        for _ in range(num_microbatches):
            win = rng.integers(0, vocab, (microbatch, seq + 1), dtype=np.int32)
            step.append({"tokens": win[:, :-1], "targets": win[:, 1:]})
        yield step
