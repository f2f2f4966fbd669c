"""PyTorch on the simulator's device timeline (the default event mode),
under torch's own allocator and under gpumem's: record_stream's deferred
reuse while a side stream still runs, events not ready until the host
waits, stream-wait ordering; the CUDA context's memory in mem_get_info and
in the point of out-of-memory; the memory fraction; and the order of
segment addresses."""

from __future__ import annotations

import pytest

from torch_helpers import run_gm

pytestmark = pytest.mark.slow  # torch subprocesses: left out of the fast tier

MiB, GiB = 1 << 20, 1 << 30
H100_CONTEXT = 514 * MiB  # gpumem/sim/gpus.py: 250 MiB + 1 KiB x 132 SMs x 2048 threads

ALLOCATORS = pytest.mark.parametrize("install", [False, True], ids=["torch", "gpumem"])


@ALLOCATORS
def test_record_stream_defers_reuse_while_the_side_stream_runs(install):
    o = run_gm('''
        n = 4 << 20
        side = torch.cuda.Stream()
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(2e8))          # ~0.1 s of simulated time on the side stream
        x.record_stream(side)
        ptr = x.data_ptr()
        del x                                    # freed while the side stream still runs
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
        early = y.data_ptr() == ptr
        busy = side.query()
        side.synchronize()
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
        emit({"early": early, "busy": busy, "after": z.data_ptr() == ptr})
    ''', install=install)
    assert o == {"early": False, "busy": False, "after": True}


@ALLOCATORS
def test_without_a_busy_stream_the_block_is_reused_at_once(install):
    # the same, but the side stream's work is one ordinary kernel, long done
    # by the time of the next allocation's event poll (host calls cost time)
    o = run_gm('''
        n = 4 << 20
        side = torch.cuda.Stream()
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(side):
            x.add_(1)
        x.record_stream(side)
        ptr = x.data_ptr()
        del x
        torch.cuda._sleep(int(2e6))              # the default stream: 1 ms, the host waits for it
        torch.cuda.current_stream().synchronize()
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
        emit({"reused": y.data_ptr() == ptr})
    ''', install=install)
    assert o == {"reused": True}


def test_events_streams_and_elapsed_time():
    o = run_gm('''
        side, other = torch.cuda.Stream(), torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            start.record()
            torch.cuda._sleep(19_800_000)         # 10 ms at the H100's 1980 MHz
            end.record()
        waiter = torch.cuda.Event()
        other.wait_event(end)                     # other's later work follows side's
        waiter.record(other)
        free = torch.cuda.Event(); free.record(torch.cuda.current_stream())
        out = {"end": end.query(), "waiter": waiter.query(), "free": free.query(),
               "side": side.query()}
        end.synchronize()
        out.update(end_after=end.query(), waiter_after=waiter.query(),
                   ms=start.elapsed_time(end))
        emit(out)
    ''', install=False)
    assert o["end"] is False and o["waiter"] is False and o["side"] is False
    assert o["free"] is True                      # the default stream has nothing to do
    assert o["end_after"] is True and o["waiter_after"] is True
    assert o["ms"] == pytest.approx(10.0, abs=0.01)


@ALLOCATORS
def test_context_memory_sets_where_memory_runs_out(install):
    o = run_gm('''
        free, total = torch.cuda.mem_get_info()
        room = free // (2 << 20) * (2 << 20)
        big = torch.empty(room, dtype=torch.uint8, device="cuda")      # all of it fits
        try:
            torch.empty(2 << 20, dtype=torch.uint8, device="cuda")     # and not a byte more
            oom = None
        except torch.OutOfMemoryError as e:
            oom = str(e).split("\\n")[0]
        emit({"free": free, "total": total, "room": room, "oom": oom})
    ''', install=install, memory="4GiB")
    assert o["total"] == 4 * GiB and o["free"] == 4 * GiB - H100_CONTEXT
    assert o["oom"] and "GPU 0 has a total capacity of 4.00 GiB of which 0 bytes is free" in o["oom"]


@pytest.mark.parametrize("env,context", [
    ({"GPUMEM_SIM_GPU": "context_mib=338"}, 338 * MiB),   # a figure in MiB
    ({"GPUMEM_SIM_GPU": "context_mib=338;context_kib=539456"}, 539456 << 10),  # KiB wins (--gpu's)
    ({"GPUMEM_SIM_CONTEXT_MEMORY": "0"}, 0),               # the override
])
def test_context_memory_follows_the_model_and_the_override(env, context):
    o = run_gm('''
        free, total = torch.cuda.mem_get_info()
        emit({"free": free, "total": total})
    ''', install=False, memory="4GiB", env=env)
    assert o == {"free": 4 * GiB - context, "total": 4 * GiB}


@ALLOCATORS
def test_memory_fraction_limits_below_what_is_free(install):
    o = run_gm('''
        torch.cuda.set_per_process_memory_fraction(0.5)          # of the 4 GiB total: 2 GiB
        a = torch.empty(1536 << 20, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            msg = None
        except torch.OutOfMemoryError as e:
            msg = str(e).split("\\n")[0]
        free, total = torch.cuda.mem_get_info()
        emit({"msg": msg, "free": free, "total": total})
    ''', install=install, memory="4GiB")
    assert o["msg"] and "2.00 GiB allowed" in o["msg"], o
    # the device itself had room: the limit, not the device, refused it
    assert o["free"] >= GiB and o["total"] == 4 * GiB


@ALLOCATORS
def test_segments_get_increasing_addresses_and_reuse_holes(install):
    o = run_gm('''
        n = 30 << 20                                  # one 30 MiB segment each
        ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(3)]
        ptrs = [t.data_ptr() for t in ts]
        hole = ptrs[1]
        del ts[1]
        torch.cuda.empty_cache()
        again = torch.empty(n, dtype=torch.uint8, device="cuda")
        emit({"ptrs": ptrs, "again": again.data_ptr(), "hole": hole})
    ''', install=install)
    ptrs = o["ptrs"]
    assert all(p % (2 * MiB) == 0 for p in ptrs)
    assert ptrs == sorted(ptrs) and len(set(ptrs)) == 3
    if not install:  # torch's allocator: one exact-size segment per tensor, adjacent
        assert ptrs[1] - ptrs[0] == ptrs[2] - ptrs[1] == 30 * MiB
    assert o["again"] == o["hole"]


@ALLOCATORS
def test_out_of_memory_path_waits_for_pending_events_and_frees_the_cache(install):
    # a 2 GiB block freed while the side stream still uses it cannot serve the
    # next 2 GiB request, and the device has no other 2 GiB: before giving up
    # the allocator synchronises the pending event, frees its cache and retries
    o = run_gm('''
        side = torch.cuda.Stream()
        x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(2e9))          # about a second of simulated time
        x.record_stream(side)
        del x
        busy = side.query()
        y = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        stats = torch.cuda.memory_stats()
        emit({"busy": busy, "done": side.query(), "ok": y.data_ptr() != 0,
              "retries": stats["num_alloc_retries"], "ooms": stats["num_ooms"]})
    ''', install=install, memory="4GiB")
    assert o["busy"] is False and o["ok"] and o["done"] is True, o
    assert o["retries"] >= 1 and o["ooms"] == 0, o
