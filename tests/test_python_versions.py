"""The core and the Alpa adapter run where Alpa 0.2.3 lives (its jaxlib wheels are for
Python 3.7-3.9; the package asks for >= 3.8): no syntax or standard-library call newer
than 3.8 (vermin), and no annotation-only syntax evaluated at run time, which vermin
does not see (``Box = tuple[...]`` at module level, ``isinstance(x, int | None)``)."""
import ast
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
