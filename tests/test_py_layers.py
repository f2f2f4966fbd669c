"""The Python package's layering: imports point only downward, and the lists
that say so are the import graph's own.

Every module under ``gpumem/`` (subpackages too; names are dotted and
relative to the package: ``snapshots.view``, ``sim`` for
``gpumem/sim/__init__.py``, ``__init__`` for gpumem's own) is parsed (not
imported: no torch, no extension) and each import of one of gpumem's
modules is an edge, wherever it is written: at module level, inside a
function, under ``if TYPE_CHECKING``, or as
``importlib.import_module("gpumem.x")``.  A deferred import still counts.
``import gpumem`` and ``from gpumem import name`` (name not a module) are
edges to the package's ``__init__``; the implicit import of the packages
that enclose a module (``gpumem/__init__`` before ``gpumem.sim.command``) is
not.

Checked against that graph:
- no import cycle;
- the layer list in gpumem/__init__.py's docstring names every module once,
  and each module imports only modules on earlier lines (so the list cannot
  drift from the code); docs/architecture.md holds the same list;
- each subpackage's docstring lists its modules bottom to top, and a module
  of a subpackage imports only the ones listed before it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = "gpumem"
ROOT = Path(__file__).resolve().parent.parent
PKG_DIR = ROOT / PKG
INIT = "__init__"
LAYERS_MARK = "Layers import only downward."
SUB_MARK = "bottom to top:"


def module_name(path: Path) -> str:
    """``snapshots/view.py`` -> 'snapshots.view'; ``sim/__init__.py`` -> 'sim'."""
    parts = list(path.relative_to(PKG_DIR).with_suffix("").parts)
    if parts[-1] == INIT and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    """Module name -> path, for every .py file of the package."""
    return {module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


def _member(prefix: str, name: str, modules: set[str]) -> str | None:
    """The module that ``from gpumem[.prefix] import name`` executes."""
    full = f"{prefix}.{name}" if prefix else name
    if full in modules or full == "_C":
        return full
    return _target_rel(prefix, modules)


def _target_rel(dotted: str, modules: set[str]) -> str | None:
    """The module named by ``dotted`` (relative to gpumem; '' is the package)."""
    if not dotted:
        return INIT
    parts = dotted.split(".")
    while parts:                       # gpumem.x.y where y is a name in module x
        name = ".".join(parts)
        if name in modules or name == "_C":
            return name
        parts.pop()
    return None


def _target(dotted: str, modules: set[str]) -> str | None:
    """The gpumem module that importing ``dotted`` (absolute) executes, if any."""
    parts = dotted.split(".")
    if parts[0] != PKG:
        return None
    return _target_rel(".".join(parts[1:]), modules)


def _base_of(path: Path, level: int) -> list[str]:
    """The package (as parts relative to gpumem) that a relative import of ``level`` names."""
    parts = list(path.relative_to(PKG_DIR).parts[:-1])
    up = level - 1
    if up > len(parts):
        raise AssertionError(f"{path.name}: relative import above the package")
    return parts[:len(parts) - up]


def imports_of(path: Path, modules: set[str],
               pkg_dir: Path | None = None) -> list[tuple[str, int]]:
    """(gpumem module imported, line) for every import written in ``path``
    (``pkg_dir``: the package folder to resolve its relative imports in, when
    ``path`` lies elsewhere)."""
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
            if node.level:
                base = _base_of(path if pkg_dir is None else pkg_dir / path.name, node.level)
                rel = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == PKG:
                rel = ".".join(node.module.split(".")[1:])
            else:
                continue
            for alias in node.names:
                add(_member(rel, alias.name, modules), node)
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
    hops = [f"{a}:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "  (" + "; ".join(hops) + ")"


def parse_layers(text: str) -> list[list[str]]:
    """The layer list after LAYERS_MARK: one layer a line (a line indented by
    four or more spaces continues the one above), bottom first, names separated
    by commas; text in parentheses is a comment."""
    lines = text[text.index(LAYERS_MARK):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  "))
    layers: list[list[str]] = []
    for line in lines[start:]:
        if not line.startswith("  ") or line.strip().startswith("```"):
            break
        names = [n.strip() for n in re.sub(r"\([^)]*\)", "", line).split(",") if n.strip()]
        if line.startswith("    ") and layers:
            layers[-1].extend(names)
        else:
            layers.append(names)
    return layers


def layer_violations(graph: dict[str, dict[str, int]], layers: list[list[str]]) -> list[str]:
    """Every import that is not of a module on an earlier line, and every module
    listed twice, not listed, or listed but absent."""
    line_of: dict[str, int] = {}
    out = []
    for i, layer in enumerate(layers):
        for name in layer:
            if name in line_of:
                out.append(f"{name} is listed twice")
            line_of[name] = i
    listed = set(line_of)
    for name in sorted(set(graph) - listed):
        out.append(f"{name} is not in the layer list")
    for name in sorted(listed - set(graph) - {"_C"}):   # _C: the extension, no .py
        out.append(f"{name} is listed but is no module of the package")
    for a in sorted(graph):
        for b, line in sorted(graph[a].items()):
            if a in line_of and b in line_of and line_of[b] >= line_of[a]:
                out.append(f"{a}:{line} imports {b}, which is not on an earlier line")
    return out


def layered_modules() -> dict[str, dict[str, int]]:
    """The graph less the packages' empty __init__s (a docstring and nothing else)."""
    graph = import_graph()
    mods = package_modules()
    for name, path in mods.items():
        if path.name == "__init__.py" and name != INIT:
            body = ast.parse(path.read_text(encoding="utf-8")).body
            if len(body) == 1 and isinstance(body[0], ast.Expr):
                assert not any(name in deps for deps in graph.values()), name
                del graph[name]
    return graph


def subpackage_lists() -> dict[str, list[str]]:
    """subpackage -> its modules as its docstring lists them, bottom to top."""
    out = {}
    for name, path in package_modules().items():
        if path.name != "__init__.py" or name == INIT:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        at = doc.lower().find(SUB_MARK)
        assert at >= 0, f"gpumem/{name}/__init__.py does not list its modules ('{SUB_MARK}')"
        rows = doc[at + len(SUB_MARK):].splitlines()[1:]
        mods = []
        for row in rows:
            m = re.match(r"  (\S+)", row)
            if m:
                mods.append(m.group(1))
            elif not row.startswith("   ") and row.strip():
                break
        out[name] = mods
    return out


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 10 and "pytorch.installer" in graph, \
        f"gpumem's modules not found in {PKG_DIR}"
    cycles = find_cycles(graph)
    assert not cycles, ("import cycles among gpumem's modules (layers import only downward, "
                        "see gpumem/__init__.py):\n  "
                        + "\n  ".join(describe(c, graph) for c in cycles))


def test_the_layer_list_is_the_import_graph():
    graph = layered_modules()
    layers = parse_layers((PKG_DIR / "__init__.py").read_text(encoding="utf-8"))
    bad = layer_violations(graph, layers)
    assert not bad, "gpumem/__init__.py's layer list:\n  " + "\n  ".join(bad)


def test_the_architecture_document_holds_the_same_list():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    init = (PKG_DIR / "__init__.py").read_text(encoding="utf-8")
    assert parse_layers(doc) == parse_layers(init), (
        "docs/architecture.md's Python layer list differs from gpumem/__init__.py's")


def test_each_subpackage_lists_its_modules_and_imports_only_downward():
    graph = layered_modules()
    lists = subpackage_lists()
    assert {"sim", "snapshots", "recording", "pytorch", "categories", "checkup"} <= set(lists)
    bad = []
    for pkg, listed in sorted(lists.items()):
        names = [pkg if m == INIT else f"{pkg}.{m}" for m in listed]
        own = sorted(m for m in graph if m == pkg or m.startswith(pkg + "."))
        if sorted(names) != own:
            bad.append(f"gpumem/{pkg}: the docstring lists {listed}, the folder holds "
                       f"{own}")
            continue
        rank = {n: i for i, n in enumerate(names)}
        for a in names:
            for b, line in sorted(graph[a].items()):
                if b in rank and rank[b] >= rank[a]:
                    bad.append(f"{a}:{line} imports {b}, listed above it in gpumem/{pkg}")
    assert not bad, "\n  ".join(bad)


def test_deferred_and_relative_imports_are_edges(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import gpumem.pytorch.installer as t\n"
                   "from . import stats\n"
                   "from .history import snapshot\n"
                   "def f():\n"
                   "    from gpumem import record, install\n"
                   "    import gpumem\n"
                   "    importlib.import_module('gpumem.cli')\n"
                   "    from gpumem.snapshots.view import write_view\n"
                   "    from gpumem.snapshots import replay, unpickle as u\n"
                   "    from .. import _conf\n"
                   "    from gpumem.sim import run_snippet\n")
    mods = {"pytorch.installer", "recording.stats", "recording.history", "cli",
            "snapshots.view", "snapshots.replay", "snapshots.unpickle", "_conf", "sim", INIT}
    got = imports_of(src, mods, pkg_dir=PKG_DIR / "recording")
    assert sorted(got) == [
        (INIT, 5), (INIT, 5), (INIT, 6), ("_conf", 10), ("cli", 7), ("pytorch.installer", 1),
        ("recording.history", 3), ("recording.stats", 2), ("sim", 11), ("snapshots.replay", 9),
        ("snapshots.unpickle", 9), ("snapshots.view", 8)]


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b": 3}, "b": {"c": 7, "d": 8}, "c": {"a": 9}, "d": {"a": 1}, "e": {"a": 2}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["a", "b", "d", "a"]]
    cycle = find_cycles(graph)[0]
    assert describe(cycle, graph) == ("a -> b -> c -> a  (a:3 imports b; b:7 imports c; "
                                      "c:9 imports a)")
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []


def test_a_drifted_layer_list_is_caught():
    graph = {"_conf": {}, "history": {"_conf": 3}, "installer": {"history": 5, "_conf": 2}}
    good = parse_layers(f"{LAYERS_MARK}\n  _conf (settings)\n  history\n  installer\n\n")
    assert good == [["_conf"], ["history"], ["installer"]]
    assert layer_violations(graph, good) == []
    assert layer_violations(graph, [["_conf", "history"], ["installer"]]) == [
        "history:3 imports _conf, which is not on an earlier line"]
    assert layer_violations(graph, [["_conf"], ["installer"], ["gone"]]) == [
        "history is not in the layer list", "gone is listed but is no module of the package"]
