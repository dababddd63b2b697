"""Run Alpa's own n-to-m resharding benchmark with and without alpa_comm (needs Alpa 0.2.3).

This is the check a user with an Alpa 0.2.3 installation (GPUs, Ray cluster with
enough hosts) runs to see the adapter work inside Alpa; it has NOT been run by
alpa_comm's authors, who had no Alpa installation. It drives Alpa's benchmark
script `benchmark/alpa/resharding/benchmark_cross_mesh_resharding.py` from
Alpa's source tree, once per case with Alpa's strategy generation and once
with alpa_comm's (the same replacement `comm_optimization="alpa_comm"` installs):

    python benchmarks/alpa_nm_suite.py --alpa-benchmark-dir ~/alpa/benchmark/alpa/resharding \
        [--cases case1,case2,...] [--out alpa_nm.json]

Each case runs in a fresh process (Alpa's benchmark initializes and shuts down
Ray per case); the JSON holds Alpa's measured mean and variance per run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, sys
sys.path.insert(0, {bench_dir!r})
import benchmark_cross_mesh_resharding as b
import suite
if {ours!r}:
    from alpa_comm.integrations import alpa as adapter
    import alpa.pipeline_parallel.cross_mesh_resharding as cmr
    adapter.install()
    def ours(mode):
        return staticmethod(lambda spec, *rest: adapter._strategy(cmr, spec, mode))
    cmr.CrossMeshCommunicator._generate_broadcast_resharding_strategy_by_loads = ours("broadcast")
    cmr.CrossMeshCommunicator._generate_send_recv_resharding_strategy_by_loads = ours("sendrecv")
case = suite.perf_n_to_m_suite[{case!r}]
r = b.benchmark_one_case_internal(case.src_mesh_shape, case.dst_mesh_shape, case.src_sharding_spec,
                                  case.dst_sharding_spec, case.tensor_shape, {mode!r}, {allgather!r}, "normal")
print("RESULT " + json.dumps(r, default=str))
'''

RUNS = [("alpa send_recv + local allgather", "send_recv", True, False),
        ("alpa broadcast", "broadcast", False, False),
        ("alpa_comm broadcast", "broadcast", False, True)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alpa-benchmark-dir", required=True, help="Alpa's benchmark/alpa/resharding directory")
    p.add_argument("--cases", default="case1,case2,case3,case4,case5,case6,case7,case9")
    p.add_argument("--out", default="alpa_nm.json")
    args = p.parse_args(argv)
    bench_dir = str(Path(args.alpa_benchmark_dir).expanduser().resolve())
    if not Path(bench_dir, "benchmark_cross_mesh_resharding.py").exists():
        print(f"alpa_nm_suite: {bench_dir} has no benchmark_cross_mesh_resharding.py", file=sys.stderr)
        return 2
    results = []
    for case in args.cases.split(","):
        for label, mode, allgather, ours in RUNS:
            print(f"{case}: {label} ...", file=sys.stderr, flush=True)
            code = CHILD.format(bench_dir=bench_dir, ours=ours, case=case, mode=mode, allgather=allgather)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(out.stderr[-2000:], file=sys.stderr)
                results.append({"case": case, "run": label, "error": out.stderr[-500:]})
                continue
            r = json.loads(line[len("RESULT "):])
            results.append({"case": case, "run": label, **r})
            print(f"  {r['exec_time_mean']:.4f} s", file=sys.stderr)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
