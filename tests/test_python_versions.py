"""The core and the Alpa adapter run where Alpa 0.2.3 lives (its jaxlib wheels are for
Python 3.7-3.9; the package asks for >= 3.8): no syntax or standard-library call newer
than 3.8 (vermin), no annotation-only syntax evaluated at run time (``Box = tuple[...]``
at module level, ``isinstance(x, int | None)``), and no method or keyword argument newer
than 3.8 (``s.removeprefix(p)``, ``pool.shutdown(cancel_futures=True)``, ``a | b`` of
dicts): vermin sees neither of the last two, since it cannot know what type a name
holds, so a table of distinctive names (``NEWER_METHODS``, ``NEWER_KEYWORDS``, ...)
does."""
import ast
import json
import configparser
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "alpa_comm"
MINIMUM = (3, 8)
BUILTIN_GENERICS = {"dict", "list", "tuple", "set", "frozenset", "type"}
# the trainer and models need jax >= 0.4.30 (Python >= 3.9); everything else must run on 3.8
EXEMPT = {"train", "models"}


def modules():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in EXEMPT]


def _annotation_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs] + [node.returns]
            anns += [v.annotation for v in (a.vararg, a.kwarg) if v is not None]
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        for ann in anns:
            if ann is not None:
                out.update(id(sub) for sub in ast.walk(ann))
    return out


def runtime_new_syntax(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in tree.body)
    in_annotations = _annotation_nodes(tree)
    bad = []
    for node in ast.walk(tree):
        generic = (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                   and node.value.id in BUILTIN_GENERICS)
        union = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
        if id(node) in in_annotations:
            if (generic or union) and not future:
                bad.append(f"{path.name}:{node.lineno}: annotation needs 'from __future__ import annotations'")
        elif generic:
            bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:50]} runs at import (Python >= 3.9)")
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("isinstance", "issubclass")
              and len(node.args) == 2 and isinstance(node.args[1], ast.BinOp)):
            bad.append(f"{path.name}:{node.lineno}: isinstance with 'X | Y' (Python >= 3.10)")
    return bad


# What vermin cannot see, as (name -> (first Python that has it, what it is)). A method is
# matched by its name on any receiver, so only names no 3.8 type has are listed.
NEWER_METHODS = {
    "removeprefix": ((3, 9), "str.removeprefix"),
    "removesuffix": ((3, 9), "str.removesuffix"),
    "randbytes": ((3, 9), "random.randbytes"),
    "is_relative_to": ((3, 9), "PurePath.is_relative_to"),
    "with_stem": ((3, 9), "PurePath.with_stem"),
    "bit_count": ((3, 10), "int.bit_count"),
}
# a keyword argument, on a call of the named function or method (None: any call)
NEWER_KEYWORDS = {
    (None, "cancel_futures"): ((3, 9), "Executor.shutdown(cancel_futures=...)"),
    ("zip", "strict"): ((3, 10), "zip(strict=...)"),
    ("dataclass", "slots"): ((3, 10), "dataclass(slots=...)"),
    ("dataclass", "kw_only"): ((3, 10), "dataclass(kw_only=...)"),
    ("bisect_left", "key"): ((3, 10), "bisect(key=...)"),
    ("bisect_right", "key"): ((3, 10), "bisect(key=...)"),
    ("insort", "key"): ((3, 10), "insort(key=...)"),
}
# module.attribute, written so or imported by name (vermin knows most; this is the floor)
NEWER_MODULE_NAMES = {
    ("math", "lcm"): (3, 9), ("math", "nextafter"): (3, 9), ("math", "ulp"): (3, 9),
    ("random", "randbytes"): (3, 9), ("functools", "cache"): (3, 9), ("ast", "unparse"): (3, 9),
    ("asyncio", "to_thread"): (3, 9), ("os", "waitstatus_to_exitcode"): (3, 9),
    ("typing", "Annotated"): (3, 9), ("types", "GenericAlias"): (3, 9), ("itertools", "pairwise"): (3, 10),
    ("typing", "TypeAlias"): (3, 10), ("typing", "ParamSpec"): (3, 10), ("typing", "Self"): (3, 11),
}
NEWER_MODULES = {"zoneinfo": (3, 9), "graphlib": (3, 9), "tomllib": (3, 11)}
ABC_GENERICS_RUN = (3, 9)  # collections.abc.Callable[...] evaluated at run time


def _version(v) -> str:
    return f"Python >= {v[0]}.{v[1]}"


def _call_name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_dict(node: ast.AST) -> bool:
    """An expression that is a dict whatever the names hold: a literal, a comprehension,
    ``dict(...)`` or ``vars(...)``."""
    return (isinstance(node, (ast.Dict, ast.DictComp))
            or (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("dict", "vars")))


def newer_methods_and_arguments(path: pathlib.Path, minimum=MINIMUM) -> list[str]:
    """Every method, keyword argument, module name or dict union in ``path`` that Python
    ``minimum`` lacks (by the tables above), as ``file:line: what (Python >= X.Y)``."""
    tree = ast.parse(path.read_text())
    in_annotations = _annotation_nodes(tree)
    abc_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.module == "collections.abc" for a in n.names}
    bad = []

    def report(node, what, version):
        if tuple(version) > tuple(minimum):
            bad.append(f"{path.name}:{node.lineno}: {what} ({_version(version)})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node.func)
            if isinstance(node.func, ast.Attribute) and name in NEWER_METHODS:
                version, what = NEWER_METHODS[name]
                report(node, what, version)
            for kw in node.keywords:
                rule = NEWER_KEYWORDS.get((name, kw.arg)) or NEWER_KEYWORDS.get((None, kw.arg))
                if rule:
                    report(node, rule[1], rule[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            version = NEWER_MODULE_NAMES.get((node.value.id, node.attr))
            if version:
                report(node, f"{node.value.id}.{node.attr}", version)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                version = NEWER_MODULE_NAMES.get((node.module, a.name))
                if version:
                    report(node, f"from {node.module} import {a.name}", version)
            top = (node.module or "").split(".")[0]
            if node.level == 0 and top in NEWER_MODULES:
                report(node, f"module {top}", NEWER_MODULES[top])
        elif isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in NEWER_MODULES:
                    report(node, f"module {top}", NEWER_MODULES[top])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in in_annotations:
            if _is_dict(node.left) or _is_dict(node.right):
                report(node, "dict | dict", (3, 9))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr) and _is_dict(node.value):
            report(node, "dict |= dict", (3, 9))
        elif (isinstance(node, ast.Subscript) and id(node) not in in_annotations
              and ((isinstance(node.value, ast.Name) and node.value.id in abc_names)
                   or (isinstance(node.value, ast.Attribute) and ast.unparse(node.value.value).endswith("abc")))):
            report(node, f"{ast.unparse(node.value)}[...] at run time", ABC_GENERICS_RUN)
    return sorted(set(bad), key=lambda b: (int(b.split(":")[1]), b))


def test_no_method_or_argument_newer_than_3_8():
    bad = [f"{p.relative_to(PACKAGE).parent}/{b}" for p in modules() for b in newer_methods_and_arguments(p)]
    assert not bad, "\n".join(bad)


NEWER_SAMPLE = """\
import functools, math, random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
import zoneinfo

Handler = Callable[[int], int]
name = "run_x".removeprefix("run_").removesuffix("_x")
ThreadPoolExecutor().shutdown(wait=False, cancel_futures=True)
merged = {"a": 1} | dict(b=2)
merged |= {"c": 3}
both = math.lcm(4, 6), random.randbytes(4), (5).bit_count()
pairs = list(zip([1], [2], strict=True))


@dataclass(slots=True)
class Point:
    x: int


@functools.cache
def f(x: dict | None) -> "dict[str, int] | None":
    return x
"""


def test_the_method_rules_see_what_python_38_lacks(tmp_path):
    """Every kind of rule fires on a sample of each, and an annotation (which ``from
    __future__ import annotations`` or a string keeps from running) is left alone."""
    f = tmp_path / "sample.py"
    f.write_text(NEWER_SAMPLE)
    found = [b.split(": ", 1)[1].split(" (Python")[0] for b in newer_methods_and_arguments(f)]
    assert found == ["from functools import cache", "module zoneinfo", "Callable[...] at run time",
                     "str.removeprefix", "str.removesuffix", "Executor.shutdown(cancel_futures=...)", "dict | dict",
                     "dict |= dict", "int.bit_count", "math.lcm", "random.randbytes", "zip(strict=...)",
                     "dataclass(slots=...)", "functools.cache"], found
    # the same file is fine where the newest rule's Python is the minimum
    assert newer_methods_and_arguments(f, minimum=(3, 10)) == []


def test_no_annotation_syntax_runs_at_import():
    bad = [b for p in modules() for b in runtime_new_syntax(p)]
    assert not bad, "\n".join(bad)


def test_the_check_sees_what_python_38_rejects(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("Box = tuple[int, ...]\ndef f(x: list[int]): return isinstance(x, int | None)\n")
    found = runtime_new_syntax(f)
    assert len(found) == 3, found


def test_vermin_finds_nothing_newer_than_3_8():
    pytest.importorskip("vermin")
    files = [str(p) for p in modules()]
    run_vermin = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"
    done = subprocess.run([sys.executable, "-c", run_vermin, "--no-tips", "--violations",
                           f"-t={MINIMUM[0]}.{MINIMUM[1]}-", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_package_says_3_8():
    cfg = configparser.ConfigParser()
    cfg.read(PACKAGE.parent / "setup.cfg")
    assert cfg["options"]["python_requires"].strip() == ">=3.8"


def _interpreter(version: str):
    """A Python ``version`` interpreter on this machine: on PATH, or one pyenv installed."""
    import glob
    import shutil

    pyenv = sorted(glob.glob(str(pathlib.Path.home() / ".pyenv" / "versions" / f"{version}.*" / "bin" / "python")))
    for candidate in pyenv[::-1] + [shutil.which(f"python{version}")]:
        # a pyenv shim on PATH may exist without the version behind it: it must run
        if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    return None


CHECK_38 = r'''
import json, sys
from alpa_comm import plan_resharding
from alpa_comm.integrations import alpa as adapter, alpa_translate
from alpa_comm.integrations.alpa_harness.loader import run_in_subprocess
plan = plan_resharding((64, 64), "float32", "2x4@0,1", "S0R", "2x4@2,3", "RS1")
done = run_in_subprocess("load_package(ALPA_ROOT)\nimport json\nfrom alpa_comm.integrations import alpa as adapter\n"
                         "from alpa_comm.integrations.alpa_harness import conformance\nadapter.install()\n"
                         "rows = conformance.run(conformance.cases(), ('alpa', 'alpa_comm'))\n"
                         "print(json.dumps([r['verified'] for r in rows]))\n")
print(json.dumps({"python": sys.version.split()[0], "planned": plan.predicted_seconds > 0,
                  "harness": done.returncode, "verified": json.loads(done.stdout or "[]"), "err": done.stderr[-800:]}))
'''


@pytest.mark.timeout(900)
def test_installs_and_runs_where_alpa_lives(tmp_path):
    """Where Alpa 0.2.3 lives (its jaxlib wheels: Python 3.7-3.9): a virtual environment of
    the oldest of Python 3.8 and 3.9 this machine has (3.8, the package's minimum, is the
    strictest; one install is half a minute, so one version) takes alpa_comm together with
    Alpa's pins (ray 2.1.0, numpy 1.24, the last numpy for 3.8), and there the planner runs
    and the adapter passes the conformance cases on Alpa's own code."""
    version, python = next(((v, p) for v in ("3.8", "3.9") if (p := _interpreter(v))), (None, None))
    if python is None:
        pytest.skip("no Python 3.8 or 3.9 interpreter on this machine (PATH or ~/.pyenv)")
    from alpa_comm.integrations.alpa_harness.sources import SourcesUnavailable, alpa_root

    try:
        alpa_root()
    except SourcesUnavailable as e:
        pytest.skip(str(e))
    import shutil

    src = tmp_path / "src"  # a copy, so the install leaves nothing in the checkout
    shutil.copytree(PACKAGE, src / "alpa_comm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "setup.py", "README.md"):
        shutil.copy(PACKAGE.parent / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          str(src), "ray==2.1.0", "numpy==1.24.4"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-3000:]
    done = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK_38], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["python"].startswith(version + ".") and out["planned"], out
    assert out["harness"] == 0 and out["verified"] and all(out["verified"]), out
