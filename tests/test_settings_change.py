"""Settings changed while blocks are live never make the stats disagree.

A setting that classifies a block (max_split_size decides "oversize") is
captured on the block when it is allocated, and on the segment when it is
created, so freeing it later undoes exactly what allocating it counted.
These drive gpumem._C.Allocator.set_settings, the call torch's
_set_allocator_settings reaches; tests/c/test_stats.c checks the same in C.
"""

import pytest

from gpumem import _C

MiB = 1 << 20


def _with_max_split(a, mib):
    s = a.settings()
    s["max_split_size"] = -1 if mib is None else mib * MiB
    a.set_settings(s)


@pytest.mark.parametrize("expandable", [False, True], ids=["segments", "expandable"])
def test_lowering_max_split_size_with_a_live_block(expandable):
    a = _C.Allocator(settings={"expandable_segments": expandable})
    p = a.malloc(40 * MiB)
    _with_max_split(a, 32)
    a.free(p)
    st = a.stats()
    assert st["oversize_allocations.current"] == 0
    assert st["oversize_allocations.freed"] == 0
    assert st["max_split_size"] == 32 * MiB
    assert a.check() == (0, "")
    a.empty_cache()
    assert a.check() == (0, "")


def test_lifting_max_split_size_with_a_live_oversize_block():
    a = _C.Allocator(settings={"max_split_size": 32 * MiB})
    p = a.malloc(50 * MiB)
    st = a.stats()
    assert st["oversize_allocations.current"] == 1 and st["oversize_segments.current"] == 1
    _with_max_split(a, None)
    assert a.stats()["max_split_size"] == -1
    a.free(p)
    assert a.check() == (0, "")
    a.empty_cache()
    st = a.stats()
    assert st["oversize_allocations.current"] == 0 and st["oversize_allocations.freed"] == 1
    assert st["oversize_segments.current"] == 0 and st["oversize_segments.freed"] == 1
    assert st["segment.all.current"] == 0
    assert a.check() == (0, "")


def test_settings_toggled_under_churn_keep_every_stat_consistent():
    """Many blocks, settings changed between allocations and frees."""
    a = _C.Allocator(capacity=8 << 30)
    live = []
    sizes = [512, 3 * MiB, 25 * MiB, 40 * MiB, 70 * MiB]
    for step in range(60):
        live.append(a.malloc(sizes[step % len(sizes)] + step))
        if step % 7 == 3:
            _with_max_split(a, [None, 24, 64][step % 3])
        if step % 3 == 2:
            a.free(live.pop(0))
        assert a.check() == (0, ""), f"after step {step}"
    for p in live:
        a.free(p)
    a.empty_cache()
    st = a.stats()
    assert st["oversize_allocations.current"] == 0 and st["oversize_segments.current"] == 0
    assert st["reserved_bytes.all.current"] == 0
    assert a.check() == (0, "")
