"""Backward weight delaying inside Alpa 0.2.3, on Alpa's own classes: its
``JaxPipelineComputation`` stages (merged layers in nested ``named_call``s, markers,
gradient accumulators) split into input- and weight-gradient computations through the
adapter's wrapper of Alpa's ``compile_pipeshard_executable_internal``; Alpa's own
``gen_dependency_with_stages`` on the split stages; the schedule Alpa's dispatch builds;
and Alpa's ``PipelineInstEmitter`` emitting each mesh's instructions, where every
weight-gradient computation runs after the send of its input gradient.

What cannot run here (Alpa's jaxlib): the jaxpr tracing and slicing before stage
construction, auto-sharding and XLA compilation of the stages; the stages are built in
Alpa's layout from stand-in equations instead, and evaluated on NumPy."""
import pytest

from alpa_comm.integrations.alpa_weight_delay import WeightDelayError, inline_calls

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def harness():
    from conftest import alpa_package_runner

    return alpa_package_runner()


SPLIT = r'''
import types
import numpy as np
import alpa.pipeline_parallel.compile_executable as ce
import alpa.pipeline_parallel.schedules as schedules
from alpa_comm.integrations.alpa_harness import pipeline_objects as po
from alpa_comm.integrations.alpa_harness.alpa_objects import mesh_of
from alpa_comm.integrations.alpa_translate import validate_clocks

S, M = 3, 4
meshes = [mesh_of({"hosts": [h], "dph": 2}) for h in range(S)]
P = po.pipeline(S)
original = list(P["stages"])

class Captured(Exception):
    pass

def capture(jax_all_stages, sliced_meshes, schedule, *args, **kwargs):
    raise Captured(jax_all_stages, schedule)

# stand-ins for the steps that need jaxprs traced by Alpa's jax or XLA; the dispatch, the
# dependency generator and the schedule base classes are Alpa's own
ce.split_and_process_layers = lambda *a: (a[0], [], [], None, None, None, None, P["accumulators"], [], [])
ce.slice_apply_grad_for_stage_construction = lambda *a: ([], None)
ce.cluster_layers_and_slice_mesh = lambda *a: (list(P["stages"]), list(P["stage_to_mesh"]), meshes,
                                                types.SimpleNamespace(submesh_logical_shapes=None,
                                                                      submesh_autosharding_option_dicts=None))
ce.process_apply_gradient = lambda *a: ([], {}, [], [])
ce.create_donation_mapping = lambda *a: {}
ce.split_donate_invars = lambda mapping, stages, gensym: ({}, stages)
ce._rewrite_global_outvars_post_concate = lambda *a: ([], {})
ce.shard_each_stage = capture
closed = types.SimpleNamespace(jaxpr=types.SimpleNamespace(invars=[]))

adapter.install()
adapter.configure("alpa_comm_eager")
adapter._fresh_variables = lambda stages: (lambda aval: P["new_var"]("wd", aval.shape))
args = (closed, None, 1, [], [], None, M, "eager_1f1b", None, None, "test", None, None, None, None)
try:
    ce.compile_pipeshard_executable_internal(*args)
except Captured as c:
    stages, schedule = c.args
out["cluster_restored"] = getattr(ce.cluster_layers_and_slice_mesh, "__name__", "") == "<lambda>"
out["names"] = [s.name for s in stages]
out["classes"] = sorted({type(s).__name__ for s in stages})
weight = {k: stages.index(s) for k, s in enumerate(stages) if s.name.endswith("_weight")}
mesh_of_stage = {k: sorted(schedule.stage_placement(k))[0] for k in range(len(stages))}
weight_stages = {mesh_of_stage[k]: k for k in range(2 * S, len(stages))}
out["weight_stages"] = {str(m): k for m, k in weight_stages.items()}
out["schedule"] = type(schedule).__name__
validate_clocks(schedule.schedules, S, M, weight_stages)
out["clocks"] = [[list(t) if t else None for t in row] for row in schedule.schedules]

# Alpa's own dependency generator on the split stages: BW depends on its BI (residuals)
dep = schedules.gen_dependency_with_stages(stages, [])
out["bw_depends_on_bi"] = all(dep[k, 2 * S - 1 - m] == 1 for m, k in weight_stages.items())
out["bw_feeds_nothing"] = all(not dep[:, k].any() for k in weight_stages.values())
out["bi_feeds_previous_backward"] = all(dep[2 * S - 1 - (m - 1), 2 * S - 1 - m] == 1 for m in weight_stages)

# the split computes what the whole backward computes, bit for bit, on NumPy
rng = np.random.default_rng(0)
values = {v: rng.normal(size=v.aval.shape).astype(np.float32) for v in P["global_invars"]}
values.update({v: np.zeros(v.aval.shape, np.float32) for v in P["accumulators"]})
for s in original[:S]:
    values.update(po.run_stage(s, values))
whole = dict(values)
for s in original[S:]:
    whole.update(po.run_stage(s, whole))
split = dict(values)
for k in list(range(S, 2 * S)) + sorted(weight_stages.values()):
    split.update(po.run_stage(stages[k], split))
out["outputs_equal"] = all(np.array_equal(whole[v], split[v]) for s in original[S:] for v in s.outvars)
out["every_original_output_made"] = all(v in split for s in original[S:] for v in s.outvars)
out["bi_computes_no_weight_product"] = all(
    e.primitive.name != "matmul_tn" for m in weight_stages for e in stages[2 * S - 1 - m].eqns)
out["bw_only_weight_work"] = {stages[k].name: sorted({e.primitive.name for e in stages[k].eqns}) for k in weight_stages.values()}
out["residuals"] = {stages[k].name: len(stages[k].invars) for k in weight_stages.values()}

# Alpa's emitter over the schedule: the instruction order on each mesh
out["lines"] = po.emit(stages, schedule, meshes, P["global_invars"], P["is_batch"], P["accumulators"], M)
out["input_gradient"] = {str(m): v.name for m, v in P["input_gradient"].items()}
out["names_of"] = {str(m): stages[2 * S - 1 - m].name for m in range(S)}
'''


def _position(lines, text):
    hits = [k for k, line in enumerate(lines) if line.startswith(text)]
    assert len(hits) == 1, (text, lines)
    return hits[0]


def test_alpa_s_backward_stages_split_and_the_weight_part_runs_after_the_send(harness):
    out = harness(SPLIT)
    S, M = 3, 4
    assert out["schedule"] == "EagerOneFOneB" and out["cluster_restored"]
    assert out["classes"] == ["JaxPipelineComputation"]
    # meshes 1 and 2 send an input gradient; mesh 0's backward (inputs: the data) stays whole
    assert out["weight_stages"] == {"1": 6, "2": 7}
    assert out["names"][6:] == ["4_weight", "3_weight"]
    assert out["bw_depends_on_bi"] and out["bw_feeds_nothing"] and out["bi_feeds_previous_backward"]
    assert out["outputs_equal"] and out["every_original_output_made"]
    assert out["bi_computes_no_weight_product"]
    for ops in out["bw_only_weight_work"].values():
        assert ops == ["add", "matmul_tn", "pipeline_marker"]  # x^T dy and the accumulation, nothing else
    for mesh in (1, 2):
        lines = out["lines"][mesh]
        bi, bw = out["names_of"][str(mesh)], out["names_of"][str(mesh)] + "_weight"
        grad = out["input_gradient"][str(mesh)]
        for mb in range(M):
            run_bi = _position(lines, f"RUN {bi} mb{mb}")
            send = _position(lines, f"SEND {grad} mb{mb}")
            run_bw = _position(lines, f"RUN {bw} mb{mb}")
            assert run_bi < send < run_bw, lines
        # the delay: in steady state another computation runs between a send and its BW
        between = lines[_position(lines, f"SEND {grad} mb0") + 1:_position(lines, f"RUN {bw} mb0")]
        assert any(line.startswith("RUN") for line in between), lines
        # gradients are synchronised across data-parallel replicas once, on the last BW
        syncs = [line for line in lines if line.startswith(f"RUN {bw}") and line.endswith("sync")]
        assert syncs == [f"RUN {bw} mb{M - 1} sync"]


def test_a_stage_not_in_alpa_s_shape_is_a_clear_error():
    from types import SimpleNamespace as NS
    from alpa_comm.integrations.alpa_harness.pipeline_objects import PRIMS, Eqn
    from alpa_comm.integrations.alpa_weight_delay import split_backward, split_backward_stages

    stage = NS(name="7", eqns=[Eqn([], [], PRIMS["add"], {})])
    with pytest.raises(WeightDelayError, match="stage '7' does not start and end with pipeline markers"):
        split_backward(stage, consumed=set(), new_var=None)
    with pytest.raises(WeightDelayError, match=r"got stage_to_mesh \[0, 1\]"):
        split_backward_stages([stage, stage], [0, 1], new_var=None)
    assert inline_calls([]) == []
