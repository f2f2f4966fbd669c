"""Memory history under PyTorch's CUDA build on the simulated GPU, with
gpumem installed: torch.cuda.memory._record_memory_history, _snapshot and
_dump_snapshot (routed to gpumem) record real torch allocations, and the
snapshots they write are what PyTorch's own tools expect.

One simulator process (the ``recorded`` fixture) runs SCRIPT, a real file,
so that frames name it: a Transformer + AdamW training loop, direct use of
the allocator (torch.cuda.caching_allocator_alloc / _delete), a known
allocation pattern, one recording per context level and an out-of-memory
error, each dumped to its own file. torch.cuda._memory_viz reads those in
the same process; the assertions and the consistency checks (blocks tile
segments, replaying the trace backwards as MemoryViz's Allocator State
History does never misses a block or segment) run here on the files,
loaded with gpumem's restricted unpickler. Recording under load (Python
threads, autograd's backward thread, snapshots taken meanwhile) runs in a
second process with a time limit, so a deadlock fails the test. The last
test checks interning's per-thread cache directly on gpumem._C.

Not run here (skipped with the reason): MemoryViz.js in Chromium, because
torch 2.14.1's wheel does not ship torch/utils/viz/MemoryViz.js (it is never
downloaded), and _memory_viz's flamegraph rendering, which needs
flamegraph.pl (downloaded by _memory_viz from the network when missing).
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import os
import pickle
import pickletools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpumem.snapshots.unpickle import load_snapshot

from test_history_support import check_snapshot
from torch_helpers import TRANSFORMER, run_gm, run_py

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

MiB = 1 << 20

# Sizes of the known patterns (odd values no other allocation has).
PAT_SMALL = 777_777          # small pool: <= 1 MiB
PAT_BIG = 30 * MiB + 12_345  # large pool: its own segment (> 10 MiB)
CTX_SIZE = 3_333_333
OOM_SIZE = 8 << 30           # more than the simulated device holds

# Runs with run_gm's prelude (TRANSFORMER, emit) in globals; OUT is the
# directory for the dumps. Lines marked "# <NAME>" are looked up by marker.
SCRIPT = '''
import pickle, sys
import torch.cuda._memory_viz as mv
from gpumem.snapshots.unpickle import load_snapshot

mem = torch.cuda.memory
res = {"routed": [mem._record_memory_history is gpumem._record_memory_history,
                  mem._snapshot is gpumem._snapshot,
                  mem._dump_snapshot is gpumem._dump_snapshot]}
identity = lambda lines: lines   # flamegraph.pl is not here (see the flamegraph test)


def viz(name):
    """Every _memory_viz view of OUT/name.pickle; sizes of what they produce."""
    snap = load_snapshot(f"{OUT}/{name}.pickle")
    out = {"segsum": mv.segsum(snap), "trace": len(mv.trace(snap)),
           "trace_plot": len(mv.trace_plot(snap)),
           "trace_plot_segments": len(mv.trace_plot(snap, plot_segments=True)),
           "segment_plot": len(mv.segment_plot(snap)),
           "segments": len(mv.segments(snap, format_flamegraph=identity)),
           "memory": len(mv.memory(snap, format_flamegraph=identity))}
    # filter_freed edits the dict it is given
    out["trace_plot_filtered"] = len(mv.trace_plot(load_snapshot(f"{OUT}/{name}.pickle"),
                                                   filter_freed=True))
    return out


# --- 1. a training loop, with torch's defaults (context='all', stacks='all')
mem._record_memory_history(max_entries=100_000)
model, opt = make_model()
x = torch.randn(8, 16, 64, device="cuda")
for step in range(3):
    mem._set_memory_metadata(f"step {step}")
    train_step(model, opt, x)  # <TRAIN>
mem._set_memory_metadata("")
torch.cuda.synchronize()
mem._dump_snapshot(f"{OUT}/train.pickle")
res["viz_train"] = viz("train")
mem._record_memory_history(None)

# --- 2. direct allocator use: raw allocations on two streams
mem._record_memory_history("all", context="all", stacks="python")
side = torch.cuda.Stream()
raw = []
for i, n in enumerate([1000, 5000, 2 * MiB, 30 * MiB, 700, 12345, 64 << 10, 11 * MiB]):
    raw.append(torch.cuda.caching_allocator_alloc(n, stream=side if i % 2 else None))
for p in raw[::2]:
    torch.cuda.caching_allocator_delete(p)
torch.cuda.empty_cache()
mem._dump_snapshot(f"{OUT}/direct.pickle")
res["viz_direct"] = viz("direct")
for p in raw[1::2]:
    torch.cuda.caching_allocator_delete(p)
mem._record_memory_history(None)


# --- 3. a known pattern, counted in the pickle
def pattern():
    small = [torch.empty(PAT_SMALL, dtype=torch.uint8, device="cuda") for _ in range(5)]
    big = [torch.empty(PAT_BIG, dtype=torch.uint8, device="cuda") for _ in range(3)]
    del small
    del big
    torch.cuda.empty_cache()


torch.cuda.empty_cache()
mem._record_memory_history("all", context="all", stacks="python")
pattern()
mem._dump_snapshot(f"{OUT}/pattern.pickle")
mem._record_memory_history(None)


# --- 4. which stack goes on which event, per context level
def make_tensor():
    return torch.empty(CTX_SIZE, dtype=torch.uint8, device="cuda")  # <ALLOC>


def drop_tensor(box):
    del box[0]  # <FREE>


for ctx in ("state", "alloc", "all"):
    mem._record_memory_history("all", context=ctx, stacks="python")
    box = [make_tensor()]
    keep = make_tensor()
    drop_tensor(box)
    res.setdefault("keep", {})[ctx] = keep.data_ptr()
    mem._dump_snapshot(f"{OUT}/ctx_{ctx}.pickle")
    del keep
    mem._record_memory_history(None)

# --- 5. out of memory while recording
torch.cuda.empty_cache()
mem._record_memory_history("all", context="all", stacks="python")
hold = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
cached = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
del cached
try:
    torch.empty(OOM_SIZE, dtype=torch.uint8, device="cuda")  # <OOM>
    res["oom"] = None
except torch.OutOfMemoryError as e:
    res["oom"] = str(e).splitlines()[0]
res["free_after_oom"] = torch.cuda.mem_get_info()[0]
after = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")   # still works
mem._dump_snapshot(f"{OUT}/oom.pickle")
mem._record_memory_history(None)
emit(res)
'''

LOAD_SCRIPT = '''
import faulthandler, random, sys, threading, time
faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)   # a deadlock prints every stack
mem = torch.cuda.memory
SIZES = [512, 3000, 40 << 10, 700 << 10, 2 << 20, 12 << 20]
errors = []
barrier = threading.Barrier(N_THREADS + 2)


def worker(i, live_out, taken):
    try:
        mem._set_memory_metadata(f"worker {i}")
        rng = random.Random(i)
        stream = torch.cuda.Stream()
        live = []
        barrier.wait()
        k = 0
        while k < ITERS or (len(taken) < 3 and k < 10 * ITERS):   # overlap the snapshots
            k += 1
            if k % 3 == 0:
                with torch.cuda.stream(stream):
                    t = torch.empty(rng.choice(SIZES), dtype=torch.uint8, device="cuda")
                t.record_stream(torch.cuda.current_stream())   # a pending free
                live.append(t)
            else:
                live.append(torch.empty(rng.choice(SIZES), dtype=torch.uint8, device="cuda"))
            if len(live) > 6:
                del live[rng.randrange(len(live))]
            time.sleep(0.0005)   # interleave with the other threads (and release the GIL)
        live_out.extend(live[:2])
    except BaseException as e:  # noqa: BLE001 - reported below
        errors.append(f"worker {i}: {e!r}")


def snapshotter(tag, workers, taken):
    """Dump 3 snapshots while the workers allocate."""
    try:
        barrier.wait()
        time.sleep(0.02)
        while len(taken) < 3 and any(w.is_alive() for w in workers):
            mem._dump_snapshot(f"{OUT}/{tag}_during_{len(taken)}.pickle")
            taken.append(sum(w.is_alive() for w in workers))
    except BaseException as e:  # noqa: BLE001
        errors.append(f"snapshotter: {e!r}")


def run(tag, max_entries):
    mem._record_memory_history(None)
    mem._record_memory_history("all", context="all", stacks="python", max_entries=max_entries)
    mem._set_memory_metadata("main")
    live = []
    taken = []   # per snapshot taken meanwhile: how many workers were still running
    threads = [threading.Thread(target=worker, args=(i, live, taken))
               for i in range(N_THREADS)]
    threads.append(threading.Thread(target=snapshotter, args=(tag, threads[:], taken)))
    for t in threads:
        t.start()
    barrier.wait()
    for _ in range(STEPS):            # backward runs on autograd's device thread
        train_step(model, opt, x)
    for t in threads:
        t.join(JOIN_S)
    stuck = [t.name for t in threads if t.is_alive()]
    torch.cuda.synchronize()
    mem._dump_snapshot(f"{OUT}/{tag}.pickle")
    snap = mem._snapshot()
    active = {b["address"] for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated"}
    owned = [t.data_ptr() in active for t in live + [x] + list(model.parameters())]
    return {"stuck": stuck, "owned": all(owned), "n_owned": len(owned), "taken": taken}


model, opt = make_model()
x = torch.randn(4, 16, 64, device="cuda")
train_step(model, opt, x)
out = {"full": run("full", 1_000_000), "wrapped": run("wrapped", 700), "errors": errors}
mem._record_memory_history(None)
faulthandler.cancel_dump_traceback_later()
emit(out)
'''


def _lines(text: str) -> dict:
    """{marker: line number} for the '# <NAME>' markers of a script."""
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = re.search(r"# <([A-Z]+)>", line)
        if m:
            out[m.group(1)] = i
    return out


def _run_script(path: Path, text: str, **kw):
    """Run text from the file `path` (so frames name it) on the simulator."""
    path.write_text(text)
    code = (f"OUT = {str(path.parent)!r}\n"
            f"exec(compile(open({str(path)!r}).read(), {str(path)!r}, 'exec'))\n")
    return run_gm(code, prelude=TRANSFORMER, **kw)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("hist_torch")
    consts = (f"MiB = {MiB}\nPAT_SMALL = {PAT_SMALL}\nPAT_BIG = {PAT_BIG}\n"
              f"CTX_SIZE = {CTX_SIZE}\nOOM_SIZE = {OOM_SIZE}\n")
    text = consts + SCRIPT
    res = _run_script(d / "hist_script.py", text, memory="4GiB", timeout=240)
    return {"dir": d, "script": str(d / "hist_script.py"), "lines": _lines(text), "res": res}


def _load(rec, name):
    return load_snapshot(rec["dir"] / f"{name}.pickle")


def _trace(snap):
    return snap["device_traces"][0]


def _innermost_py(frames, script):
    """(line, name) of the innermost frame that is in `script`, else None."""
    for f in frames:
        if f["filename"] == script:
            return f["line"], f["name"]
    return None


# ------------------------------------------------------------ torch's tools

@pytest.mark.parametrize("name", ["train", "direct"])
def test_memory_viz_processes_our_snapshots(recorded, name):
    res = recorded["res"]
    assert res["routed"] == [True, True, True], "torch's names are not routed to gpumem"
    v = res[f"viz_{name}"]
    snap = _load(recorded, name)
    # stats (segsum) raises itself unless every segment's blocks add up; its totals agree
    text = v["segsum"]
    assert f"segments: {len(snap['segments'])}\n" in text, text[:2000]
    reserved = sum(s["total_size"] for s in snap["segments"])
    allocated = sum(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    assert _approx(_printed(text, "total_reserved"), reserved), (text[-1500:], reserved)
    assert _approx(_printed(text, "total_allocated"), allocated), (text[-1500:], allocated)
    for key in ("trace", "trace_plot", "trace_plot_segments", "trace_plot_filtered",
                "segment_plot", "segments", "memory"):
        assert v[key] > 0, key
    for key in ("trace_plot", "trace_plot_segments", "segment_plot"):
        assert v[key] > len(pickle.dumps(snap)), key   # the snapshot is embedded
    n = check_snapshot(snap)
    assert n > (500 if name == "train" else 10), n
    for s in snap["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]


UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def _printed(text: str, key: str) -> tuple:
    """(value, unit factor) of a 'key: 12.5MiB' line of segsum's report."""
    m = re.search(rf"^{key}: ([0-9.]+)([KMGT]?i?)B", text, re.M)
    assert m, f"no {key} line in:\n{text[-1500:]}"
    return float(m.group(1)), UNITS[m.group(2)]


def _approx(printed: tuple, exact: int) -> bool:
    """A one-decimal size as segsum prints it matches the exact byte count."""
    value, unit = printed
    return abs(value * unit - exact) <= 0.05 * unit + 1e-9


def test_training_snapshot_names_the_script_lines(recorded):
    snap = _load(recorded, "train")
    script, train_line = recorded["script"], recorded["lines"]["TRAIN"]
    events = _trace(snap)
    actions = {e["action"] for e in events}
    assert {"segment_alloc", "alloc", "free_requested", "free_completed"} <= actions, actions
    allocs = [e for e in events if e["action"] == "alloc"]
    # The main thread's allocations (its metadata names the step) all carry the
    # loop's line; with stacks='all' C frames surround the Python ones.
    steps = [e for e in allocs if e["user_metadata"].startswith("step ")]
    assert {e["user_metadata"] for e in steps} == {"step 0", "step 1", "step 2"}
    assert all(any(f["filename"] == script and f["line"] == train_line for f in e["frames"])
               for e in steps)
    names = {f["name"] for e in steps for f in e["frames"]}
    assert "train_step" in names and "<module>" in names
    assert all(any(f["line"] == 0 and f["filename"] != script for f in e["frames"])
               for e in steps), "stacks='all' should add C frames"
    # Backward's allocations come from autograd's device thread: no metadata
    # (it is per thread); with stacks='all' they carry that thread's C frames,
    # innermost, then the Python frames of the line that ran backward
    # (Note [Backward context]).
    backward = [e for e in allocs if e["user_metadata"] == "" and
                events.index(e) > events.index(steps[0])]
    assert backward, "no allocation from autograd's thread"
    for e in backward:
        frames = e.get("frames", [])
        assert frames and frames[0]["line"] == 0, frames[:1]
        assert any(f["name"] == "train_step" for f in frames), \
            [f["name"] for f in frames if f["line"]]


def test_direct_allocations_are_recorded_with_streams(recorded):
    snap = _load(recorded, "direct")
    events = _trace(snap)
    allocs = [e for e in events if e["action"] == "alloc"]
    assert sorted(e["size"] for e in allocs) == sorted(
        [1000, 5000, 2 * MiB, 30 * MiB, 700, 12345, 64 << 10, 11 * MiB])
    streams = {e["stream"] for e in allocs}
    assert len(streams) == 2 and 0 in streams, streams
    freed = {e["addr"] for e in events if e["action"] == "free_completed"}
    assert freed == {e["addr"] for e in allocs[::2]}
    live = {b["address"] for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"}
    assert {e["addr"] for e in allocs[1::2]} <= live


# ------------------------------------------------------------- round trip

def test_round_trip_with_no_globals_and_exact_event_counts(recorded):
    path = recorded["dir"] / "pattern.pickle"
    data = path.read_bytes()
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ops[0] == "PROTO" and data[1] <= 4
    assert not {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ"} & set(ops)
    snap = load_snapshot(path)              # restricted: refuses any global
    assert snap == pickle.loads(data)
    check_snapshot(snap)
    events = _trace(snap)

    def count(action, size):
        return sum(1 for e in events if e["action"] == action and e["size"] == size)

    for size, n in ((PAT_SMALL, 5), (PAT_BIG, 3)):
        for action in ("alloc", "free_requested", "free_completed"):
            assert count(action, size) == n, (action, size, count(action, size))
    allocs = [e for e in events if e["action"] == "alloc"]
    assert len(allocs) == 8     # nothing else allocated
    freed = [e["addr"] for e in events if e["action"] == "free_completed"]
    assert sorted(freed) == sorted(e["addr"] for e in allocs)
    # every segment the pattern made was released by its empty_cache
    made = [e for e in events if e["action"] == "segment_alloc"]
    released = {(e["addr"], e["size"]) for e in events if e["action"] == "segment_free"}
    assert made and {(e["addr"], e["size"]) for e in made} <= released
    big_segments = [e for e in made if e["size"] >= PAT_BIG]
    assert len(big_segments) == 3, made
    assert [e["action"] for e in events][-1] == "segment_free"


# --------------------------------------------------- stacks per context level

@pytest.mark.parametrize("context", ["state", "alloc", "all"])
def test_stack_per_event_for_real_torch_allocations(recorded, context):
    snap = _load(recorded, f"ctx_{context}")
    script, lines = recorded["script"], recorded["lines"]
    at_alloc = (lines["ALLOC"], "make_tensor")
    at_free = (lines["FREE"], "drop_tensor")
    events = [e for e in _trace(snap) if e["size"] == CTX_SIZE]
    assert [e["action"] for e in events] == [
        "alloc", "alloc", "free_requested", "free_completed"], events
    if context == "state":
        assert all("frames" not in e for e in _trace(snap))
    else:
        want_free = at_alloc if context == "alloc" else at_free   # torch's table
        got = [_innermost_py(e["frames"], script) for e in events]
        assert got == [at_alloc, at_alloc, want_free, want_free], got
        # the whole stack: the calling module line is there too
        assert any(f["name"] == "<module>" and f["filename"] == script
                   for f in events[0]["frames"])
    # blocks keep the stack of their live allocation at every level
    keep = recorded["res"]["keep"][context]
    block = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == keep]
    assert len(block) == 1 and block[0]["state"] == "active_allocated"
    assert _innermost_py(block[0]["frames"], script) == at_alloc
    seg = [s for s in snap["segments"] if s["address"] <= keep < s["address"] + s["total_size"]]
    assert len(seg) == 1


# --------------------------------------------------------------------- OOM

def test_oom_entry_has_device_free_and_snapshot_stays_consistent(recorded):
    res = recorded["res"]
    assert res["oom"] and "CUDA out of memory" in res["oom"], res["oom"]
    snap = _load(recorded, "oom")
    check_snapshot(snap)
    ooms = [e for e in _trace(snap) if e["action"] == "oom"]
    assert len(ooms) == 1, ooms
    oom = ooms[0]
    assert "addr" not in oom and isinstance(oom["device_free"], int)
    assert oom["size"] == OOM_SIZE
    # free device memory when it gave up: after releasing the 300 MiB it had cached
    assert oom["device_free"] == res["free_after_oom"], (oom["device_free"], res)
    assert 0 < oom["device_free"] < 3 << 30
    assert _innermost_py(oom["frames"], recorded["script"]) == (recorded["lines"]["OOM"],
                                                                "<module>")
    actions = [e["action"] for e in _trace(snap)]
    i = actions.index("oom")
    assert "segment_free" in actions[:i]        # the cache went back before giving up
    assert actions[i + 1:].count("alloc") == 1  # and the next allocation worked


# --------------------------------------------------------- recording under load

def test_recording_under_load_is_consistent_and_never_deadlocks(tmp_path):
    consts = ("N_THREADS = 4\nITERS = 200\nSTEPS = 3\nWATCHDOG_S = 100\nJOIN_S = 90\n")
    out = _run_script(tmp_path / "load_script.py", consts + LOAD_SCRIPT,
                      events="after:2", timeout=150)
    assert out["errors"] == [], out["errors"]
    for tag in ("full", "wrapped"):
        r = out[tag]
        assert r["stuck"] == [] and r["owned"] and r["n_owned"] > 10, r
        # snapshots taken while the workers were allocating are consistent too
        assert len(r["taken"]) == 3 and min(r["taken"]) > 0, r["taken"]
        for k in range(len(r["taken"])):
            check_snapshot(load_snapshot(tmp_path / f"{tag}_during_{k}.pickle"), check_every=20)
        final = load_snapshot(tmp_path / f"{tag}.pickle")
        n = check_snapshot(final, check_every=20)
        events = _trace(final)
        if tag == "wrapped":
            assert len(events) == 700 and n > 0
            continue
        # every thread left its mark; autograd's thread has no metadata (it is
        # per thread) and no Python frame of its own: its allocations carry
        # the stack of the line that ran backward (Note [Backward context])
        meta = {e["user_metadata"] for e in events if e["action"] == "alloc"}
        assert {"main", "worker 0", "worker 3"} <= meta, meta
        from_autograd = [e for e in events if e["action"] == "alloc"
                         and e["user_metadata"] == ""]
        assert from_autograd, "no allocation came from autograd's device thread"
        assert all(any(f["name"] == "train_step" for f in e.get("frames", []))
                   for e in from_autograd)
        with_frames = [e for e in events if e["action"] == "alloc" and e["user_metadata"]]
        assert all(e.get("frames") for e in with_frames)
        # record_stream'd blocks: their frees wait for the side stream's events
        assert any(e["action"] == "free_requested" and e["stream"] != 0 for e in events)


# --------------------------------------------- interning's per-thread cache

def _capture_site(i, capture):
    """A capture from one of 3 lines at a depth of i % 7: 21 distinct stacks."""
    def down(n):
        return capture(1) if n == 0 else down(n - 1)
    k = i % 3
    if k == 0:
        return down(i % 7), _capture_site.__code__.co_firstlineno + 6   # line A
    if k == 1:
        return down(i % 7), _capture_site.__code__.co_firstlineno + 8   # line B
    return down(i % 7), _capture_site.__code__.co_firstlineno + 9       # line C


def test_interned_ids_stay_exact_with_the_per_thread_cache():
    """More distinct stacks (21) than a thread's cache has slots, from four
    threads at once: distinct stacks never share an id, and every id
    resolves to the stack it was handed out for (Note [Traceback cache]).
    (One stack may get a second id: CPython 3.11+ specializes a call site
    after its first runs, which moves the caller's instruction offset.)"""
    import threading

    from gpumem import _C
    from gpumem.recording import history
    history.record_memory_history("all", context="all", stacks="python")
    try:
        seen: dict = {}
        errors: list = []

        def run(tag):
            try:
                for i in range(600):
                    tb, line = _capture_site(i, _C._hist_capture)
                    seen.setdefault((tag, i % 3, i % 7, line), set()).add(tb)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
        for t in threads:
            t.start()
        run("main")
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(seen) == 4 * 21
        owner: dict = {}
        for key, ids in seen.items():
            assert 0 not in ids and len(ids) <= 2, (key, ids)
            for tb in ids:
                _tag, k, depth, line = key   # the threads' stacks are alike: tag is no part
                assert owner.setdefault(tb, (k, depth)) == (k, depth), (key, owner[tb], tb)
                frames = _C._hist_traceback(tb)
                names = [f["name"] for f in frames]
                assert names[:depth + 1] == ["down"] * (depth + 1), (key, names[:10])
                assert (frames[depth + 1]["name"], frames[depth + 1]["line"]) == (
                    "_capture_site", line), key
                assert frames[depth + 2]["name"] == "run", key
    finally:
        history.record_memory_history(None)


# ------------------------------------------------------------ not runnable here

def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")   # does not import torch
    if spec is None or not spec.origin:
        pytest.skip("torch is not importable")
    return Path(spec.origin).parent


def _torch_version(tdir: Path) -> str:
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", (tdir / "version.py").read_text(), re.M)
    return m.group(1) if m else "?"


# The views MemoryViz.js offers (the names torch.cuda._memory_viz passes it).
VIEWS = ("Active Memory Timeline", "Active Cached Memory Timeline", "Allocator State History")
REMOTE_IMPORT = re.compile(r"""\bimport\b[^;]*?\bfrom\s*["'](https?://[^"']+)|"""
                           r"""\bimport\s*\(?\s*["'](https?://[^"']+)""")

PAGE = """<!doctype html>
<meta charset="utf-8">
<body>
<pre id="gm-result"></pre>
<script type="application/json" id="gm-data">%(data)s</script>
<script>
window.gmErrors = [];
window.gmDone = false;
addEventListener("error", e => gmErrors.push("error: " + (e.message || e.type)), true);
addEventListener("unhandledrejection", e => gmErrors.push("rejection: " + String(e.reason)));
const gmConsoleError = console.error;
console.error = (...a) => { gmErrors.push("console: " + a.join(" ")); gmConsoleError(...a); };
function gmReport(extra) {
  if (gmDone) return;
  gmDone = true;
  const svg = [...document.querySelectorAll("svg")];
  document.getElementById("gm-result").textContent = JSON.stringify(Object.assign({
    errors: gmErrors, svgs: svg.length,
    shapes: svg.reduce((n, s) => n + s.querySelectorAll("rect,path,line,polygon").length, 0),
    text: document.body.innerText.length}, extra));
}
setTimeout(() => gmReport({timeout: true}), 20000);
</script>
<script type="module">
import {add_local_files} from "./MemoryViz.js";
try {
  add_local_files(JSON.parse(document.getElementById("gm-data").textContent), %(view)s);
} catch (e) {
  gmErrors.push("add_local_files: " + (e.stack || e));
}
setTimeout(() => gmReport({}), 5000);
</script>
"""


def _chromium_view(viz_dir: Path, snapshot: Path, view: str, work: Path) -> dict:
    """Render `snapshot` in MemoryViz.js's `view` in headless Chromium, offline."""
    for js in viz_dir.glob("*.js"):
        shutil.copy(js, work / js.name)
    data = base64.b64encode(snapshot.read_bytes()).decode()
    files = json.dumps([{"name": snapshot.name, "base64": data}])
    page = work / "page.html"
    page.write_text(PAGE % {"data": files.replace("</", "<\\/"), "view": json.dumps(view)})
    profile = tempfile.mkdtemp(prefix="gm-chromium-")
    try:
        proc = subprocess.run(
            ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--allow-file-access-from-files", "--proxy-server=127.0.0.1:9",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom",
             page.as_uri()], capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'<pre id="gm-result">(.*?)</pre>', proc.stdout, re.S)
    assert m and m.group(1), f"the page never reported:\n{proc.stderr[-3000:]}"
    return json.loads(html.unescape(m.group(1)))


def test_memory_viz_js_renders_our_snapshot_in_chromium(request, tmp_path):
    tdir = _torch_dir()
    viz_dir = tdir / "utils" / "viz"
    js = viz_dir / "MemoryViz.js"
    if not js.is_file():
        shipped = sorted(p.name for p in viz_dir.glob("*") if p.is_file())
        pytest.skip(f"torch {_torch_version(tdir)} does not ship torch/utils/viz/MemoryViz.js "
                    f"(its torch/utils/viz holds {shipped}); it is never downloaded at test time")
    if not os.access("/usr/bin/chromium", os.X_OK):
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium)")
    remote = []
    for f in viz_dir.glob("*.js"):
        remote += [a or b for a, b in REMOTE_IMPORT.findall(f.read_text(errors="replace"))]
    if remote:
        pytest.skip(f"MemoryViz.js imports {remote[0]} (d3) from the network, which this "
                    "machine cannot reach, so it cannot render offline")
    rec = request.getfixturevalue("recorded")
    for name in ("train", "oom"):
        for view in VIEWS:
            work = tmp_path / f"{name}_{VIEWS.index(view)}"
            work.mkdir()
            r = _chromium_view(viz_dir, rec["dir"] / f"{name}.pickle", view, work)
            assert r["errors"] == [] and not r.get("timeout"), (name, view, r)
            assert r["svgs"] > 0 and r["shapes"] > 0, (name, view, r)


def test_memory_viz_flamegraphs(request, tmp_path):
    script = Path(os.path.expanduser("~/.cache/flamegraph.pl"))
    if not script.is_file():
        pytest.skip("_memory_viz's segments/memory views render with flamegraph.pl, which it "
                    "downloads from GitHub into ~/.cache when missing; there is no network "
                    "here and tests never download (their input is checked with an identity "
                    "formatter in test_memory_viz_processes_our_snapshots)")
    if not shutil.which("perl"):
        pytest.skip("flamegraph.pl needs perl")
    rec = request.getfixturevalue("recorded")
    viz = _torch_dir() / "cuda" / "_memory_viz.py"
    for view in ("segments", "memory"):
        out = tmp_path / f"{view}.svg"
        # As a script it needs only the standard library.
        run_py(f"""
            import runpy, sys
            sys.argv = [{str(viz)!r}, {view!r}, {str(rec['dir'] / 'train.pickle')!r},
                        "-o", {str(out)!r}]
            runpy.run_path({str(viz)!r}, run_name="__main__")
        """)
        assert "<svg" in out.read_text()[:2000]


@pytest.mark.slow
def test_allocator_c_frames_are_named_as_torchs_are():
    """stacks='all': torch names its allocator's own C++ frames
    (NativeCachingAllocator::malloc ...), and keeps them; gpumem's frames
    (in gpumem._C and the torch shim, hidden symbols) are named too."""
    code = '''
torch.cuda.memory._record_memory_history(stacks="all")
x = torch.empty(1 << 20, device="cuda")
alloc = [e for e in torch.cuda.memory._snapshot()["device_traces"][0]
         if e["action"] == "alloc"][-1]
emit([[f["name"], f["filename"]] for f in alloc["frames"] if f["line"] == 0][:6])
'''
    first = {"torch": run_gm(code, install=False), "gpumem": run_gm(code)}
    allocator = {"torch": "NativeCachingAllocator::malloc", "gpumem": "GpumemAllocator::malloc"}
    for who, frames in first.items():
        names = [n for n, _f in frames]
        i = next(i for i, n in enumerate(names) if "empty_generic" in n)
        assert i >= 1 and any(allocator[who] in n for n in names[:i]), (who, frames)
        assert not [n for n in names[:i] if n.startswith("??")], (who, frames)
    assert not first["gpumem"][0][1].endswith(".so"), first["gpumem"][0]
