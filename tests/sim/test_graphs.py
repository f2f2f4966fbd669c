"""Stream capture and CUDA graphs on the simulated GPU.

The fast tests drive the fake runtime (and through it the fake driver's
capture state, simgpu/driver/fakecuda_capture.c) with ctypes in a
subprocess started under the simulator, as tests/sim/test_runtime.py does:
the capture state machine, the calls a capture forbids and the errors
NVIDIA documents for them (cuda_runtime_api.h, the Programming Guide's
"CUDA Graphs"), fork/join through events, host nodes, replay of captured
copies and memsets, the device timeline, and the leak report. The slow
tests run torch.cuda.graph, make_graphed_callables and torch.compile's
cudagraph trees with torch's own caching allocator.
"""

from __future__ import annotations

import textwrap

import pytest

from sim_helpers import needs_cc, needs_torch, run_sim

PRELUDE = r'''
import ctypes as C, threading
rt = C.CDLL("libcudart.so.13")
vp, sz, u64 = C.c_void_p, C.c_size_t, C.c_ulonglong
NONE, ACTIVE, INVALIDATED = 0, 1, 2
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
H2D, D2H, D2D = 1, 2, 3
def stream(flags=1):                      # cudaStreamNonBlocking by default
    s = vp(); assert rt.cudaStreamCreateWithFlags(C.byref(s), flags) == 0; return s
def event():
    e = vp(); assert rt.cudaEventCreateWithFlags(C.byref(e), 2) == 0; return e
def malloc(n):
    p = vp(); assert rt.cudaMalloc(C.byref(p), sz(n)) == 0; return p
def status(s):
    st = C.c_int(-1); err = rt.cudaStreamIsCapturing(s, C.byref(st)); return [err, st.value]
def info(s):
    st, cid, g, deps, n = C.c_int(-1), u64(), vp(), C.POINTER(vp)(), sz()
    err = rt.cudaStreamGetCaptureInfo(s, C.byref(st), C.byref(cid), C.byref(g), C.byref(deps),
                                      None, C.byref(n))
    return err, st.value, cid.value, g.value, [deps[i] for i in range(n.value)]
def end(s):
    g = vp(1); err = rt.cudaStreamEndCapture(s, C.byref(g)); return err, g.value
def mode(m):
    v = C.c_int(m); err = rt.cudaThreadExchangeStreamCaptureMode(C.byref(v)); return err, v.value
def nodes(g):
    n = sz(); assert rt.cudaGraphGetNodes(vp(g), None, C.byref(n)) == 0
    arr = (vp * max(n.value, 1))(); assert rt.cudaGraphGetNodes(vp(g), arr, C.byref(n)) == 0
    return list(arr[:n.value])
def instantiate(g, flags=0):
    x = vp(); err = rt.cudaGraphInstantiateWithFlags(C.byref(x), vp(g), u64(flags)); return err, x
def host(n, p):
    buf = (C.c_ubyte * n)(); rt.cudaMemcpy(buf, p, sz(n), D2H); return bytes(buf).hex()
def last():
    return rt.cudaGetLastError()
o = {}
'''

pytestmark = needs_cc


def sim(body: str, **kw):
    return run_sim(PRELUDE + textwrap.dedent(body), **kw)


def test_capture_records_work_and_replay_runs_it():
    """Captured memsets/copies change nothing until the graph is launched;
    every launch runs them again with the arguments captured."""
    out = sim(r'''
        s = stream()
        a, b = malloc(256), malloc(256)
        rt.cudaMemset(a, 0, sz(256)); rt.cudaMemset(b, 0, sz(256))
        o["legacy"] = [rt.cudaStreamBeginCapture(None, GLOBAL), last()]
        o["before"] = status(s)
        o["begin"] = rt.cudaStreamBeginCapture(s, GLOBAL)
        o["again"] = rt.cudaStreamBeginCapture(s, GLOBAL)
        o["during"] = status(s)
        e1, st, cid, g1, deps0 = info(s)
        o["info0"] = [e1, st, cid != 0, g1 is not None, deps0]
        rt.cudaMemsetAsync(a, 7, sz(256), s)
        rt.cudaMemcpyAsync(b, a, sz(256), D2D, s)
        _, _, cid2, _, deps = info(s)
        hsrc, hdst = (C.c_ubyte * 4)(1, 2, 3, 4), (C.c_ubyte * 4)()
        rt.cudaMemcpyAsync(hdst, hsrc, sz(4), 0, s)   # host to host, also a node
        o["same_id"] = cid2 == cid
        old = mode(RELAXED)[1]   # a synchronous copy is allowed in relaxed mode only
        o["not_run"] = [host(4, a), host(4, b)]
        mode(old)
        err, g = end(s)
        o["end"] = [err, g == g1, status(s)]
        o["end_again"] = end(s)[0]
        ns = nodes(g)
        dep = (vp * 2)(); n = sz(2)
        rt.cudaGraphNodeGetDependencies(vp(ns[1]), dep, None, C.byref(n))
        o["graph"] = [len(ns), deps == [ns[1]], [dep[i] for i in range(n.value)] == [ns[0]]]
        # a second capture gets another nonzero id
        rt.cudaStreamBeginCapture(s, RELAXED); cid3 = info(s)[2]; e, g3 = end(s)
        o["ids"] = [cid3 != cid, cid3 != 0, e, len(nodes(g3))]
        err, x = instantiate(g, 1 | 8)     # AutoFreeOnLaunch | UseNodePriority, as torch does
        o["inst"] = err
        o["h2h"] = list(hdst)
        o["launch"] = [rt.cudaGraphLaunch(x, s), rt.cudaStreamSynchronize(s), host(4, a), host(4, b)]
        o["h2h_launched"] = list(hdst)
        rt.cudaMemset(b, 1, sz(256))
        rt.cudaGraphLaunch(x, s); rt.cudaStreamSynchronize(s)
        o["relaunch"] = host(4, b)
        o["destroy"] = [rt.cudaGraphDestroy(vp(g)), rt.cudaGraphDestroy(vp(g3)),
                        rt.cudaGraphDestroy(vp(g)), rt.cudaGraphExecDestroy(x),
                        rt.cudaGraphExecDestroy(x)]
        o["leaks"] = report()["driver"]["leaks"]["graphs"]
        emit(o)
    ''')
    assert out["legacy"] == [900, 900]          # cudaErrorStreamCaptureUnsupported, recorded
    assert out["before"] == [0, 0] and out["begin"] == 0
    assert out["again"] == 401                  # cudaErrorIllegalState
    assert out["during"] == [0, 1]
    assert out["info0"] == [0, 1, True, True, []]
    assert out["same_id"] is True
    assert out["not_run"] == ["00000000", "00000000"]
    assert out["end"] == [0, True, [0, 0]] and out["end_again"] == 401
    assert out["graph"] == [3, True, True]
    assert out["h2h"] == [0, 0, 0, 0] and out["h2h_launched"] == [1, 2, 3, 4]
    assert out["ids"] == [True, True, 0, 0]
    assert out["inst"] == 0
    assert out["launch"] == [0, 0, "07070707", "07070707"]
    assert out["relaunch"] == "07070707"       # the captured copy ran again
    assert out["destroy"] == [0, 0, 1, 0, 1]    # second destroy: cudaErrorInvalidValue
    assert out["leaks"] == 0


def test_potentially_unsafe_calls_follow_the_capture_modes():
    out = sim(r'''
        s = stream()
        buf64 = malloc(64)
        o["exchange"] = [mode(RELAXED), mode(THREAD_LOCAL), mode(GLOBAL), mode(7)[0]]
        # global mode: cudaMalloc fails and invalidates; EndCapture reports it
        rt.cudaStreamBeginCapture(s, GLOBAL)
        p = vp()
        o["malloc"] = [rt.cudaMalloc(C.byref(p), sz(1 << 20)), status(s)]
        o["after"] = rt.cudaMemsetAsync(buf64, 0, sz(64), s)
        o["end"] = end(s)
        # relaxed (torch's cudaMallocMaybeCapturing): allowed, capture intact
        rt.cudaStreamBeginCapture(s, GLOBAL)
        old = mode(RELAXED)[1]
        o["relaxed"] = [rt.cudaMalloc(C.byref(p), sz(1 << 20)), rt.cudaFree(p)]
        mode(old)
        o["relaxed_end"] = [end(s)[0], status(s)]
        # synchronous copy and device synchronize in global mode
        d = malloc(64)
        buf = (C.c_ubyte * 64)()
        rt.cudaStreamBeginCapture(s, GLOBAL)
        o["memcpy"] = rt.cudaMemcpy(d, buf, sz(64), H2D)
        o["memcpy_end"] = end(s)
        rt.cudaStreamBeginCapture(s, GLOBAL)
        o["devsync"] = rt.cudaDeviceSynchronize()
        o["devsync_end"] = end(s)[0]
        # captures of other threads: a global one forbids, a thread-local one does not
        def other(m, box):
            t = stream(); rt.cudaStreamBeginCapture(t, m); box["go"].set(); box["done"].wait()
            box["end"] = end(t)[0]
        for m in (GLOBAL, THREAD_LOCAL):
            box = {"go": threading.Event(), "done": threading.Event()}
            th = threading.Thread(target=other, args=(m, box)); th.start(); box["go"].wait()
            r = [rt.cudaMalloc(C.byref(p), sz(4096))]
            if r[0] == 0: rt.cudaFree(p)
            old = mode(THREAD_LOCAL)[1]; r.append(rt.cudaMalloc(C.byref(p), sz(4096))); mode(old)
            rt.cudaFree(p)
            box["done"].set(); th.join(); r.append(box["end"])
            o["thread%d" % m] = r
        last()
        emit(o)
    ''')
    assert out["exchange"] == [[0, 0], [0, 2], [0, 1], 1]
    assert out["malloc"] == [900, [0, 2]]       # status: cudaStreamCaptureStatusInvalidated
    assert out["after"] == 901                  # further use: cudaErrorStreamCaptureInvalidated
    assert out["end"] == [901, None]
    assert out["relaxed"] == [0, 0] and out["relaxed_end"] == [0, [0, 0]]
    assert out["memcpy"] == 900 and out["memcpy_end"] == [901, None]
    assert out["devsync"] == 900 and out["devsync_end"] == 901
    # another thread's global capture forbids this thread's cudaMalloc (and is
    # invalidated) unless this thread is in thread-local mode
    assert out["thread0"] == [900, 0, 901]
    assert out["thread1"] == [0, 0, 0]


def test_synchronising_or_querying_captured_work_is_rejected():
    out = sim(r'''
        s, e = stream(), event()
        for name, call in (("sync", lambda: rt.cudaStreamSynchronize(s)),
                           ("query", lambda: rt.cudaStreamQuery(s)),
                           ("event_query", lambda: rt.cudaEventQuery(e)),
                           ("event_sync", lambda: rt.cudaEventSynchronize(e))):
            rt.cudaStreamBeginCapture(s, RELAXED)   # forbidden in every mode
            rt.cudaEventRecord(e, s)
            o[name] = [call(), status(s)[1], end(s)[0]]
        o["event_after"] = rt.cudaEventQuery(e)     # its capture ended
        # implicit synchronisation: the legacy stream next to a blocking capture
        b, d = stream(0), malloc(64)
        rt.cudaStreamBeginCapture(b, GLOBAL)
        o["implicit"] = [rt.cudaMemsetAsync(d, 0, sz(64), None), status(b)[1], end(b)[0]]
        n = stream(1)
        rt.cudaStreamBeginCapture(n, GLOBAL)
        o["nonblocking"] = [rt.cudaMemsetAsync(d, 0, sz(64), None), end(n)[0]]
        # no memory nodes: stream-ordered allocation is refused on a capturing stream
        rt.cudaStreamBeginCapture(n, RELAXED)
        p = vp()
        o["malloc_async"] = [rt.cudaMallocAsync(C.byref(p), sz(64), n), end(n)[0],
                             rt.cudaMallocAsync(C.byref(p), sz(64), n), rt.cudaFreeAsync(p, n)]
        last()
        emit(o)
    ''')
    for name in ("sync", "query"):
        assert out[name] == [900, 2, 901], name
    for name in ("event_query", "event_sync"):
        assert out[name] == [907, 2, 901], name   # cudaErrorCapturedEvent
    assert out["event_after"] == 0
    assert out["implicit"] == [906, 2, 901]       # cudaErrorStreamCaptureImplicit
    assert out["nonblocking"] == [0, 0]
    assert out["malloc_async"] == [900, 0, 0, 0]


def test_fork_join_through_events_and_the_join_rules():
    out = sim(r'''
        s1, s2, s3 = stream(), stream(), stream()
        e1, e2 = event(), event()
        a, b = malloc(64), malloc(64)
        # fork without join: unjoined
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        rt.cudaEventRecord(e1, s1)
        o["fork"] = [rt.cudaStreamWaitEvent(s2, e1, 0), status(s2), info(s2)[2] == info(s1)[2]]
        rt.cudaMemsetAsync(b, 5, sz(64), s2)
        o["unjoined"] = [end(s1), status(s2)]
        # fork and join: one graph with work of both streams
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        rt.cudaMemsetAsync(a, 3, sz(64), s1)
        rt.cudaEventRecord(e1, s1)
        rt.cudaStreamWaitEvent(s2, e1, 0)
        o["unmatched"] = [end(s2)[0], end(s1)[0]]  # not the origin stream
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        rt.cudaMemsetAsync(a, 3, sz(64), s1)
        rt.cudaEventRecord(e1, s1)
        rt.cudaStreamWaitEvent(s2, e1, 0)
        rt.cudaMemsetAsync(b, 4, sz(64), s2)
        rt.cudaEventRecord(e2, s2)
        rt.cudaStreamWaitEvent(s1, e2, 0)
        _, _, _, _, deps = info(s1)
        err, g = end(s1)
        ns = nodes(g)
        o["joined"] = [err, len(ns), sorted(deps) == sorted(ns), status(s2)]  # the union
        _, x = instantiate(g)
        rt.cudaGraphLaunch(x, s3); rt.cudaStreamSynchronize(s3)
        o["replay"] = [host(1, a), host(1, b)]
        # waiting on work outside the capture: isolation
        rt.cudaEventRecord(e2, s3)
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        o["isolation"] = [rt.cudaStreamWaitEvent(s1, e2, 0), end(s1)[0]]
        # two captures cannot merge
        rt.cudaStreamBeginCapture(s1, GLOBAL); rt.cudaStreamBeginCapture(s2, GLOBAL)
        rt.cudaEventRecord(e1, s1)
        o["merge"] = [rt.cudaStreamWaitEvent(s2, e1, 0), end(s1)[0], end(s2)[0]]
        # an idle stream cannot join an invalidated capture
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        rt.cudaEventRecord(e1, s1)
        rt.cudaStreamSynchronize(s1)                 # invalidates it
        o["join_invalidated"] = [rt.cudaStreamWaitEvent(s2, e1, 0), status(s2), end(s1)[0]]
        # a global capture must end in the thread that began it
        rt.cudaStreamBeginCapture(s1, GLOBAL)
        box = {}
        th = threading.Thread(target=lambda: box.setdefault("r", end(s1)[0])); th.start(); th.join()
        o["wrong_thread"] = [box["r"], end(s1)[0]]
        rt.cudaGraphDestroy(vp(g)); rt.cudaGraphExecDestroy(x)
        last()
        emit(o)
    ''')
    assert out["fork"] == [0, [0, 1], True]
    assert out["unjoined"] == [[904, None], [0, 0]]   # cudaErrorStreamCaptureUnjoined
    assert out["unmatched"] == [903, 901]
    assert out["joined"] == [0, 2, True, [0, 0]]
    assert out["replay"] == ["03", "04"]
    assert out["isolation"] == [905, 901]
    assert out["merge"] == [902, 901, 901]
    assert out["join_invalidated"] == [1, [0, 0], 901]   # cudaErrorInvalidValue
    assert out["wrong_thread"] == [908, 0]


def test_host_nodes_flags_update_dot_timeline_and_leaks(tmp_path):
    dot = tmp_path / "g.dot"
    out = sim(r'''
        import sys
        s = stream()
        calls = []
        CB = C.CFUNCTYPE(None, vp)
        cb = CB(lambda p: calls.append(p))
        rt.cudaLaunchHostFunc(s, cb, vp(11))
        o["eager"] = list(calls)
        d = malloc(1 << 20)
        rt.cudaStreamBeginCapture(s, GLOBAL)
        for i in range(3):
            rt.cudaMemsetAsync(d, i, sz(1 << 20), s)
        rt.cudaLaunchHostFunc(s, cb, vp(22))
        err, g = end(s)
        o["captured"] = [err, len(nodes(g)), list(calls)]
        o["dot"] = rt.cudaGraphDebugDotPrint(vp(g), sys.argv[1].encode(), 1)
        o["flags"] = [instantiate(g, 2)[0], instantiate(g, 16)[0], instantiate(g, 4 | 1)[0]]
        _, x = instantiate(g, 1)
        # one launch costs what its three memsets cost when run eagerly; a
        # long memset first keeps the stream busy, so host latency is hidden
        big = malloc(64 << 20)
        t0, t1 = vp(), vp()
        rt.cudaEventCreate(C.byref(t0)); rt.cudaEventCreate(C.byref(t1))
        ms = C.c_float()
        rt.cudaMemsetAsync(big, 0, sz(64 << 20), s)
        rt.cudaEventRecord(t0, s)
        for i in range(3):
            rt.cudaMemsetAsync(d, i, sz(1 << 20), s)
        rt.cudaEventRecord(t1, s); rt.cudaEventSynchronize(t1)
        rt.cudaEventElapsedTime(C.byref(ms), t0, t1); eager = ms.value
        rt.cudaMemsetAsync(big, 0, sz(64 << 20), s)
        rt.cudaEventRecord(t0, s)
        o["launch"] = [rt.cudaGraphLaunch(x, s), rt.cudaGraphLaunch(x, s)]
        rt.cudaEventRecord(t1, s); rt.cudaEventSynchronize(t1)
        rt.cudaEventElapsedTime(C.byref(ms), t0, t1)
        o["timeline"] = [eager > 0, ms.value / eager]
        o["calls"] = list(calls)
        o["value"] = host(1, d)
        # update: same topology takes the new graph, another topology fails
        rt.cudaStreamBeginCapture(s, GLOBAL); rt.cudaMemsetAsync(d, 9, sz(1 << 20), s)
        _, g2 = end(s)
        res = (C.c_int * 6)()
        o["update"] = [rt.cudaGraphExecUpdate(x, vp(g2), res), res[0]]
        lk = report()["driver"]["leaks"]
        o["leaks"] = [lk["graphs"], lk["graph_execs"],
                      sorted(d["kind"] for d in lk["details"] if d["kind"].startswith("graph"))]
        for h in (g, g2): rt.cudaGraphDestroy(vp(h))
        rt.cudaGraphExecDestroy(x)
        lk = report()["driver"]["leaks"]
        o["after"] = [lk["graphs"], lk["graph_execs"]]
        last()
        emit(o)
    ''', args=[str(dot)])
    assert out["eager"] == [11]
    assert out["captured"] == [0, 4, [11]]      # recorded, not called
    assert out["dot"] == 0
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("->") == 3 and "host" in text
    assert out["flags"] == [1, 1, 1]            # Upload needs WithParams; unknown; DeviceLaunch+AutoFree
    assert out["launch"] == [0, 0]
    assert out["timeline"][0] is True and out["timeline"][1] == pytest.approx(2.0, rel=1e-3)
    assert out["calls"] == [11, 22, 22]         # the host node ran at each launch
    assert out["value"] == "02"
    assert out["update"] == [910, 2]            # cudaErrorGraphExecUpdateFailure, topology
    assert out["leaks"][0:2] == [2, 1] and out["leaks"][2] == ["graph", "graph", "graph_exec"]
    assert out["after"] == [0, 0]


def test_driver_level_graph_rules():
    """Driver entry points the runtime does not reach in the tests above."""
    out = sim(r'''
        cu = C.CDLL("libcuda.so.1")
        rt.cudaFree(None)                                  # context current
        s, t = stream(), stream()
        g = vp()
        o["create"] = [cu.cuGraphCreate(C.byref(g), 1), cu.cuGraphCreate(C.byref(g), 0),
                       cu.cuGraphDestroy(g)]
        # the capture's graph cannot be destroyed while captured into
        cu.cuStreamBeginCapture_v2(s, GLOBAL)
        st, cid, cg, deps, n = C.c_int(), u64(), vp(), C.POINTER(vp)(), sz()
        o["info_v2"] = [cu.cuStreamGetCaptureInfo_v2(s, C.byref(st), C.byref(cid), C.byref(cg),
                                                     C.byref(deps), C.byref(n)), st.value, cid.value > 0]
        o["destroy_capturing"] = cu.cuGraphDestroy(cg)
        # an external record becomes a node; a graph cannot launch into a capture
        e = event()
        o["external"] = [cu.cuEventRecordWithFlags(e, s, 1), len(nodes(cg.value))]
        rt.cudaStreamBeginCapture(t, RELAXED)
        _, g1 = end(t)
        _, x1 = instantiate(g1)
        o["launch_into_capture"] = cu.cuGraphLaunch(x1, s)
        err, g2 = end(s)
        o["end"] = err
        # WithParams: Upload with a stream; the result field is filled in
        class P(C.Structure):
            _fields_ = [("flags", u64), ("up", vp), ("err", vp), ("res", C.c_int)]
        x2 = vp(); p = P(2, s, None, 7)
        o["params"] = [cu.cuGraphInstantiateWithParams(C.byref(x2), vp(g2), C.byref(p)), p.res,
                       cu.cuGraphUpload(x2, s)]
        # a captured copy whose memory is freed before the launch faults
        d = malloc(64)
        rt.cudaStreamBeginCapture(t, GLOBAL); rt.cudaMemsetAsync(d, 1, sz(64), t)
        _, g3 = end(t); _, x3 = instantiate(g3)
        rt.cudaFree(d)
        o["freed"] = cu.cuGraphLaunch(x3, t)
        for x in (x1, x2, x3): cu.cuGraphExecDestroy(x)
        for h in (g1, g2, g3): cu.cuGraphDestroy(vp(h))
        rt.cudaStreamDestroy(s); rt.cudaStreamDestroy(t); rt.cudaEventDestroy(e)
        o["leaks"] = report()["driver"]["leaks"]["total"]
        last()
        emit(o)
    ''')
    assert out["create"] == [1, 0, 0]
    assert out["info_v2"] == [0, 1, True]
    assert out["destroy_capturing"] == 401       # CUDA_ERROR_ILLEGAL_STATE
    assert out["external"] == [0, 1]
    assert out["launch_into_capture"] == 900
    assert out["end"] == 0
    assert out["params"] == [0, 0, 0]
    assert out["freed"] == 700                   # CUDA_ERROR_ILLEGAL_ADDRESS
    assert out["leaks"] == 0


# --------------------------------------------------------------------------
# torch, with its own caching allocator


@pytest.mark.slow
@needs_torch
def test_torch_cuda_graph_replays_copies_into_a_private_pool():
    out = run_sim(textwrap.dedent(r'''
        import os, torch
        o = {}
        static_in = torch.zeros(4096, device="cuda")
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = static_in.clone()       # a copy: replayed for real
            scaled = static_out * 2              # a kernel: computes nothing
        o["not_run"] = static_out[:3].tolist()
        o["pools"] = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})
        o["allocated"] = torch.cuda.memory_allocated() - before["allocated_bytes.all.current"]
        seen = []
        for k in range(3):
            static_in.copy_(torch.full((4096,), float(k + 1)))
            g.replay()
            seen.append(static_out[:2].tolist())
        o["seen"] = seen
        launches = report()["calls"].get("cudaGraphLaunch", 0)
        o["launches"] = launches
        del g, static_out, scaled
        torch.cuda.empty_cache()
        o["released"] = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})
        o["graph_leaks"] = report()["driver"]["leaks"]["graphs"]
        emit(o)
        os._exit(0)
    '''))
    assert out["not_run"] == [0.0, 0.0, 0.0]
    private = [p for p in out["pools"] if p != [0, 0]]
    assert len(private) == 1 and private[0][0] > 0   # torch's graph pool (id from capture_begin)
    assert out["allocated"] >= 2 * 4096 * 4          # the graph's outputs stay allocated
    assert out["seen"] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert out["launches"] == 3
    assert all(p == [0, 0] for p in out["released"])  # the private pool went with the graph
    assert out["graph_leaks"] == 0


@pytest.mark.slow
@needs_torch
def test_prohibited_call_inside_torch_cuda_graph_raises():
    out = run_sim(textwrap.dedent(r'''
        import os, torch
        x = torch.ones(16, device="cuda")
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                y = x + 1
                torch.cuda.synchronize()
            msgs = ["no error"]
        except Exception as e:
            msgs, cur = [], e
            while cur is not None:
                msgs.append(str(cur).splitlines()[0]); cur = cur.__context__
        emit({"msgs": msgs, "capturing": torch.cuda.is_current_stream_capturing()})
        os._exit(0)
    '''))
    joined = " | ".join(out["msgs"])
    assert "operation not permitted when stream is capturing" in joined
    assert "operation failed due to a previous error during capture" in joined
    assert out["capturing"] is False


@pytest.mark.slow
@needs_torch
def test_torch_graph_forks_to_a_side_stream_and_must_join_it():
    out = run_sim(textwrap.dedent(r'''
        import os, torch
        a, b = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
        oa, ob = torch.empty(8, device="cuda"), torch.empty(8, device="cuda")
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            cur = torch.cuda.current_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                ob.copy_(b)
            oa.copy_(a)
            cur.wait_stream(side)
        a.copy_(torch.full((8,), 3.0)); b.copy_(torch.full((8,), 4.0))
        g.replay(); torch.cuda.synchronize()
        o = {"replay": [oa[0].item(), ob[0].item()]}
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    ob.copy_(b)
            o["unjoined"] = "no error"
        except Exception as e:
            o["unjoined"] = str(e).splitlines()[0]
        emit(o)
        os._exit(0)
    '''))
    assert out["replay"] == [3.0, 4.0]     # both branches of the graph ran
    assert "capturing stream has unjoined work" in out["unjoined"]


@pytest.mark.slow
@needs_torch
def test_make_graphed_callables_trains_an_mlp():
    out = run_sim(textwrap.dedent(r'''
        import os, torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        graphed = torch.cuda.make_graphed_callables(model, (torch.randn(32, 64, device="cuda"),))
        start = report()["calls"].get("cudaGraphLaunch", 0)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            graphed(torch.randn(32, 64, device="cuda")).sum().backward()
            opt.step()
        torch.cuda.synchronize()
        emit({"launches": report()["calls"].get("cudaGraphLaunch", 0) - start,
              "grads": all(p.grad is not None for p in model.parameters()),
              "pools": sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})})
        os._exit(0)
    '''))
    assert out["launches"] == 6          # forward and backward graph per step
    assert out["grads"] is True
    assert any(p != [0, 0] for p in out["pools"])


@pytest.mark.slow
@needs_torch
def test_compile_cudagraph_trees_train_a_tiny_model():
    """torch.compile(mode="reduce-overhead") needs Triton, which the simulator
    does not run yet; the cudagraphs backend uses the same cudagraph trees."""
    out = run_sim(textwrap.dedent(r'''
        import os, torch
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        cm = torch.compile(m, backend="cudagraphs")
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            cm(torch.randn(8, 16, device="cuda")).sum().backward()
            opt.step()
        torch.cuda.synchronize()
        r = report()
        emit({"launches": r["calls"].get("cudaGraphLaunch", 0),
              "captures": r["calls"].get("cudaStreamBeginCapture", 0),
              "pools": sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})})
        os._exit(0)
    '''))
    assert out["captures"] >= 2          # forward and backward recorded
    assert out["launches"] >= 4          # and replayed in later steps
    assert any(p != [0, 0] for p in out["pools"])
