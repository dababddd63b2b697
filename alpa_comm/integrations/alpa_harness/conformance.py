"""Conformance of the Alpa adapter on Alpa 0.2.3's own code.

For each case — one pipeline stage boundary: a source mesh, a destination mesh and
the tensors that cross it — this builds Alpa's real ``CrossMeshCommunicator`` from
Alpa's ``XlaShardedPipelineComputation`` stages and ``PipeDreamFlush`` schedule,
once per mode:

* ``alpa``: Alpa as shipped (``resharding_mode="send_recv"``, ``normal`` load balance,
  its local all-gather rewrite);
* ``alpa_send_recv``: the same without the local all-gather (``use_local_allgather=False``);
* ``alpa_broadcast``: Alpa's own broadcast mode;
* ``alpa_comm``: after ``configure("alpa_comm")`` (alpa_comm's plan of the whole
  boundary, handed to Alpa as its broadcast strategy);
* ``alpa_comm_sendrecv``: the same, with Alpa switched back to send/recv mode (our plan
  as Alpa's send/recv strategy, after Alpa's local all-gather rewrite);

then compiles every tensor's task list with Alpa's own ``Symbolic*ReshardingTask``,
runs it on NumPy buffers (``alpa_objects.execute``) and checks every destination
tile bit-exact. ``cases()`` gives Alpa's n-to-m and 1-to-m suites, several tensors
per boundary and meshes sliced inside one host, as JSON; ``run`` must run in a
harness process (``loader.load_package`` first) and returns one row per (case, mode).
"""
from __future__ import annotations

from ...errors import InvalidOptionError
from ...mesh import DeviceMesh
from ...spec import ShardingSpec
from ...topology import PAPER_TESTBED
from ...validation import one_of

MODES = ("alpa", "alpa_send_recv", "alpa_broadcast", "alpa_comm", "alpa_comm_sendrecv")
GIB = (1 << 30) / 4
"""float32 elements in 1 GiB."""
SMALL = {3: (24, 8, 4), 1: (24,)}
"""Alpa's suite cases at a size whose every element is checked (same meshes, specs and
divisibility as the suites)."""


# ------------------------------------------------------------- the cases (pure)
def side(mesh: DeviceMesh, devices=None) -> dict:
    """A mesh as Alpa's ``VirtualPhysicalMesh`` arguments: its hosts, the GPUs it uses on
    each (Alpa's ``num_devices_per_host`` is the mesh's width per host, which may be less
    than the host has) and, for a mesh sliced inside its hosts, their local ids
    (``devices``; by default read off the mesh's device ids)."""
    if devices is None:
        per_host: dict[int, list[int]] = {}
        for d in mesh.devices:
            per_host.setdefault(int(d) // mesh.devices_per_host, []).append(int(d) % mesh.devices_per_host)
        devices = [per_host[h] for h in mesh.hosts]
        if all(ids == list(range(len(ids))) for ids in devices):
            devices = None
        width = len(per_host[mesh.hosts[0]])
    else:
        width = len(devices[0])
    return {"hosts": list(mesh.hosts), "dph": width, "devices": devices}


def tensor(shape, src_mesh: DeviceMesh, src_spec, dst_mesh: DeviceMesh, dst_spec) -> dict:
    """One tensor of a boundary, its specs in the form Alpa's auto-sharding emits."""
    def form(mesh, spec):
        alpa = ShardingSpec.parse(spec).to_alpa(mesh.shape, canonical=True) if isinstance(spec, str) else spec
        return {"sharding": ["N" if type(s).__name__ == "NoSharding" else [int(c) for c in s.chunks]
                             for s in alpa.sharding],
                "mapping": [["S", int(m.axis)] if type(m).__name__ == "ShardedAxis" else ["R", int(m.replicas)]
                            for m in alpa.mesh_mapping]}

    return {"shape": list(shape), "src": form(src_mesh, src_spec), "dst": form(dst_mesh, dst_spec)}


def _mesh(text: str) -> DeviceMesh:
    return DeviceMesh.parse(text, int(text.split("@")[0].split("x")[1]))


def cases() -> list[dict]:
    """Every n-to-m and 1-to-m suite case, three tensors on one boundary, and meshes sliced
    inside hosts (two stages on one 4-GPU host; two hosts each split between stages)."""
    from ...suites import n_to_m, one_to_m

    import math

    out = []
    for c in n_to_m() + one_to_m():  # the paper's sizes: 2 GiB (n-to-m), 1 GiB (1-to-m)
        src, dst = _mesh(c.src_mesh), _mesh(c.dst_mesh)
        small = SMALL[len(c.shape)]
        # checked element by element at ``small``; bytes and times reported at the paper's size
        # (every piece is the same fraction of the tensor at both sizes)
        out.append({"name": f"{c.suite} {c.name}", "src": side(src), "dst": side(dst), "paper_shape": list(c.shape),
                    "scale": math.prod(c.shape) / math.prod(small),
                    "tensors": [tensor(small, src, c.src_spec, dst, c.dst_spec)]})
    # the other cases: bytes reported as if the first tensor were 1 GiB (the others in proportion)
    src, dst = _mesh("2x4@0,1"), _mesh("2x4@2,3")
    out.append({"name": "three tensors, one boundary", "src": side(src), "dst": side(dst), "scale": GIB / (24 * 8 * 4),
                "tensors": [tensor((24, 8, 4), src, "S0S1R", dst, "RRR"),
                            tensor((16, 16), src, "RR", dst, "S01R"),
                            tensor((8, 32), src, "S1S0", dst, "RS0")]})
    one = DeviceMesh.parse("1x2@0", 4)
    out.append({"name": "sliced: GPUs 0,1 -> 2,3 of one host", "src": side(one, [[0, 1]]), "scale": GIB / (8 * 16),
                "dst": side(one, [[2, 3]]),
                "tensors": [tensor((8, 16), one, "S1R", one, "RS1"), tensor((16,), one, "R", one, "S1")]})
    two = DeviceMesh.parse("2x2@0,1", 4)
    out.append({"name": "sliced: 2 hosts, GPUs 0,1 -> 2,3", "src": side(two, [[0, 1], [0, 1]]),
                "scale": GIB / (8 * 8 * 4),
                "dst": side(two, [[2, 3], [2, 3]]),
                "tensors": [tensor((8, 8, 4), two, "S0S1R", two, "RRS01"), tensor((8, 8), two, "RR", two, "S1S0")]})
    return out


# -------------------------------------------------- in the harness process only
def nic_seconds(messages, nic_gbps: float = PAPER_TESTBED["nic_send_gbps"],
                latency_s: float = PAPER_TESTBED["latency_s"]) -> float:
    """The same simple model for every mode: the busiest NIC side's bytes at the paper's
    testbed rate, plus one latency per message it handles. Messages inside a host are free
    (NVLink)."""
    out, into, n_out, n_in = {}, {}, {}, {}
    for a, b, nbytes, *_ in messages:
        if a == b:
            continue
        out[a], n_out[a] = out.get(a, 0) + nbytes, n_out.get(a, 0) + 1
        into[b], n_in[b] = into.get(b, 0) + nbytes, n_in.get(b, 0) + 1
    rate = nic_gbps * 1e9 / 8
    times = [out[h] / rate + n_out[h] * latency_s for h in out] + [into[h] / rate + n_in[h] * latency_s for h in into]
    return max(times, default=0.0)


def _communicator(case, mode):
    """Alpa's communicator for the case's boundary, built by Alpa's own code in ``mode``."""
    import alpa
    from alpa.pipeline_parallel.computation import XlaShardedPipelineComputation
    from alpa.pipeline_parallel.cross_mesh_resharding import CrossMeshCommunicator
    from alpa.pipeline_parallel.schedules import PipeDreamFlush, gen_linear_pipeline_dependency

    from alpa_comm.integrations import alpa as adapter

    from .alpa_objects import Var, mesh_of, spec_of

    adapter.configure("alpa_comm" if mode.startswith("alpa_comm") else "off")
    alpa.global_config.resharding_mode = ("send_recv" if mode in ("alpa", "alpa_send_recv", "alpa_comm_sendrecv")
                                          else "broadcast")
    alpa.global_config.use_local_allgather = mode != "alpa_send_recv"
    src_mesh, dst_mesh = mesh_of(case["src"]), mesh_of(case["dst"])
    xs = [Var(f"x{i}", t["shape"]) for i, t in enumerate(case["tensors"])]
    grad = Var("g", (1,))
    stages = [  # forward 0 on the source mesh sends xs to forward 1; the backward stages exchange nothing
        XlaShardedPipelineComputation(name="fwd0", invars=[], outvars=list(xs), input_sharding_specs=[],
                                      output_sharding_specs=[spec_of(t["src"]) for t in case["tensors"]]),
        XlaShardedPipelineComputation(name="fwd1", invars=list(xs), outvars=[],
                                      input_sharding_specs=[spec_of(t["dst"]) for t in case["tensors"]],
                                      output_sharding_specs=[]),
        XlaShardedPipelineComputation(name="bwd1", invars=[], outvars=[grad], input_sharding_specs=[],
                                      output_sharding_specs=[spec_of(case["tensors"][0]["src"])]),
        XlaShardedPipelineComputation(name="bwd0", invars=[], outvars=[], input_sharding_specs=[],
                                      output_sharding_specs=[]),
    ]
    schedule = PipeDreamFlush(dependency=gen_linear_pipeline_dependency(4), meshes=[src_mesh, dst_mesh],
                              apply_grad_placement={}, num_batch=1)
    return CrossMeshCommunicator(stages, schedule), src_mesh, dst_mesh, xs


def run_case(case: dict, mode: str) -> dict:
    """One row: the case in ``mode``, every tensor's compiled tasks executed and checked."""
    from .alpa_objects import check_delivery, compile_task, execute, values

    one_of(mode, MODES, "conformance mode")
    row = {"case": case["name"], "mode": mode}
    try:
        comm, src_mesh, dst_mesh, xs = _communicator(case, mode)
    except AssertionError as e:  # Alpa's own asserts (e.g. its local all-gather rewrite)
        return {**row, "verified": False, "error": f"Alpa refused: {e}"}
    specs = comm.resharding_specs[0][1]
    wrong, messages, sends, operations = [], [], [], 0
    for i, var in enumerate(xs):
        spec = specs[var]
        x = values(var.aval.shape, i)
        buffers, msgs, ops = execute(compile_task(spec, src_mesh, dst_mesh), spec, x)
        wrong += [f"{var}:{d}" for d in check_delivery(spec, x, buffers)]
        messages += msgs
        operations += ops
        sends += [(var.name, *m[3:]) for m in msgs]
    scale = case.get("scale", 1)
    messages = [(a, b, nbytes * scale, *rest) for a, b, nbytes, *rest in messages]
    out, into = {}, {}
    for a, b, nbytes, *_ in messages:
        if a != b:
            out[a] = out.get(a, 0) + nbytes
            into[b] = into.get(b, 0) + nbytes
    return {**row, "verified": not wrong, "wrong": wrong[:8], "tensors": len(xs), "bytes_scale": scale,
            "max_host_in_bytes": int(max(into.values(), default=0)),
            "max_host_out_bytes": int(max(out.values(), default=0)),
            "total_bytes": int(sum(m[2] for m in messages)), "transfers": operations,
            "resent": len(sends) - len(set(sends)),
            "predicted_seconds": nic_seconds(messages)}


def run(cases_: list[dict], modes=MODES) -> list[dict]:
    return [run_case(c, m) for c in cases_ for m in modes]


def compiled_sends(case: dict, mode: str) -> list[list]:
    """Per tensor of the case, the point-to-point messages Alpa compiles in ``mode``
    (``alpa`` or ``alpa_send_recv``), in Alpa's order: [sender device string, receiver
    device string, global box]. Re-sends included. Compiling is symbolic: the case's
    shapes may be any size."""
    from .alpa_objects import HOST_IP as HOST, compile_task, global_box

    if mode not in ("alpa", "alpa_send_recv"):
        raise InvalidOptionError(f"Alpa compiles point-to-point sends in modes alpa and alpa_send_recv, not {mode!r}")
    comm, src_mesh, dst_mesh, xs = _communicator(case, mode)
    out = []
    for var in xs:
        spec = comm.resharding_specs[0][1][var]
        task = compile_task(spec, src_mesh, dst_mesh)
        ranks = task.collective_group.rank_host
        sends = []
        for worker, tasks in task.sender_tasks.items():
            for t in tasks:
                src = f"{HOST}:gpu:{t.device_id}".format(worker.host)
                dst = f"{HOST}:gpu:{t.tile_spec.gpu_idx}".format(ranks[t.tile_spec.rank])
                sends.append([src, dst, [list(b) for b in global_box(spec, src, t.tile_spec.offset)]])
        out.append({"sends": sends, "sent_spec_rewritten": spec.dst_sharding_spec != spec.final_dst_spec})
    return out
