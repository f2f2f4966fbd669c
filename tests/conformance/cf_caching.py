"""Caching turned off: torch.cuda.caching_allocator_enable(False), the
caching_allocator_disabled() context, and PYTORCH_NO_CUDA_MEMORY_CACHING=1
(variant "env").  Freed memory goes straight back to the device; turning
caching on again brings caching back."""

import os

from harness import MiB, differs, empty, gpumem, needs, settle, stat, torch_mod

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
    # with PYTORCH_NO_CUDA_MEMORY_CACHING set, caching stays off whatever is asked
    torch = torch_mod()
    torch.cuda.init()
    on = not _env_off()
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


@differs("uncached-stats")
def check_stats_while_caching_is_off():
    torch = torch_mod()
    settle()
    _off()
    try:
        before = stat("requested_bytes.all.allocated")
        p = torch._C._cuda_cudaCachingAllocator_raw_alloc(MiB, 0)
        got = stat("requested_bytes.all.allocated") - before
        torch._C._cuda_cudaCachingAllocator_raw_delete(p)
        x = empty(40 * MiB)
        allocated = torch.cuda.memory_allocated()
        del x
        # torch's uncached path bypasses its allocator, so its stats never see
        # the memory; gpumem counts it like any other allocation
        assert got == (MiB if gpumem() else 0), got
        assert allocated == (40 * MiB if gpumem() else 0), allocated
    finally:
        _restore()
    if not _env_off():
        p = torch._C._cuda_cudaCachingAllocator_raw_alloc(MiB, 0)
        assert stat("requested_bytes.all.current") == MiB
        torch._C._cuda_cudaCachingAllocator_raw_delete(p)
