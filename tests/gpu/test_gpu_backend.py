"""gpumem's CUDA driver backend on the GPU: the allocator core on the real
driver (or the simulator's), every figure checked against cuMemGetInfo.

These are the workloads tests/test_cuda_backend.py runs over the fake driver,
without the fake's own accounting: here the only witness is the driver.
"""

from __future__ import annotations

import random
import threading

import pytest

from gpumem import _C
from gpu_helpers import tolerance

MiB = 1 << 20


def settings(expandable):
    return {"expandable_segments": expandable}


def vmm_or_skip(gpu, expandable):
    if expandable and not gpu["gpus"][0]["vmm"]:
        pytest.skip("GPU 0 has no virtual memory management (expandable segments)")


def agrees(driver, gpu, base, a, when):
    held = a.stats()["reserved_bytes.all.current"]
    delta = driver.used(0) - base
    assert abs(delta - held) <= tolerance(gpu), (
        f"{when}: the driver shows {delta} bytes more in use, gpumem reserved {held}")
    bad, first = a.check()
    assert bad == 0, f"{when}: {first}"


@pytest.mark.parametrize("expandable", [False, True])
def test_seeded_workload_matches_the_driver(driver, gpu, expandable):
    """3000 mallocs and frees of 512 B to 96 MiB on two streams, some blocks
    used on the second stream; the driver agrees with gpumem throughout."""
    vmm_or_skip(gpu, expandable)
    rng = random.Random(15)
    side = driver.stream_create(0)
    base = driver.used(0)
    a = _C.Allocator(backend="cuda", settings=settings(expandable))
    assert a.expandable_active() == expandable
    live = {}
    try:
        for i in range(3000):
            if live and (rng.random() < 0.45 or len(live) > 200):
                p = rng.choice(list(live))
                a.free(p)
                del live[p]
            else:
                kind = rng.random()
                n = (rng.randint(1, 1 << 20) if kind < 0.7 else rng.randint(1, 12) * MiB
                     if kind < 0.97 else rng.randint(32, 96) * MiB)
                stream = side if rng.random() < 0.2 else 0
                p = a.malloc(n, stream)
                if stream == 0 and rng.random() < 0.1:
                    a.record_stream(p, side)
                live[p] = n
            if i % 500 == 499:
                st = a.stats()
                assert st["allocated_bytes.all.current"] == sum(
                    a.block_size(p)[0] for p in live)
                agrees(driver, gpu, base, a, f"after {i + 1} operations")
        for p in live:
            a.free(p)
        driver.stream_synchronize(0, side)
        a.process_events()
        a.empty_cache()
        assert a.stats()["reserved_bytes.all.current"] == 0
        agrees(driver, gpu, base, a, "after freeing everything and empty_cache")
    finally:
        driver.stream_destroy(0, side)


@pytest.mark.parametrize("expandable", [False, True])
def test_out_of_memory_at_the_devices_limit(driver, gpu, expandable):
    vmm_or_skip(gpu, expandable)
    base = driver.used(0)
    a = _C.Allocator(backend="cuda", settings=settings(expandable))
    keep = a.malloc(64 * MiB)
    free, total = driver.mem_get_info(0)
    with pytest.raises(_C.OutOfMemoryError) as e:
        a.malloc(free + 512 * MiB)
    assert e.value.device_total == total
    assert str(e.value).startswith("CUDA out of memory. Tried to allocate ")
    assert a.stats()["num_ooms"] == 1
    agrees(driver, gpu, base, a, "after the out-of-memory error")
    a.free(keep)
    again = a.malloc(128 * MiB)                 # the device still works
    a.free(again)
    a.empty_cache()
    agrees(driver, gpu, base, a, "at the end")


def test_a_thread_without_a_context_gets_the_primary_one(driver):
    """As the CUDA runtime does: the thread's current context becomes the
    device's primary context, which torch uses too."""
    a = _C.Allocator(backend="cuda")
    primary = driver.primary(0)
    seen = {}

    def work():
        seen["before"] = driver.current_context()
        p = a.malloc(2 * MiB)
        seen["after"] = driver.current_context()
        a.free(p)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == {"before": 0, "after": primary}


def test_a_pushed_context_is_left_in_place(driver, gpu):
    """A thread whose current context is another device's keeps it."""
    if len(gpu["gpus"]) < 2:
        pytest.skip("needs 2 GPUs (gpumem simulate --devices 2 -- python -m pytest tests/gpu)")
    a = _C.Allocator(backend="cuda", device=0)
    other = driver.primary(1)
    seen = {}

    def work():
        driver.set_current(other)
        p = a.malloc(2 * MiB)
        seen["after"] = driver.current_context()
        a.free(p)
        driver.set_current(0)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == {"after": other}
