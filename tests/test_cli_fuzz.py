"""Bad input for ``gpumem view``, ``summary``, ``diff`` and ``replay``: one line, exit 2,
no traceback.

Every variant is generated here and knows its expected outcome:
- 2 for what the loader (gpumem.snapshots.unpickle) must reject: truncations (a
  proper prefix of a pickle never holds its STOP),
  wrong types and missing values for the keys the loader checks, negative or
  beyond-64-bit integers there, a top level that is not a dict or a list of
  segments, pickles naming globals, protocol 0/1 pickles, empty files,
  directories, missing files, text;
- 0 for what is tolerated: wrong types or absurd values in optional fields
  (frames, time_us, user_metadata, allocator_settings, ...);
- for random bit flips the outcome is whatever the loader says about the
  flipped bytes: 0 only if they still load to a structurally valid snapshot.

Each variant runs in-process through cli.main (stderr captured) for all
four commands (diff with the variant as BEFORE, and as AFTER for some;
replay must also refuse a request no allocator serves); a few run as
``python -m gpumem`` in a subprocess.  tests/test_hostile_inputs.py runs
them all again, each command in a child of its own with its time and
memory measured.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import random
import subprocess
import sys
import zlib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gpumem import cli
from gpumem.snapshots.unpickle import SnapshotError, load_snapshot, loads_snapshot

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
N_TRUNC = 64
N_FLIPS = 72
BYTEARRAY8 = 0x96


# ----------------------------------------------------------------- base snapshots

def _frames(line):
    return [{"filename": "/home/u/train.py", "line": line, "name": "step"},
            {"filename": "/home/u/train.py", "line": 90, "name": "<module>"}]


def hand_built():
    """A small, consistent snapshot in torch's schema (every optional key present)."""
    fa, fb = _frames(10), _frames(20)
    base = 1 << 32
    seg = {"device": 0, "address": base, "total_size": 2 * MiB, "allocated_size": 4096,
           "active_size": 4096, "requested_size": 4000, "stream": 0, "segment_type": "small",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": fa,
           "blocks": [{"address": base, "size": 4096, "requested_size": 4000,
                       "state": "active_allocated", "frames": fa},
                      {"address": base + 4096, "size": 2 * MiB - 4096, "requested_size": 0,
                       "state": "inactive", "frames": []}]}
    def entry(action, addr, size, frames, t):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                "frames": frames, "compile_context": "N/A", "user_metadata": ""}
    trace = [entry("segment_alloc", base, 2 * MiB, fa, 1000),
             entry("alloc", base, 4000, fa, 1001),
             entry("alloc", base + 4096, 8000, fb, 1002),
             entry("free_requested", base + 4096, 8000, fb, 1003),
             entry("free_completed", base + 4096, 8000, fb, 1004),
             {"action": "oom", "device_free": 1024, "size": 1 << 30, "stream": 0,
              "time_us": 1005, "frames": fb},
             entry("snapshot", 0, 4000, [], 1006)]
    return {"segments": [seg], "device_traces": [trace],
            "allocator_settings": {"expandable_segments": False, "max_split_size": -1},
            "external_annotations": [{"name": "x", "stage": "START", "device": 0,
                                      "time_us": 1001}]}


def gpumem_made() -> bytes:
    """A snapshot dumped by gpumem's recorder (frames memoized), else the hand-built one."""
    try:
        from gpumem import _C
        from gpumem.recording import history
    except ImportError:
        return pickle.dumps(hand_built(), protocol=4)
    a = _C.Allocator(capacity=256 * MiB)
    history.record_memory_history("all")
    try:
        keep = [a.malloc(s) for s in (1000, 3 * MiB, 40_000)]
        a.free(a.malloc(5 * MiB))
        a.free(keep.pop())
        return pickle.dumps(history.snapshot(), protocol=4)
    finally:
        history.record_memory_history(None)


# ----------------------------------------------------------------- variants

class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def _set(snap, path, value):
    """Set (or delete, for value is DELETE) the key at path, e.g. ('segments', 0, 'device')."""
    obj = snap
    for k in path[:-1]:
        obj = obj[k]
    if value is DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


DELETE = object()
SEG = ("segments", 0)
BLK = ("segments", 0, "blocks", 0)
ALLOC = ("device_traces", 0, 1)
OOM = ("device_traces", 0, 5)
FRAME = ("device_traces", 0, 1, "frames", 0)

# (path, must the loader reject a wrong type there?)
TYPED_KEYS = [
    (("segments",), True), (("device_traces",), True),
    (SEG + ("device",), True), (SEG + ("address",), True), (SEG + ("total_size",), True),
    (SEG + ("stream",), True), (SEG + ("blocks",), True),
    (BLK + ("size",), True), (BLK + ("requested_size",), True), (BLK + ("state",), True),
    (ALLOC + ("action",), True), (ALLOC + ("addr",), True), (ALLOC + ("size",), True),
    (ALLOC + ("stream",), True), (OOM + ("device_free",), True),
    (("device_traces", 0), True), (SEG[:2], True), (BLK, True), (ALLOC, True),
    (("allocator_settings",), False), (("external_annotations",), False),
    (SEG + ("segment_type",), False), (SEG + ("segment_pool_id",), False),
    (SEG + ("is_expandable",), False), (SEG + ("frames",), False),
    (SEG + ("allocated_size",), False), (BLK + ("frames",), False),
    (BLK + ("address",), False), (ALLOC + ("frames",), False), (ALLOC + ("time_us",), False),
    (ALLOC + ("user_metadata",), False), (ALLOC + ("compile_context",), False),
    (FRAME + ("filename",), False), (FRAME + ("line",), False), (FRAME + ("name",), False),
    (FRAME, False), (("external_annotations", 0, "time_us"), False),
]
WRONG_VALUES = [("str", "oops"), ("float", 1.5), ("none", None), ("dict", {"a": 1})]
# (path, must the loader reject the key's absence?)
MISSING_KEYS = [
    (SEG + ("device",), True), (SEG + ("address",), True), (SEG + ("total_size",), True),
    (BLK + ("size",), True), (BLK + ("state",), True), (ALLOC + ("action",), True),
    (ALLOC + ("addr",), True), (ALLOC + ("size",), True), (OOM + ("device_free",), True),
    (SEG + ("stream",), False), (SEG + ("blocks",), False), (BLK + ("requested_size",), False),
    (BLK + ("frames",), False), (ALLOC + ("frames",), False), (ALLOC + ("time_us",), False),
    (ALLOC + ("stream",), False), (("segments",), False), (("device_traces",), False),
    (("allocator_settings",), False), (FRAME + ("line",), False),
]
NUMBERS = [  # (name, path, value, expected exit)
    ("size-2^64", ALLOC + ("size",), 1 << 64, 2), ("size-2^63", ALLOC + ("size",), 1 << 63, 0),
    ("addr-2^70", ALLOC + ("addr",), 1 << 70, 2), ("address-2^64", SEG + ("address",), 1 << 64, 2),
    ("total-10^30", SEG + ("total_size",), 10 ** 30, 2), ("blocksize-2^64", BLK + ("size",), 1 << 64, 2),
    ("device-2^40", SEG + ("device",), 1 << 40, 0), ("device-2^64", SEG + ("device",), 1 << 64, 2),
    ("stream-min", ALLOC + ("stream",), -(1 << 63), 0), ("stream-2^65", ALLOC + ("stream",), -(1 << 65), 2),
    ("free-2^64", OOM + ("device_free",), 1 << 64, 2), ("time-10^30", ALLOC + ("time_us",), 10 ** 30, 0),
    ("line-10^30", FRAME + ("line",), 10 ** 30, 0), ("size-neg", ALLOC + ("size",), -1, 2),
    ("addr-neg", ALLOC + ("addr",), -4096, 2), ("device-neg", SEG + ("device",), -1, 2),
    ("total-neg", SEG + ("total_size",), -5, 2), ("blocksize-neg", BLK + ("size",), -1, 2),
    ("req-neg", BLK + ("requested_size",), -1, 2), ("time-neg", ALLOC + ("time_us",), -7, 0),
    ("line-neg", FRAME + ("line",), -1, 0), ("stream-neg", SEG + ("stream",), -1, 0),
    ("size-zero", ALLOC + ("size",), 0, 0), ("bool-size", ALLOC + ("size",), True, 2),
    ("state-unknown", BLK + ("state",), "active_awaiting_free", 0),
    ("action-unknown", ALLOC + ("action",), "teleport", 0),
]


def _deep(n):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def _dumps_deep(obj) -> bytes:
    """pickle.dumps for the deeply nested variants (the pickler recurses, the unpickler does not).
    CPython 3.12 bounds the C pickler's recursion by a C limit that
    setrecursionlimit does not raise; there the pure-Python pickler (the
    same bytes) writes them."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        try:
            return pickle.dumps(obj, protocol=4)
        except RecursionError:
            buf = io.BytesIO()
            pickle._Pickler(buf, protocol=4).dump(obj)
            return buf.getvalue()
    finally:
        sys.setrecursionlimit(old)


def _variants(blob: bytes) -> dict[str, tuple[str, object, object]]:
    """name -> (kind, data, expected); kind 'bytes' | 'path'; expected 0, 2 or 'oracle'."""
    out: dict[str, tuple[str, object, object]] = {}
    n = len(blob)
    for i in range(N_TRUNC):
        out[f"truncate-{i:02d}"] = ("bytes", blob[: i * (n - 1) // (N_TRUNC - 1)], 2)
    rng = random.Random(1234)
    for i in range(N_FLIPS):
        pos, bit = rng.randrange(n), rng.randrange(8)
        while blob[pos] ^ (1 << bit) == BYTEARRAY8:  # see test_overlong_bytearray8_...
            pos, bit = rng.randrange(n), rng.randrange(8)
        flipped = bytearray(blob)
        flipped[pos] ^= 1 << bit
        out[f"flip-{i:02d}"] = ("bytes", bytes(flipped), "oracle")
    base = hand_built()

    def mutated(path, value):
        snap = copy.deepcopy(base)
        _set(snap, path, value)
        return pickle.dumps(snap, protocol=4)
    for path, required in TYPED_KEYS:
        wrong = WRONG_VALUES if path[-1] not in ("action", "state") else (
            [("int", 7)] + WRONG_VALUES[1:])
        for tname, value in wrong:
            name = "type-" + ".".join(map(str, path)) + "-" + tname
            out[name] = ("bytes", mutated(path, value), 2 if required else 0)
    for path, required in MISSING_KEYS:
        out["missing-" + ".".join(map(str, path))] = ("bytes", mutated(path, DELETE),
                                                      2 if required else 0)
    for name, path, value, expected in NUMBERS:
        out["number-" + name] = ("bytes", mutated(path, value), expected)
    for name, obj in [("int", 5), ("str", "snapshot"), ("none", None), ("float", 2.5),
                      ("tuple", (1, 2)), ("set", {1, 2}), ("bytes", b"\x00"),
                      ("list-of-ints", [1, 2]), ("empty-dict", {}), ("deep-list", _deep(3000))]:
        out["toplevel-" + name] = ("bytes", _dumps_deep(obj), 2)
    out["toplevel-bare-segment-list"] = ("bytes", pickle.dumps(base["segments"], protocol=4), 0)
    deep = copy.deepcopy(base)
    deep["device_traces"][0][1]["frames"] = [{"filename": _deep(3000), "line": 1, "name": "x"}]
    out["deep-frame-filename"] = ("bytes", _dumps_deep(deep), 0)
    cyc = copy.deepcopy(base)
    cyc["device_traces"][0][1]["frames"].append(cyc["device_traces"][0][1]["frames"])
    out["cyclic-frames"] = ("bytes", pickle.dumps(cyc, protocol=4), 0)
    for name, obj in [("os-system", Evil()), ("ordereddict", __import__("collections").OrderedDict(a=1)),
                      ("in-segments", {"segments": [Evil()], "device_traces": []}),
                      ("range", range(3)), ("exception", ValueError("x"))]:
        out["global-" + name] = ("bytes", pickle.dumps(obj, protocol=4), 2)
    out["global-protocol2"] = ("bytes", pickle.dumps(Evil(), protocol=2), 2)
    for proto in (0, 1):
        out[f"protocol-{proto}"] = ("bytes", pickle.dumps(base, protocol=proto), 2)
    for proto in (2, 3, 4, 5):
        out[f"protocol-{proto}-ok"] = ("bytes", pickle.dumps(base, protocol=proto), 0)
    out["protocol-9"] = ("bytes", b"\x80\x09" + blob[2:], 2)
    out["empty-file"] = ("bytes", b"", 2)
    out["text-file"] = ("bytes", b"segments: [] # not a pickle\n", 2)
    out["json-file"] = ("bytes", b'{"segments": [], "device_traces": []}', 2)
    out["random-after-header"] = ("bytes", b"\x80\x04" + random.Random(7).randbytes(300), "oracle")
    out["proto-only"] = ("bytes", b"\x80\x04", 2)
    out["stop-only"] = ("bytes", b"\x80\x04.", 2)
    out["directory"] = ("path", "dir", 2)
    out["missing-file"] = ("path", "missing", 2)
    out["unreadable-file"] = ("path", "unreadable", 2)
    out["valid-gpumem"] = ("bytes", blob, 0)
    out["valid-hand-built"] = ("bytes", pickle.dumps(base, protocol=4), 0)
    return out


def _oracle(data: bytes) -> int:
    try:
        loads_snapshot(data, "x")
    except SnapshotError:
        return 2
    return 0


def replay_oracle(path) -> int:
    """gpumem replay's status for a file the loader accepts: 2 if it holds a
    request no allocator serves."""
    from gpumem.snapshots import replay
    snap = load_snapshot(path)
    try:
        for d in replay.traced_devices(snap):
            replay.build_ops(snap, d, str(path))
    except SnapshotError:
        return 2
    return 0


BLOB = gpumem_made()
VARIANTS = _variants(BLOB)
SUBPROCESS = ["truncate-31", "flip-05", "global-os-system", "type-segments.0.device-str",
              "directory", "valid-gpumem"]


def test_there_are_enough_variants():
    assert len(VARIANTS) >= 200
    expected = [v[2] for v in VARIANTS.values()]
    assert expected.count(2) >= 150 and expected.count(0) >= 30


@pytest.fixture
def good(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "fuzz-good.pickle"
    if not path.exists():
        path.write_bytes(BLOB)
    return path


def materialise(tmp_path, name):
    kind, data, expected = VARIANTS[name]
    if kind == "bytes":
        path = tmp_path / "variant.pickle"
        path.write_bytes(data)
        return path, (_oracle(data) if expected == "oracle" else expected)
    if data == "dir":
        path = tmp_path / "snapshot.pickle"
        path.mkdir()
    elif data == "missing":
        path = tmp_path / "does-not-exist.pickle"
    else:
        path = tmp_path / "unreadable.pickle"
        path.write_bytes(BLOB)
        path.chmod(0)
        if os.access(path, os.R_OK):  # running as root: permissions do not bite
            return path, 0
    return path, expected


def run_in_process(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def check(code, out, err, expected, what):
    assert "Traceback" not in err and "Traceback" not in out, (what, err)
    assert code == expected, (what, code, err[-500:])
    if expected == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpumem: error: "), (what, err)
        assert out == "", (what, out[:200])
    else:
        assert err == "", (what, err)


# The fast tier runs a fixed third of the variants (by a hash of the name);
# the full tier every one.
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if zlib.crc32(n.encode()) % 3 == 1
                                               else [pytest.mark.slow])
                                  for n in sorted(VARIANTS)])
def test_variant(tmp_path, good, name):
    path, expected = materialise(tmp_path, name)
    html = tmp_path / "out.html"
    commands = [["view", path, "-o", html], ["summary", path], ["summary", path, "--json"],
                ["diff", path, good], ["replay", path]]
    if zlib.crc32(name.encode()) % 3 == 0 or expected == 0:
        commands.append(["diff", good, path, "--json"])
    for argv in commands:
        code, out, err = run_in_process(argv)
        want = replay_oracle(path) if argv[0] == "replay" and expected == 0 else expected
        check(code, out, err, want, argv[0])
        if argv[0] == "view":
            assert html.exists() == (expected == 0), name
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "temporary left"


@pytest.mark.parametrize("name", SUBPROCESS)
def test_variant_in_a_subprocess(tmp_path, good, name):
    path, expected = materialise(tmp_path, name)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("GPUMEM_TRACEBACK", None)
    for argv in (["view", path, "-o", tmp_path / "o.html"], ["summary", path],
                 ["diff", good, path]):
        proc = subprocess.run([sys.executable, "-m", "gpumem", *map(str, argv)], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=120)
        check(proc.returncode, "" if expected == 2 and not proc.stdout else proc.stdout,
              proc.stderr, expected, argv[0])


def test_usage_errors_are_one_line(good):
    for argv in (["view"], ["diff", good], ["summary", good, "--top", "0"],
                 ["summary", good, "--top", "x"], ["view", good, "--device", "-1"],
                 ["view", good, "--device", "7"], ["summary", good, "--device", "9"]):
        code, out, err = run_in_process(argv)
        check(code, out, err, 2, argv)


def test_unwritable_output_is_one_line(tmp_path, good):
    code, out, err = run_in_process(["view", good, "-o", tmp_path / "no" / "such" / "x.html"])
    check(code, out, err, 2, "view")
    assert "cannot write" in err and "-o" in err


def test_overlong_bytearray8_prints_nothing_more(tmp_path):
    """An over-long BYTEARRAY8 must not leak a buffer export (which CPython
    reports on stderr, sometimes only at exit): one error line per run."""
    path = tmp_path / "ba8.pickle"
    path.write_bytes(b"\x80\x05\x96" + (1 << 40).to_bytes(8, "little") + b"x" * 100)
    code = ("import sys; from gpumem import cli\n"
            "codes = [cli.main(['summary', sys.argv[1]]) for _ in range(3)]\n"
            "sys.exit(max(codes))")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and all(x.startswith("gpumem: error: ") for x in lines), lines


def test_closed_stdout_is_not_an_error(tmp_path):
    """'gpumem summary x --json | head -1' stops quietly, with no error line."""
    trace = [{"action": "alloc", "addr": (1 << 30) + i * 4096, "size": 4096, "stream": 0,
              "frames": [{"filename": f"/u/m{i}.py", "line": i, "name": "f"}]}
             for i in range(3000)]
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen([sys.executable, "-m", "gpumem", "summary", str(path), "--json",
                             "--top", "5000"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and err == b"", err
