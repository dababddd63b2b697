"""The parts of the Alpa translation layer that need no Alpa objects: device strings and
clock tables. Everything that reads Alpa's objects is tested on Alpa 0.2.3's own classes
(tests/test_alpa_harness.py, tests/test_alpa_adapter.py)."""
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm.integrations.alpa_translate import (DeviceStrings, TranslationError, parse_device_str,
                                                   plan_to_strategy, schedule_to_clocks, validate_clocks)
from alpa_comm.pipeline import SCHEDULES, generate


def test_device_strings_round_trip():
    s = DeviceStrings(["10.0.0.1", "10.0.0.2"], 4)
    assert s.to_str(6) == "10.0.0.2:gpu:2" and s.to_id("10.0.0.2:gpu:2") == 6
    assert all(s.to_id(s.to_str(d)) == d for d in range(8))
    assert parse_device_str("1.2.3.4:gpu:3") == ("1.2.3.4", "gpu", 3)
    with pytest.raises(TranslationError, match="10.9.9.9"):
        s.to_id("10.9.9.9:gpu:0")
    with pytest.raises(TranslationError, match="cannot read"):
        s.to_id("gpu0")


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


def test_bad_mode():
    with pytest.raises(TranslationError, match="'multicast'"):
        plan_to_strategy([], None, DeviceStrings(["10.0.0.1"], 4), "multicast")
