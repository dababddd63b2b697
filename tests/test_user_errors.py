"""A user's mistake ends in one ``AlpaCommError`` subclass whose message names the value,
through the public API (``alpa_comm``'s and ``alpa_comm.jax``'s exports: plans, trees,
specs, meshes, cluster descriptions, options) and through the command line (one line on
stderr, exit 2). Each subclass is also the built-in it replaces (``ValueError``,
``TypeError``, ``RuntimeError``, ``TimeoutError``), so ``except ValueError`` still works.

Hypothesis draws the bad values where a whole family is wrong (anything that is not a
positive integer, any text that is no mesh); the tables hold the mistakes users make."""
import ast
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import alpa_comm.cli as cli
from alpa_comm import (LOADBALANCE_MODES, STRATEGIES, AlpaCommError, ClusterSpec, DeviceMesh, InvalidClusterError,
                       InvalidMeshError, InvalidOptionError, InvalidSpecError, Placement, Resharding, ShardingSpec,
                       plan_resharding)
from alpa_comm import errors, validation
from alpa_comm.errors import InvalidArgumentError, InvalidTypeError
from alpa_comm.resharding.tree import plan_resharding_tree

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "alpa_comm"
GOOD = dict(shape=(8, 8), dtype="float32", src_mesh="2x2@0,1", src_spec="S0R", dst_mesh="2x2@2,3", dst_spec="RS1")
CLUSTER = ClusterSpec(4, 2)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def named(value, message: str) -> bool:
    """The message shows the value as Python writes it, or as text."""
    return repr(value) in message or str(value) in message


def refused(call, value, error=AlpaCommError) -> AlpaCommError:
    """``call()`` raises ``error`` (an ``AlpaCommError``) naming ``value``."""
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, AlpaCommError), type(info.value)
    assert named(value, str(info.value)), (value, str(info.value))
    return info.value


def plan(**kw):
    args = {**GOOD, **kw}
    six = [args.pop(k) for k in list(GOOD)]
    return plan_resharding(*six, **{"cache": False, **args})


def tree(**kw):
    return plan_resharding_tree({"w": Resharding.between(*GOOD.values())}, **{"cluster": CLUSTER, "cache": False,
                                                                              **kw})


# ------------------------------------------------------------------ the classes
def test_every_error_class_is_an_alpa_comm_error_and_the_builtin_it_replaces():
    builtins = {errors.InvalidSpecError: ValueError, errors.InvalidMeshError: ValueError,
                errors.InvalidClusterError: ValueError, errors.InvalidOptionError: ValueError,
                errors.InvalidArgumentError: ValueError, errors.InvalidTypeError: TypeError,
                errors.UsageError: RuntimeError, errors.CommunicationError: RuntimeError,
                errors.CommunicationTimeoutError: TimeoutError, errors.InternalError: RuntimeError}
    for cls, builtin in builtins.items():
        assert issubclass(cls, AlpaCommError) and issubclass(cls, builtin), cls
    from alpa_comm.runtime import CommunicationError

    assert CommunicationError is errors.CommunicationError  # one class, wherever it is imported from


# --------------------------------------------------------------- bad values
NOT_INTS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.booleans(),
                     st.lists(st.integers(), max_size=2), st.binary(max_size=2), st.just(object()))
NOT_POSITIVE_INTS = st.one_of(st.integers(max_value=0), NOT_INTS)
NOT_NON_NEGATIVE_NUMBERS = st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf),
                                     st.integers(max_value=-1), st.text(max_size=4), st.booleans(), st.none(),
                                     st.lists(st.floats(), max_size=2))


def not_one_of(choices):
    return st.one_of(st.text(max_size=8).filter(lambda s: s not in choices), st.integers(), st.none(),
                     st.lists(st.text(max_size=2), max_size=2), st.just(np.zeros(2)))


BAD_OPTIONS = {
    "strategy": not_one_of(STRATEGIES),
    "loadbalance": not_one_of(LOADBALANCE_MODES),
    "chunks": NOT_POSITIVE_INTS,
    "seed": NOT_INTS.filter(lambda v: not isinstance(v, bool)) | st.floats(),
    "dfs_budget_s": NOT_NON_NEGATIVE_NUMBERS,
    "bucket_bytes": st.one_of(st.integers(max_value=-1), NOT_INTS.filter(lambda v: v != "auto" and v is not False)),
    "max_inflight_bytes": NOT_POSITIVE_INTS,
    "cluster": st.one_of(st.integers(), st.text(max_size=6), st.tuples(st.integers(), st.integers())),
    "cache": st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=1)),
}


@FAST
@given(data=st.data(), option=st.sampled_from(sorted(BAD_OPTIONS)))
def test_a_bad_planning_option_is_named_for_one_array_and_for_a_tree(data, option):
    value = data.draw(BAD_OPTIONS[option], label=option)
    refused(lambda: plan(**{option: value}), value)
    if option != "strategy":  # a tree has its own strategies: checked by name below
        refused(lambda: tree(**{option: value}), value)


@pytest.mark.parametrize("option,value,error", [
    ("strategy", "teleport", InvalidOptionError), ("loadbalance", "best", InvalidOptionError),
    ("chunks", 0, InvalidOptionError), ("seed", 1.5, InvalidOptionError),
    ("dfs_budget_s", -1.0, InvalidOptionError), ("bucket_bytes", -4, InvalidOptionError),
    ("max_inflight_bytes", 0, InvalidOptionError), ("cluster", "4x2", InvalidTypeError),
    ("cache", "yes", InvalidTypeError),
])
def test_planning_options_name_their_kind(option, value, error):
    err = refused(lambda: plan(**{option: value}), value, error)
    assert option.split("_")[0] in str(err)


def test_a_tree_names_a_strategy_it_cannot_use_and_a_leaf_that_is_no_move():
    refused(lambda: tree(strategy="alpa"), "alpa", InvalidOptionError)
    refused(lambda: plan_resharding_tree({"w": "8x8"}, cluster=CLUSTER), "str", InvalidOptionError)
    refused(lambda: plan_resharding_tree({"w": Resharding.between(*GOOD.values())}, cluster=None), "None",
            InvalidTypeError)


# ------------------------------------------------------ specs, meshes, clusters
@FAST
@given(field=st.sampled_from(["num_hosts", "devices_per_host"]), value=NOT_POSITIVE_INTS)
def test_cluster_counts_are_positive_integers(field, value):
    kw = {"num_hosts": 4, "devices_per_host": 2, field: value}
    refused(lambda: ClusterSpec(**kw), value, InvalidClusterError)


@pytest.mark.parametrize("kw,value", [
    (dict(nic_send_gbps=0), 0), (dict(nic_send_gbps=-1.0), -1.0), (dict(latency_s=-1e-6), -1e-6),
    (dict(latency_s=math.nan), "nan"),
])
def test_cluster_rates_and_latency_are_named(kw, value):
    refused(lambda: ClusterSpec(4, 2, **kw), value, InvalidClusterError)


@FAST
@given(text=st.one_of(st.text(max_size=12), st.from_regex(r"[0-9x@,\- ]{0,10}", fullmatch=True)))
def test_any_mesh_text_parses_or_is_named(text):
    try:
        DeviceMesh.parse(text, 4)
    except InvalidMeshError as e:
        assert named(text, str(e)) or "lists a host twice" in str(e) or "devices per host" in str(e) \
            or "divide evenly" in str(e), str(e)


@FAST
@given(text=st.one_of(st.text(max_size=8), st.from_regex(r"[RS0-9]{0,6}", fullmatch=True)))
def test_any_spec_text_parses_or_is_named(text):
    try:
        ShardingSpec.parse(text)
    except InvalidSpecError as e:
        assert named(text, str(e)), str(e)


@pytest.mark.parametrize("call,value,error", [
    (lambda: ShardingSpec.parse("S0Q"), "S0Q", InvalidSpecError),
    (lambda: ShardingSpec.parse(42), "42", InvalidSpecError),
    (lambda: DeviceMesh.parse("2x2@0,1", 0), "0", InvalidMeshError),
    (lambda: DeviceMesh.parse("2x2@0,1", "2"), "'2'", InvalidMeshError),
    (lambda: DeviceMesh.on_hosts((2, 2), "01", 2), "'01'", InvalidMeshError),
    (lambda: DeviceMesh.on_hosts((2, "x"), (0, 1), 2), "'x'", InvalidMeshError),
    (lambda: DeviceMesh.on_hosts((2, 2), (), 2), "()", InvalidMeshError),
    (lambda: DeviceMesh.from_devices(["a", "b"], 2), "'a'", InvalidMeshError),
    (lambda: DeviceMesh.from_devices([0.5, 1.5], 2), "0.5", InvalidMeshError),
    (lambda: DeviceMesh.from_devices([0, 1], True), "True", InvalidMeshError),
    (lambda: Placement("2x2@0,0", "S0R").resolved(2), "2x2@0,0", InvalidMeshError),
    (lambda: Placement("2x2@0,1", "S0S0").resolved(2), "S0S0", InvalidSpecError),
    (lambda: Resharding.between(8, *list(GOOD.values())[1:]), "8", InvalidSpecError),
    (lambda: Resharding.between("8,8", *list(GOOD.values())[1:]), "'8,8'", InvalidSpecError),
    (lambda: plan(shape=(5, 8)), "5", InvalidSpecError),
    (lambda: plan(shape=(8, 8.5)), "8.5", InvalidSpecError),
    (lambda: plan(dtype="float8"), "float8", InvalidOptionError),
    (lambda: plan(dst_mesh="2x2@2,9", cluster=CLUSTER), "9", InvalidMeshError),
    (lambda: plan(src_spec="S0R", src_mesh="2x2@0-"), "2x2@0-", InvalidMeshError),
])
def test_specs_meshes_and_shapes_name_the_value(call, value, error):
    refused(call, value, error)


# ----------------------------------------------------------- shared validators
@FAST
@given(value=NOT_POSITIVE_INTS)
def test_positive_int_names_any_value_that_is_not_one(value):
    refused(lambda: validation.positive_int(value, "count"), value, InvalidOptionError)


@FAST
@given(value=st.one_of(st.integers(max_value=0), st.integers(min_value=validation.MAX_STREAMS + 1), NOT_INTS))
def test_a_bad_streams_value_is_named_alike_everywhere(value):
    """The process group, its ``"auto"`` rule and the validator refuse the same value with
    the same class and words (one check, ``validation.check_streams``)."""
    from alpa_comm.jax import ProcessGroup
    from alpa_comm.jax.group import streams_for

    if value == "auto":
        return
    first = refused(lambda: validation.check_streams(value, allow_auto=True), value, InvalidOptionError)
    assert str(refused(lambda: streams_for(value, 10.0, 5.0), value, InvalidOptionError)) == str(first)
    assert str(refused(lambda: ProcessGroup(0, 1, address="127.0.0.1:1", streams=value), value,
                       InvalidOptionError)) == str(first)


def test_one_of_takes_what_cannot_be_compared():
    for value in (np.zeros(3), [1], {"a": 1}, None, 3):
        refused(lambda: validation.one_of(value, ("tcp", "gloo"), "transport"), value, InvalidOptionError)
    assert validation.one_of("tcp", ("tcp", "gloo"), "transport") == "tcp"


# ---------------------------------------------------------- alpa_comm.jax
@pytest.mark.parametrize("kw,value", [
    (dict(rank=-1), "-1"), (dict(rank=1), "1"), (dict(world_size=0), "0"), (dict(rank=True), "True"),
    (dict(timeout=0), "0"), (dict(timeout="30"), "'30'"), (dict(nic_gbps=math.inf), "inf"),
    (dict(latency_s=-1), "-1"), (dict(recycle_bytes=-1), "-1"), (dict(backend="mpi"), "mpi"),
    (dict(buffers="gpu"), "gpu"), (dict(streams=0), "0"), (dict(streams="auto", stream_gbps=0), "0"),
    (dict(address="localhost"), "localhost"),
])
def test_a_process_group_names_a_bad_option_before_it_connects(kw, value):
    from alpa_comm.jax import ProcessGroup

    args = {"rank": 0, "world_size": 1, "address": "127.0.0.1:1", **kw}
    refused(lambda: ProcessGroup(**args), value, InvalidOptionError)


def test_jax_placements_name_what_is_not_a_sharding():
    from alpa_comm.jax import named_sharding

    refused(lambda: named_sharding(42, 2), "int", InvalidSpecError)


# ------------------------------------------------------------- the runtime
def test_runtime_pieces_name_what_they_refuse():
    from alpa_comm.runtime.allreduce import allreduce_mean
    from alpa_comm.runtime.host_memory import BufferPool
    from alpa_comm.runtime.pieces import Pieces

    refused(lambda: Pieces([np.zeros(4, np.float32)]), "float32", InvalidArgumentError)
    refused(lambda: Pieces([np.zeros(4, np.uint8)])[1], "1", InvalidTypeError)
    refused(lambda: BufferPool(-5), "-5", InvalidOptionError)
    refused(lambda: BufferPool(True), "True", InvalidOptionError)
    refused(lambda: allreduce_mean(None, [], [0], 0, method="tree"), "tree", InvalidOptionError)
    refused(lambda: allreduce_mean(None, [np.zeros(2, np.float32), np.zeros(2)], [0, 1], 0), "float64",
            InvalidArgumentError)


def test_simulation_and_reports_name_what_they_refuse():
    from alpa_comm.report.trace import chrome_trace
    from alpa_comm.sim.network import FluidNetwork

    refused(lambda: FluidNetwork({}, sharing="fifo"), "fifo", InvalidOptionError)
    refused(lambda: chrome_trace(42), "int", InvalidTypeError)


def test_emulated_nic_options_are_named():
    from alpa_comm.runtime.emulated import netns

    for rate in ("fast", "0mbit", "mbit", 400):
        refused(lambda: netns.rate_gbps(rate), rate, InvalidOptionError)
    assert netns.rate_gbps("400mbit") == pytest.approx(0.4) and netns.rate_gbps("64000bit") == pytest.approx(64e-6)


# ------------------------------------------------------------ the command line
PLAN = ["plan", "--shape", "8,8", "--src-mesh", "2x2@0,1", "--src-spec", "S0R", "--dst-mesh", "2x2@2,3",
        "--dst-spec", "RS1"]
SIM = ["simulate", *PLAN[1:]]


def replaced(argv, option, value):
    argv = list(argv)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


@pytest.fixture
def raised(monkeypatch):
    """The exceptions the command line's one error path turned into its line."""
    seen = []
    one_line = cli._one_line

    def spy(e):
        seen.append(e)
        return one_line(e)

    monkeypatch.setattr(cli, "_one_line", spy)
    return seen


@pytest.mark.parametrize("argv,value", [
    (replaced(PLAN, "--src-spec", "S0X"), "S0X"),
    (replaced(PLAN, "--dst-mesh", "2x2@1,1"), "2x2@1,1"),
    (replaced(PLAN, "--src-mesh", "2x2@0-"), "2x2@0-"),
    (replaced(PLAN, "--dtype", "float8"), "float8"),
    (replaced(PLAN, "--shape", "5,8"), "5"),
    (replaced(PLAN, "--hosts", "1"), "2x2@0,1"),
    (replaced(PLAN, "--devices-per-host", "1"), "2x2@0,1"),
    (replaced(SIM, "--dst-spec", "S3"), "S3"),
    (replaced(SIM, "--dst-mesh", "3x3@2,3"), "3x3@2,3"),
])
def test_the_cli_says_a_library_error_in_one_line_exit_2(argv, value, raised, capsys):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"alpa-comm {argv[0]}: error: ") and value in lines[0], err
    assert raised and all(isinstance(e, AlpaCommError) for e in raised), [type(e) for e in raised]
    assert "Traceback" not in out + err


@pytest.mark.parametrize("argv,value", [
    (replaced(PLAN, "--chunks", "0"), "0"), (replaced(PLAN, "--nic-gbps", "0"), "0"),
    (replaced(PLAN, "--latency-us", "-1"), "-1"), (replaced(PLAN, "--strategy", "teleport"), "teleport"),
    (["schedule", "--stages", "0"], "0"), (["schedule", "--schedule", "bogus"], "bogus"),
    (["schedule", "--memory-cap", "0"], "0"),
])
def test_the_cli_says_a_bad_option_value_in_one_line_exit_2(argv, value, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and value in lines[0] and "error" in lines[0], err


def test_the_installed_command_says_it_too():
    script = pathlib.Path(sys.executable).with_name("alpa-comm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "alpa_comm.cli"]
    done = subprocess.run([*cmd, *replaced(PLAN, "--src-spec", "S0X")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "S0X" in done.stderr, done.stderr


# --------------------------------------------------------- no bare built-in
BARE = {"ValueError", "TypeError", "RuntimeError", "TimeoutError", "KeyError", "IndexError", "Exception"}


def bare_raises(path: pathlib.Path) -> list[str]:
    """``raise ValueError(...)`` and the like: a built-in error raised by name, which no
    caller can tell from a failure deep inside Python or NumPy."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                out.append((node.lineno, f"{path.relative_to(PACKAGE)}:{node.lineno}: raise {exc.id}"))
    return [text for _, text in sorted(out)]


def test_no_module_raises_a_bare_builtin_error():
    """Every error the package raises is an ``AlpaCommError`` subclass (``alpa_comm.errors``);
    a broken invariant of the library itself is an ``InternalError``."""
    bad = [b for p in sorted(PACKAGE.rglob("*.py")) for b in bare_raises(p)]
    assert not bad, "\n".join(bad)
