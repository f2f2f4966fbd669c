"""The native layers include only downward (csrc/layers.py states the rule).

Every #include "..." of every file under csrc/<layer>/ is resolved and must
name a file of the same layer or of a layer below it; base/ includes nothing
of gpumem's; core/ and history/ include neither <cuda.h> nor <Python.h>.
Inside core/ each concept has its own header, and the graph of which file
includes which concept's header must have no cycle: a .c file includes only
the headers of what it calls, so this is the core's call graph, and it runs
one way. The same holds for the files of every layer of the extension, read
from the objects' defined and undefined symbols (nm). And no .c, .cpp or .h
file of any of these layers is over 500 lines: one that grows past that holds
more than one concept and is split.
"""

import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sysconfig

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


# ------------------------------------------------ file-level call graph (nm)

CC = shlex.split(os.environ.get("CC", "cc"))
NM = shutil.which("nm")
needs_nm = pytest.mark.skipif(shutil.which(CC[0]) is None or NM is None,
                              reason="needs a C compiler and nm")


def _compile_objects(paths, out_dir):
    """path -> object file, each .c compiled alone (-O0: only its symbols matter)."""
    flags = ["-c", "-std=c11", "-O0", "-Werror=implicit-function-declaration", "-D_GNU_SOURCE",
             "-I", CSRC,
             "-I", sysconfig.get_paths()["include"]]

    def one(path):
        rel = os.path.relpath(path, CSRC).replace(os.sep, "__")
        obj = os.path.join(out_dir, rel + ".o")
        proc = subprocess.run(CC + flags + [path, "-o", obj], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path} does not compile:\n{proc.stderr[-2000:]}"
        return path, obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(one, paths))


def _symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    out = subprocess.run([NM, obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCVW":
            defined.add(parts[2])
    return defined, undefined


def call_graph(objects):
    """file -> the files (of the same set) whose global symbols it uses."""
    syms = {path: _symbols(obj) for path, obj in objects.items()}
    owner = {name: path for path, (defined, _) in syms.items() for name in defined}
    return {path: {owner[name] for name in undefined if name in owner and owner[name] != path}
            for path, (_, undefined) in syms.items()}


@pytest.fixture(scope="module")
def extension_objects(tmp_path_factory):
    paths = [p for layer in layers.EXTENSION_LAYERS for p in _files(layer) if p.endswith(".c")]
    return _compile_objects(paths, str(tmp_path_factory.mktemp("layer_objects")))


@needs_nm
@pytest.mark.parametrize("layer", layers.EXTENSION_LAYERS)
def test_files_of_a_layer_call_one_way(layer, extension_objects):
    """Inside each layer the files call each other one way: helpers two files
    share live in a third file below both, never in one of the two (so no
    pair like cuda_backend.c <-> cuda_vmm.c calls in both directions)."""
    objs = {p: o for p, o in extension_objects.items() if _layer_of(p) == layer}
    cycle = find_cycle(call_graph(objs))
    assert cycle is None, (f"{layer}/ files call each other in a circle: "
                           + " -> ".join(os.path.basename(p) for p in cycle))


@needs_nm
def test_call_graph_check_finds_a_pair_calling_each_other(tmp_path):
    """The nm check can fail: two files that call each other are a cycle, and
    a third file both call is not."""
    src = {"a.c": "int b(void); int c(void); int a(void) { return b() + c(); }\n",
           "b.c": "int a(void); int c(void); int b(void) { return a() + c(); }\n",
           "c.c": "int c(void) { return 1; }\n"}
    for name, text in src.items():
        (tmp_path / name).write_text(text)
    objs = _compile_objects([str(tmp_path / n) for n in src], str(tmp_path))
    graph = {os.path.basename(p): {os.path.basename(d) for d in deps}
             for p, deps in call_graph(objs).items()}
    assert graph == {"a.c": {"b.c", "c.c"}, "b.c": {"a.c", "c.c"}, "c.c": set()}
    assert find_cycle(graph) == ["a.c", "b.c", "a.c"]


def test_csrc_holds_exactly_the_layers():
    """csrc/ is the allocator's native code and nothing else: the layers
    layers.py names, layers.py and README.md (the simulated GPU is simgpu/)."""
    entries = {e for e in os.listdir(CSRC) if e != "__pycache__"}
    assert entries == set(layers.LAYERS) | {"layers.py", "README.md"}
