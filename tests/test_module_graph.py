"""The package's shape: no import cycle anywhere in sluice/ (counting imports inside functions and under
TYPE_CHECKING: a cycle there still means two modules that cannot be read one after the other), and every
module small enough to read in one go, or saying at its top why not.

The convention for a long module: the first paragraph of its docstring (up to the first blank line) says
``Over 300 lines:`` followed by the reason, in at least a few words, e.g. "Over 300 lines: it is one state
machine ...". A reason further down, or a bare marker, does not count: a reader should see it first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 300
_REASON = re.compile(r"over 300 lines:\s*\S+(\s+\S+){3,}", re.IGNORECASE)  # the marker and 4+ words


def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "sluice").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the sluice modules it names in an import (``from a.b import c`` names ``a.b.c`` when that
    is a module, else ``a.b``). A package's implicit import of its parent is not an edge."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in mods:
                        graph[name].add(target)
                    elif base in mods:
                        graph[name].add(base)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_sluice() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "sluice.operator.runner" in graph["sluice.operator.build"]  # the graph is real
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_the_config_layer_imports_nothing_of_the_operator_or_connectors() -> None:
    graph = import_graph()
    config = [m for m in graph if m == "sluice.config" or m.startswith("sluice.config.")]
    assert len(config) >= 10
    for m in config:
        assert not {t for t in graph[m] if t.startswith(("sluice.operator", "sluice.connectors"))}, m


def too_long(source: str) -> int | None:
    """The line count of a module over MAX_LINES whose docstring's first paragraph gives no reason; else None."""
    lines = source.count("\n")
    if lines <= MAX_LINES:
        return None
    first_paragraph = (ast.get_docstring(ast.parse(source)) or "").split("\n\n", 1)[0]
    return None if _REASON.search(" ".join(first_paragraph.split())) else lines


def test_every_module_in_sluice_is_short_or_says_why_at_its_top() -> None:
    paths = sorted((ROOT / "sluice").rglob("*.py"))
    assert len(paths) > 100  # the whole package, not one folder
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in paths if (n := too_long(p.read_text())) is not None]
    assert long == [], "split these along a real seam, or start their docstring with 'Over 300 lines: <why>'"


def test_the_length_check_wants_the_reason_in_the_first_paragraph() -> None:
    body = "x = 1\n" * MAX_LINES
    assert too_long('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 2)) is None
    assert too_long('"""A parser.\n\nOver 300 lines: it is one grammar, read top to bottom."""\n' + body) is not None
    assert too_long('"""A parser. Over 300 lines:"""\n' + body) is not None  # a marker without a reason
    assert too_long('"""A parser. Over 300 lines: it is one grammar,\nread top to bottom."""\n' + body) is None


def repeated_module_names(paths: list[Path]) -> dict[str, list[str]]:
    """Module file names (``__init__.py`` aside) used by more than one module, with where."""
    where: dict[str, list[str]] = {}
    for p in paths:
        if p.name != "__init__.py":
            where.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    return {name: places for name, places in where.items() if len(places) > 1}


def test_no_module_name_is_used_twice_in_sluice() -> None:
    # A name says what a module holds without its folder: ``registry.py`` four times meant four things.
    paths = sorted((ROOT / "sluice").rglob("*.py"))
    assert len(paths) > 100
    assert repeated_module_names(paths) == {}


def test_the_repeated_name_check_finds_a_repeat() -> None:
    paths = [ROOT / "sluice" / "a" / "base.py", ROOT / "sluice" / "b" / "base.py", ROOT / "sluice" / "a" / "x.py",
             ROOT / "sluice" / "a" / "__init__.py", ROOT / "sluice" / "b" / "__init__.py"]
    assert repeated_module_names(paths) == {"base.py": ["sluice/a/base.py", "sluice/b/base.py"]}
