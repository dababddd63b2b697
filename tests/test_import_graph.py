"""The packages' modules import each other without circles (type-only imports count:
they are how a circle starts, and so do `importlib.import_module("alpa_comm....")` calls), except the ones listed here with why they remain; the
library never imports the benchmark package."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "alpa_comm"
BENCH = PACKAGE.parent / "alpa_comm_bench"

KNOWN: set = set()
"""Circles that remain, each as the set of its modules."""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            candidates = [node.args[0].value]  # importlib.import_module("alpa_comm..."): an import all the same
        else:
            continue
        out |= {c for c in candidates if c.startswith("alpa_comm")}
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. Packages' ``__init__`` are left out: they
    re-export their modules' names, so through them every module would seem to import
    every other; ``from pkg import mod`` counts as importing ``pkg.mod``."""
    modules = {module_name(p): p for root in (PACKAGE, BENCH) for p in root.rglob("*.py") if p.name != "__init__.py"}
    return {m: {i for i in imports_of(p) if i in modules and i != m} for m, p in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[frozenset]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_beyond_the_known_ones():
    found = set(cycles(graph()))
    assert found <= KNOWN, f"new import circles: {[sorted(c) for c in found - KNOWN]}"


def test_the_library_never_imports_the_benchmarks():
    """alpa_comm_bench imports alpa_comm, never the other way: the CLI reaches a runner
    through ``cli.needs.bench`` when its command runs, so importing the library (and its
    CLI) loads no benchmark code."""
    bad = sorted(module_name(p) for p in PACKAGE.rglob("*.py")
                 if any(i.split(".")[0] == "alpa_comm_bench" for i in imports_of(p)))
    assert not bad, f"library modules that import alpa_comm_bench: {bad}"
    code = ("import sys, alpa_comm, alpa_comm.cli, alpa_comm.suites, alpa_comm.sim, alpa_comm.report\n"
            "assert not [m for m in sys.modules if m.startswith('alpa_comm_bench')]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [frozenset({"a", "b"})]
