"""One schedule registry: every family's generated order kept (against the digests of
``tests/schedule_golden.py``)."""
import json

from schedule_golden import GOLDEN, digests


def test_generated_orders_are_unchanged():
    """Every family, variant and size of the grid generates the order (or the refusal) it
    generated when the digests were written: a refactor of the generators changes none."""
    want = json.loads(GOLDEN.read_text())
    got = digests()
    assert sorted(got) == sorted(want)
    changed = sorted(k for k in want if got[k] != want[k])
    assert not changed, f"{len(changed)} generated orders changed, e.g. {changed[:5]}"
