"""Private memory pools with gpumem installed: torch.cuda.MemPool,
torch.cuda.use_mem_pool and CUDA graph capture, each snippet run under
torch's own allocator and under gpumem on the simulated GPU, and compared.

torch's behaviour is the specification (c10/cuda/CUDACachingAllocator.cpp's
PrivatePool): allocations inside use_mem_pool come from the pool (only on
the thread that entered it; nested blocks use the innermost pool), blocks
are reused only within their pool, a live pool keeps its cached segments
through empty_cache, deleting the MemPool frees them, snapshots name each
segment's pool in segment_pool_id and memory_snapshot(pool.id) lists only
that pool's segments. The CUDA graph tests need stream capture in the
simulated GPU; they skip, saying so, when torch's own allocator cannot
capture there (detected when the test runs). Kernels compute nothing on
the simulated GPU, so they check what copies show. CUDA graph trees,
make_graphed_callables and reduce-overhead: tests/test_torch_graphs.py.
"""

from __future__ import annotations

import pytest

from torch_helpers import run_gm

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

STATS = '''
import threading
MiB = 1 << 20
KEYS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "segment.all.current",
        "segment.small_pool.current", "segment.large_pool.current", "active_bytes.all.current",
        "inactive_split_bytes.all.current", "allocation.all.current", "num_device_alloc",
        "num_device_free", "requested_bytes.all.current")

def stats():
    s = torch.cuda.memory_stats()
    return {k: s.get(k) for k in KEYS}

def pool_of(t):
    for s in torch.cuda.memory_snapshot():
        if s["address"] <= t.data_ptr() < s["address"] + s["total_size"]:
            return list(s["segment_pool_id"])
    return None

def segs(snapshot):
    return sorted((list(s["segment_pool_id"]), s["segment_type"], s["total_size"],
                   s["allocated_size"]) for s in snapshot)
'''


def both(code: str, **kw):
    """The snippet's result under torch's allocator and under gpumem."""
    return run_gm(code, prelude=STATS, install=False, **kw), run_gm(code, prelude=STATS, **kw)


def assert_same(torch_out: dict, gm_out: dict):
    diff = {k: (torch_out[k], gm_out.get(k)) for k in torch_out if torch_out[k] != gm_out.get(k)}
    assert not diff, f"gpumem differs from torch (torch, gpumem): {diff}"


def test_mempool_routing_reuse_and_release_match_torch():
    t, g = both('''
        out = {}
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        pool = torch.cuda.MemPool()
        out["id"], out["use0"] = list(pool.id), pool.use_count()
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(1000, dtype=torch.uint8, device="cuda")
            b = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        out["use1"] = pool.use_count()
        out["pools"] = [pool_of(x), pool_of(a), pool_of(b)]
        out["live"] = stats()
        out["pool_snapshot"] = segs(pool.snapshot())
        out["all_snapshot"] = segs(torch.cuda.memory_snapshot())
        pa = a.data_ptr()
        del a
        c = torch.empty(1000, dtype=torch.uint8, device="cuda")
        out["default_took_pool_block"] = c.data_ptr() == pa
        with torch.cuda.use_mem_pool(pool):
            d = torch.empty(1000, dtype=torch.uint8, device="cuda")
        out["pool_reused_its_block"] = d.data_ptr() == pa
        del d
        torch.cuda.empty_cache()
        out["after_empty_cache"] = stats()
        del b
        torch.cuda.empty_cache()
        out["live_pool_kept_its_cache"] = stats()
        del pool
        out["after_deleting_the_pool"] = stats()
        emit(out)
    ''')
    assert_same(t, g)
    assert g["pools"][1] == g["id"] and g["pools"][0] == [0, 0], g["pools"]
    assert g["pool_reused_its_block"] and not g["default_took_pool_block"]
    # the pool's segments went back when the MemPool was deleted
    assert (g["after_deleting_the_pool"]["reserved_bytes.all.current"]
            < g["live_pool_kept_its_cache"]["reserved_bytes.all.current"])


def test_several_pools_nesting_threads_and_live_checks_match_torch():
    t, g = both('''
        out = {}
        p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
        out["ids"] = [list(p1.id), list(p2.id)]
        res = {}
        with torch.cuda.use_mem_pool(p1):
            a = torch.empty(MiB // 2, dtype=torch.uint8, device="cuda")
            with torch.cuda.use_mem_pool(p2):
                b = torch.empty(MiB // 2, dtype=torch.uint8, device="cuda")
                def other():  # use_mem_pool routes only the thread that entered it
                    res["t"] = torch.empty(MiB // 2, dtype=torch.uint8, device="cuda")
                th = threading.Thread(target=other)
                th.start()
                th.join()
            c = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
        out["pools"] = [pool_of(a), pool_of(b), pool_of(res["t"]), pool_of(c)]
        out["use"] = [p1.use_count(), p2.use_count()]
        out["live"] = stats()
        out["p1"], out["p2"] = segs(p1.snapshot()), segs(p2.snapshot())
        out["unknown_pool"] = torch.cuda.memory_snapshot((0, 999))
        out["cpp_snapshot_p2"] = segs(torch._C._cuda_memorySnapshot(p2.id)["segments"])
        live = {a.data_ptr(), c.data_ptr()}
        out["live_check"] = [
            torch._C._cuda_checkPoolLiveAllocations(0, p1.id, live),
            torch._C._cuda_checkPoolLiveAllocations(0, p1.id, {a.data_ptr()}),
            torch._C._cuda_checkPoolLiveAllocations(0, p1.id, live | {b.data_ptr()})]
        del a, b, c
        torch.cuda.empty_cache()
        out["freed_but_pools_live"] = stats()
        del p2
        out["p2_deleted"] = stats()
        del p1
        del res
        torch.cuda.empty_cache()
        out["end"] = stats()
        emit(out)
    ''')
    assert_same(t, g)
    assert g["pools"] == [[0, 1], [0, 2], [0, 0], [0, 1]], g["pools"]
    assert g["live_check"] == [True, False, False]
    assert g["end"]["reserved_bytes.all.current"] == 0


def test_entering_a_pool_twice_is_refused_like_torch():
    t, g = both('''
        p = torch.cuda.MemPool()
        try:
            with torch.cuda.use_mem_pool(p):
                with torch.cuda.use_mem_pool(p):
                    pass
            err = None
        except RuntimeError as e:
            err = str(e).splitlines()[0]
        emit({"error": err, "use": p.use_count()})
    ''')
    assert t["error"] == g["error"] == "beginAllocateToPool: already recording to mempool_id"
    # torch takes a use of the pool before it refuses, and never gives it
    # back (the pool then outlives its MemPool); gpumem refuses first.
    assert t["use"] == 2 and g["use"] == 1, (t, g)


def test_mempool_options_gpumem_cannot_honour_are_refused():
    g = run_gm('''
        out = {}
        for kw in ({"use_on_oom": True}, {"no_split": True}):
            try:
                torch.cuda.MemPool(**kw)
                out[str(kw)] = None
            except RuntimeError as e:
                out[str(kw)] = str(e).splitlines()[0]
        p = torch.cuda.MemPool()  # a plain one works, and deleting it too
        with torch.cuda.use_mem_pool(p):
            x = torch.ones(10, device="cuda")
        del x, p
        out["ok"] = True
        emit(out)
    ''')
    assert "use_on_oom" in g["{'use_on_oom': True}"], g
    assert "no_split" in g["{'no_split': True}"], g
    assert g["ok"]


CAPTURE = '''
out = {}
try:
    probe = torch.cuda.CUDAGraph()
    z = torch.ones(4, device="cuda")
    with torch.cuda.graph(probe):
        z2 = z * 2
    del probe, z2
    out["capture"] = True
except Exception as e:
    out["capture"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
'''


def capture_both(code: str) -> tuple:
    """Run a capture snippet under torch's allocator, skip if the simulated
    GPU cannot capture, else under gpumem too; the two must agree on
    everything but out["driver"] (the device calls each allocator makes
    differ: torch's go through the runtime, gpumem's to the driver)."""
    t = run_gm(code, prelude=STATS, install=False)
    if t["capture"] is not True:
        pytest.skip(f"the simulated GPU cannot capture CUDA graphs here: {t['capture']}")
    g = run_gm(code, prelude=STATS)
    assert_same({k: v for k, v in t.items() if k != "driver"},
                {k: v for k, v in g.items() if k != "driver"})
    return t, g


# Device calls made between two points: how many allocations of each API,
# and how often the calling thread changed its capture mode.
DRIVER = '''
DRIVER_CALLS = ("cuMemAlloc_v2", "cudaMalloc", "cuThreadExchangeStreamCaptureMode",
                "cudaThreadExchangeStreamCaptureMode", "cuStreamEndCapture")
def calls():
    r = report()  # the runtime's calls, and the driver's (its own report)
    c = dict(r["calls"], **r["driver"]["calls"])
    return {k: c.get(k, 0) for k in DRIVER_CALLS}
def since(before):
    now = calls()
    return {k: now[k] - before[k] for k in DRIVER_CALLS}
'''


def assert_allocated_in_relaxed_mode(t: dict, g: dict):
    """Both allocators reached the device during the capture, and the
    capture survived: the fake driver refuses cuMemAlloc (and cudaMalloc)
    in global capture mode and invalidates the capture, so a successful
    capture that allocated switched the thread to relaxed mode (twice per
    allocation: to relaxed and back)."""
    td, gd = t["driver"], g["driver"]
    assert td["cudaMalloc"] >= 1 and td["cudaThreadExchangeStreamCaptureMode"] >= 2, td
    assert gd["cuMemAlloc_v2"] >= 1 and gd["cudaMalloc"] == 0, gd
    assert gd["cuThreadExchangeStreamCaptureMode"] >= 2 * gd["cuMemAlloc_v2"], gd
    assert gd["cuStreamEndCapture"] == td["cuStreamEndCapture"] == 1, (td, gd)
    print(f"\ndevice calls during the capture: torch {td}, gpumem {gd}")


def test_graph_capture_matches_torch():
    """Kernels compute nothing on the simulated GPU, but copies move data
    and a replay performs its captured copies: a graph that copies its
    static input shows, after each replay, the input of that moment."""
    code = CAPTURE + DRIVER + '''
if out["capture"] is True:
    torch.cuda.empty_cache()
    n = 256 * 1024
    static_in = torch.zeros(n, device="cuda")
    g1 = torch.cuda.CUDAGraph()
    before = calls()
    with torch.cuda.graph(g1):
        y = torch.empty_like(static_in)
        y.copy_(static_in)
        tmp = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        del tmp
    out["driver"] = since(before)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g1.pool()):  # shares g1's pool
        w = y.clone()
    values = []
    for v in (3.0, 5.0):
        static_in.copy_(torch.full((n,), v))  # a host-to-device copy moves data
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        values.append([y[0].item(), y[-1].item(), w[n // 2].item()])
    out["values"] = values
    out["pools"] = [pool_of(static_in)[0] == 0, pool_of(y)[0] != 0, pool_of(w) == pool_of(y)]
    out["captured"] = stats()
    out["snapshot"] = segs(torch.cuda.memory_snapshot())
    g1.reset()
    torch.cuda.empty_cache()
    out["one_graph_left"] = stats()
    del g2, y, w
    torch.cuda.empty_cache()
    out["graphs_gone"] = stats()
emit(out)
'''
    t, g = capture_both(code)
    assert g["values"] == [[3.0, 3.0, 3.0], [5.0, 5.0, 5.0]] and all(g["pools"]), g
    assert_allocated_in_relaxed_mode(t, g)
    # the graphs' pool kept its memory while a graph held it, and gave it back after
    assert (g["graphs_gone"]["reserved_bytes.all.current"]
            < g["captured"]["reserved_bytes.all.current"])


def test_record_stream_during_capture_is_deferred_like_torch():
    code = CAPTURE + DRIVER + '''
if out["capture"] is True:
    s = torch.cuda.Stream()
    x = torch.ones(1000, device="cuda")
    g = torch.cuda.CUDAGraph()
    before = calls()
    with torch.cuda.graph(g):
        y = x.clone()
        y.record_stream(s)
        del y  # freed during capture with a use on another stream
        z = torch.empty(1000, device="cuda")
    out["driver"] = since(before)
    out["during"] = stats()
    torch.cuda.synchronize()
    a = torch.empty(10, device="cuda")  # the first malloc after capture inserts the events
    torch.cuda.synchronize()
    b = torch.empty(10, device="cuda")
    out["after"] = stats()
    del g, z, a, b
    torch.cuda.empty_cache()
    out["end"] = stats()
emit(out)
'''
    t, g = capture_both(code)
    assert_allocated_in_relaxed_mode(t, g)
    # y's block stayed active (its use on s pending) until events could be
    # recorded after the capture
    d, a = g["during"], g["after"]
    assert d["active_bytes.all.current"] > d["allocated_bytes.all.current"], d
    assert a["active_bytes.all.current"] == a["allocated_bytes.all.current"], a


def test_snapshot_with_private_pools_replays_and_views(tmp_path):
    """A snapshot gpumem records while MemPools are in use names each
    segment's pool (a tuple, as torch's does) and stays readable by gpumem's
    own tools: replay, view and summary."""
    import subprocess
    import sys

    from gpumem.snapshots.unpickle import load_snapshot
    from torch_helpers import ROOT

    path = tmp_path / "pools.pickle"
    run_gm(f'''
        torch.cuda.memory._record_memory_history(max_entries=10000)
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(p1):
            a = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(p2):
            b = torch.empty(1000, dtype=torch.uint8, device="cuda")
        del a
        torch.cuda.memory._dump_snapshot({str(path)!r})
        emit({{}})
    ''', prelude=STATS)
    snap = load_snapshot(path)
    ids = sorted({tuple(s["segment_pool_id"]) for s in snap["segments"]})
    assert ids == [(0, 0), (0, 1), (0, 2)], ids
    assert all(type(s["segment_pool_id"]) is tuple for s in snap["segments"])
    for cmd in (["replay", str(path), "--json"], ["view", str(path), "-o", str(tmp_path / "v.html")],
                ["summary", str(path)]):
        proc = subprocess.run([sys.executable, "-m", "gpumem", *cmd], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-2000:])
    assert (tmp_path / "v.html").stat().st_size > 1000


def test_out_of_memory_message_counts_private_pools_like_torch():
    t, g = both('''
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
        del a  # cached in the pool, which is still alive
        keep = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
            msg = None
        except torch.OutOfMemoryError as e:
            msg = str(e).split(" If reserved")[0]
        emit({"message": msg, "stats": stats()})
    ''', memory="1GiB")
    assert_same(t, g)
    assert "allocated in private pools" in g["message"], g["message"]
