"""Weight sync between process groups: a training group pushes a transformer's weights to
two inference groups every step, with ``alpa_comm.jax.reshard_tree``.

    python examples/weight_sync.py [--steps 3] [--layers 4] [--width 256] [--wire-dtype bfloat16]

Four processes of one ``jax.distributed`` program on this machine, 2 CPU devices each
(launched by this script with ``alpa_comm.jax.launch``):

* training, processes 0-1: mesh (data=2, fsdp=2), every weight sharded FSDP-style
  along its first dim over all 4 devices;
* inference, processes 2-3: mesh (replica=2, tp=2), two tensor-parallel groups (matrices
  split by column over each process's 2 devices), one replica per process.

Every step the trainer's weights change; one ``reshard_tree`` call (one plan, made on the
first step and cached, small weights packed) moves them all to both inference groups,
and each inference process checks every shard it received against the trainer's values
(bit-exact; with ``--wire-dtype bfloat16``, equal to the values rounded to bfloat16 and
received as float32). Prints seconds and bytes per sync.
"""
from __future__ import annotations

import argparse
import sys
import time

WORLD, DEVICES = 4, 2


def weights(layers: int, width: int, step: int):
    """The model's weights at ``step`` (deterministic: every process can compute them)."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = {"embed": rng.standard_normal((1024, width)).astype(np.float32)}
    for i in range(layers):
        out[f"layer{i}"] = {
            "attn": {k: rng.standard_normal((width, width)).astype(np.float32) for k in ("wq", "wk", "wv", "wo")},
            "mlp": {"w1": rng.standard_normal((width, 4 * width)).astype(np.float32),
                    "w2": rng.standard_normal((4 * width, width)).astype(np.float32)},
            "norm": np.ones(width, np.float32)}
    return _map(lambda w: w + np.float32(0.01 * step), out)


def _map(f, tree):
    return {k: _map(f, v) for k, v in tree.items()} if isinstance(tree, dict) else f(tree)


def run_rank(args) -> int:
    from alpa_comm.jax.launch import worker_init

    rank, _, _ = worker_init()
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import reshard_tree
    from alpa_comm.runtime.executor import numpy_dtype

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    train = Mesh(np.array(devices[:4]).reshape(2, 2), ("data", "fsdp"))
    infer = Mesh(np.array(devices[4:]).reshape(2, 2), ("replica", "tp"))

    def train_sharding(w):
        return NamedSharding(train, P(("data", "fsdp")) if w.shape[0] % 4 == 0 else P())

    def infer_sharding(w):
        return NamedSharding(infer, P(None, "tp") if w.ndim == 2 else P())

    trainer = rank < 2
    for step in range(args.steps):
        host = weights(args.layers, args.width, step)
        params = _map(lambda w: jax.make_array_from_callback(w.shape, train_sharding(w), lambda i, w=w: w[i],
                                                             dtype=w.dtype), host)
        targets = _map(infer_sharding, host)
        t0 = time.perf_counter()
        got = reshard_tree(params, targets, wire_dtype=args.wire_dtype)
        seconds = time.perf_counter() - t0
        wrong = 0
        if not trainer:
            def expect(w):
                return w.astype(numpy_dtype(args.wire_dtype)).astype(w.dtype) if args.wire_dtype else w

            flat_got, flat_want = [], []
            _map(flat_got.append, got)
            _map(lambda w: flat_want.append(expect(w)), host)
            for y, w in zip(flat_got, flat_want):
                wrong += sum(not np.array_equal(np.asarray(s.data), w[s.index]) for s in y.addressable_shards)
        nbytes = sum(w.nbytes for w in _flat(host)) // (2 if args.wire_dtype else 1)
        print(f"progress: rank {rank} step {step}: synced {nbytes / 2**20:.1f} MiB of weights in {seconds:.3f} s"
              + ("" if trainer else f", {wrong} wrong shards"), file=sys.stderr, flush=True)
        if wrong:
            return 1
    jax.distributed.shutdown()
    return 0


def _flat(tree):
    out = []
    _map(out.append, tree)
    return out


def parse_args(doc: str, argv, extra=None):
    """The options both weight-sync examples take, checked (``extra(p)`` adds more)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    p.add_argument("--steps", type=int, default=3, help="training steps, one sync each (default 3)")
    p.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    p.add_argument("--width", type=int, default=256, help="model width (default 256)")
    p.add_argument("--wire-dtype", default=None, help="e.g. bfloat16: weights travel in it, arrive as float32")
    if extra:
        extra(p)
    args = p.parse_args(argv)
    for name in ("steps", "layers", "width"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.width % 4:
        p.error(f"--width must be a multiple of 4 (FSDP over 4 devices), got {args.width}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(__doc__, argv, lambda p: p.add_argument("--worker", action="store_true",
                                                              help=argparse.SUPPRESS))
    if args.worker:
        return run_rank(args)
    from alpa_comm.jax.launch import launch

    print(f"launching {WORLD} processes (training: 0-1, inference: 2-3) ...", file=sys.stderr, flush=True)
    outs = launch(WORLD, DEVICES, [sys.executable, __file__, *argv, "--worker"], timeout=600, fail_fast=True,
                  progress=lambda line: print(line, flush=True))
    failed = [o for o in outs if o.returncode != 0]
    for o in failed:
        print(f"process {o.rank} failed (exit code {o.returncode}):\n{o.stderr[-2000:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
