"""Move a ``jax.Array`` from two processes' devices onto a third process, in another layout.

    python examples/jax_quickstart.py

Starts three processes of one ``jax.distributed`` program on this computer, each with 2
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``). Processes 0 and 1
hold an 8 x 6 float32 array with its rows sharded over their 4 devices; one
``alpa_comm.jax.reshard`` call gives process 2 the array split by column over its 2
devices (a layout change that JAX's own ``device_put`` refuses across processes), and a
``reshard_tree`` call moves a dict of arrays in one plan. Process 2 checks every shard it
received against NumPy, bit for bit, and prints them.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

WORLD, DEVICES = 3, 2


def run_process(rank: int, coordinator: str) -> None:
    """One process of the program; every process runs the same calls."""
    import jax

    jax.distributed.initialize(coordinator_address=coordinator, num_processes=WORLD, process_id=rank)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from alpa_comm.jax import reshard, reshard_tree

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    train = Mesh(np.array(devices[:4]).reshape(2, 2), ("fsdp", "tp"))  # processes 0 and 1
    infer = Mesh(np.array(devices[4:]).reshape(1, 2), ("dp", "tp"))  # process 2

    def global_array(values, sharding):
        """Every process makes the global array from the shards it holds; process 2 holds
        none, so the callback never runs there and ``dtype=`` says what the array holds."""
        return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index], dtype=values.dtype)

    host = np.arange(48, dtype=np.float32).reshape(8, 6)
    bias = np.arange(6, dtype=np.int32)
    x = global_array(host, NamedSharding(train, P(("fsdp", "tp"))))  # rows over 4 devices
    b = global_array(bias, NamedSharding(train, P()))  # replicated

    y = reshard(x, NamedSharding(infer, P(None, "tp")))  # every process of both meshes calls it
    same = reshard(x, (infer, "RS1"))  # the same destination in alpa_comm's notation
    tree = reshard_tree({"w": x, "b": b}, {"w": NamedSharding(infer, P()), "b": NamedSharding(infer, P("tp"))})

    for name, got, want in [("y", y, host), ("same", same, host), ("w", tree["w"], host), ("b", tree["b"], bias)]:
        for shard in got.addressable_shards:  # none on processes 0 and 1: they only send
            assert np.array_equal(np.asarray(shard.data), want[shard.index]), (name, shard.device)
    if rank == 2:
        for shard in y.addressable_shards:
            print(f"process 2, {shard.device}, columns {shard.index[1].start}-{shard.index[1].stop - 1}:\n"
                  f"{np.asarray(shard.data)}")
        print("process 2: every shard bit-exact", flush=True)
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        run_process(args.rank, args.coordinator)
        return 0
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--coordinator", coordinator], env=env)
             for r in range(WORLD)]
    deadline = time.monotonic() + 120
    while any(q.poll() is None for q in procs) and time.monotonic() < deadline:
        if any(q.poll() not in (None, 0) for q in procs):  # one failed: the others would wait for it
            break
        time.sleep(0.1)
    for q in procs:
        if q.poll() is None:
            q.kill()
    codes = [q.wait() for q in procs]
    if any(codes):
        print(f"exit codes by process: {codes}", file=sys.stderr)
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
