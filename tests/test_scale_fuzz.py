"""The scale fuzz benchmark, CI-sized: a seeded draw of random reshardings at 16-64 hosts
is planned, simulated and verified (every destination byte delivered exactly), and the
table, JSON and picture are written; the draw is reproducible from its seed and every
drawn case divides its tensor by its shard counts."""
import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("scale_fuzz", ROOT / "benchmarks" / "scale_fuzz.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_seeded_draw_plans_simulates_and_verifies(tmp_path):
    fuzz = _module()
    assert fuzz.main(["--cases", "6", "--hosts", "16-64", "--seed", "3", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "fuzz.json").read_text())
    assert data["seed"] == 3 and len(data["rows"]) + data["skipped"] == 6
    for r in data["rows"]:
        assert 16 <= r["hosts"] <= 64 and (r["ratio"] is None or r["ratio"] >= 0.99)  # never faster than the bound
        assert r["makespan_seconds"] > 0 and r["repeat_plan_seconds"] < r["plan_seconds"] + 1e-3
    assert (tmp_path / "fuzz.png").stat().st_size > 0 and "within 1.25x" in (tmp_path / "fuzz.md").read_text()


def test_the_draw_is_reproducible_and_always_divisible():
    fuzz = _module()
    a = [fuzz.draw_case(random.Random(7), 16, 1024) for _ in range(1)]
    b = [fuzz.draw_case(random.Random(7), 16, 1024) for _ in range(1)]
    assert a == b
    rng = random.Random(11)
    for _ in range(200):
        case = fuzz.draw_case(rng, 16, 1024)
        for d, n in enumerate(case["shape"]):
            for side in ("src", "dst"):
                assert n % fuzz._parts(case[side], d) == 0, case
        assert case["src"]["mesh"].count("@") == 1 and 16 <= case["hosts"] <= 1024
