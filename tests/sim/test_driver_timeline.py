"""The fake driver's device timeline (Note [Device timeline] in
simgpu/driver/fakecuda_timeline.c), its address order (Note [Device
addresses], fakecuda_va.c) and context memory from the GPU model, through
ctypes, without torch: work takes simulated time on its stream, events
complete when the simulated host clock reaches them, host waits move that
clock, cuStreamWaitEvent orders streams, the legacy stream waits for
blocking streams, and everything is reproducible."""

from __future__ import annotations

import textwrap

import pytest

from driver_helpers import run_json

GiB = 1 << 30

# What the scenarios add to driver_helpers' prelude.
TIMELINE = r'''
for _n, _a in {"cuMemsetD8Async": [u64, C.c_ubyte, sz, vp], "cuStreamWaitEvent": [vp, vp, cu],
               "cuEventElapsedTime_v2": [P(C.c_float), vp, vp],
               "fakecuda_launch": [vp, C.c_longlong]}.items():
    globals()[_n] = _proto(_n, *_a)

def host_ns():
    return fakecuda_query(b"host_ns", -1)

def elapsed(a, b):
    ms = C.c_float()
    ok(cuEventElapsedTime_v2(C.byref(ms), a, b))
    return ms.value

SECOND = 1_980_000_000            # cycles of the default model's 1980 MHz clock
'''


@pytest.fixture(scope="module")
def lib(fakecuda):
    return fakecuda("fallback")


def scenario(lib, body: str, env: dict | None = None):
    return run_json(lib, TIMELINE + textwrap.dedent(body), env)


def test_work_takes_time_and_host_waits_complete_it(lib):
    o = scenario(lib, """
        init(); s = stream(1); e = event()
        ok(fakecuda_launch(s, SECOND))              # torch's _sleep for one second
        ok(cuEventRecord(e, s))
        polls = [cuEventQuery(e) for _ in range(1000)] + [cuStreamQuery(s)]
        before = host_ns()
        ok(cuEventSynchronize(e))
        print(json.dumps({"polls": sorted(set(polls)), "before": before, "after": host_ns(),
                          "query": cuEventQuery(e), "stream": cuStreamQuery(s)}))
    """)
    assert o["polls"] == [600]                      # NOT_READY, however often it is polled
    assert o["before"] < 10**7 and o["after"] >= 10**9   # the host waited about a second
    assert o["query"] == 0 and o["stream"] == 0


def test_kernels_copies_and_memsets_cost_what_the_model_says(lib):
    o = scenario(lib, """
        init(); s = stream(1)
        a, b, c, d = event(0), event(0), event(0), event(0)
        p = alloc(GiB)
        ok(cuEventRecord(a, s))
        ok(fakecuda_launch(s, SECOND // 1000))      # 1 ms at 1980 MHz
        ok(cuEventRecord(b, s))
        ok(cuMemsetD8Async(p, 0, GiB, s))           # 1 GiB at 3350 GB/s
        ok(cuEventRecord(c, s))
        ok(fakecuda_launch(s, -1))                  # any other kernel
        ok(cuEventRecord(d, s))
        ok(cuEventSynchronize(d))
        print(json.dumps({"sleep": elapsed(a, b), "memset": elapsed(b, c),
                          "kernel": elapsed(c, d)}))
    """)
    # the kernel starts one driver call (1 us of host time) after the record
    assert o["sleep"] == pytest.approx(1.0 + 0.001, abs=1e-6)
    assert o["memset"] == pytest.approx((2000 + GiB / 3350) / 1e6, rel=1e-4)
    assert o["kernel"] == pytest.approx(0.005, rel=1e-3)


def test_stream_wait_event_orders_streams(lib):
    o = scenario(lib, """
        init(); s1, s2, s3 = stream(1), stream(1), stream(1)
        e1, e2, e3 = event(), event(), event()
        ok(fakecuda_launch(s1, SECOND)); ok(cuEventRecord(e1, s1))
        ok(cuStreamWaitEvent(s2, e1, 0)); ok(cuEventRecord(e2, s2))   # waits for s1
        ok(cuEventRecord(e3, s3))                                     # does not
        out = {"waiting": cuEventQuery(e2), "free": cuEventQuery(e3)}
        ok(cuEventSynchronize(e1))
        out["after"] = cuEventQuery(e2)
        print(json.dumps(out))
    """)
    assert o == {"waiting": 600, "free": 0, "after": 0}


def test_legacy_stream_synchronises_with_blocking_streams(lib):
    o = scenario(lib, """
        init(); blocking, nonblocking = stream(0), stream(1)
        ev = [event() for _ in range(4)]
        ok(fakecuda_launch(nonblocking, SECOND)); ok(cuEventRecord(ev[0], None))
        ok(fakecuda_launch(blocking, SECOND)); ok(cuEventRecord(ev[1], None))
        out = {"after_nonblocking": cuEventQuery(ev[0]), "after_blocking": cuEventQuery(ev[1])}
        ok(cuCtxSynchronize())
        ok(fakecuda_launch(None, SECOND))           # the legacy stream is busy
        ok(cuEventRecord(ev[2], blocking)); ok(cuEventRecord(ev[3], nonblocking))
        out.update(blocking_waits=cuEventQuery(ev[2]), nonblocking_runs=cuEventQuery(ev[3]))
        print(json.dumps(out))
    """)
    assert o == {"after_nonblocking": 0, "after_blocking": 600, "blocking_waits": 600,
                 "nonblocking_runs": 0}


def test_synchronous_copies_wait_and_other_modes_stay_selectable(lib):
    o = scenario(lib, """
        init(); s = stream(1); e, f = event(), event()
        p = alloc(GiB); buf = C.create_string_buffer(64 << 20)
        t0 = host_ns()
        ok(cuMemcpyDtoH_v2(buf, p, 64 << 20))       # 64 MiB at 64 GB/s: the host waits
        waited = host_ns() - t0
        L.fakecuda_set_event_mode(b"immediate")
        ok(fakecuda_launch(s, SECOND)); ok(cuEventRecord(e, s))
        immediate = cuEventQuery(e)
        L.fakecuda_set_event_mode(b"never")
        ok(cuEventRecord(f, s))
        never = [cuEventQuery(f) for _ in range(3)]
        print(json.dumps({"waited": waited, "immediate": immediate, "never": never,
                          "mode": report()["config"]["events"]}))
    """)
    assert o["waited"] >= (64 << 20) // 64 and o["immediate"] == 0
    assert o["never"] == [600] * 3 and o["mode"] == "never"


def test_simulated_time_is_reproducible(lib):
    body = """
        init(); s = stream(1); e = event(0); f = event(0)
        for i in range(50):
            ok(fakecuda_launch(s, -1 if i % 7 else SECOND // 10000))
            ok(cuEventRecord(e, s)); cuEventQuery(e)
        ok(cuEventRecord(f, s)); ok(cuStreamSynchronize(s))
        print(json.dumps({"host": host_ns(), "elapsed": elapsed(e, f)}))
    """
    assert scenario(lib, body) == scenario(lib, body)


def test_allocations_get_increasing_2mib_aligned_addresses_first_fit(lib):
    o = scenario(lib, """
        init()
        a, b, c = alloc(3 << 20), alloc(3 << 20), alloc(3 << 20)
        ok(cuMemFree_v2(b))
        d = alloc(1 << 20)                          # fits in b's hole
        e = alloc(5 << 20)                          # does not: after c
        print(json.dumps({"a": a, "b": b, "c": c, "d": d, "e": e}))
    """)
    MiB = 1 << 20
    assert all(o[k] % (2 * MiB) == 0 for k in o)
    assert o["b"] == o["a"] + 4 * MiB and o["c"] == o["b"] + 4 * MiB   # 3 MiB -> 4 MiB apart
    assert o["d"] == o["b"] and o["e"] == o["c"] + 4 * MiB


@pytest.mark.parametrize("env,want", [
    ({}, 0),                                                        # the bare driver
    ({"GPUMEM_SIM_GPU": "context_mib=300"}, 300),                   # the model's figure
    ({"GPUMEM_SIM_GPU": "context_mib=300", "GPUMEM_SIM_CONTEXT_MEMORY": "0"}, 0),  # override
    ({"GPUMEM_SIM_GPU": "context_mib=300", "GPUMEM_SIM_CONTEXT_MEMORY": "100MiB"}, 100),
])
def test_context_memory_comes_from_the_model(lib, env, want):
    o = scenario(lib, """
        init()
        free, total = sz(), sz()
        ok(cuMemGetInfo_v2(C.byref(free), C.byref(total)))
        print(json.dumps({"context": fakecuda_query(b"bytes_context", 0),
                          "free": free.value, "total": total.value}))
    """, env)
    assert o["context"] == want << 20
    assert o["free"] == o["total"] - (want << 20)
