"""Caching turned off: torch.cuda.caching_allocator_enable(False), the
caching_allocator_disabled() context, and PYTORCH_NO_CUDA_MEMORY_CACHING=1
(variant "env").  Freed memory goes straight back to the device; turning
caching on again brings caching back."""

import os

from harness import MiB, at_least, empty, needs, recording, settle, stat, stats, torch_mod, trace

VARIANTS = {"": {}, "env": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}}


def _env_off() -> bool:
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") is not None


def _off():
    torch = torch_mod()
    torch.cuda.init()
    torch.cuda.caching_allocator_enable(False)


def _restore():
    torch_mod().cuda.caching_allocator_enable(True)


@needs("_C._cuda_cudaCachingAllocator_is_enabled", "cuda.caching_allocator_disabled")
def check_enable_flag_reads_back():
    # with PYTORCH_NO_CUDA_MEMORY_CACHING set, caching stays off whatever is
    # asked; from 2.13 the flag says so, 2.12 reads back what was asked
    torch = torch_mod()
    torch.cuda.init()
    on = not _env_off() or not at_least("2.13")
    assert torch._C._cuda_cudaCachingAllocator_is_enabled() is on
    torch.cuda.caching_allocator_enable(False)
    assert torch._C._cuda_cudaCachingAllocator_is_enabled() is False
    torch.cuda.caching_allocator_enable(True)
    assert torch._C._cuda_cudaCachingAllocator_is_enabled() is on
    with torch.cuda.caching_allocator_disabled():
        assert torch._C._cuda_cudaCachingAllocator_is_enabled() is False
    assert torch._C._cuda_cudaCachingAllocator_is_enabled() is on


def check_freed_memory_goes_back_to_the_device():
    torch = torch_mod()
    settle()
    _off()
    try:
        free0 = torch.cuda.mem_get_info()[0]
        x = empty(40 * MiB)
        assert torch.cuda.mem_get_info()[0] <= free0 - 40 * MiB
        del x
        assert torch.cuda.mem_get_info()[0] == free0   # nothing stays cached
        assert torch.cuda.memory_reserved() == 0
    finally:
        _restore()


@needs("cuda.caching_allocator_disabled")
def check_caching_comes_back():
    torch = torch_mod()
    settle()
    with torch.cuda.caching_allocator_disabled():
        x = empty(40 * MiB)
        del x
    if _env_off():
        return                                  # the variable keeps caching off for good
    free0 = torch.cuda.mem_get_info()[0]
    y = empty(40 * MiB)
    del y
    assert torch.cuda.memory_reserved() >= 40 * MiB  # cached again
    assert torch.cuda.mem_get_info()[0] < free0
    settle()


def check_env_variable_turns_caching_off():
    torch = torch_mod()
    settle()
    free0 = torch.cuda.mem_get_info()[0]
    x = empty(40 * MiB)
    del x
    if _env_off():
        assert torch.cuda.mem_get_info()[0] == free0
        assert torch.cuda.memory_reserved() == 0
    else:
        assert torch.cuda.memory_reserved() >= 40 * MiB
    settle()


def check_uncached_tensors_are_usable():
    torch = torch_mod()
    _off()
    try:
        a = torch.ones(1000, device="cuda")
        b = a.to("cpu")
        assert b.shape == (1000,)
        p = torch.cuda.caching_allocator_alloc(3 * MiB)
        torch.cuda.caching_allocator_delete(p)
    finally:
        _restore()


def _numbers(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}


def check_memory_while_caching_is_off_is_outside_the_stats():
    # torch hands these requests to cudaMalloc around its allocator: no
    # statistic moves (requested_bytes, reserved_bytes, num_device_alloc,
    # ... every key), and neither the trace nor the snapshot shows them
    torch = torch_mod()
    settle()
    _off()
    try:
        with recording(max_entries=1000):
            before = _numbers(stats())
            free0 = torch.cuda.mem_get_info()[0]
            p = torch._C._cuda_cudaCachingAllocator_raw_alloc(MiB, 0)
            x = empty(40 * MiB)
            q = torch.cuda.caching_allocator_alloc(3 * MiB)
            during = _numbers(stats())
            assert torch.cuda.mem_get_info()[0] <= free0 - 44 * MiB   # the device did give it
            snap = torch.cuda.memory._snapshot()
            torch._C._cuda_cudaCachingAllocator_raw_delete(p)
            del x
            torch.cuda.caching_allocator_delete(q)
            after = _numbers(stats())
        assert torch.cuda.mem_get_info()[0] == free0
        changed = {k: (before[k], during.get(k), after.get(k)) for k in before
                   if not before[k] == during.get(k) == after.get(k)}
        assert not changed, changed
        assert snap["segments"] == [], snap["segments"]
        actions = [e["action"] for e in trace(snap)]
        assert actions in ([], ["snapshot"]), actions
    finally:
        _restore()
    if not _env_off():
        p = torch._C._cuda_cudaCachingAllocator_raw_alloc(MiB, 0)
        assert stat("requested_bytes.all.current") == MiB
        torch._C._cuda_cudaCachingAllocator_raw_delete(p)


def check_the_switch_at_allocation_decides_the_free():
    # memory allocated while caching is on is cached when freed with caching
    # off; memory allocated while it is off goes back to the device when
    # freed after caching is on again
    if _env_off():
        return                                  # caching cannot be turned on
    torch = torch_mod()
    settle()
    z = empty(8 * MiB)
    _off()
    try:
        y = empty(8 * MiB)
        del z                                   # allocated while on: cached
        assert torch.cuda.memory_reserved() == 20 * MiB
        assert torch.cuda.memory_allocated() == 0
    finally:
        _restore()
    free0 = torch.cuda.mem_get_info()[0]
    before = _numbers(stats())
    del y                                       # allocated while off: to the device
    assert torch.cuda.mem_get_info()[0] == free0 + 8 * MiB
    assert _numbers(stats()) == before
    settle()
