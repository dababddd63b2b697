"""The architecture page's layout section and the docs' links follow the tree; every source folder is a package."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def layout_block() -> str:
    """The code block of docs/architecture.md's "## Layout" section (the source tree, folder by folder)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("\n## Layout"):]
    return section[section.index("```") + 3:section.index("```", section.index("```") + 3)]


def test_layout_names_every_package_and_module():
    block = layout_block()
    pkg = ROOT / "alpa_comm"
    folders = sorted(p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.name for p in pkg.glob("*.py") if p.name != "__init__.py")
    missing = [f"{f}/" for f in folders if f"{f}/" not in block] + [m for m in modules if m not in block]
    assert not missing, f"docs/architecture.md's layout does not mention {missing}"
    named = set(re.findall(r"^  ([a-z_]+)/", block, re.M))
    gone = sorted(named - set(folders))
    assert not gone, f"docs/architecture.md's layout names folders that do not exist: {gone}"
    bench = ROOT / "alpa_comm_bench"
    section = block[block.index("\nalpa_comm_bench/"):]
    section = section[:re.search(r"\n\S", section[1:]).start() + 1]  # up to the next top-level entry
    unnamed = [p.stem for p in sorted(bench.glob("*.py")) if p.name != "__init__.py" and p.stem not in section]
    assert not unnamed, f"docs/architecture.md's layout does not name alpa_comm_bench's modules {unnamed}"


def test_readme_and_docs_links_resolve():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_source_folder_is_a_package():
    """setup.cfg finds packages by their __init__.py: a folder without one would be left
    out of a (non-editable) install."""
    folders = {p.parent for top in ("alpa_comm", "alpa_comm_bench") for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"source folders without __init__.py: {missing}"
