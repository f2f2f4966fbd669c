"""The native layers include only downward (csrc/layers.py states the rule).

Every #include "..." of every file under csrc/<layer>/ is resolved and must
name a file of the same layer or of a layer below it; base/ includes nothing
of gpumem's; core/ and history/ include neither <cuda.h> nor <Python.h>.
Inside core/ each concept has its own header, and the graph of which file
includes which concept's header must have no cycle: a .c file includes only
the headers of what it calls, so this is the core's call graph, and it runs
one way. And no .c, .cpp or .h file of any of these layers is over 500
lines: one that grows past that holds more than one concept and is split.
"""

import os
import re

import pytest

from csrc_layers import layers

CSRC = layers.HERE
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)
SYSTEM_FORBIDDEN = {"core": ("cuda.h", "Python.h"), "history": ("cuda.h", "Python.h"),
                    "base": ("cuda.h", "Python.h"), "device": ("Python.h",)}
MAX_LINES = 500


def _files(layer):
    d = os.path.join(CSRC, layer)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith((".c", ".h", ".cpp")))


def _includes(path):
    with open(path, encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


def _layer_of(path):
    rel = os.path.relpath(path, CSRC)
    return rel.split(os.sep)[0] if os.sep in rel else None


def layer_violations(layer):
    """(file, include, why) for every include of `layer` that breaks the rule."""
    allowed = {layer, *layers.LAYERS[layer]}
    bad = []
    for path in _files(layer):
        for kind, name in _includes(path):
            if kind == "<":
                if os.path.basename(name) in SYSTEM_FORBIDDEN.get(layer, ()):
                    bad.append((path, name, f"{layer}/ must not include <{name}>"))
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(path), name))
            if not os.path.exists(target):
                bad.append((path, name, "the included file does not exist"))
                continue
            to = _layer_of(target)
            if to not in allowed:
                bad.append((path, name, f"{layer}/ may include only {sorted(allowed)}, "
                                        f"not {to}/"))
    return bad


@pytest.mark.parametrize("layer", list(layers.LAYERS))
def test_layer_includes_only_downward(layer):
    bad = layer_violations(layer)
    assert not bad, "\n".join(f"{os.path.relpath(p, CSRC)}: #include \"{n}\": {why}"
                              for p, n, why in bad)


def test_base_includes_nothing_of_gpumem():
    assert layers.LAYERS["base"] == ()
    for path in _files("base"):
        for kind, name in _includes(path):
            if kind == '"':
                assert "/" not in name, f"{path} includes {name}"


def _core_graph():
    """concept -> concepts whose headers it includes (foo.c and foo.h are one concept)."""
    graph = {}
    for path in _files("core"):
        concept = os.path.splitext(os.path.basename(path))[0]
        deps = graph.setdefault(concept, set())
        for kind, name in _includes(path):
            if kind == '"' and "/" not in name:
                dep = os.path.splitext(name)[0]
                if dep != concept:
                    deps.add(dep)
    return graph


def find_cycle(graph):
    """A list of nodes forming a cycle, or None."""
    state = {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, stack)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_core_concepts_call_one_way():
    cycle = find_cycle(_core_graph())
    assert cycle is None, "core/ headers include each other in a circle: " + " -> ".join(cycle)


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_layer_check_catches_an_upward_include(tmp_path, monkeypatch):
    """The include check can fail: a core file that includes python/ is caught."""
    fake = tmp_path / "csrc"
    for layer in layers.LAYERS:
        (fake / layer).mkdir(parents=True)
    (fake / "python" / "api.h").write_text("")
    (fake / "core" / "bad.c").write_text('#include "../python/api.h"\n#include <Python.h>\n')
    monkeypatch.setattr(layers, "HERE", str(fake))
    monkeypatch.setitem(globals(), "CSRC", str(fake))
    whys = [why for _, _, why in layer_violations("core")]
    assert any("not python/" in w for w in whys) and any("<Python.h>" in w for w in whys)


def oversized_files(max_lines=MAX_LINES):
    """(path under csrc/, line count) for every file of every layer over max_lines."""
    big = []
    for layer in layers.LAYERS:
        for path in _files(layer):
            with open(path, encoding="utf-8") as f:
                n = sum(1 for _ in f)
            if n > max_lines:
                big.append((os.path.relpath(path, CSRC).replace(os.sep, "/"), n))
    return big


def test_files_stay_small():
    big = oversized_files()
    assert not big, (f"files over {MAX_LINES} lines (split each by concept):\n"
                     + "\n".join(f"  csrc/{path}: {n} lines" for path, n in big))


def test_size_check_covers_every_layer(tmp_path, monkeypatch):
    """The size check can fail, and looks at .c, .cpp and .h files of every layer."""
    fake = tmp_path / "csrc"
    for layer in layers.LAYERS:
        (fake / layer).mkdir(parents=True)
    (fake / "base" / "ok.c").write_text("x\n" * MAX_LINES)
    (fake / "device" / "big.h").write_text("x\n" * (MAX_LINES + 1))
    (fake / "torch" / "big.cpp").write_text("x\n" * (MAX_LINES + 7))
    (fake / "python" / "notes.txt").write_text("x\n" * (MAX_LINES + 1))
    monkeypatch.setattr(layers, "HERE", str(fake))
    monkeypatch.setitem(globals(), "CSRC", str(fake))
    assert oversized_files() == [("device/big.h", MAX_LINES + 1), ("torch/big.cpp", MAX_LINES + 7)]
