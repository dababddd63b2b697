"""The NCCL model across processes (``alpa_comm.testing.nccl_model_remote``): ranks in
separate processes, each a client of one model world served from the test's process, run
the real ``NcclBackend``; the model's rules and its deadlock report hold across them.
(``alpa_comm.jax`` with ``backend="nccl"`` on it: tests/test_jax_processes.py.)"""
import os
import subprocess
import sys

from alpa_comm.testing import nccl_model as M
from alpa_comm.testing.nccl_model_remote import serve

RANK = r'''
import sys
import numpy as np
from alpa_comm.testing.nccl_model_remote import connect_from_env
assert connect_from_env()
import cupy
from alpa_comm.runtime.backend import NcclBackend
from alpa_comm.testing.ungrouped_nccl import ungrouped

rank, world, uid, kind = int(sys.argv[1]), int(sys.argv[2]), tuple(map(int, sys.argv[3].split(","))), sys.argv[4]
backend = (ungrouped(NcclBackend) if kind == "ungrouped" else NcclBackend)(rank, world, uid, timeout=20)
flat = cupy.asarray(np.arange(1001, dtype=np.float32) * (rank + 1))
try:
    backend.allreduce_sum(flat, list(range(world)), 0)
except Exception as e:
    print("ERROR", type(e).__name__, str(e).replace("\n", " | "), flush=True)
    sys.exit(0)
want = np.arange(1001, dtype=np.float32) * sum(range(1, world + 1))
print("EXACT" if np.array_equal(flat.get(), want) else "WRONG", flush=True)
backend.barrier()
'''


def _run_ranks(world: int, kind: str) -> list[str]:
    with serve() as server:
        uid = ",".join(map(str, M._ACTIVE.new_uid()))
        env = dict(os.environ, **server.env())
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), uid, kind], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err[-2000:]
            outs.append(out.strip())
    return outs


def test_the_ring_all_reduce_across_processes_is_exact():
    assert _run_ranks(3, "grouped") == ["EXACT"] * 3


def test_the_ungrouped_ring_deadlocks_across_processes_and_is_named():
    """Today's deadlock, with ranks as processes: every rank gets the report, which names
    the ring step where each blocked send was issued (the client's own stack)."""
    outs = _run_ranks(3, "ungrouped")
    for out in outs:
        assert out.startswith("ERROR NcclDeadlock"), out
        assert "exchange <- runtime/backend.py" in out and "ring_allreduce_sum" in out, out
        assert "needs: rank" in out, out
