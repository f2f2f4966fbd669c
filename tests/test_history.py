"""Memory history: configuration, which stack goes on which event, the ring,
frames and their sharing, metadata, and what recording costs.

Everything drives gpumem._C.Allocator on the virtual device directly
(with tests/ext's VirtualDevice where a test controls the device).
"""

from __future__ import annotations

import os

import sys
import threading

import pytest

import gpumem
from gpumem import _C
from gpumem.recording import history
from gpumem.recording.history import HistoryConfigError

import testext

MiB = 1 << 20
HERE = __file__


@pytest.fixture(autouse=True)
def _reset_history():
    history.record_memory_history(None)
    history.set_memory_metadata("")
    yield
    history.record_memory_history(None)
    history.set_memory_metadata("")


def trace(snap, device=0):
    return snap["device_traces"][device]


def site(frames):
    """Name of the innermost frame, or None without frames."""
    return frames[0]["name"] if frames else None


# Allocation sites with known lines (frames are checked against these).
def alloc_site(a, size, stream=0):
    return a.malloc(size, stream)


ALLOC_LINE = alloc_site.__code__.co_firstlineno + 1


def free_site(a, p):
    a.free(p)


FREE_LINE = free_site.__code__.co_firstlineno + 1


def later_site(a, size):
    return a.malloc(size)


def empty_site(a):
    a.empty_cache()


def oom_site(a, size):
    with pytest.raises(gpumem.OutOfMemoryError):
        a.malloc(size)


# ------------------------------------------------------------ the table

def _scenario(context):
    """One of every event; returns (snapshot, live block addresses)."""
    dev = testext.VirtualDevice(capacity=64 * MiB)
    a = _C.Allocator(device_backend=dev)
    history.record_memory_history("all", context=context)
    p = alloc_site(a, 1000)              # segment_alloc S1 + alloc
    free_site(a, p)                      # free_requested + free_completed
    q = alloc_site(a, 2000)              # reuses S1
    dev.set_event_mode("never")
    a.record_stream(q, 7)
    free_site(a, q)                      # free_requested only: pending on stream 7
    dev.set_event_mode("immediate")
    r = later_site(a, 3 * MiB)           # completes q's free, then segment_alloc S3 + alloc
    empty_site(a)                        # segment_free S1
    oom_site(a, 1 << 40)                 # oom
    live = alloc_site(a, 4000)           # segment_alloc S2 + alloc
    history.snapshot()                   # records a snapshot marker
    snap = history.snapshot()
    return snap, {"r": r, "live": live, "p": p, "q": q}, a


# The scenario's events in order, and the innermost frame torch's table
# gives each at context 'alloc' and 'all' ('state' and None: no frames).
EXPECTED = [
    ("segment_alloc S1", "alloc_site", "alloc_site"),
    ("alloc p", "alloc_site", "alloc_site"),
    ("free_requested p", "alloc_site", "free_site"),    # 'alloc' falls back to the alloc stack
    ("free_completed p", "alloc_site", "free_site"),
    ("alloc q", "alloc_site", "alloc_site"),
    ("free_requested q", "alloc_site", "free_site"),
    ("free_completed q", "later_site", "later_site"),   # completed by a later malloc
    ("segment_alloc S3", "later_site", "later_site"),
    ("alloc r", "later_site", "later_site"),
    ("segment_free S1", "alloc_site", "empty_site"),    # 'alloc': the segment's own stack
    ("oom", "oom_site", "oom_site"),
    ("segment_alloc S2", "alloc_site", "alloc_site"),
    ("alloc live", "alloc_site", "alloc_site"),
    ("snapshot", None, None),                           # never has frames
]


@pytest.mark.parametrize("context", [None, "state", "alloc", "all"])
def test_stack_per_event_matches_torch_table(context):
    snap, ptrs, _a = _scenario(context)
    events = trace(snap)
    assert [e["action"] for e in events] == [label.split()[0] for label, _, _ in EXPECTED]
    assert [e["addr"] for e in events if e["action"] == "alloc"] == [
        ptrs["p"], ptrs["q"], ptrs["r"], ptrs["live"]]
    for e, (label, at_alloc, at_all) in zip(events, EXPECTED):
        want = {"alloc": at_alloc, "all": at_all}.get(context)
        if want is None:
            assert "frames" not in e, f"{label} has frames at context={context}"
        else:
            assert site(e.get("frames")) == want, f"{label} at context={context}"
    oom = events[10]
    assert "addr" not in oom and oom["device_free"] > 0 and oom["size"] == 1 << 40

    # Snapshot state: blocks keep their stacks from level 'state'; segments
    # carry none at any level, as in torch 2.14 (their stack is on the
    # segment_alloc event).
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    live, r = blocks[ptrs["live"]], blocks[ptrs["r"]]
    assert live["state"] == r["state"] == "active_allocated"
    assert all(s["frames"] == [] for s in snap["segments"])
    if context is None:
        assert live["frames"] == r["frames"] == []
    else:
        assert site(live["frames"]) == "alloc_site"
        assert site(r["frames"]) == "later_site"
    inactive = [b for b in blocks.values() if b["state"] == "inactive"]
    assert inactive and all(b["frames"] == [] for b in inactive)


def test_frames_are_innermost_first_with_file_line_and_name():
    a = _C.Allocator()
    history.record_memory_history()

    def level3():
        return a.malloc(700)

    def level2():
        return level3()

    def level1():
        return level2()

    p = level1()
    snap = history.snapshot()
    alloc = [e for e in trace(snap) if e["action"] == "alloc"][-1]
    names = [f["name"] for f in alloc["frames"]]
    assert names[:4] == ["level3", "level2", "level1",
                         "test_frames_are_innermost_first_with_file_line_and_name"]
    f0 = alloc["frames"][0]
    assert f0 == {"name": "level3", "filename": HERE,
                  "line": level3.__code__.co_firstlineno + 1}
    assert list(f0) == ["name", "filename", "line"]  # torch's key order
    assert alloc["frames"][1]["line"] == level2.__code__.co_firstlineno + 1
    # The whole stack is there, out to this test's callers (pytest).
    assert len(alloc["frames"]) > 10
    assert all(isinstance(f["line"], int) and isinstance(f["filename"], str)
               for f in alloc["frames"])
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == p)
    assert block["frames"] == alloc["frames"]
    assert alloc["size"] == 700 and alloc["addr"] == p


def test_deep_stacks_are_captured_whole():
    a = _C.Allocator()
    history.record_memory_history()

    # the allocator is an argument, not a closure variable: a recursive inner
    # function is a reference cycle, which would keep it (and its segment)
    # alive for later tests until the collector runs
    def down(n, alloc):
        return alloc.malloc(999) if n == 0 else down(n - 1, alloc)

    down(0, a)
    down(400, a)  # deeper than the inline capture buffer
    allocs = [e["frames"] for e in trace(history.snapshot()) if e["action"] == "alloc"]
    assert len(allocs) == 2 and len(allocs[1]) == len(allocs[0]) + 400
    assert [f["name"] for f in allocs[1][:402]] == ["down"] * 401 + [
        "test_deep_stacks_are_captured_whole"]


def test_known_lines_for_alloc_and_free_sites():
    a = _C.Allocator()
    history.record_memory_history(context="all")
    p = alloc_site(a, 1234)
    free_site(a, p)
    ev = trace(history.snapshot())
    alloc = next(e for e in ev if e["action"] == "alloc")
    freed = next(e for e in ev if e["action"] == "free_requested")
    assert alloc["frames"][0] == {"name": "alloc_site", "filename": HERE, "line": ALLOC_LINE}
    assert freed["frames"][0] == {"name": "free_site", "filename": HERE, "line": FREE_LINE}
    assert alloc["frames"][1]["name"] == freed["frames"][1]["name"] == (
        "test_known_lines_for_alloc_and_free_sites")
    assert alloc["frames"][1]["line"] + 1 == freed["frames"][1]["line"]


# ------------------------------------------------------------ sharing

def test_identical_frames_and_tracebacks_are_the_same_objects():
    a = _C.Allocator()
    history.record_memory_history()

    def site1():
        return a.malloc(1000)

    def site2():
        return a.malloc(2000)

    def outer(fn):
        return fn()

    ptrs = []
    for _ in range(5):
        ptrs.append(outer(site1))
    other = outer(site2)
    snap = history.snapshot()
    allocs = [e for e in trace(snap) if e["action"] == "alloc"]
    same = [e["frames"] for e in allocs if e["size"] == 1000]
    assert len(same) == 5
    assert all(f is same[0] for f in same), "identical tracebacks must be one list"
    diff = next(e["frames"] for e in allocs if e["size"] == 2000)
    assert diff is not same[0]
    # outer's frame (same code, same call site) is one dict in both stacks.
    assert diff[1] is same[0][1] and diff[1]["name"] == "outer"
    # and so are all frames further out except this test's own (other line)
    assert all(x is y for x, y in zip(diff[3:], same[0][3:]))
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    assert all(blocks[p]["frames"] is same[0] for p in ptrs[1:])
    assert blocks[other]["frames"] is diff
    seg_alloc = next(e for e in trace(snap) if e["action"] == "segment_alloc")
    assert seg_alloc["frames"] is same[0]  # the first malloc made the segment
    # The empty frame list is shared too.
    empties = [b["frames"] for b in blocks.values() if b["state"] == "inactive"]
    assert all(x is empties[0] for x in empties)


# ------------------------------------------------------------ the ring

def _ops(a, n):
    for i in range(n):
        p = a.malloc(512 * (i + 1))
        a.free(p)


def test_ring_keeps_the_newest_max_entries_oldest_first():
    a = _C.Allocator()
    history.record_memory_history(max_entries=100_000)
    _ops(a, 20)
    full = [(e["action"], e["size"]) for e in trace(history.snapshot())]
    assert len(full) == 61  # segment_alloc + 20 * (alloc, free_requested, free_completed)

    b = _C.Allocator()  # takes device 0 over: its ring starts empty
    history.record_memory_history(max_entries=10)
    _ops(b, 20)
    ev = trace(history.snapshot())
    assert [(e["action"], e["size"]) for e in ev] == full[-10:]
    times = [e["time_us"] for e in ev]
    assert times == sorted(times)
    import time
    assert abs(times[-1] - time.time() * 1e6) < 60e6  # microseconds since the epoch


def test_shrinking_max_entries_keeps_the_newest_events():
    a = _C.Allocator()
    history.record_memory_history(max_entries=1000)
    _ops(a, 10)
    before = trace(history.snapshot())  # also records a snapshot marker
    history.record_memory_history(max_entries=5)
    after = trace(history.snapshot())
    assert [(e["action"], e["addr"]) for e in after] == [
        (e["action"], e["addr"]) for e in before[-4:]] + [("snapshot", 0)]
    # the same four events: each snapshot converts event times with the rate
    # it measures (Note [Event clock] in csrc/history/clock.h), so a time may
    # move by a microsecond between the two, never more
    assert all(abs(x["time_us"] - y["time_us"]) <= 1 for x, y in zip(after, before[-4:])), (
        after, before[-4:])
    history.record_memory_history(max_entries=50)  # growing keeps everything
    _ops(a, 3)
    ev = trace(history.snapshot())
    assert len(ev) == 5 + 9  # 3 events lost to the 5-entry bound, 2 markers, 3 pairs


def test_folded_frees_expand_to_torchs_entries_at_every_bound():
    """A free that completes at once shares one ring slot with its request
    (Note [Folded frees] in csrc/history/ring.c); a copy expands it, so a
    bound of any size, odd or even, still keeps exactly the newest entries,
    also when it cuts a folded pair in two, and growing the bound brings no
    entry back that it dropped."""
    a = _C.Allocator()
    history.record_memory_history(max_entries=1000)
    _ops(a, 6)
    full = [(e["action"], e["addr"], e["size"]) for e in trace(history.snapshot())]
    assert len(full) == 19
    for bound in range(1, 9):
        b = _C.Allocator()  # takes device 0 over: its ring starts empty
        history.record_memory_history(None)
        history.record_memory_history(max_entries=bound)
        _ops(b, 6)
        ev = trace(history.snapshot())
        got = [(e["action"], e["size"]) for e in ev]
        assert got == [(x[0], x[2]) for x in full[-bound:]], bound
        times = [e["time_us"] for e in ev]
        assert times == sorted(times)
        history.record_memory_history(max_entries=100)  # grown: nothing comes back
        ev = trace(history.snapshot())
        assert [(e["action"], e["size"]) for e in ev] == got[1:] + [("snapshot", 0)], bound


def test_a_free_completed_at_once_takes_no_slot_of_its_own():
    """4,000 cached pairs record 12,001 entries (a segment, then alloc,
    free_requested, free_completed each): in 8,001 slots, two chunks of the
    ring's 4,096 48-byte slots, not three."""
    a = _C.Allocator()
    history.record_memory_history(None)
    history.record_memory_history(max_entries=100_000)
    for _ in range(4000):
        a.free(a.malloc(4096))
    ev = trace(history.snapshot())
    assert len(ev) == 12_001
    assert [e["action"] for e in ev[1:4]] == ["alloc", "free_requested", "free_completed"]
    chunk = 4096 * 48
    assert 2 * chunk <= _C._hist_counts()["ring_bytes"] < 3 * chunk


@pytest.mark.parametrize("gap_s", [0.002, 0.05])
def test_a_free_completed_later_keeps_its_own_time(gap_s):
    """A completion that waited for a stream is folded into its request's
    slot only when nothing was recorded in between and it came within 2^24
    ticks (a few ms: the 2 ms gap), and keeps its own time either way."""
    import time
    dev = testext.VirtualDevice(capacity=64 * MiB)
    a = _C.Allocator(device_backend=dev)
    history.record_memory_history(None)
    history.record_memory_history(context=None)
    q = a.malloc(2000)
    dev.set_event_mode("never")
    a.record_stream(q, 7)
    a.free(q)  # free_requested only: pending on stream 7
    dev.set_event_mode("immediate")
    t0 = time.perf_counter()
    time.sleep(gap_s)
    a.process_events()  # free_completed, right after its request in the ring
    gap_us = (time.perf_counter() - t0) * 1e6
    ev = [e for e in trace(history.snapshot()) if e["action"] != "segment_alloc"]
    assert [(e["action"], e["addr"]) for e in ev] == [
        ("alloc", q), ("free_requested", q), ("free_completed", q)]
    took = ev[2]["time_us"] - ev[1]["time_us"]
    assert gap_s * 1e6 - 2 <= took <= gap_us + 2000, (took, gap_us)


def test_state_mode_keeps_only_the_last_event():
    a = _C.Allocator()
    history.record_memory_history("state")
    assert history.recording_config()["max_entries"] == 1
    p = a.malloc(1000)
    q = a.malloc(3000)
    a.free(p)
    snap = history.snapshot()
    ev = trace(snap)
    assert len(ev) == 1 and ev[0]["action"] == "free_completed" and ev[0]["addr"] == p
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == q)
    assert block["frames"][0]["name"] == "test_state_mode_keeps_only_the_last_event"
    ev = trace(history.snapshot())
    assert [e["action"] for e in ev] == ["snapshot"]  # the previous snapshot's marker


def test_clear_history_and_disable():
    a = _C.Allocator()
    history.record_memory_history()
    _ops(a, 5)
    assert len(trace(history.snapshot())) == 16
    history.record_memory_history(clear_history=True)
    assert trace(history.snapshot()) == []
    _ops(a, 2)
    assert len(trace(history.snapshot())) == 1 + 6  # marker + 2 pairs
    history.record_memory_history(None)
    snap = history.snapshot()
    assert trace(snap) == []  # None clears, and records no marker
    _ops(a, 3)
    p = a.malloc(100)
    snap = history.snapshot()
    assert trace(snap) == []
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == p)
    assert block["frames"] == []
    history.record_memory_history()  # re-enabling starts from nothing
    assert trace(history.snapshot()) == []


def test_skip_actions():
    a = _C.Allocator()
    history.record_memory_history(skip_actions=["free_requested", "snapshot"])
    _ops(a, 3)
    history.snapshot()
    actions = {e["action"] for e in trace(history.snapshot())}
    assert actions == {"segment_alloc", "alloc", "free_completed"}


def test_skipping_free_completed_keeps_each_request_alone():
    """A free returned at once is recorded with its completion in one slot
    (Note [Folded frees]); with free_completed skipped the request is
    recorded alone, and the next events are not taken for completions."""
    a = _C.Allocator()
    history.record_memory_history(skip_actions=["free_completed"])
    _ops(a, 3)
    history.record_memory_history(skip_actions=[])
    _ops(a, 1)
    got = [e["action"] for e in trace(history.snapshot())]
    assert got == ["segment_alloc"] + ["alloc", "free_requested"] * 3 + [
        "alloc", "free_requested", "free_completed"]


def test_a_free_completed_at_once_has_its_requests_time():
    """The completion of a free returned at once is stamped with its
    request's time (one clock read for both, Note [Folded frees]); the
    events around them keep their own, in order."""
    import time
    a = _C.Allocator()
    history.record_memory_history(context=None)
    for _ in range(3):
        p = a.malloc(4096)
        time.sleep(0.002)
        a.free(p)
        time.sleep(0.002)
    ev = [e for e in trace(history.snapshot()) if e["action"] != "segment_alloc"]
    assert [e["action"] for e in ev] == ["alloc", "free_requested", "free_completed"] * 3
    for i in range(0, 9, 3):
        assert ev[i + 2]["time_us"] == ev[i + 1]["time_us"]
        assert ev[i + 1]["time_us"] >= ev[i]["time_us"] + 1000


# ------------------------------------------------------------ validation

@pytest.mark.parametrize("kwargs, text", [
    ({"enabled": "yes"}, "expected state to be 'state', 'all', or None"),
    ({"enabled": 2}, "expected state to be 'state', 'all', or None"),
    ({"context": "stack"}, "expected context to be 'state', 'alloc', 'all', or None"),
    ({"context": 3}, "expected context to be 'state', 'alloc', 'all', or None"),
    ({"stacks": "cpp"}, "expected stacks to be 'python', or 'all'"),
    ({"stacks": None}, "expected stacks to be 'python', or 'all'"),
    ({"max_entries": -1}, "max_entries must be a non-negative int"),
    ({"max_entries": 2.0}, "max_entries must be a non-negative int"),
    ({"skip_actions": ["allocate"]}, "Unknown TraceEntry action: allocate"),
])
def test_invalid_arguments_raise_with_torch_wording(kwargs, text):
    history.record_memory_history(max_entries=7)
    with pytest.raises(ValueError) as info:
        history.record_memory_history(**kwargs)
    assert str(info.value).startswith(text)
    assert isinstance(info.value, RuntimeError)  # what torch raises
    assert history.recording_config()["max_entries"] == 7  # nothing changed
    with pytest.raises(HistoryConfigError):
        history._record_memory_history(**kwargs)


def test_torch_signatures_and_legacy_form():
    history._record_memory_history()
    cfg = history.recording_config()
    assert cfg == {"enabled": "all", "context": "all", "stacks": "all",
                   "max_entries": sys.maxsize, "skip_actions": [],
                   "categories": False, "sample": False}
    history._record_memory_history("state", "alloc", "python", 50, None, True)
    cfg = history.recording_config()
    assert (cfg["enabled"], cfg["context"], cfg["stacks"], cfg["max_entries"]) == (
        "state", "alloc", "python", 1)
    history._record_memory_history(True, trace_alloc_max_entries=3,
                                   trace_alloc_record_context=True)
    cfg = history.recording_config()
    assert (cfg["enabled"], cfg["context"], cfg["max_entries"]) == ("all", "alloc", 3)
    history._record_memory_history(False)
    assert history.recording_config()["enabled"] is None
    gm = history.record_memory_history
    assert (gm.__defaults__ == ("all", "all", "python", 100_000, False))
    assert gpumem._record_memory_history is history._record_memory_history
    assert gpumem._snapshot is history._snapshot and gpumem._dump_snapshot is history._dump_snapshot
    with pytest.raises(NotImplementedError):
        history._record_memory_history(record_pinned_host_memory=True)


# ------------------------------------------------------------ metadata

def test_user_metadata_is_per_thread():
    a = _C.Allocator()
    history.record_memory_history()
    history.set_memory_metadata("step 1")
    assert history.get_memory_metadata() == "step 1"
    p = a.malloc(1000)
    seen = {}

    def worker():
        seen["before"] = history.get_memory_metadata()
        history.set_memory_metadata("worker \N{SNOWMAN}")
        a.free(a.malloc(5000))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    history.set_memory_metadata("")
    a.free(p)
    ev = trace(history.snapshot())
    meta = [(e["action"], e["size"], e["user_metadata"]) for e in ev]
    assert ("alloc", 1000, "step 1") in meta
    assert ("alloc", 5000, "worker \N{SNOWMAN}") in meta
    assert ("free_requested", 1000, "") in meta
    assert seen["before"] == ""
    assert all(e["compile_context"] == "N/A" for e in ev)
    with pytest.raises(TypeError):
        history.set_memory_metadata(5)


# ------------------------------------------------------------ costs

def test_recording_off_captures_nothing():
    a = _C.Allocator()
    assert _C._hist_capture(1) == 0
    before = _C._hist_counts()

    def unique(n):
        return a.malloc(512) if n == 0 else unique(n - 1)

    for n in range(30):
        a.free(unique(n))
    assert _C._hist_counts()["tracebacks"] == before["tracebacks"]
    history.record_memory_history()
    assert trace(history.snapshot()) == []
    assert _C._hist_capture(1) != 0


def test_overhead_grows_with_unique_stacks_only():
    a = _C.Allocator()
    history.record_memory_history(max_entries=1)  # a fixed-size ring

    def same():
        return a.malloc(512)

    def churn(k):
        for _ in range(k):
            a.free(same())

    for k in (10, 5000):  # one call site, so one stack for every malloc
        churn(k)
        if k == 10:
            base = history.history_overhead_bytes()
            n0 = _C._hist_counts()["tracebacks"]
    assert history.history_overhead_bytes() == base
    assert _C._hist_counts()["tracebacks"] == n0

    def unique(n):
        return a.malloc(512) if n == 0 else unique(n - 1)

    for n in range(300):
        a.free(unique(n))
    assert _C._hist_counts()["tracebacks"] >= n0 + 300
    assert history.history_overhead_bytes() > base
    assert gpumem.history_overhead_bytes is history.history_overhead_bytes


def test_ring_memory_follows_max_entries():
    a = _C.Allocator()
    history.record_memory_history(max_entries=1)
    small = _C._hist_counts()["ring_bytes"]
    history.record_memory_history(max_entries=100_000)
    _ops(a, 3000)
    big = _C._hist_counts()["ring_bytes"]
    assert big > small + 9000 * 40  # about 48 bytes an event
    history.record_memory_history(None)
    assert _C._hist_counts()["ring_bytes"] < big // 10


# ------------------------------------------------------------ C stacks and C threads

def test_stacks_all_adds_c_frames_around_python_frames():
    a = _C.Allocator()
    history.record_memory_history(stacks="all")

    def pysite():
        return a.malloc(800)

    pysite()
    alloc = next(e for e in trace(history.snapshot()) if e["action"] == "alloc")
    frames = alloc["frames"]
    py_names = [f["name"] for f in frames if f["filename"] == HERE]
    assert py_names[:2] == ["pysite", "test_stacks_all_adds_c_frames_around_python_frames"]
    c_frames = [f for f in frames if f["line"] == 0]
    assert c_frames, "no C frames with stacks='all'"
    assert all(isinstance(f["name"], str) and f["name"] for f in c_frames)
    assert any("PyEval_EvalFrame" in f["name"] for f in c_frames)
    # A Python frame is spliced in just before an eval-loop C frame.
    i = next(i for i, f in enumerate(frames) if f["name"] == "pysite")
    assert "PyEval_EvalFrame" in frames[i + 1]["name"]


def test_gpumems_own_c_frames_are_named():
    """gpumem's functions are hidden (-fvisibility=hidden), so dladdr names
    none of them: they are named from the library's symbol table, with their
    source file, as torch names its allocator's frames (name, file, line 0)."""
    a = _C.Allocator()
    history.record_memory_history(stacks="all")
    a.malloc(800)
    alloc = next(e for e in trace(history.snapshot()) if e["action"] == "alloc")
    history.record_memory_history(None)
    ours = [f for f in alloc["frames"] if f["line"] == 0
            and (f["filename"].endswith(".c") or os.path.basename(_C.__file__) in f["filename"])]
    assert ours and ours[0] is alloc["frames"][0], alloc["frames"][:4]
    assert not [f for f in ours if f["name"].startswith("??")], ours
    assert not alloc["frames"][0]["filename"].endswith(".so"), alloc["frames"][0]
    assert alloc["frames"][0]["filename"].endswith(".c"), alloc["frames"][0]


def test_capture_in_a_thread_without_python_state_does_not_block():
    history.record_memory_history(stacks="python")
    tb, blocked = testext.hist_capture_in_c_thread(1)
    assert (tb, blocked) == (0, False)
    history.record_memory_history(stacks="all")
    tb, blocked = testext.hist_capture_in_c_thread(1)
    assert not blocked and tb != 0
    frames = _C._hist_traceback(tb)
    assert frames and all(f["line"] == 0 for f in frames)  # C frames only
    history.record_memory_history(None)
    assert testext.hist_capture_in_c_thread(1) == (0, False)


def test_capture_on_a_thread_with_a_state_but_no_frames_does_not_take_the_gil():
    """Autograd's device threads have a Python thread state (torch makes one,
    then releases the GIL) and never a Python frame. Their captures find
    nothing to walk, so they must not wait for the GIL (Note [Capture and
    the GIL]): here the caller holds it while the thread captures."""
    history.record_memory_history(stacks="python")
    try:
        assert testext.hist_capture_in_c_thread(1, 2.0, True) == (0, False)
        prev = _C._hist_backward_enter()   # as gpumem's backward wrapper does
        try:
            tb, blocked = testext.hist_capture_in_c_thread(1, 2.0, True)
        finally:
            _C._hist_backward_exit(prev)
        assert not blocked and tb != 0
        names = [f["name"] for f in _C._hist_traceback(tb)]
        assert names[0] == "test_capture_on_a_thread_with_a_state_but_no_frames_does_not_take_the_gil"
    finally:
        history.record_memory_history(None)


def test_allocations_from_a_c_thread_are_recorded_without_frames():
    from test_history_support import check_snapshot
    a = _C.Allocator()
    history.record_memory_history()
    kept, blocked = testext.hist_c_thread_alloc(a, 4096, 50, keep=5)
    assert not blocked and len(kept) == 5
    mine = a.malloc(4096)
    snap = history.snapshot()
    ev = trace(snap)
    allocs = [e for e in ev if e["action"] == "alloc"]
    assert len(allocs) == 51
    assert all("frames" not in e for e in allocs[:50])
    assert "frames" in allocs[50]
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    assert all(blocks[p]["frames"] == [] for p in kept)
    assert blocks[mine]["frames"]
    check_snapshot(snap)


def test_capsule_api_is_exported():
    assert type(_C._hist_api).__name__ == "PyCapsule"
    assert "gpumem._C._hist_api" in repr(_C._hist_api)


def test_event_numbers_name_each_recorded_event():
    """_C._hist_seq counts the events recorded on a device, and a snapshot's
    seqs give the number of its oldest event: what gpumem.categories.tagger uses to
    place its tags between events (Note [Categories follow the allocation])."""
    a = _C.Allocator()
    a.free(a.malloc(512))                         # the segment exists: later mallocs are cached
    history.record_memory_history(max_entries=4, clear_history=True)
    before = _C._hist_seq(0)
    p = a.malloc(512)
    assert _C._hist_seq(0) == before + 1          # one alloc event
    a.free(p)                                     # free_requested + free_completed
    assert _C._hist_seq(0) == before + 3
    for _ in range(3):
        a.free(a.malloc(512))
    seq = _C._hist_seq(0)
    segments, traces, _settings, first = _C._hist_snapshot(seqs=True)
    assert len(traces[0]) == 4                    # the ring keeps the newest 4
    assert first[0] == seq - 4
    assert _C._hist_seq(0) == seq + 1             # the snapshot marker came after the copy
    assert len(_C._hist_snapshot()) == 3          # without seqs: torch's three parts
    with pytest.raises(ValueError):
        _C._hist_seq(-1)


# ------------------------------------------------------------ timestamps

def test_event_times_are_wall_clock_microseconds_in_order():
    """Events are stamped in ticks and converted when copied (clock.h):
    every time lies between wall-clock readings taken around its event, in
    event order, and a known gap between two events comes out as it was."""
    import time
    a = _C.Allocator()
    history.record_memory_history()
    try:
        before = time.time() * 1e6
        p = a.malloc(4096)
        mid_lo = time.time() * 1e6
        time.sleep(0.25)
        mid_hi = time.time() * 1e6
        a.free(p)
        after = time.time() * 1e6
        for _ in range(2):  # a second copy converts the same events the same way
            ev = [e for e in trace(history.snapshot()) if e["action"] != "snapshot"]
            times = [e["time_us"] for e in ev]
            assert times == sorted(times)
            alloc = next(e for e in ev if e["action"] == "alloc")["time_us"]
            freed = next(e for e in ev if e["action"] == "free_completed")["time_us"]
            assert before - 2 <= alloc <= mid_lo + 2
            assert mid_hi - 2 <= freed <= after + 2
            assert abs((freed - alloc) - 250e3) < 50e3
    finally:
        history.record_memory_history(None)
