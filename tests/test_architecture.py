"""The tree reads as the architecture that docs/architecture.md claims.

- The packages form one ordered list, bottom up, and an import may only go down it (or stay inside
  its own package).
- No module imports, directly or through others, a module that imports it back.
- Both rules count every import statement anywhere in a module: at module level, lazily inside a
  function, and under `if TYPE_CHECKING:`. An annotation-only import is still a dependency a
  reader has to follow, and a circle hidden behind it is a type on the wrong side of the line.
- The doc's package map names exactly the packages and modules in the tree, in this order.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import alignatt

ROOT = Path(alignatt.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"

# Bottom up. `cli` is the front end (a package of command groups), the only thing above the packages;
# `__main__` (`python -m alignatt`) only calls it.
LAYERS = ["core", "models", "heads", "capture", "record", "serve", "replay", "speech", "checks", "evaluate",
          "measure", "pipeline", "report", "cli", "__main__"]
FRONT = ("cli", "__main__")  # the front end: the doc's map lists the packages below it


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.Module, module: str, is_package: bool = False) -> set[str]:
    """Every dotted name an import statement anywhere in the tree may refer to (relative ones resolved)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target in imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            # importing through a package whose __init__ holds only its docstring is no edge; one
            # with code (record/artifacts: the Artifact union, load, write) is a module like any other
            if target in modules and target != name and not _docstring_only(modules[target]):
                graph[name].add(target)
    return graph


def _docstring_only(path: Path) -> bool:
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], layers: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if rank[layer_of(t)] > rank[layer_of(m)])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph.get(m, ())):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(found)


def test_every_package_has_a_place_in_the_layers():
    packages = {layer_of(_module_name(p)) for p in ROOT.rglob("*.py")} - {"alignatt"}
    assert packages == set(LAYERS), f"not in LAYERS: {packages - set(LAYERS)}; gone: {set(LAYERS) - packages}"


def test_imports_go_down_only():
    assert upward_imports(_import_graph(), LAYERS) == []


def test_no_module_circles():
    assert circles(_import_graph()) == []


def test_type_checking_and_lazy_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from alignatt.serve.session import S\n"
                     "def f():\n    import alignatt.report.page\n    from . import sibling\n")
    names = imported_names(tree, "alignatt.core.draft")
    assert {"alignatt.serve.session", "alignatt.report.page", "alignatt.core.sibling"} <= names
    graph = {"alignatt.core.draft": {"alignatt.serve.session"}, "alignatt.serve.session": set()}
    assert upward_imports(graph, LAYERS) == ["alignatt.core.draft -> alignatt.serve.session"]


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_every_package_has_a_one_line_purpose():
    for init in ROOT.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "\n" not in doc.strip(), f"{init.relative_to(ROOT.parent)} needs a one-line docstring"


def _expand(spec: str) -> set[str]:
    """`hf/{base,eager}` -> {"hf/base", "hf/eager"}."""
    if m := re.fullmatch(r"(.*)\{(.*)\}", spec):
        return {m.group(1) + part.strip() for part in m.group(2).split(",")}
    return {spec}


def test_the_doc_map_matches_the_tree():
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", DOC.read_text(), flags=re.M)
    assert [name for name, _ in rows] == [p for p in LAYERS if p not in FRONT], "the map lists the packages bottom up"
    for package, cell in rows:
        listed = set().union(*(_expand(s) for s in re.findall(r"`([^`]+)`", cell)))
        real = {str(p.relative_to(ROOT / package).with_suffix("")) for p in (ROOT / package).rglob("*.py")
                if p.name != "__init__.py"}
        assert listed == real, f"{package}: the doc lists {sorted(listed - real)} too many, misses {sorted(real - listed)}"
    order = " ← ".join(f"`{p}`" for p in LAYERS if p != "__main__")
    assert order in DOC.read_text(), f"the doc states the layering as: {order}"
