"""Every command, every bad input: one line on stderr that names the option, exit 2,
never a traceback. Hypothesis drives argument vectors over every subcommand's options
(bad numbers, paths, choices, specs, JSON files); the examples are the mistakes users hit."""
import argparse
import atexit
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from alpa_comm.cli import build_parser, main
from alpa_comm.cli.options import shape_value

PARSER = build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices
A_FILE = tempfile.NamedTemporaryFile(prefix="alpa-comm-fuzz-", delete=False).name
"""A regular file: no folder can be made inside it, not even by root (CI runs as root)."""
atexit.register(lambda: os.path.exists(A_FILE) and os.unlink(A_FILE))
BAD_FILES = [f"{A_FILE}/x.json", "", tempfile.gettempdir(), "/nonexistent-folder-alpa-comm/x"]
BAD_FOLDERS = [A_FILE, f"{A_FILE}/sub", ""]


@pytest.fixture(autouse=True)
def no_real_work(monkeypatch):
    """Whatever the parser lets through must not start clusters, training or suites here:
    those entry points fail the test instead."""
    import alpa_comm.runtime.emulated.launch as launch
    import alpa_comm.train.trainer as trainer
    import alpa_comm_bench.simulated as suite
    from alpa_comm.runtime.cluster import Cluster

    def refuse(*args, **kwargs):
        raise AssertionError("the command line was accepted and would have started real work")

    for target, name in ((launch, "launch_emulated"), (launch, "teardown_emulated"), (trainer, "train"),
                         (suite, "run_suite")):
        monkeypatch.setattr(target, name, refuse)
    monkeypatch.setattr(Cluster, "open", classmethod(lambda cls, *a, **k: refuse()))


def run(argv, capsys):
    """(exit code, stdout, stderr) of ``alpa-comm argv`` in this process."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def bad_values(action) -> list[str]:
    """Values the option's own type or choices must refuse."""
    if action.choices is not None:
        return ["bogus-choice"]
    name = getattr(action.type, "__name__", "")
    if action.type is shape_value:
        return ["0,4", "a,b", "", "4,-1"]
    if name == "integer":
        return ["-1", "1.5", "abc", "", "99999999999999999999999"]
    if name == "number":
        return ["nan", "-1", "abc", "-inf"]
    if name == "rate":
        return ["5", "fast", "0mbit", "-1gbit", ""]
    if name == "file path":
        return BAD_FILES
    if name == "folder path":
        return BAD_FOLDERS
    return []


def checked_options():
    out = []
    for cmd, sub in SUBCOMMANDS.items():
        for a in sub._actions:
            if a.option_strings and a.nargs != 0 and a.dest != "help" and bad_values(a):
                out.append((cmd, a))
    return out


CHECKED = checked_options()


def test_every_numeric_and_path_option_is_checked():
    """No option takes a bare int/float/str where a bad value could slip through."""
    loose = [(cmd, a.option_strings[0]) for cmd, sub in SUBCOMMANDS.items() for a in sub._actions
             if a.option_strings and a.type in (int, float)]
    assert not loose, f"options without a checked type: {loose}"
    assert len(CHECKED) > 40


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(CHECKED), st.data())
def test_a_bad_value_is_one_line_naming_the_option(capsys, target, data):
    cmd, action = target
    value = data.draw(st.sampled_from(bad_values(action)))
    flag = data.draw(st.sampled_from(action.option_strings))
    argv = [cmd, "status"] if cmd == "cluster" else [cmd]
    code, _, err = run(argv + [f"{flag}={value}"], capsys)
    assert code == 2, (argv, flag, value, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert flag in lines[0] or action.option_strings[0] in lines[0], (flag, lines[0])


SPEC_TEXT = st.text(alphabet="SR0123x@,-", min_size=0, max_size=6)
MESH_TEXT = st.one_of(st.sampled_from(["1x2@0", "2x2@0,1", "2x2@2,3", "1x4@1", "2x1@3,4"]),
                      st.text(alphabet="0123x@,", min_size=0, max_size=8))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["plan", "simulate"]), st.sampled_from(["8,8", "16", "4,6,2", "7,5"]), MESH_TEXT, SPEC_TEXT,
       MESH_TEXT, SPEC_TEXT, st.sampled_from(["broadcast", "auto", "double_tree", "alpa"]))
def test_random_specs_and_meshes_never_crash(capsys, cmd, shape, src_mesh, src_spec, dst_mesh, dst_spec, strategy):
    argv = [cmd, "--shape", shape, f"--src-mesh={src_mesh}", f"--src-spec={src_spec}", f"--dst-mesh={dst_mesh}",
            f"--dst-spec={dst_spec}", "--strategy", strategy]
    code, out, err = run(argv, capsys)
    assert "Traceback" not in err and "internal error" not in err, err
    if code != 0:
        assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content", ['{"foo":1}', '{"stages":5}', "null", '{"stages":[[1]]}', '{"stages":[]}',
                                     "[1, 2]", '{"stages":[["F0","X9"]]}', "stage 0: F0 Q1", "\x00\x01binary",
                                     "stage 1: F0"])
def test_schedule_files_of_the_wrong_shape(capsys, tmp_path, content):
    f = tmp_path / "s.json"
    f.write_bytes(content.encode("latin-1"))
    code, _, err = run(["schedule", "--from-file", str(f)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--from-file" in err, err


EXAMPLES = [
    (["schedule", "--from-file", "/nonexistent.json"], "--from-file"),
    (["schedule", "--from-file", "/tmp"], "--from-file"),
    (["schedule", "--png", "/nonexistent-folder-alpa-comm/x.png"], "--png"),
    (["schedule", "--trace", "/tmp"], "--trace"),
    (["schedule", "--t-bwd", "nan"], "--t-bwd"),
    (["schedule", "--t-fwd", "0", "--t-bwd", "0", "--t-comm", "0"], "--t-fwd"),
    (["schedule", "--format", "text", "--png", "x.png"], "--png"),
    (["schedule", "--compare", "--trace", "t.json"], "--trace"),
    (["simulate", "--suite", "n-to-m", "--out", A_FILE], "--out"),
    (["simulate", "--shape", "8", "--src-mesh", "1x1@0", "--src-spec", "R", "--dst-mesh", "1x1@1",
      "--dst-spec", "R", "--png", "/nonexistent-folder-alpa-comm/g"], "--png"),
    (["train", "--stages", "0"], "--stages"),
    (["train", "--heads", "0"], "--heads"),
    (["train", "--width", "0"], "--width"),
    (["train", "--microbatch-size", "0"], "--microbatch-size"),
    (["train", "--seq", "0"], "--seq"),
    (["train", "--seq", "100000"], "--seq"),
    (["train", "--lr", "nan"], "--lr"),
    (["train", "--lr", "-1"], "--lr"),
    (["train", "--width", "30", "--heads", "4"], "--width"),
    (["train", "--cluster", "inprocess", "--trace", "t.json"], "--trace"),
    (["train", "--out", A_FILE], "--out"),
    (["plan", "--hosts", "0"], "--hosts"),
    (["plan", "--devices-per-host", "0"], "--devices-per-host"),
    (["plan", "--suite", "1-to-m", "--size-mb", "-1"], "--size-mb"),
    (["plan", "--nic-gbps", "0"], "--nic-gbps"),
    (["plan", "--latency-us", "-1"], "--latency-us"),
    (["plan", "--shape", "99999999999,99999999999,99999999"], "--shape"),
    (["plan", "--suite", "n-to-m", "--strategy", "send_recv"], "--strategy"),
    (["plan", "--shape", "8", "--src-mesh", "1x1@0", "--src-spec", "R", "--dst-mesh", "1x1@1", "--dst-spec", "R",
      "--plan-cache", A_FILE], "--plan-cache"),
    (["bench", "--repeat", "0"], "--repeat"),
    (["bench", "--cluster", "local", "--nic", "1gbit"], "--nic"),
    (["cluster", "status", "--hosts", "3"], "--hosts"),
]


def example_id(value) -> str:
    """The same on every pytest-xdist worker: the scratch file's random name left out."""
    return (" ".join(value) if isinstance(value, list) else value).replace(A_FILE, "A_FILE")


@pytest.mark.parametrize("argv,flag", EXAMPLES, ids=example_id)
def test_reported_mistakes_end_in_one_line_naming_the_option(capsys, argv, flag):
    code, _, err = run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert flag in lines[0] and "Traceback" not in err


def test_an_internal_error_is_one_line_and_a_traceback_file(capsys, monkeypatch):
    from alpa_comm.cli import resharding

    def boom(args):
        raise ZeroDivisionError("synthetic")

    monkeypatch.setattr(resharding, "cmd_plan", boom)  # main() builds its parser afresh, so it sees this
    code, _, err = run(["plan", "--suite", "n-to-m"], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "ZeroDivisionError: synthetic" in lines[0]
    path = lines[0].split("traceback in ")[1].split(";")[0]
    assert "Traceback" in open(path).read()


def test_json_output_is_json(capsys):
    code, out, _ = run(["plan", "--shape", "8,8", "--src-mesh", "1x2@0", "--src-spec", "RS1", "--dst-mesh", "1x2@1",
                        "--dst-spec", "S0R", "--json"], capsys)
    assert code == 0 and "latency_bound_seconds" in json.loads(out)


JSON_LEAVES = st.none() | st.booleans() | st.integers(-3, 9) | st.sampled_from(["F0", "B0", "stages", "x"])
JSON_VALUES = st.recursive(JSON_LEAVES,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                               st.sampled_from(["stages", "name", "foo"]), inner, max_size=3), max_leaves=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(JSON_VALUES)
def test_any_json_schedule_file_is_run_or_refused_in_one_line(capsys, tmp_path_factory, value):
    f = tmp_path_factory.mktemp("s") / "s.json"
    f.write_text(json.dumps(value))
    code, _, err = run(["schedule", "--from-file", str(f)], capsys)
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 0 or (code == 2 and len(err.strip().splitlines()) == 1), err
