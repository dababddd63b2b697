"""The Alpa translation layer against fixtures with Alpa 0.2.3's formats."""
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm import plan_resharding
from alpa_comm.integrations.alpa_translate import (DeviceStrings, TranslationError, inputs_from_task_spec,
                                                   parse_device_str, plan_to_strategy, schedule_to_clocks,
                                                   strategy_to_sends, tileslice_box, validate_clocks)
from alpa_comm.pipeline import SCHEDULES, generate
from alpa_comm.suites import n_to_m, one_to_m

from alpa_fixtures import task_spec

CASES = n_to_m(4) + one_to_m(1 << 16)


def _spec(case):
    return task_spec(case.shape, "float32", case.src_mesh, case.src_spec, case.dst_mesh, case.dst_spec, 4)


def test_device_strings_round_trip():
    s = DeviceStrings(["10.0.0.1", "10.0.0.2"], 4)
    assert s.to_str(6) == "10.0.0.2:gpu:2" and s.to_id("10.0.0.2:gpu:2") == 6
    assert all(s.to_id(s.to_str(d)) == d for d in range(8))
    assert parse_device_str("1.2.3.4:gpu:3") == ("1.2.3.4", "gpu", 3)
    with pytest.raises(TranslationError, match="10.9.9.9"):
        s.to_id("10.9.9.9:gpu:0")
    with pytest.raises(TranslationError, match="cannot read"):
        s.to_id("gpu0")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.suite}-{c.name}")
def test_task_spec_becomes_the_planner_inputs(case):
    spec = _spec(case)
    inp = inputs_from_task_spec(spec)
    assert inp.shape == case.shape and inp.dtype == "float32"
    assert str(inp.src_spec) == case.src_spec and str(inp.dst_spec) == case.dst_spec
    assert inp.src_mesh.shape == tuple(int(x) for x in case.src_mesh.split("@")[0].split("x"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.suite}-{c.name}")
@pytest.mark.parametrize("mode,strategy", [("sendrecv", "send_recv"), ("broadcast", "broadcast"),
                                           ("sendrecv", "broadcast")])
def test_plan_translates_to_alpa_strategy_without_duplicate_sends(case, mode, strategy):
    spec = _spec(case)
    inp = inputs_from_task_spec(spec)
    plan = plan_resharding(inp.shape, inp.dtype, inp.src_mesh, inp.src_spec, inp.dst_mesh, inp.dst_spec,
                           cluster=inp.cluster(), strategy=strategy)
    per_spec_plans, order = plan_to_strategy(plan, spec, inp.strings, mode)
    assert len(per_spec_plans) == len(spec.dst_tile_to_src_tiles_map)
    sends = strategy_to_sends(per_spec_plans, order, spec, inp.strings, mode)
    # every replica of every destination tile gets every piece exactly once: no m^2 re-sends
    expected = {(inp.strings.to_id(r), tileslice_box(ts)) for tile, tss, _ in spec.dst_tile_to_src_tiles_map
                for r in tile.replica_device_strs for ts in tss}
    got = [(r, box) for _, r, box in sends]
    assert len(got) == len(set(got)) == len(expected) and set(got) == expected
    # every sender holds what it sends
    for sender, _, box in sends:
        holders = {inp.strings.to_id(s) for tile, tss, _ in spec.dst_tile_to_src_tiles_map for ts in tss
                   if tileslice_box(ts) == box for s in ts.replica_device_strs}
        assert sender in holders
    if mode == "sendrecv":
        assert all(len(o) == 3 for o in order) and per_spec_plans[0].ndim == 2
    else:
        assert all(len(o) == 2 for o in order) and per_spec_plans[0].ndim == 1


def test_bad_mode():
    case = CASES[0]
    spec = _spec(case)
    inp = inputs_from_task_spec(spec)
    plan = plan_resharding(inp.shape, inp.dtype, inp.src_mesh, inp.src_spec, inp.dst_mesh, inp.dst_spec,
                           cluster=inp.cluster())
    with pytest.raises(TranslationError, match="'multicast'"):
        plan_to_strategy(plan, spec, inp.strings, "multicast")


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8), st.integers(1, 32), st.sampled_from(SCHEDULES), st.booleans())
def test_schedule_tables_are_valid(S, M, kind, split):
    sched = generate(kind, S, M, split_backward=split)
    clocks = schedule_to_clocks(sched, apply_grad_placement={2 * S + i: i for i in range(S)})
    validate_clocks(clocks, S, M)
    assert clocks[-1] == [(M - 1, 2 * S + i) for i in range(S)]


def test_eager_table_keeps_the_eager_warmup():
    S, M = 4, 8
    clocks = schedule_to_clocks(generate("eager-1f1b", S, M))
    first_backward = next(c for c, row in enumerate(clocks) if row[0] and row[0][1] >= S)
    forwards_before = sum(1 for row in clocks[:first_backward] if row[0] and row[0][1] < S)
    assert forwards_before == min(M, 2 * S - 1)


def test_validate_clocks_catches_errors():
    with pytest.raises(TranslationError, match="depends on"):  # stage 1 before stage 0
        validate_clocks([[None, (0, 1)], [(0, 0), None], [None, None]], 2, 1)
    with pytest.raises(TranslationError, match="forward stage 1 on mesh 0"):
        validate_clocks([[(0, 1), None], [None, None]], 2, 1)
    with pytest.raises(TranslationError, match="never run"):
        validate_clocks([[(0, 0), None], [None, None]], 2, 1)
