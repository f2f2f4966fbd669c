"""The core's size policy as gpumem._C exports it (round_size, is_small,
segment_size), checked against what the allocator really does: the block
size (Allocator.block_size), the pool (stats) and the segment (reserved
bytes) of real allocations, with and without roundup_power2_divisions."""

from __future__ import annotations

import random

import pytest

from gpumem import _C
from gpumem.snapshots import replay as replay_mod

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# Sizes of real allocations (malloc(0) returns 0 and allocates nothing).
SIZES = sorted({1, 511, 512, 513, 1000, 4096, 100 * KiB, MiB - 1, MiB, MiB + 1,
                1500 * KiB, 2 * MiB + 7, 5 * MiB + 3, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1,
                19 * MiB + 512, 20 * MiB, 33 * MiB + 5, 300 * MiB + 1, 3 * GiB + 17}
               | {random.Random(3).randint(1, 64 * MiB) for _ in range(40)})

SETTINGS = {
    "default": None,
    "pow2-4": {"roundup_power2_divisions": [4] * 16},
    "pow2-mixed": {"roundup_power2_divisions": [1, 2, 8, 0, 16, 4, 2, 1, 8, 8, 8, 8, 1, 1, 1, 1]},
}


def expected_block(rounded: int) -> int:
    """The block a fresh allocator (expandable segments off) hands out: the
    rounded size, unless the large pool leaves 1 MiB or less of the new
    segment, which is then not split off (torch's rule)."""
    if _C.is_small(rounded):
        return rounded
    seg = _C.segment_size(rounded)
    return rounded if seg - rounded > _C.SMALL_SIZE else seg


@pytest.mark.parametrize("name", list(SETTINGS))
def test_round_size_matches_real_allocations(name):
    settings = SETTINGS[name]
    for size in SIZES:
        rounded = _C.round_size(size, settings)
        assert rounded >= max(size, _C.MIN_BLOCK_SIZE) and rounded % _C.MIN_BLOCK_SIZE == 0
        a = _C.Allocator(capacity=16 * GiB, settings=settings)
        p = a.malloc(size)
        block, requested, _stream = a.block_size(p)
        assert requested == size
        assert block == expected_block(rounded), (name, size, rounded)
        st = a.stats()
        pool = "small_pool" if _C.is_small(rounded) else "large_pool"
        assert st[f"allocation.{pool}.current"] == 1, (name, size)
        assert st["reserved_bytes.all.current"] == _C.segment_size(rounded), (name, size)
        a.free(p)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_round_size_is_the_block_size_with_expandable_segments(name):
    settings = dict(SETTINGS[name] or {}, expandable_segments=True)
    a = _C.Allocator(capacity=16 * GiB, settings=settings)
    assert a.expandable_active()
    for size in SIZES:
        p = a.malloc(size)
        assert a.block_size(p)[0] == _C.round_size(size, settings), (name, size)
        a.free(p)


def test_divisions_change_the_rounding():
    pow2 = SETTINGS["pow2-4"]
    assert _C.round_size(0) == _C.round_size(0, pow2) == _C.MIN_BLOCK_SIZE
    # 1.2 MiB lies in [1 MiB, 2 MiB): four divisions round it up to 1.25 MiB.
    assert _C.round_size(1200 * KiB) == 1200 * KiB
    assert _C.round_size(1200 * KiB, pow2) == 1280 * KiB
    assert _C.round_size(5 * MiB + 1, pow2) == 6 * MiB
    assert _C.round_size(4 * MiB, pow2) == 4 * MiB
    # Below 512 bytes times the divisions, the plain rounding applies.
    assert _C.round_size(1000, pow2) == 1024


def test_pools_and_segments():
    assert _C.is_small(_C.SMALL_SIZE) and not _C.is_small(_C.SMALL_SIZE + 512)
    assert _C.segment_size(512) == _C.segment_size(_C.SMALL_SIZE) == _C.SMALL_BUFFER
    assert _C.segment_size(_C.SMALL_SIZE + 512) == _C.LARGE_BUFFER
    assert _C.segment_size(10 * MiB) == 10 * MiB
    assert _C.segment_size(10 * MiB + 512) == 12 * MiB


def test_bad_arguments_raise_one_clear_error():
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError, match="size must be an int from 0"):
            _C.round_size(bad)
        with pytest.raises(ValueError, match="rounded must be an int from 0"):
            _C.segment_size(bad)
    with pytest.raises(TypeError):
        _C.is_small("1")
    with pytest.raises(ValueError, match="unknown allocator setting"):
        _C.round_size(1, {"colour": 1})


def test_replay_rounds_as_the_core_does():
    for size in [0] + SIZES:
        assert replay_mod.round_size(size) == _C.round_size(size)
