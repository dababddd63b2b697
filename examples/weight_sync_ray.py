"""Weight sync between separate JAX programs in Ray actors: a trainer pushes a
transformer's weights to two inference engines every step.

    python examples/weight_sync_ray.py [--steps 3] [--layers 4] [--width 256] [--wire-dtype bfloat16]

Four Ray actors on a local Ray instance, 2 CPU devices each:

* the trainer, actors 0-1: one 2-process ``jax.distributed`` program, mesh (data=2,
  fsdp=2), every weight sharded FSDP-style along its first dim over its 4 devices;
* two inference engines, actors 2 and 3: each its own single-process JAX program, its
  matrices split by column over its 2 devices (tensor parallel).

No ``NamedSharding`` spans the trainer and an engine, so each actor passes the side it
has: the trainer its global arrays (``reshard_tree(params, None)``), each engine the
shardings it wants in its own program (``reshard_tree(None, targets)``). The four meet
as ``ProcessGroup.from_ray("weights", rank, 4)``; one exchange per call merges the picture
and one joint plan (made on the first step, then reused) moves everything. Each engine
checks every shard it received (bit-exact; with ``--wire-dtype bfloat16``: the values
rounded to bfloat16, received as float32).
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINER, ENGINES, DEVICES = (0, 1), (2, 3), 2


class Actor:
    """One member: its own JAX; the trainer's two actors are one jax.distributed program."""

    def __init__(self, rank: int, coordinator: str):
        import jax

        jax.config.update("jax_num_cpu_devices", DEVICES)
        if rank in TRAINER:
            jax.distributed.initialize(coordinator, num_processes=len(TRAINER), process_id=rank)
        from alpa_comm.jax import ProcessGroup

        self.rank = rank
        self.group = ProcessGroup.from_ray("weights", rank, len(TRAINER) + len(ENGINES))

    def sync(self, layers: int, width: int, step: int, wire_dtype):
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        from alpa_comm.jax import reshard_tree
        from alpa_comm.runtime.executor import numpy_dtype
        from weight_sync import _flat, _map, weights

        host = weights(layers, width, step)
        t0 = time.perf_counter()
        if self.rank in TRAINER:
            devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
            mesh = Mesh(np.array(devices).reshape(2, 2), ("data", "fsdp"))

            def put(w):
                spec = P(("data", "fsdp")) if w.shape[0] % 4 == 0 else P()
                return jax.make_array_from_callback(w.shape, NamedSharding(mesh, spec), lambda i: w[i],
                                                    dtype=w.dtype)
            reshard_tree(_map(put, host), None, group=self.group, wire_dtype=wire_dtype)
            return time.perf_counter() - t0, None
        mesh = Mesh(np.array(jax.devices()), ("tp",))
        got = reshard_tree(None, _map(lambda w: NamedSharding(mesh, P(None, "tp") if w.ndim == 2 else P()), host),
                           group=self.group)
        seconds = time.perf_counter() - t0
        want = _flat(host)
        if wire_dtype:
            want = [w.astype(numpy_dtype(wire_dtype)).astype(w.dtype) for w in want]
        wrong = sum(not np.array_equal(np.asarray(s.data), w[s.index])
                    for y, w in zip(_flat(got), want) for s in y.addressable_shards)
        return seconds, wrong


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    from weight_sync import parse_args

    args = parse_args(__doc__, argv)
    import ray

    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": path}})
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            coordinator = f"127.0.0.1:{s.getsockname()[1]}"
        print("starting 4 Ray actors (trainer: 0-1, one JAX program; engines: 2 and 3, one each) ...",
              file=sys.stderr, flush=True)
        actors = [ray.remote(num_cpus=0)(Actor).remote(r, coordinator) for r in TRAINER + ENGINES]
        for step in range(args.steps):
            out = ray.get([a.sync.remote(args.layers, args.width, step, args.wire_dtype) for a in actors],
                          timeout=600)
            wrong = sum(w for _, w in out[len(TRAINER):])
            print(f"step {step}: synced in {max(s for s, _ in out):.3f} s, engines found {wrong} wrong shards",
                  flush=True)
            if wrong:
                return 1
        return 0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
