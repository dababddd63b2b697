"""Split backward: what BI and BW cost beside the whole backward, per model.

    python benchmarks/split_backward.py [--repeat 15] [--width 256] [--devices 1] [--out benchmarks/results/split_backward]

For one pipeline stage of each model (GPT and U-Transformer from ``alpa_comm.models``, GPT's
first stage, whose input is the batch, and a flax CNN the project did not write), the
stage's backward four ways, each compiled once
and timed (median of ``--repeat`` after a warm-up), and XLA's flop count of each:

* ``jax.vjp``: JAX's own pullback, the whole backward in one program;
* ``B``: ``split_vjp``'s two halves in one program (what the trainer runs unsplit);
* ``BI``, ``BW``: the halves alone (what a split schedule runs), and ``BI+BW``.

The claims it measures: BI + BW do the backward's work once (flops), BI is cheaper by the
weight-gradient products, and splitting costs no time (BI + BW against ``jax.vjp``).
Writes split_backward.md (the table and the command), .json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _placement(devices: int):
    """(split, replicate, pin): the batch split over ``devices`` CPU devices, parameters
    replicated, and each program's outputs pinned to the split layout, as the trainer
    places a stage over its host's devices; identities on one device."""
    import jax

    if devices == 1:
        return (lambda x: x), (lambda x: x), (lambda t: t)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < devices:  # JAX started before XLA_FLAGS was set, or another count won
        raise SystemExit(f"error: --devices {devices} but JAX sees {len(jax.devices())} devices")
    mesh = Mesh(np.array(jax.devices()[:devices]), ("d",))
    split, rep = NamedSharding(mesh, PartitionSpec("d")), NamedSharding(mesh, PartitionSpec())

    def pin(tree):
        return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, split) if x.ndim else x, tree)
    return (lambda x: jax.device_put(x, split)), (lambda t: jax.device_put(t, rep)), pin


def _models(width: int, devices: int = 1):
    import jax
    import jax.numpy as jnp

    from alpa_comm.models import build_model

    shard, replicate, pin = _placement(devices)
    seq, b = 64, 8
    batch = {"tokens": shard(jnp.zeros((b, seq), jnp.int32)), "targets": shard(jnp.zeros((b, seq), jnp.int32))}
    for name in ("gpt", "utransformer"):
        m = build_model(name, 2, layers=4, d=width, heads=4, seq=seq)
        inputs = {k: shard(jnp.full((b, seq, width), 0.1)) for k in m.consumes[1]}
        yield name, (lambda p, x, f=m.stages[1]: pin(f(p, x, batch))), replicate(m.params[1]), inputs
        if name == "gpt":  # a first stage: its input is the batch, no input cotangent is wanted
            yield "gpt-first", (lambda p, x, f=m.stages[0]: pin(f(p, x, batch))), replicate(m.params[0]), {}
    try:
        from flax import linen as nn
    except ImportError:  # flax is in the dev extras; without it the row is left out
        return

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(3):
                x = nn.gelu(nn.LayerNorm()(nn.Conv(width, (5,))(x)))
            return nn.Dense(10)(x.mean(1))

    cnn = CNN()
    x = shard(jnp.full((b, seq, width), 0.1))
    params = replicate(cnn.init(jax.random.PRNGKey(0), x))
    yield "flax-cnn", (lambda p, x: pin({"y": cnn.apply(p, x)})), params, x


def _time_interleaved(programs: dict, repeat: int) -> dict:
    """Median seconds of every program (key -> callable), timed in rounds that run each
    once after a warm-up: timing one program's repeats back to back let the machine's
    state at that moment decide (the same BW program measured 10.7 and 17.3 ms for two
    models whose BW compiles to the same HLO)."""
    import jax

    for f in programs.values():
        jax.block_until_ready(f())
    xs: dict = {k: [] for k in programs}
    for _ in range(repeat):
        for k, f in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            xs[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in xs.items()}


def _flops(fn, *args) -> float:
    import jax

    c = jax.jit(fn).lower(*args).compile().cost_analysis()
    return float((c[0] if isinstance(c, list) else c).get("flops", 0.0))


def measure(width: int, repeat: int, progress=print, devices: int = 1) -> list[dict]:
    import jax
    import numpy as np

    from alpa_comm.train import split_vjp

    rows, programs = [], {}
    for name, fn, params, inputs in _models(width, devices):
        out, pullback = jax.jit(lambda p, x: jax.vjp(fn, p, x))(params, inputs)
        _, bi, bw = jax.jit(lambda p, x: split_vjp(fn, p, x))(params, inputs)
        ct = jax.tree_util.tree_map(lambda o: np.ones(o.shape, o.dtype), out)
        run_vjp = jax.jit(lambda f, c: f(c))
        run_bi = jax.jit(lambda h, c: h(c))
        run_bw = jax.jit(lambda h, r: h(r))
        run_b = jax.jit(lambda h, w, c: w(h(c)[1]))
        _, residuals = run_bi(bi, ct)
        programs.update({(name, "jax.vjp"): lambda g=run_vjp, a=pullback, c=ct: g(a, c),
                         (name, "B"): lambda g=run_b, a=bi, w=bw, c=ct: g(a, w, c),
                         (name, "BI"): lambda g=run_bi, a=bi, c=ct: g(a, c),
                         (name, "BW"): lambda g=run_bw, w=bw, r=residuals: g(w, r)})
        f = {"jax.vjp": _flops(lambda g, c: g(c), pullback, ct), "BI": _flops(lambda h, c: h(c), bi, ct),
             "BW": _flops(lambda h, r: h(r), bw, residuals)}
        rows.append({"model": name, "vjp_gflop": f["jax.vjp"] / 1e9, "bi_gflop": f["BI"] / 1e9, "bw_gflop": f["BW"] / 1e9,
                     "residual_mib": sum(np.asarray(r).nbytes for r in jax.tree_util.tree_leaves(residuals)) / 2 ** 20})
        progress(f"{name}: compiled")
    times = _time_interleaved(programs, repeat)  # every model's programs in the same rounds
    for row in rows:
        t = {k: times[(row["model"], k)] for k in ("jax.vjp", "B", "BI", "BW")}
        row.update({"vjp_ms": t["jax.vjp"] * 1e3, "b_ms": t["B"] * 1e3, "bi_ms": t["BI"] * 1e3, "bw_ms": t["BW"] * 1e3,
                    "bi_plus_bw_ms": (t["BI"] + t["BW"]) * 1e3})
        progress(f"{row['model']}: jax.vjp {row['vjp_ms']:.1f} ms, BI {row['bi_ms']:.1f} + BW {row['bw_ms']:.1f} ms")
    return rows


def write(rows: list[dict], command: str, out: Path) -> None:
    from alpa_comm.report.tables import table

    out.mkdir(parents=True, exist_ok=True)
    headers = ["model", "jax.vjp ms", "B ms", "BI ms", "BW ms", "BI+BW ms", "BI+BW / jax.vjp", "GFLOP jax.vjp",
               "GFLOP BI", "GFLOP BW", "residuals MiB"]
    body = [[r["model"], f"{r['vjp_ms']:.1f}", f"{r['b_ms']:.1f}", f"{r['bi_ms']:.1f}", f"{r['bw_ms']:.1f}",
             f"{r['bi_plus_bw_ms']:.1f}", f"{r['bi_plus_bw_ms'] / r['vjp_ms']:.2f}", f"{r['vjp_gflop']:.3f}",
             f"{r['bi_gflop']:.3f}", f"{r['bw_gflop']:.3f}", f"{r['residual_mib']:.1f}"] for r in rows]
    md = ["# Split backward (`split_vjp`) beside the whole backward", "", f"`{command}`", "", table(headers, body), ""]
    (out / "split_backward.md").write_text("\n".join(md))
    (out / "split_backward.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["vjp_ms"] for r in rows], 0.4, label="jax.vjp (whole backward)")
    ax.bar([x + 0.2 for x in xs], [r["bi_ms"] for r in rows], 0.4, label="BI")
    ax.bar([x + 0.2 for x in xs], [r["bw_ms"] for r in rows], 0.4, bottom=[r["bi_ms"] for r in rows], label="BW")
    ax.set_xticks(list(xs), [r["model"] for r in rows])
    ax.set_ylabel("ms (median)")
    ax.set_title("split_vjp: BI + BW beside the whole backward (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "split_backward.png", dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--repeat", type=int, default=15, help="timed runs per program (median), after a warm-up")
    p.add_argument("--width", type=int, default=256, help="model width d (sequence 64, batch 8)")
    p.add_argument("--devices", type=int, default=1,
                   help="split the batch over this many CPU devices, parameters replicated, as the trainer "
                        "places a stage over its host's devices (default 1)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/split_backward"))
    args = p.parse_args(argv)
    if args.devices < 1 or 8 % args.devices:
        p.error(f"--devices must divide the batch of 8, got {args.devices}")
    if args.devices > 1:  # before JAX starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}").strip()
    if args.repeat < 1 or args.width < 4 or args.width % 4:
        p.error(f"--repeat must be >= 1 and --width a multiple of 4 (>= 4), got {args.repeat} and {args.width}")
    command = "python benchmarks/split_backward.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = measure(args.width, args.repeat, progress=lambda s: print(s, file=sys.stderr, flush=True),
                   devices=args.devices)
    write(rows, command.strip(), args.out)
    print((args.out / "split_backward.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
