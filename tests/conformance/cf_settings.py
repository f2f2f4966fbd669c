"""Allocator settings changed at run time: torch.cuda.memory._set_allocator_settings
and torch._C._accelerator_setAllocatorSettings (the same parser), what each
key does to the next allocations, which keys a new settings string resets,
and the errors for bad strings."""

import contextlib

from harness import (MiB, differs, empty, fraction, gpumem, needs, raises, set_settings, settings,
                     settings_error, settings_in_force, settle, since, stat, torch_mod,
                     torch_release)

MEMORY = "8GiB"
NBYTES = 84 * MiB      # 21 Mi floats: between 64 and 128 MiB


def _rounded(nbytes: int) -> int:
    """How many bytes a request of nbytes gets now (active_bytes grows by it)."""
    before = stat("active_bytes.all.allocated")
    x = empty(nbytes)
    got = stat("active_bytes.all.allocated") - before
    del x
    return got


def _power2_div(size: int, divisions: int) -> int:
    """torch's rounding: the next of `divisions` steps between powers of two."""
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step = pow2 // 2 // divisions
    out = pow2 // 2
    while out < size:
        out += step
    return out


def check_roundup_power2_divisions():
    torch = torch_mod()
    settle()
    assert _rounded(NBYTES) == NBYTES
    with settings("roundup_power2_divisions:4"):
        before = stat("requested_bytes.all.allocated")
        assert _rounded(NBYTES) == _power2_div(NBYTES, 4) == 96 * MiB
        assert stat("requested_bytes.all.allocated") - before == NBYTES
    torch.cuda.empty_cache()


def check_a_new_string_resets_what_it_does_not_name():
    # max_split_size_mb, roundup_power2_divisions and
    # garbage_collection_threshold go back to their defaults
    settle()
    with settings("roundup_power2_divisions:4"):
        set_settings("garbage_collection_threshold:0.5")
        set_settings("garbage_collection_threshold:0.5,max_split_size_mb:40")
        assert _rounded(NBYTES) == NBYTES


def check_roundup_list_syntax():
    torch = torch_mod()
    settle()
    with settings("garbage_collection_threshold:0.5,"
                  "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"):
        assert _rounded(NBYTES) == _power2_div(NBYTES, 8)
        torch.cuda.empty_cache()
        assert _rounded(400 * MiB) == _power2_div(400 * MiB, 2)
    torch.cuda.empty_cache()


def check_release_lock_on_cudamalloc_is_accepted():
    settle()
    with settings("release_lock_on_cudamalloc:True"):
        assert _rounded(NBYTES) == NBYTES


def check_bad_strings_raise_value_error():
    torch = torch_mod()
    setter = set_settings
    for bad in ("foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2",
                "release_lock_on_cudamalloc:none", "pinned_use_cuda_host_register:none",
                "pinned_num_register_threads:none", "pinned_num_register_threads:1024",
                "expandable_segments:1", "roundup_power2_divisions:3"):
        with settings(""):       # (the failed string is kept as the "last" one)
            raises(settings_error(), lambda: setter(bad))
    unknown = ("Unrecognized key 'foo'" if settings_error() is ValueError
               else "Unrecognized CachingAllocator option: foo")
    with settings(""):
        raises(settings_error(), lambda: setter("foo:1"), match=unknown)


@since("2.10", "max_split_size_mb:20 (it needs more than 20)")
def check_max_split_size_mb_20_is_accepted():
    with settings("max_split_size_mb:20"):
        pass


@needs("_C._accelerator_getAllocatorSettings")
def check_last_settings_string_reads_back():
    torch = torch_mod()
    with settings("max_split_size_mb:40"):
        assert torch._C._accelerator_getAllocatorSettings() == "max_split_size_mb:40"


def check_deprecated_spelling_still_works():
    import warnings
    torch = torch_mod()
    settle()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        try:
            assert _rounded(NBYTES) == 96 * MiB
        finally:
            torch.cuda.memory._set_allocator_settings("")


def check_expandable_segments_switch_at_run_time():
    torch = torch_mod()
    settle()
    with settings("expandable_segments:True"):
        a = empty(30 * MiB)
    b = empty(30 * MiB)                          # the setting is off again
    segs = {s["address"]: s["is_expandable"] for s in torch.cuda.memory_snapshot()}
    kinds = sorted(segs.values())
    assert kinds == [False, True], segs
    assert torch.cuda.memory_snapshot()[0]["device"] == 0
    del a, b


@contextlib.contextmanager
def _allowed_120_mib_more():
    """A fraction that allows 120 MiB above what is reserved now, and the
    settings in force restored after."""
    torch = torch_mod()
    settle()
    _, total = torch.cuda.mem_get_info()
    allowed = 120 * MiB + torch.cuda.memory_reserved()
    with fraction(allowed / total), settings(""):
        yield


def check_max_split_with_expandable_segments_mixed():
    # plain and expandable segments side by side under a tight limit
    torch = torch_mod()
    with _allowed_120_mib_more():
        set_settings("expandable_segments:False,max_split_size_mb:40")
        a = empty(40 * MiB)
        set_settings("expandable_segments:True,max_split_size_mb:40")
        b = empty(40 * MiB)
        set_settings("expandable_segments:False,max_split_size_mb:40")
        c = empty(40 * MiB)
        raises(torch.OutOfMemoryError, lambda: empty(40 * MiB))
        del a, b, c
        d = empty(120 * MiB)                     # the cached segments are released first
        del d


def check_garbage_collection_with_expandable_segments():
    with _allowed_120_mib_more():
        set_settings("expandable_segments:False,garbage_collection_threshold:0.5")
        a = empty(40 * MiB)
        set_settings("expandable_segments:True,garbage_collection_threshold:0.5")
        b = empty(40 * MiB)
        del a, b
        c = empty(80 * MiB)
        del c


def check_max_split_size_oversize_blocks():
    # blocks of max_split_size or more are never split, and serve only
    # requests within 20 MiB of their size
    torch = torch_mod()
    settle()
    with settings("max_split_size_mb:40"):
        a = empty(100 * MiB)
        pa = a.data_ptr()
        del a
        b = empty(50 * MiB)                      # too far below 100 MiB: a new segment
        assert b.data_ptr() != pa
        c = empty(90 * MiB)                      # within 20 MiB: reuses it, unsplit
        assert c.data_ptr() == pa
        assert stat("oversize_allocations.current") == 2
        assert stat("oversize_segments.current") >= 2
        del b, c
        torch.cuda.empty_cache()


@differs("max-split-size-stat")
def check_max_split_size_stat_after_a_change():
    with settings("max_split_size_mb:40"):
        got = stat("max_split_size")
        # torch fixes the stat when the device's allocator is created
        assert got == (40 * MiB if gpumem() else -1), got


@differs("settings-check")
def check_a_negative_max_split_size_is_refused_not_applied_as_no_limit():
    # torch's parser reads -5 through std::stoull as 2**64 - 5 and applies no
    # limit; gpumem's one settings check refuses it in one line, before
    # torch's parser applies anything.  Before 2.10 torch's own setter parses
    # the string first (gpumem follows it: installer._follow_settings_setter),
    # so there gpumem applies what that release's allocator applies.
    before = settings_in_force()
    if gpumem() and torch_release() >= (2, 10):
        e = raises(ValueError, lambda: set_settings("max_split_size_mb:-5"),
                   match="max_split_size_mb")
        assert "\n" not in str(e), str(e)
        assert settings_in_force() == before
    else:
        try:
            set_settings("max_split_size_mb:-5")
            assert stat("max_split_size") == -1 or stat("max_split_size") > (1 << 50), \
                stat("max_split_size")
        finally:
            set_settings(before)
