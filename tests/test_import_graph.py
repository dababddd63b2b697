"""The package's modules import each other without circles (type-only imports count:
they are how a circle starts), except the ones listed here with why they remain."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "alpa_comm"

KNOWN = {
    # the Alpa adapter and the code it installs in Alpa's workers share the adapter's
    # registration; untangling them is the Alpa issue's work
    frozenset({"alpa_comm.integrations.alpa", "alpa_comm.integrations.alpa_worker"}),
}
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
        else:
            continue
        out |= {c for c in candidates if c.startswith("alpa_comm")}
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. Packages' ``__init__`` are left out: they
    re-export their modules' names, so through them every module would seem to import
    every other; ``from pkg import mod`` counts as importing ``pkg.mod``."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
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


def test_the_detector_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [frozenset({"a", "b"})]
