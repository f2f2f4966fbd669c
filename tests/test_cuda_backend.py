"""gpumem's CUDA driver backend (csrc/device/cuda_backend.c and cuda_vmm.c)
over the fake libcuda.so.1 (tests/sim/fakecuda).

Each scenario runs in its own subprocess: the fake reads its configuration
(capacity, granularity, event mode, failure injection) once, at cuInit, and
gpumem loads the driver once per process. The child prints one JSON line.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "sim", "fakecuda"))

from build import build_fakecuda  # noqa: E402

# The driver entry points gpumem's backend calls (DRIVER_FUNCS, cuda_internal.h).
BACKEND_ENTRY_POINTS = [
    "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuEventCreate",
    "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
    "cuStreamSynchronize", "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
    "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
]


@pytest.fixture(scope="session")
def fake_libcuda():
    try:   # rebuilt only when its sources or flags changed
        return str(build_fakecuda(os.path.join(ROOT, "build", "test-fakecuda", "auto")))
    except Exception as e:  # no compiler
        pytest.skip("cannot build the fake libcuda: %s" % e)


# Helpers available to every child script.
PRELUDE = textwrap.dedent(
    """
    import ctypes, gc, json, os, sys, warnings
    import gpumem
    from gpumem import _C
    LIB = ctypes.CDLL(os.environ["GPUMEM_LIBCUDA"])
    MiB = 1 << 20

    def report():
        buf = ctypes.create_string_buffer(1 << 20)
        LIB.fakecuda_report_json(buf, len(buf))
        return json.loads(buf.value.decode())

    def make_stream(device=0):
        ctx = ctypes.c_void_p()
        assert LIB.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0
        cur = ctypes.c_void_p()
        LIB.cuCtxGetCurrent(ctypes.byref(cur))
        LIB.cuCtxPushCurrent_v2(ctx)
        s = ctypes.c_void_p()
        assert LIB.cuStreamCreate(ctypes.byref(s), 0) == 0
        LIB.cuCtxPopCurrent_v2(ctypes.byref(cur))
        LIB.cuDevicePrimaryCtxRelease_v2(device)
        return s.value

    def destroy_stream(s, device=0):
        ctx = ctypes.c_void_p()
        LIB.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
        cur = ctypes.c_void_p()
        LIB.cuCtxPushCurrent_v2(ctx)
        LIB.cuStreamDestroy_v2(ctypes.c_void_p(s))
        LIB.cuCtxPopCurrent_v2(ctypes.byref(cur))
        LIB.cuDevicePrimaryCtxRelease_v2(device)

    def out(**kw):
        print(json.dumps(kw))
    """
)


def run_child(fake, body, timeout=120, **fake_env):
    env = dict(os.environ)
    env["GPUMEM_LIBCUDA"] = fake
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for k, v in fake_env.items():
        env["GPUMEM_FAKECUDA_" + k.upper()] = str(v)
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, "child failed (%d):\n%s\n%s" % (
        proc.returncode, proc.stdout, proc.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    assert lines, "child printed no result:\n%s\n%s" % (proc.stdout, proc.stderr)
    return json.loads(lines[-1]), proc.stderr


def settings(expandable):
    return "{'expandable_segments': %s}" % bool(expandable)


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@pytest.mark.parametrize("expandable", [False, True])
def test_allocations_are_real_device_memory(fake_libcuda, expandable):
    res, _ = run_child(fake_libcuda, """
        a = _C.Allocator(backend='cuda', settings=%s)
        ptrs = [a.malloc(n) for n in (1000, 300 * 1024, 3 * MiB, 25 * MiB)]
        # The fake's device memory is host memory: write and read it back.
        for i, p in enumerate(ptrs):
            ctypes.memset(p, 0x40 + i, 512)
        ok = all(ctypes.string_at(p, 512) == bytes([0x40 + i]) * 512 for i, p in enumerate(ptrs))
        st = a.stats()
        r = report()["devices"][0]
        out(ok=ok, backend=a.backend(), expandable=a.expandable_active(), check=a.check()[0],
            allocated=st["allocated_bytes.all.current"], reserved=st["reserved_bytes.all.current"],
            used=r["bytes_allocated"] + r["bytes_mapped"])
    """ % settings(expandable))
    assert res["ok"] and res["backend"] == "cuda" and res["check"] == 0
    assert res["expandable"] == expandable
    # Large blocks split only when more than 1 MiB would remain (torch's
    # rule), except in expandable mode, where any 512 B remainder splits.
    last = 25 * 2**20 if expandable else 26 * 2**20
    assert res["allocated"] == 1024 + 300 * 1024 + 3 * 2**20 + last
    # What the allocator believes it reserved is what the driver handed out.
    assert res["reserved"] == res["used"]


@pytest.mark.parametrize("expandable", [pytest.param(False, marks=pytest.mark.slow), True])
def test_empty_cache_returns_everything_to_the_driver(fake_libcuda, expandable):
    res, _ = run_child(fake_libcuda, """
        a = _C.Allocator(backend='cuda', settings=%s)
        ptrs = [a.malloc((i %% 7 + 1) * 700 * 1024) for i in range(40)]
        for p in ptrs[::2]:
            a.free(p)
        mid = report()["devices"][0]
        for p in ptrs[1::2]:
            a.free(p)
        a.empty_cache()
        d = report()["devices"][0]
        st = a.stats()
        del a; gc.collect()
        fin = report()
        out(mid_used=mid["bytes_allocated"] + mid["bytes_mapped"], dev=d,
            reserved=st["reserved_bytes.all.current"], check_ok=True, leaks=fin["leaks"],
            calls=fin["calls"])
    """ % settings(expandable))
    d = res["dev"]
    assert res["mid_used"] > 0
    assert d["bytes_allocated"] == 0 and d["allocations"] == 0
    assert d["bytes_mapped"] == 0 and d["mappings"] == 0 and d["handles"] == 0
    assert res["reserved"] == 0
    calls = res["calls"]
    if expandable:
        assert calls["cuMemMap"] > 0 and calls["cuMemUnmap"] > 0
        assert calls["cuMemCreate"] == calls["cuMemRelease"]
        assert calls["cuMemAlloc_v2"] == 0
    else:
        assert calls["cuMemAlloc_v2"] == calls["cuMemFree_v2"] > 0
    leaks = res["leaks"]
    # Only the primary context stays retained (gpumem keeps the driver open).
    assert leaks["allocations"] == leaks["handles"] == leaks["mappings"] == 0
    assert leaks["reservations"] == leaks["events"] == 0


@pytest.mark.parametrize("expandable", [False, True])
def test_injected_oom_frees_cache_retries_then_reports(fake_libcuda, expandable):
    res, _ = run_child(fake_libcuda, """
        a = _C.Allocator(backend='cuda', settings=%s)
        keep = a.malloc(40 * MiB)
        cached = a.malloc(60 * MiB); a.free(cached)       # 60 MiB now cached
        big = a.malloc(70 * MiB)                         # needs the cache back
        st1 = a.stats()
        try:
            a.malloc(200 * MiB)
            oom = None
        except gpumem.OutOfMemoryError as e:
            oom = str(e)
        st2 = a.stats()
        a.free(big)
        again = a.malloc(50 * MiB)                       # still usable
        out(retries=st1["num_alloc_retries"], ooms=st2["num_ooms"], oom=oom,
            check=a.check()[0], again=again != 0)
    """ % settings(expandable), memory="128MiB")
    assert res["retries"] >= (0 if expandable else 1)
    assert res["ooms"] == 1 and res["check"] == 0 and res["again"]
    assert res["oom"].startswith("CUDA out of memory. Tried to allocate 200.00 MiB.")
    assert "total capacity of 128.00 MiB" in res["oom"]


def test_record_stream_waits_for_the_driver_event(fake_libcuda):
    res, _ = run_child(fake_libcuda, """
        a = _C.Allocator(backend='cuda')
        side = make_stream()
        p = a.malloc(4 * MiB)
        a.record_stream(p, side)
        a.free(p)
        q = a.malloc(4 * MiB)            # must not reuse p: the event is pending
        states = [b["state"] for s in a.segments() for b in s["blocks"]]
        LIB.fakecuda_complete_events()
        a.free(q)
        r = a.malloc(4 * MiB)            # event done: p is reusable
        calls = report()["calls"]
        a.free(r)
        destroy_stream(side)
        out(p=p, q=q, r=r, pending="active_pending_free" in states,
            created=calls["cuEventCreate"], recorded=calls["cuEventRecord"],
            queried=calls["cuEventQuery"], check=a.check()[0])
    """, events="never")
    assert res["q"] != res["p"] and res["pending"]
    assert res["r"] in (res["p"], res["q"])
    assert res["created"] == 1 and res["recorded"] == 1 and res["queried"] >= 2
    assert res["check"] == 0


def test_context_of_the_caller_is_left_alone(fake_libcuda):
    res, _ = run_child(fake_libcuda, """
        a = _C.Allocator(backend='cuda', device=0)
        ctx1 = ctypes.c_void_p()
        LIB.cuDevicePrimaryCtxRetain(ctypes.byref(ctx1), 1)
        LIB.cuCtxSetCurrent(ctx1)
        p = a.malloc(1 * MiB)
        cur = ctypes.c_void_p(); LIB.cuCtxGetCurrent(ctypes.byref(cur))
        a.free(p)
        out(same=cur.value == ctx1.value, pushes=report()["calls"]["cuCtxPushCurrent_v2"])
    """, devices=2)
    assert res["same"] and res["pushes"] >= 1


def test_no_vmm_falls_back_with_one_warning(fake_libcuda):
    res, err = run_child(fake_libcuda, """
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = _C.Allocator(backend='cuda', settings={'expandable_segments': True})
            b = _C.Allocator(backend='cuda', settings={'expandable_segments': True})
        p = a.malloc(3 * MiB)
        out(active=a.expandable_active(), warnings=[str(x.message) for x in w],
            allocs=report()["calls"]["cuMemAlloc_v2"])
    """, granularity=0)
    assert res["active"] is False and res["allocs"] == 1
    assert len(res["warnings"]) == 1 and "virtual memory management" in res["warnings"][0]


def test_missing_driver_names_library_and_simulated_device(tmp_path):
    env = dict(os.environ, GPUMEM_LIBCUDA=str(tmp_path / "nope" / "libcuda.so.1"),
               PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c",
         "from gpumem import _C\ntry:\n _C.Allocator(backend='cuda')\n"
         "except RuntimeError as e:\n print(e)"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "libcuda.so.1" in proc.stdout and "virtual device is still available" in proc.stdout


# Calls made while creating an allocator: loading the driver, then asking
# for VMM support and granularity in the device's primary context.
STARTUP_CALLS = {
    "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuMemGetAllocationGranularity",
}

FAULT_WORKLOAD = """
    errors = []
    def attempt(fn, *args):
        try:
            return fn(*args)
        except (RuntimeError, MemoryError, ValueError) as e:
            errors.append(type(e).__name__ + ": " + str(e))
            return None
    try:
        a = _C.Allocator(backend='cuda', settings=%s)
    except RuntimeError as e:
        out(created=False, error=str(e), leaks=report()["leaks"]); sys.exit(0)
    side = make_stream()
    ptrs = []
    for n in (1000, 2 * MiB, 5 * MiB, 30 * MiB, 700 * 1024):
        p = attempt(a.malloc, n)
        if p: ptrs.append(p)
    if ptrs:
        attempt(a.record_stream, ptrs[0], side)
    for p in ptrs:
        attempt(a.free, p)
    attempt(a.process_events)
    q = attempt(a.malloc, 2 * MiB)
    if q: attempt(a.free, q)
    attempt(a.empty_cache)
    bad = a.check()[0]
    st = a.stats()
    del a; gc.collect()
    destroy_stream(side)
    LIB.fakecuda_set_fail(b"")
    out(created=True, errors=errors, check=bad, leaks=report()["leaks"],
        allocated=st["allocated_bytes.all.current"])
"""


# The fast tier fails each entry point with expandable segments on (the
# path that calls the most of them); the full tier also with them off.
@pytest.mark.parametrize("expandable", [pytest.param(False, marks=pytest.mark.slow), True])
@pytest.mark.parametrize("fn", BACKEND_ENTRY_POINTS)
def test_each_driver_call_failing_once_is_survivable(fake_libcuda, fn, expandable):
    """Fail one entry point once: no crash, no leak, a clear error."""
    res, err = run_child(fake_libcuda, FAULT_WORKLOAD % settings(expandable),
                         fail="%s:1" % fn, devices=1)
    if not res["created"]:
        # Start-up calls may stop the allocator being created: with a clear
        # error naming the call, and nothing left behind.
        assert fn in STARTUP_CALLS, res
        assert fn in res["error"], res
        assert res["leaks"]["allocations"] == res["leaks"]["handles"] == 0
        return
    assert res["check"] == 0, res
    assert res["allocated"] == 0, res
    for e in res["errors"]:
        # Every error names the failed call, or is the out-of-memory report.
        assert fn in e or e.startswith("OutOfMemoryError: CUDA out of memory"), e
    leaks = res["leaks"]
    assert leaks["allocations"] == 0 and leaks["handles"] == 0, leaks
    assert leaks["mappings"] == 0 and leaks["reservations"] == 0, leaks
    assert "Traceback" not in err
