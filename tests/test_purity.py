"""The pure core stays pure: no heavy framework is loaded by planning, and no module of
a pure package imports the shell (runtime, report, trainer, CLI, ...) or writes files."""
import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "alpa_comm"
PURE = ["spec.py", "mesh.py", "placement.py", "topology.py", "dtypes.py", "errors.py", "validation.py", "_extras.py",
        "suites.py", "resharding", "sim", "pipeline"]
SHELL = {"runtime", "report", "train", "models", "cli", "integrations", "alpa_comm_bench"}
"""The shell: alpa_comm's packages that run, measure or write, and the benchmark package."""
HEAVY = {"jax", "ray", "torch", "cupy", "matplotlib", "tqdm", "optax"}
WRITES = {"write_text", "write_bytes", "savefig", "mkdir", "unlink", "open"}


def pure_modules():
    for entry in PURE:
        path = PACKAGE / entry
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _nodes(tree: ast.AST, top_level_only: bool):
    """Every node, skipping ``if TYPE_CHECKING:`` blocks (annotations only) and, with
    ``top_level_only``, function bodies (lazy imports)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            stack.append(child)


def imported(tree: ast.AST, path: pathlib.Path, top_level_only: bool = False):
    """(top-level alpa_comm package or external module) of every import in ``tree``."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for alpa_comm/x.py
    for node in _nodes(tree, top_level_only):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                yield parts[1] if parts[0] == "alpa_comm" and len(parts) > 1 else parts[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                yield parts[1] if parts[0] == "alpa_comm" and len(parts) > 1 else parts[0]
            elif node.level > depth:  # climbs to alpa_comm/: the first part names a top-level module
                first = (node.module or "").split(".")[0]
                yield from ([first] if first else [a.name for a in node.names])


@pytest.mark.parametrize("path", list(pure_modules()), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_module_imports_no_shell_and_writes_no_files(path):
    tree = ast.parse(path.read_text())
    bad = sorted(set(imported(tree, path)) & SHELL)
    assert not bad, f"{path.name} imports {bad}: the pure core must not depend on the shell"
    # A heavy framework only inside a function, for an optional conversion (ShardingSpec -> jax)
    heavy = sorted(set(imported(tree, path, top_level_only=True)) & HEAVY)
    assert not heavy, f"{path.name} imports {heavy} at module level"
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not calls & WRITES, f"{path.name} calls {sorted(calls & WRITES)}: only the shell writes files"


def test_the_check_sees_a_shell_import():
    fake = PACKAGE / "sim" / "x.py"
    tree = ast.parse("from ..report.tables import table\nimport jax\ndef f():\n    import ray\n")
    assert {"report", "jax", "ray"} <= set(imported(tree, fake))
    assert "ray" not in set(imported(tree, fake, top_level_only=True))


def test_planning_imports_no_heavy_frameworks():
    code = ("import sys, alpa_comm, alpa_comm.cli, alpa_comm.resharding.verify, alpa_comm.sim, alpa_comm.pipeline\n"
            "alpa_comm.plan_resharding((8, 8), 'float32', '2x2@0,1', 'S0R', '2x2@2,3', 'RS1')\n"
            "bad = [m for m in ('jax', 'ray', 'torch', 'cupy', 'matplotlib') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
