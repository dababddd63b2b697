"""The workloads the benchmarks move, and the tests and scripts that reuse them: plain
shapes and NumPy arrays, nothing measured here.

* ``weight_sync_trees``: transformer-shaped parameter trees (shape, training spec,
  inference spec per leaf) for the weight-sync suite on a cluster of host workers;
* ``transformer_weights``: a transformer's float32 weights by name, at a given size, for
  weight sync between JAX processes;
* ``SYNC_LAYOUTS``: the inference meshes those processes sync into.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Param:
    """One parameter of a weight-sync tree: its shape and its training / inference specs."""

    shape: tuple
    train: str
    infer: str


WEIGHT_SYNC_SRC, WEIGHT_SYNC_DST = "2x4@0,1", "1x4@2"
"""The training mesh (2 hosts x 4 devices) and the inference mesh (4 devices of a third host)."""


def weight_sync_trees() -> dict[str, dict]:
    """Transformer-shaped parameter trees, each leaf (shape, training spec, inference spec):
    training fully sharded over 2 hosts x 4 devices, inference tensor-parallel over 4
    devices of one host (the RL post-training weight sync).

    * small-leaves: 12 layers of width 128 (150 arrays, 512 B to 256 KiB, median 512 B);
    * large-leaves: 6 layers of width 512, matrices only (24 arrays of 1-4 MiB)."""
    small = {"embed": Param((512, 128), "S01R", "RS1"), "pos": Param((128, 128), "S01R", "RR"),
             "layers": [_layer(128) for _ in range(12)],
             "final_ln": [Param((128,), "S01", "R"), Param((128,), "S01", "R")]}
    large = {"layers": [_layer(512, vectors=False) for _ in range(6)]}
    return {"small-leaves": small, "large-leaves": large}


def _layer(d: int, vectors: bool = True) -> dict:
    """One transformer layer of width ``d``: matrices split along the model dim for
    inference, vectors (biases, norms) split or replicated."""
    out = {"qkv": Param((d, 3 * d), "S01R", "RS1"), "out": Param((d, d), "S01R", "S1R"),
           "mlp1": Param((d, 4 * d), "S01R", "RS1"), "mlp2": Param((4 * d, d), "S01R", "S1R")}
    if vectors:
        out.update({"qkv_b": Param((3 * d,), "S01", "S1"), "out_b": Param((d,), "S01", "R"),
                    "mlp1_b": Param((4 * d,), "S01", "S1"), "mlp2_b": Param((d,), "S01", "R"),
                    "ln1": [Param((d,), "S01", "R"), Param((d,), "S01", "R")],
                    "ln2": [Param((d,), "S01", "R"), Param((d,), "S01", "R")]})
    return out


WIDTH = 256
"""The model width of ``transformer_weights`` unless told otherwise."""


def transformer_weights(size_mb: float, width: int = WIDTH, seed: int = 0) -> dict[str, np.ndarray]:
    """A transformer's weights, flat by name, about ``size_mb`` MiB of float32: per layer
    attention (4 d x d) and MLP (d x 4d, 4d x d) matrices plus two norm vectors."""
    per_layer = 12 * width * width * 4
    layers = max(1, round(size_mb * 2**20 / per_layer))
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        for k in ("wq", "wk", "wv", "wo"):
            out[f"l{i}.attn.{k}"] = rng.standard_normal((width, width), dtype=np.float32)
        out[f"l{i}.mlp.w1"] = rng.standard_normal((width, 4 * width), dtype=np.float32)
        out[f"l{i}.mlp.w2"] = rng.standard_normal((4 * width, width), dtype=np.float32)
        out[f"l{i}.norm1"] = rng.standard_normal((width,), dtype=np.float32)
        out[f"l{i}.norm2"] = rng.standard_normal((width,), dtype=np.float32)
    return out


SYNC_LAYOUTS = {"tp-in-host": (4, 2), "tp-across-hosts": (2, 4)}
"""Inference meshes (replicas, tensor-parallel devices) of the weight sync between JAX
processes: 4 replicas of one host's 2 devices each, or 2 replicas spanning 2 hosts each."""
