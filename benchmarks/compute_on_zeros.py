"""Do a stage's programs run faster on zeros than on real data?

The `signal` configurations of ``benchmarks/train_pipeline.py`` (the no-communication
bound) move one byte per transfer, so their stages compute on zero activations and
zero cotangents. If XLA's kernels ran faster on zeros, the bound would be faster for
that alone. This times one middle stage of each model (the benchmark's width and
microbatch) forward and backward, in one process without a cap, four ways: zero or
real activations (stage 0's output on a random batch) times zero or random cotangents,
interleaved rounds, median; single-threaded per device, as the trainer's workers run XLA.

    .venv/bin/python benchmarks/compute_on_zeros.py       # ~1 min

Writes results.md and results.json under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def measure(repeat: int, width: int, rows: int, seq: int) -> list[dict]:
    """Median forward and backward milliseconds of each model's middle stage, per mix of
    zero or real activations and zero or random cotangents, with the trainer's own
    compiled programs (``StagePrograms``: the forward and the two backward halves)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from alpa_comm.models import build_model
    from alpa_comm.train.stage_runner import StagePrograms

    out = []
    for name, layers in (("utransformer", 8), ("gpt", 4)):
        print(f"{name}: compiling", file=sys.stderr, flush=True)
        m = build_model(name, 4, layers=layers, d=width, heads=4, seq=seq)
        rng = np.random.default_rng(0)
        batch = {k: jnp.asarray(rng.integers(0, 256, (rows, seq)), jnp.int32) for k in ("tokens", "targets")}
        x0 = m.stages[0](m.params[0], {}, batch)
        real = {k: x0[k] if k in x0 else jnp.asarray(rng.standard_normal((rows, seq, width)), jnp.float32)
                for k in m.consumes[1]}
        zeros = {k: jnp.zeros_like(v) for k, v in real.items()}
        programs = StagePrograms(m.stages[1])

        def run(x, zero_ct: bool):
            y, _ = programs.forward(m.params[1], x, batch)
            ct = jax.tree_util.tree_map(
                (lambda o: jnp.zeros_like(o)) if zero_ct
                else (lambda o: jnp.asarray(rng.standard_normal(o.shape) * 1e-3, o.dtype)), y)
            jax.block_until_ready(ct)
            t0 = time.perf_counter()
            y, state = programs.forward(m.params[1], x, batch)
            jax.block_until_ready(y)
            t1 = time.perf_counter()
            jax.block_until_ready(programs.backward(state, ct))
            return t1 - t0, time.perf_counter() - t1

        cases = {"zeros, zero cotangent (signal)": (zeros, True), "real, random cotangent (broadcast)": (real, False),
                 "real, zero cotangent": (real, True), "zeros, random cotangent": (zeros, False)}
        for c in cases.values():
            run(*c)  # compile and warm up
        times = {k: [] for k in cases}
        for _ in range(repeat):
            for k, c in cases.items():
                times[k].append(run(*c))
        for k, v in times.items():
            out.append({"model": name, "inputs": k, "forward_ms": 1e3 * statistics.median(t[0] for t in v),
                        "backward_ms": 1e3 * statistics.median(t[1] for t in v)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15, help="interleaved rounds (median)")
    p.add_argument("--width", type=int, default=256, help="model width d")
    p.add_argument("--rows", type=int, default=16, help="rows per microbatch")
    p.add_argument("--seq", type=int, default=64, help="tokens per row")
    p.add_argument("--out", default="benchmarks/results/compute_on_zeros", help="where results.md/.json go")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
    from alpa_comm.report.tables import table
    from alpa_comm.train.worker import xla_flags

    os.environ["XLA_FLAGS"] = xla_flags(1, os.environ.get("XLA_FLAGS", ""))  # before JAX starts
    rows = measure(args.repeat, args.width, args.rows, args.seq)
    md = ["# A stage's programs on zeros and on real data\n",
          f"Middle stage of each model (width {args.width}, {args.rows} rows x {args.seq} tokens), the trainer's "
          f"compiled programs, one process without a CPU cap, XLA single-threaded per device; median of "
          f"{args.repeat} interleaved rounds. `signal` runs compute on zeros, `broadcast` runs on real data. "
          f"Command: `.venv/bin/python benchmarks/compute_on_zeros.py --repeat {args.repeat} --width {args.width} "
          f"--rows {args.rows} --seq {args.seq}`.\n",
          table(["model", "activations, cotangents", "forward ms", "backward ms"],
                [[r["model"], r["inputs"], f"{r['forward_ms']:.2f}", f"{r['backward_ms']:.2f}"] for r in rows])]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print("\n".join(md))
    print(f"wrote {out}/results.md and results.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
