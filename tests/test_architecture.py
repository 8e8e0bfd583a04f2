"""The tree reads as the architecture: every package says what it is, and no module imports
(at module level or lazily inside a function) a module that imports it back. Imports under
`if TYPE_CHECKING:` are annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import alignatt

ROOT = Path(alignatt.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t in modules and t != name and not name.startswith(t + "."):
                    # a package's __init__ is not an edge: it holds only its docstring here
                    if modules[t].name != "__init__.py":
                        graph[name].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    assert _cycle(_import_graph()) is None, " -> ".join(_cycle(_import_graph()) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_package_has_a_one_line_purpose():
    for init in ROOT.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "\n" not in doc.strip(), f"{init.relative_to(ROOT.parent)} needs a one-line docstring"
