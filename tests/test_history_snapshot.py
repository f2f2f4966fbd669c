"""Memory history snapshots: the dump file (protocol, integers, atomicity),
the round trip through gpumem's restricted loader, consistency between trace
and segments under random and concurrent workloads, several devices, and
PyTorch's own _memory_viz tools when torch is installed.
"""

from __future__ import annotations

import collections
import gc
import os
import pickle
import pickletools
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import gpumem
from gpumem import _C
from gpumem.recording import history
from gpumem.snapshots.unpickle import load_snapshot

from test_history_support import check_snapshot, check_tiling

import testext

MiB, GiB = 1 << 20, 1 << 30
JS_LIMIT = 1 << 53
REPO = Path(__file__).resolve().parent.parent

# The opcodes MemoryViz.js's unpickler understands (protocols 2 to 4).
MEMORYVIZ_OPCODES = {
    "PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "STOP",
}


@pytest.fixture(autouse=True)
def _reset_history():
    history.record_memory_history(None)
    yield
    history.record_memory_history(None)
    history.set_memory_metadata("")


def workload(a, rng, steps, streams=(0, 0, 0, 11), use_streams=(21, 22)):
    """Random mallocs, frees (some with cross-stream uses), empty_cache and
    OOMs. Returns the counts of what was done."""
    live, done = [], collections.Counter()
    for _ in range(steps):
        r = rng.random()
        if r < 0.5 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, MiB),
                               rng.randint(MiB, 12 * MiB), rng.randint(12 * MiB, 40 * MiB)])
            try:
                live.append(a.malloc(size, rng.choice(streams)))
                done["alloc"] += 1
            except gpumem.OutOfMemoryError:
                done["oom"] += 1
        elif r < 0.92:
            p = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.2:
                a.record_stream(p, rng.choice(use_streams))
            a.free(p)
            done["free"] += 1
        elif r < 0.96:
            a.empty_cache()
        else:
            a.process_events()
    return live, done


# ------------------------------------------------------------ the collector

def test_snapshot_leaves_the_garbage_collector_as_it_found_it():
    """The build pauses the collector (hist_snapshot.c) and restores it."""
    a = _C.Allocator()
    history.record_memory_history()
    try:
        p = a.malloc(4096)
        for enabled in (True, False, True):
            (gc.enable if enabled else gc.disable)()
            snap = history.snapshot()
            assert gc.isenabled() is enabled
            assert any(e["action"] == "alloc" for t in snap["device_traces"] for e in t)
        a.free(p)
    finally:
        gc.enable()
        history.record_memory_history(None)


# ------------------------------------------------------------ round trip

def test_dump_round_trips_through_the_restricted_loader(tmp_path):
    a = _C.Allocator(capacity=160 * MiB)
    history.record_memory_history()
    rng = random.Random(1)
    live, done = [], collections.Counter()
    for _ in range(400):
        if rng.random() < 0.55 or not live:
            try:
                live.append(a.malloc(rng.choice([100, 5000, 3 * MiB, 30 * MiB])))
                done["alloc"] += 1
            except gpumem.OutOfMemoryError:
                done["oom"] += 1
        else:
            a.free(live.pop(rng.randrange(len(live))))
            done["free"] += 1
    a.empty_cache()
    history.snapshot()
    history.snapshot()
    path = tmp_path / "snap.pickle"
    history.dump_snapshot(path)
    snap = load_snapshot(path)
    assert list(snap) == ["segments", "device_traces", "allocator_settings",
                          "external_annotations", "host_segments", "host_traces"]
    counts = collections.Counter(e["action"] for e in snap["device_traces"][0])
    stats = a.stats()
    assert counts["alloc"] == done["alloc"]
    assert counts["free_requested"] == counts["free_completed"] == done["free"]
    assert counts["oom"] == done["oom"] == stats["num_ooms"] > 0
    assert counts["segment_alloc"] == stats["num_device_alloc"]
    assert counts["segment_free"] == stats["num_device_free"] > 0
    assert counts["snapshot"] == 2  # the dump's own marker is recorded after its copy
    assert sum(counts.values()) == len(snap["device_traces"][0])
    live_blocks = [b for s in snap["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated"]
    assert sorted(b["address"] for b in live_blocks) == sorted(live)
    check_snapshot(snap, check_every=25)
    assert snap["allocator_settings"]["max_split_size"] == -1
    assert snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == ""
    assert snap["external_annotations"] == []
    # Sharing survives pickling: identical tracebacks load as one object.
    allocs = [e["frames"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert len({id(f) for f in allocs}) < len(allocs) / 10


def _ints(obj, path=""):
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _ints(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _ints(v, f"{path}[{i}]")


def test_dump_uses_protocol_4_memoryviz_opcodes_and_53_bit_ints(tmp_path):
    a = _C.Allocator(settings={"expandable_segments": True})
    history.record_memory_history()
    huge_stream = (1 << 60) + 5
    p = a.malloc(3 * MiB, huge_stream)
    a.malloc(100)
    a.free(p)
    raw = history.snapshot()
    assert any(s["stream"] == huge_stream for s in raw["segments"])  # snapshot() is exact
    path = tmp_path / "s.pickle"
    history.dump_snapshot(str(path))
    data = path.read_bytes()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    used = {op.name for op, _, _ in ops}
    assert used <= MEMORYVIZ_OPCODES, used - MEMORYVIZ_OPCODES
    snap = pickle.loads(data)
    # torch writes -1 for an unlimited size in these settings, and so does gpumem
    minus_one = {".allocator_settings.max_split_size", ".allocator_settings.max_round_threshold",
                 ".allocator_settings.max_cached_size"}
    bad = [(where, v) for where, v in _ints(snap)
           if not 0 <= v < JS_LIMIT and not (where in minus_one and v == -1)]
    assert bad == []
    assert snap["allocator_settings"]["max_split_size"] == -1  # torch's value for unlimited
    assert all(s["stream"] < JS_LIMIT for s in snap["segments"])
    assert snap["segments"] and all(s["is_expandable"] for s in snap["segments"])


def test_dump_failing_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    a = _C.Allocator()
    history.record_memory_history()
    a.malloc(1000)
    path = tmp_path / "snap.pickle"
    path.write_bytes(b"previous dump")

    def broken_dump(obj, f, protocol=None):
        f.write(pickle.dumps(obj, protocol=protocol)[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history.pickle, "dump", broken_dump)
    with pytest.raises(OSError, match="No space left"):
        history.dump_snapshot(path)
    assert path.read_bytes() == b"previous dump"
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]
    monkeypatch.undo()
    history.dump_snapshot(path)
    assert load_snapshot(path)["segments"]
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]
    mode = path.stat().st_mode & 0o777
    assert mode & 0o600 == 0o600 and mode != 0o600 or os.umask(os.umask(0)) & 0o066 == 0o066


CRASH_SCRIPT = textwrap.dedent("""
    import os, pickle, sys
    from gpumem import _C
    from gpumem.recording import history
    a = _C.Allocator()
    history.record_memory_history()
    ptrs = [a.malloc(1000 * (i + 1)) for i in range(50)]
    path, first_ok = sys.argv[1], sys.argv[2] == "1"
    if first_ok:
        history.dump_snapshot(path)
    def crash(obj, f, protocol=None):
        data = pickle.dumps(obj, protocol=protocol)
        f.write(data[: len(data) // 2])
        f.flush()
        os._exit(3)  # killed mid-write: no cleanup runs
    history.pickle.dump = crash
    history.dump_snapshot(path)
""")


@pytest.mark.parametrize("first_ok", [True, False])
def test_crash_mid_dump_never_leaves_a_truncated_file(tmp_path, first_ok):
    path = tmp_path / "snap.pickle"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(path), "1" if first_ok else "0"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    if first_ok:
        snap = load_snapshot(path)  # the complete earlier dump
        assert len([b for s in snap["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated"]) == 50
    else:
        assert not path.exists()
    leftovers = [n for n in os.listdir(tmp_path) if n != "snap.pickle"]
    assert all(n.startswith(".snap.pickle.") and n.endswith(".tmp") for n in leftovers)


# ------------------------------------------------------------ consistency

@pytest.mark.parametrize("expandable", [False, True], ids=["plain", "expandable"])
@pytest.mark.parametrize("max_entries", [100_000, 37], ids=["full", "bounded"])
def test_random_workload_snapshots_are_consistent(expandable, max_entries):
    dev = testext.VirtualDevice(capacity=256 * MiB, event_mode="after_n", event_after_n=3)
    a = _C.Allocator(device_backend=dev, settings={"expandable_segments": expandable})
    history.record_memory_history(max_entries=max_entries)
    rng = random.Random(7 if expandable else 8)
    total = 0
    for round_ in range(6):
        workload(a, rng, 150)
        snap = history.snapshot()
        assert a.check() == (0, "")
        total += check_snapshot(snap)
        states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
        assert states <= {"inactive", "active_allocated", "active_pending_free"}
    assert total > 6 * min(max_entries, 100) // 2  # free pairs are folded when replayed
    assert len(snap["device_traces"][0]) == min(max_entries, len(snap["device_traces"][0]))
    if max_entries == 37:
        assert len(snap["device_traces"][0]) == 37


def test_pending_frees_show_as_active_pending_free():
    a = _C.Allocator(device_backend=testext.VirtualDevice(event_mode="never"))
    history.record_memory_history()
    p = a.malloc(5000)
    a.record_stream(p, 3)
    a.free(p)
    snap = history.snapshot()
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == p)
    assert block["state"] == "active_pending_free"
    assert [e["action"] for e in snap["device_traces"][0]][-2:] == ["alloc", "free_requested"]
    check_snapshot(snap)


def test_several_devices_get_one_trace_list_each():
    a0 = _C.Allocator(num_devices=3, device=0)
    a2 = _C.Allocator(num_devices=3, device=2)
    history.record_memory_history()
    p0 = a0.malloc(1000)
    p2 = a2.malloc(3 * MiB)
    a2.malloc(100)
    snap = history.snapshot()
    assert len(snap["device_traces"]) == 3
    assert snap["device_traces"][1] == []
    assert [e["action"] for e in snap["device_traces"][0]] == ["segment_alloc", "alloc"]
    assert [e["action"] for e in snap["device_traces"][2]] == [
        "segment_alloc", "alloc", "segment_alloc", "alloc"]
    by_dev = collections.defaultdict(list)
    for s in snap["segments"]:
        by_dev[s["device"]].append(s)
        assert type(s["device"]) is int
    assert sorted(by_dev) == [0, 2]
    assert [s["address"] for s in by_dev[2]] == sorted(s["address"] for s in by_dev[2])
    assert p0 in {b["address"] for s in by_dev[0] for b in s["blocks"]}
    assert p2 in {b["address"] for s in by_dev[2] for b in s["blocks"]}
    check_snapshot(snap)
    ev = history.snapshot()["device_traces"]
    assert ev[0][-1]["action"] == ev[2][-1]["action"] == "snapshot"
    # the marker's size is the device's active bytes (rounded block sizes)
    assert ev[0][-1]["size"] == 1024 and ev[2][-1]["size"] == 3 * MiB + 512


def test_newest_allocator_on_a_device_is_the_recorded_one():
    gc.collect()  # allocators earlier tests left in reference cycles are live until then
    history.record_memory_history()
    a1 = _C.Allocator()
    rec = testext.TraceRecorder(a1)  # the tests' trace hook, chained behind history
    a1.malloc(1000)
    a2 = _C.Allocator()
    assert history.snapshot()["device_traces"][0] == []  # a1's history went with it
    a1.malloc(2000)
    q = a2.malloc(3000)
    snap = history.snapshot()
    assert [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"] == [3000]
    assert {b["address"] for s in snap["segments"] for b in s["blocks"]} >= {q}
    # the recorder keeps working alongside history
    assert [e["size"] for e in rec.take() if e["action"] == "alloc"] == [1000, 2000]
    del a2
    # a1 is live, so it is recorded again (issue 16.12: deleting the newest
    # allocator on a device stopped recording for an older live one)
    snap = history.snapshot()
    assert snap["device_traces"][0] == []  # a2's history went with a2
    assert {s["total_size"] for s in snap["segments"] if s["device"] == 0} == {2 * MiB}
    p = a1.malloc(4000)
    snap = history.snapshot()
    assert [(e["action"], e["addr"], e["size"]) for e in snap["device_traces"][0]
            if e["action"] == "alloc"] == [("alloc", p, 4000)]
    del rec, a1
    snap = history.snapshot()
    assert [s for s in snap["segments"] if s["device"] == 0] == []
    assert snap["device_traces"][:1] in ([], [[]])


def test_allocators_detached_in_any_order_keep_the_newest_live_one_recorded():
    history.record_memory_history()
    allocs = [_C.Allocator(capacity=GiB) for _ in range(4)]
    for k in (1, 3, 0):  # a middle one, the recorded one, the oldest
        recorded = max(i for i, a in enumerate(allocs) if a is not None and i != k)
        allocs[k] = None
        p = allocs[recorded].malloc(1000 + recorded)
        sizes = [e["size"] for e in history.snapshot()["device_traces"][0]
                 if e["action"] == "alloc"]
        assert sizes[-1] == 1000 + recorded, (k, sizes)
        allocs[recorded].free(p)
    history.record_memory_history(None)  # off and on again: the hook goes to the survivor
    history.record_memory_history()
    p = allocs[2].malloc(777)
    assert [e["size"] for e in history.snapshot()["device_traces"][0]
            if e["action"] == "alloc"] == [777]
    allocs[2].free(p)


def test_settings_appear_in_allocator_settings():
    from gpumem._conf import parse_conf
    conf = parse_conf("expandable_segments:True,max_split_size_mb:64,"
                      "roundup_power2_divisions:4")
    a = _C.Allocator(settings=conf)
    s = history.snapshot()["allocator_settings"]
    assert s["expandable_segments"] is True and s["max_split_size"] == 64 * MiB
    assert s["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:4")
    assert s["roundup_power2_divisions"]["1"] == 4 and len(s["roundup_power2_divisions"]) == 16
    b = _C.Allocator(settings={"max_split_size": 30 * MiB + 7})  # no PYTORCH_CUDA_ALLOC_CONF form
    s = history.snapshot()["allocator_settings"]
    assert a is not b
    assert s["max_split_size"] == 30 * MiB + 7 and s["PYTORCH_CUDA_ALLOC_CONF"] == ""


# ------------------------------------------------------------ concurrency

def test_threads_allocating_while_snapshotting_stay_consistent():
    a = _C.Allocator(device_backend=testext.VirtualDevice(capacity=64 * GiB, event_mode="after_n",
                                                      event_after_n=2))
    history.record_memory_history(max_entries=3000)
    errors, stop = [], threading.Event()

    def guarded(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        return run

    @guarded
    def py_worker(k):
        history.set_memory_metadata(f"worker {k}")
        rng = random.Random(k)
        for _ in range(2000):
            live, _ = workload(a, rng, 40, streams=(0, 100 + k))
            for p in live:
                a.free(p)
            if stop.is_set():
                break

    @guarded
    def c_worker():  # allocates with the GIL released: truly concurrent
        for _ in range(2000):
            kept, blocked = testext.hist_c_thread_alloc(a, 8192, 100, keep=0, hold_gil=False)
            assert not blocked and kept == []
            if stop.is_set():
                break

    @guarded
    def gilfree_capture():  # takes the GIL back through PyGILState_Ensure
        for _ in range(100000):
            assert testext.hist_capture_without_gil(1)
            if stop.is_set():
                break

    threads = [threading.Thread(target=py_worker, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=c_worker), threading.Thread(target=gilfree_capture)]
    for t in threads:
        t.start()
    meta = set()
    try:
        for _ in range(25):
            snap = history.snapshot()
            check_snapshot(snap, check_every=16)
            meta |= {e["user_metadata"] for e in snap["device_traces"][0]}
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread did not finish"
    assert not errors, errors
    snap = history.snapshot()
    check_snapshot(snap)
    assert a.check() == (0, "")
    assert meta & {"worker 0", "worker 1", "worker 2", "worker 3"}


def test_capture_after_releasing_the_gil_takes_it_back():
    history.record_memory_history()

    def here():
        return testext.hist_capture_without_gil(1)

    tb = here()
    names = [f["name"] for f in _C._hist_traceback(tb)]
    assert names[:2] == ["here", "test_capture_after_releasing_the_gil_takes_it_back"]


# ------------------------------------------------------------ torch's tools

def _demo_snapshot(tmp_path):
    a = _C.Allocator(device_backend=testext.VirtualDevice(capacity=1 * GiB, event_mode="after_n",
                                                      event_after_n=2))
    history.record_memory_history()

    def layer(n):
        return [a.malloc(s) for s in (n * 1000, n * MiB, 2048)]

    live = []
    for step in range(5):
        history.set_memory_metadata(f"step {step}")
        acts = layer(step + 1)
        live.append(acts.pop())
        for p in acts:
            if step % 2:
                a.record_stream(p, 9)
            a.free(p)
    try:
        a.malloc(4 * GiB)
    except gpumem.OutOfMemoryError:
        pass
    a.empty_cache()
    path = tmp_path / "demo.pickle"
    history.dump_snapshot(path)
    return path, a


def test_torch_memory_viz_opens_our_snapshot(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from torch.cuda import _memory_viz as mv
    path, _a = _demo_snapshot(tmp_path)
    snap = load_snapshot(path)
    check_snapshot(snap)
    assert "Summary of segments" in mv.segsum(snap)
    text = mv.trace(snap)
    assert "cudaMalloc" in text and "raise OutOfMemoryError" in text
    for html in (mv.trace_plot(snap), mv.trace_plot(snap, plot_segments=True),
                 mv.trace_plot(pickle.loads(path.read_bytes()), filter_freed=True),
                 mv.segment_plot(snap)):
        assert "add_local_files" in html
    identity = lambda lines: lines  # noqa: E731 - flamegraph.pl needs the network
    assert "active_allocated" in mv.segments(snap, format_flamegraph=identity)
    assert "layer" in mv.memory(snap, format_flamegraph=identity)
    assert torch.__version__


def test_torch_memory_viz_cli_reads_our_dump(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    import importlib.util
    script = importlib.util.find_spec("torch.cuda._memory_viz").origin
    path, _a = _demo_snapshot(tmp_path)
    for args in (["stats"], ["trace"], ["trace_plot", "-o", str(tmp_path / "t.html")],
                 ["segment_plot", "-o", str(tmp_path / "s.html")]):
        # Run as a script, as its docs say: it then needs only the stdlib.
        r = subprocess.run([sys.executable, script, args[0], str(path)] + args[1:],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (args, r.stderr[-2000:])
    assert (tmp_path / "t.html").stat().st_size > 1000
    assert (tmp_path / "s.html").stat().st_size > 1000


def test_real_snapshots_still_check_out_with_the_checker():
    """The checker itself against torch-written snapshots: tiling holds there."""
    root = REPO.parent / "shared" / "snapshots"
    files = sorted(root.glob("*.pickle")) if root.is_dir() else []
    if not files:
        pytest.skip(f"no real snapshots at {root}")
    checked = 0
    for f in files:
        try:
            snap = load_snapshot(f)
        except Exception:  # noqa: BLE001 - some shared files are deliberately odd
            continue
        if all("address" in b for s in snap["segments"] for b in s.get("blocks", [])) and all(
                "allocated_size" in s and "active_size" in s for s in snap["segments"]):
            try:
                check_tiling(snap)
            except AssertionError:
                continue
            checked += 1
    assert checked > 0


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, sys, threading
    from gpumem import _C
    from gpumem.recording import history
    sys.path.insert(0, sys.argv[3])
    import testext
    a = _C.Allocator()
    history.record_memory_history(stacks=sys.argv[2])

    def dump_at_exit():  # registered after gpumem's own hook, so it runs first
        def site():
            return a.malloc(12345)
        site()
        history.dump_snapshot(sys.argv[1])

    atexit.register(dump_at_exit)

    def spin_without_gil():
        while True:
            testext.hist_capture_without_gil(1)

    def c_threads():
        while True:
            testext.hist_c_thread_alloc(a, 4096, 50, hold_gil=False)

    for target in (spin_without_gil, spin_without_gil, c_threads):
        threading.Thread(target=target, daemon=True).start()
    for _ in range(2000):
        a.free(a.malloc(1000))
    print("main done", flush=True)
""")


@pytest.mark.parametrize("stacks", ["python", "all"])
def test_interpreter_exit_with_capturing_daemon_threads(tmp_path, stacks):
    path = tmp_path / "exit.pickle"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(path), stacks,
                            str(REPO / "tests")], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "main done" in r.stdout, r.stderr[-3000:]
        snap = load_snapshot(path)
        alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc"
                 and e["size"] == 12345]
        assert alloc and any(f["name"] == "site" for f in alloc[-1]["frames"])
        check_snapshot(snap, check_every=50)
