"""memory_stats() and the functions built on it: keys, pools and rounding,
peaks and resets, raw allocations, memory_summary, and the device-generic
torch.accelerator memory API (which reads the same allocator).

Also run with expandable segments on, as PyTorch reruns its CUDA tests
(test_cuda_expandable_segments.py)."""

from harness import (MiB, at_least, delta, differs, empty, gpumem, needs, raises, settle, stat,
                     stats, torch_mod, torch_release)

FAST = ()  # slow tier only: each group costs a torch run per allocator (18 s of the fast tier)
VARIANTS = {"": {}, "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}

FAMILIES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
            "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
            "num_device_alloc", "num_device_free", "num_oom_rejections")


def _expandable() -> bool:
    return "expandable_segments:True" in __import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def check_stats_empty_before_cuda_is_initialised():
    torch = torch_mod()
    assert not torch.cuda.is_initialized()
    assert dict(torch.cuda.memory_stats()) == {}
    assert torch.cuda.memory_allocated() == 0 and torch.cuda.memory_reserved() == 0
    torch.cuda.empty_cache()                 # harmless before initialisation
    assert not torch.cuda.is_initialized()


def check_first_empty_cache_counts_a_sync():
    # empty_cache synchronises the device's streams once, even before the
    # device's first allocation (torch counts it in num_sync_all_streams)
    torch = torch_mod()
    torch.cuda.init()
    before = stat("num_sync_all_streams")
    torch.cuda.empty_cache()
    assert stat("num_sync_all_streams") == before + 1


def check_key_set():
    torch = torch_mod()
    x = torch.ones(1, device="cuda")
    keys = set(stats())
    want = {f"{f}.{p}.{s}" for f in FAMILIES for p in ("all", "large_pool", "small_pool")
            for s in ("current", "peak", "allocated", "freed")}
    want |= {f"{o}.{s}" for o in ("oversize_allocations", "oversize_segments")
             for s in ("current", "peak", "allocated", "freed")}
    want |= set(COUNTERS)
    if torch_release() < (2, 12):     # the OOM rejection observer came in 2.12
        want.discard("num_oom_rejections")
    assert keys == want, (sorted(keys - want), sorted(want - keys))
    assert list(stats()) == sorted(stats())
    assert all(isinstance(v, int) for v in stats().values())
    nested = torch.cuda.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stat("allocated_bytes.all.current")
    del x


def check_memory_allocated_follows_raw_allocations():
    torch = torch_mod()
    settle()
    prev = torch.cuda.memory_allocated()
    p = torch.cuda.caching_allocator_alloc(1)
    assert torch.cuda.memory_allocated() > prev
    torch.cuda.caching_allocator_delete(p)
    assert torch.cuda.memory_allocated() == prev


def check_small_and_large_pools():
    settle()
    s0 = stats()
    small = empty(MiB)            # the largest small request
    large = empty(MiB + 1)
    s1 = stats()

    def d(key):
        return s1[key] - s0[key]
    assert d("allocated_bytes.small_pool.current") == MiB
    assert d("allocated_bytes.large_pool.current") == MiB + 512
    assert d("requested_bytes.large_pool.current") == MiB + 1
    assert d("allocation.all.current") == 2 and d("active.all.current") == 2
    if not _expandable():
        # small requests share 2 MiB segments, requests under 10 MiB 20 MiB ones
        assert d("reserved_bytes.small_pool.current") == 2 * MiB
        assert d("reserved_bytes.large_pool.current") == 20 * MiB
        assert d("segment.all.current") == 2
    del small, large


def check_rounding_to_512_bytes_and_2_mib():
    torch = torch_mod()
    settle()
    # a large block is a whole number of 2 MiB in a plain segment, which is
    # never split below that; an expandable segment splits at 512 bytes
    big = 11 * MiB + 512 if _expandable() else 12 * MiB
    for n, want in ((1, 512), (511, 512), (513, 1024), (11 * MiB + 1, big),
                    (12 * MiB, 12 * MiB)):
        x, got = delta(lambda: empty(n), "allocated_bytes.all.current")
        assert got == want, (n, got, want)
        del x
    x, got = delta(lambda: torch.empty(0, device="cuda"), "allocation.all.current")
    assert got == 0                  # a zero-size tensor allocates nothing


def check_peak_and_reset_peak():
    torch = torch_mod()
    settle()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    a = empty(8 * MiB)
    b = empty(8 * MiB)
    del a, b
    assert torch.cuda.max_memory_allocated() == base + 16 * MiB
    assert torch.cuda.max_memory_reserved() >= 16 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()
    # the deprecated spellings still reset the same peak
    c = empty(4 * MiB)
    del c
    torch.cuda.reset_max_memory_allocated()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


def check_reset_accumulated():
    torch = torch_mod()
    settle()
    a = empty(3 * MiB)
    del a
    assert stat("allocation.all.allocated") > 0
    torch.cuda.reset_accumulated_memory_stats()
    s = stats()
    for f in FAMILIES:
        for p in ("all", "large_pool", "small_pool"):
            assert s[f"{f}.{p}.allocated"] == 0 and s[f"{f}.{p}.freed"] == 0, f
    for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
              "num_device_free"):
        assert s[k] == 0, k


@needs("_C._accelerator_isAllocatorInitialized", "accelerator.memory_allocated")
def check_active_bytes_through_torch_accelerator():
    # torch.accelerator is the device-generic API torch recommends
    torch = torch_mod()
    acc = torch.accelerator
    settle()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    assert torch._C._accelerator_isAllocatorInitialized()
    assert acc.memory_allocated() == acc.max_memory_allocated()
    assert acc.memory_reserved() == acc.max_memory_reserved()
    active = acc.memory_stats()["active_bytes.all.current"]
    t = torch.empty(256, device="cuda")
    assert acc.memory_stats()["active_bytes.all.current"] == active + 1024
    assert acc.memory_allocated() == torch.cuda.memory_allocated()
    assert acc.memory_stats()["active_bytes.all.freed"] == 0
    del t
    acc.empty_cache()
    assert acc.memory_stats()["active_bytes.all.current"] == active
    assert acc.memory_stats()["active_bytes.all.freed"] == 1024
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == acc.memory_allocated()
    acc.reset_accumulated_memory_stats()
    assert acc.memory_stats()["active_bytes.all.freed"] == 0
    a, c = dict(acc.memory_stats()), dict(torch.cuda.memory_stats())
    # torch.cuda's own key from 2.12 (memory_stats' num_oom_rejections)
    extra = {"num_oom_rejections"} if at_least("2.12") else set()
    assert set(c) - set(a) == extra and set(a) <= set(c), sorted(set(c) ^ set(a))
    assert all(a[k] == c[k] for k in a)


@needs("accelerator.memory_reserved", "accelerator.empty_cache")
def check_accelerator_empty_cache_releases_the_cache():
    torch = torch_mod()
    settle()
    x = empty(30 * MiB)
    del x
    assert torch.accelerator.memory_reserved() >= 30 * MiB
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 0
    assert torch.cuda.memory_reserved() == 0


@needs("accelerator.get_memory_info")
def check_device_memory_info():
    torch = torch_mod()
    settle()
    free0, total = torch.cuda.mem_get_info()
    assert (free0, total) == torch.accelerator.get_memory_info()
    assert total == torch.cuda.get_device_properties(0).total_memory
    x = empty(64 * MiB)
    free1, _ = torch.cuda.mem_get_info()
    assert free0 - free1 >= 64 * MiB
    del x
    torch.cuda.empty_cache()
    assert torch.cuda.mem_get_info()[0] == free0


def check_empty_cache_returns_whole_free_segments():
    torch = torch_mod()
    settle()
    keep = empty(4 * MiB)                 # shares a 20 MiB segment with `gone`
    gone = empty(4 * MiB)
    alone = empty(30 * MiB)
    del gone, alone
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after < before
    assert after >= 4 * MiB               # the segment `keep` lives in stays
    assert stat("active_bytes.all.current") == 4 * MiB
    del keep


def check_inactive_split_counts_the_free_pieces_of_used_segments():
    torch = torch_mod()
    settle()
    a = empty(4 * MiB)
    b = empty(4 * MiB)
    del a
    if _expandable():
        # expandable segments are never counted as inactive splits
        assert stat("inactive_split.all.current") == 0
    else:
        # the freed 4 MiB and the 12 MiB tail of the 20 MiB segment
        assert stat("inactive_split.large_pool.current") == 2
        assert stat("inactive_split_bytes.large_pool.current") == 16 * MiB
    del b
    torch.cuda.empty_cache()
    assert stat("inactive_split.all.current") == 0
    assert stat("inactive_split_bytes.all.current") == 0


def check_device_alloc_and_free_counters():
    torch = torch_mod()
    settle()
    s0 = stats()
    x = empty(30 * MiB)
    y = empty(30 * MiB)
    assert stat("num_device_alloc") - s0["num_device_alloc"] >= (1 if _expandable() else 2)
    del x, y
    torch.cuda.empty_cache()
    assert stat("num_device_free") - s0["num_device_free"] >= (1 if _expandable() else 2)
    assert torch.cuda.memory_reserved() == 0


def check_requested_bytes_keep_the_unrounded_size():
    settle()
    x, got = delta(lambda: empty(1000), "requested_bytes.all.current")
    assert got == 1000
    assert stat("active_bytes.all.current") >= 1024
    del x
    assert stat("requested_bytes.all.current") == 0


def check_memory_summary_table():
    torch = torch_mod()
    x = empty(3 * MiB)
    text = torch.cuda.memory_summary()
    assert "PyTorch CUDA memory summary, device ID 0" in text
    for label in ("Allocated memory", "Active memory", "Requested memory",
                  "GPU reserved memory", "Non-releasable memory", "Allocations",
                  "Active allocs", "GPU reserved segments", "Non-releasable allocs",
                  "Oversize allocations", "Oversize GPU segments", "from large pool",
                  "from small pool", "CUDA OOMs", "cudaMalloc retries"):
        assert label in text, label
    short = torch.cuda.memory_summary(abbreviated=True)
    assert "from large pool" not in short and "Allocated memory" in short
    assert torch.cuda.memory_summary(device=0) == torch.cuda.memory_summary()
    del x


def check_raw_alloc_on_a_stream():
    torch = torch_mod()
    settle()
    s = torch.cuda.Stream()
    p = torch.cuda.caching_allocator_alloc(5 * MiB, stream=s)
    assert stat("allocated_bytes.all.current") == 5 * MiB
    torch.cuda.caching_allocator_delete(p)
    p = torch._C._cuda_cudaCachingAllocator_raw_alloc(MiB, s.cuda_stream)
    assert stat("requested_bytes.all.current") == MiB
    torch._C._cuda_cudaCachingAllocator_raw_delete(p)
    assert stat("allocated_bytes.all.current") == 0
    raises(TypeError, lambda: torch.cuda.caching_allocator_alloc(MiB, stream="s"))


def check_allocator_is_per_stream():
    # a block freed on one stream is not handed to another stream
    torch = torch_mod()
    settle()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = empty(4 * MiB, s1)
    ptr = a.data_ptr()
    del a
    b = empty(4 * MiB, s2)
    assert b.data_ptr() != ptr
    c = empty(4 * MiB, s1)
    assert c.data_ptr() == ptr


def check_stats_are_per_device_index():
    torch = torch_mod()
    x = empty(MiB)
    assert torch.cuda.memory_stats(0) == torch.cuda.memory_stats("cuda:0")
    assert torch.cuda.memory_allocated(torch.device("cuda", 0)) == torch.cuda.memory_allocated()
    raises(ValueError, lambda: torch.cuda.memory_stats("cpu"))
    del x


@differs("allocator-backend-name")
def check_allocator_backend_name():
    torch = torch_mod()
    name = torch.cuda.get_allocator_backend()
    assert name == ("gpumem" if gpumem() else "native"), name
