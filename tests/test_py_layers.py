"""The Python package's layering: no import cycle among gpumem's own modules.

Every ``gpumem/*.py`` is parsed (not imported: no torch, no extension) and
each import of one of gpumem's modules is an edge, wherever it is written:
at module level, inside a function, under ``if TYPE_CHECKING``, or as
``importlib.import_module("gpumem.x")``.  A deferred import still makes a
cycle (the rule in gpumem/__init__.py: layers import only downward).
``import gpumem`` and ``from gpumem import name`` (name not a module) are
edges to the package's ``__init__``; the package's own implicit import
that precedes ``gpumem.x`` is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "gpumem"
PKG_DIR = Path(__file__).resolve().parent.parent / PKG
INIT = "__init__"


def package_modules() -> dict[str, Path]:
    """Module name (file stem, '__init__' for the package) -> path."""
    return {p.stem: p for p in sorted(PKG_DIR.glob("*.py"))}


def _member(name: str, modules: set[str]) -> str:
    """The module that ``gpumem.<name>`` is: a module of the package, or __init__'s name."""
    return name if name in modules or name == "_C" else INIT


def _target(dotted: str, modules: set[str]) -> str | None:
    """The gpumem module that importing ``dotted`` (absolute) executes, if any."""
    parts = dotted.split(".")
    if parts[0] != PKG:
        return None
    return _member(parts[1], modules) if len(parts) > 1 else INIT


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(gpumem module imported, line) for every import written in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []

    def add(name: str | None, node: ast.AST) -> None:
        if name is not None:
            found.append((name, node.lineno))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_target(alias.name, modules), node)
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                raise AssertionError(f"{path.name}:{node.lineno}: relative import above the "
                                     "package")
            base = node.module or ""
            if node.level == 1:
                base = f"{PKG}.{base}" if base else PKG
            if base == PKG:      # from gpumem import x / from . import x
                for alias in node.names:
                    add(_member(alias.name, modules), node)
            else:
                add(_target(base, modules), node)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module",
                                                                            "__import__")))):
            add(_target(node.args[0].value, modules), node)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line of such an import} (self-imports left out)."""
    mods = package_modules()
    names = set(mods)
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for m, path in mods.items():
        for dep, line in imports_of(path, names):
            if dep != m and dep in names:
                graph[m].setdefault(dep, line)
    return graph


def find_cycles(graph: dict[str, dict[str, int]], limit: int = 50) -> list[list[str]]:
    """The elementary cycles (a, b, ..., a), each starting at its smallest module name.

    At most ``limit`` are returned; the graph is a few dozen modules.
    """
    cycles: list[list[str]] = []

    def walk(start: str, path: list[str]) -> None:
        for w in sorted(graph[path[-1]]):
            if len(cycles) >= limit:
                return
            if w == start:
                cycles.append(path + [start])
            elif w > start and w not in path:
                walk(start, path + [w])

    for start in sorted(graph):
        walk(start, [start])
    return cycles


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    hops = [f"{a}.py:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "  (" + "; ".join(hops) + ")"


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 10 and "_torch" in graph, f"gpumem's modules not found in {PKG_DIR}"
    cycles = find_cycles(graph)
    assert not cycles, ("import cycles among gpumem's modules (layers import only downward, "
                        "see gpumem/__init__.py):\n  "
                        + "\n  ".join(describe(c, graph) for c in cycles))


def test_deferred_and_relative_imports_are_edges(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import gpumem._torch as t\n"
                   "from . import stats\n"
                   "from .history import snapshot\n"
                   "def f():\n"
                   "    from gpumem import record, install\n"
                   "    import gpumem\n"
                   "    importlib.import_module('gpumem.cli')\n"
                   "    from gpumem.view import write_view\n")
    mods = {"_torch", "stats", "history", "record", "cli", "view", INIT}
    assert sorted(imports_of(src, mods)) == [
        (INIT, 5), (INIT, 6), ("_torch", 1), ("cli", 7), ("history", 3), ("record", 5),
        ("stats", 2), ("view", 8)]


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b": 3}, "b": {"c": 7, "d": 8}, "c": {"a": 9}, "d": {"a": 1}, "e": {"a": 2}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["a", "b", "d", "a"]]
    cycle = find_cycles(graph)[0]
    assert describe(cycle, graph) == ("a -> b -> c -> a  (a.py:3 imports b; b.py:7 imports c; "
                                      "c.py:9 imports a)")
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []

