/*
 * test_stats.c - the statistics, with torch.cuda.memory_stats() meaning.
 *
 * allocation/allocated_bytes change at malloc and at free(); active,
 * active_bytes and requested_bytes change at malloc and when the block is
 * really freed (free_completed); inactive_split counts free blocks of
 * split segments; segment/reserved_bytes follow device allocations.
 * "allocated"/"freed" accumulate, "peak" is the high-water mark.
 * reset_peak sets peak = current; reset_accumulated zeroes allocated,
 * freed and the num_* counters.
 */
#include "helpers.h"

#define CHECK_STAT(st, cur, pk, al, fr)          \
    do {                                          \
        CHECK_EQ((st).current, (cur));            \
        CHECK_EQ((st).peak, (pk));                \
        CHECK_EQ((st).allocated, (al));           \
        CHECK_EQ((st).freed, (fr));               \
    } while (0)

TEST(stats_start_at_zero) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    gm_stats_t s = fx_stats(&fx);
    for (int t = 0; t < GM_STAT_NTYPES; t++) {
        CHECK_STAT(s.allocation[t], 0, 0, 0, 0);
        CHECK_STAT(s.segment[t], 0, 0, 0, 0);
        CHECK_STAT(s.allocated_bytes[t], 0, 0, 0, 0);
        CHECK_STAT(s.reserved_bytes[t], 0, 0, 0, 0);
        CHECK_STAT(s.requested_bytes[t], 0, 0, 0, 0);
    }
    CHECK_EQ(s.num_alloc_retries, 0);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.num_device_alloc, 0);
    CHECK_EQ(s.num_device_free, 0);
    CHECK_EQ(s.max_split_size, -1);
    fx_close(&fx);
}

TEST(stats_one_small_allocation) {
    /* plain segments: about the stats of cudaMalloc segments */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p = MALLOC(&fx, 1000, S0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_STAT(s.allocation[GM_STAT_ALL], 1, 1, 1, 0);
    CHECK_STAT(s.allocation[GM_STAT_SMALL], 1, 1, 1, 0);
    CHECK_STAT(s.allocation[GM_STAT_LARGE], 0, 0, 0, 0);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 1024, 1024, 1024, 0);
    CHECK_STAT(s.allocated_bytes[GM_STAT_SMALL], 1024, 1024, 1024, 0);
    CHECK_STAT(s.requested_bytes[GM_STAT_ALL], 1000, 1000, 1000, 0);
    CHECK_STAT(s.active[GM_STAT_ALL], 1, 1, 1, 0);
    CHECK_STAT(s.active_bytes[GM_STAT_ALL], 1024, 1024, 1024, 0);
    CHECK_STAT(s.segment[GM_STAT_ALL], 1, 1, 1, 0);
    CHECK_STAT(s.segment[GM_STAT_SMALL], 1, 1, 1, 0);
    CHECK_STAT(s.segment[GM_STAT_LARGE], 0, 0, 0, 0);
    CHECK_STAT(s.reserved_bytes[GM_STAT_ALL], 2 * MiB, 2 * MiB, 2 * MiB, 0);
    CHECK_STAT(s.reserved_bytes[GM_STAT_SMALL], 2 * MiB, 2 * MiB, 2 * MiB, 0);
    CHECK_EQ(s.inactive_split[GM_STAT_SMALL].current, 1);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_SMALL].current, 2 * MiB - 1024);
    CHECK_EQ(s.num_device_alloc, 1);
    FREE(&fx, p);
    s = fx_stats(&fx);
    CHECK_STAT(s.allocation[GM_STAT_ALL], 0, 1, 1, 1);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 0, 1024, 1024, 1024);
    CHECK_STAT(s.requested_bytes[GM_STAT_ALL], 0, 1000, 1000, 1000);
    CHECK_STAT(s.active[GM_STAT_ALL], 0, 1, 1, 1);
    CHECK_STAT(s.active_bytes[GM_STAT_ALL], 0, 1024, 1024, 1024);
    CHECK_STAT(s.reserved_bytes[GM_STAT_ALL], 2 * MiB, 2 * MiB, 2 * MiB, 0);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].peak, 1);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    s = fx_stats(&fx);
    CHECK_STAT(s.segment[GM_STAT_ALL], 0, 1, 1, 1);
    CHECK_STAT(s.reserved_bytes[GM_STAT_ALL], 0, 2 * MiB, 2 * MiB, 2 * MiB);
    CHECK_EQ(s.num_device_free, 1);
    fx_close(&fx);
}

TEST(stats_small_and_large_are_separate) {
    /* plain segments: about the stats of cudaMalloc segments */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 100 * KiB, S1);
    uintptr_t b = MALLOC(&fx, 200 * KiB, S1);
    uintptr_t c = MALLOC(&fx, 5 * MiB, S1);
    uintptr_t d = MALLOC(&fx, 50 * MiB, S1);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocation[GM_STAT_SMALL].current, 2);
    CHECK_EQ(s.allocation[GM_STAT_LARGE].current, 2);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 4);
    CHECK_EQ(s.allocated_bytes[GM_STAT_SMALL].current, 300 * KiB);
    CHECK_EQ(s.allocated_bytes[GM_STAT_LARGE].current, 55 * MiB);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].current, 55 * MiB + 300 * KiB);
    CHECK_EQ(s.segment[GM_STAT_LARGE].current, 2);
    CHECK_EQ(s.reserved_bytes[GM_STAT_LARGE].current, 70 * MiB);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 72 * MiB);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_LARGE].current, 15 * MiB);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_SMALL].current, 2 * MiB - 300 * KiB);
    /* all = small + large for every family */
    const gm_stat_t *fam[] = {s.allocation,    s.segment,         s.active,
                              s.inactive_split, s.allocated_bytes, s.reserved_bytes,
                              s.active_bytes,  s.inactive_split_bytes, s.requested_bytes};
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        CHECK_EQ(fam[f][GM_STAT_ALL].current,
                 fam[f][GM_STAT_SMALL].current + fam[f][GM_STAT_LARGE].current);
        CHECK_EQ(fam[f][GM_STAT_ALL].allocated,
                 fam[f][GM_STAT_SMALL].allocated + fam[f][GM_STAT_LARGE].allocated);
    }
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    FREE(&fx, d);
    fx_close(&fx);
}

TEST(stats_peaks_and_resets) {
    /* plain segments: about the stats of cudaMalloc segments */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 4 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 4 * MiB, S1);
    FREE(&fx, a);
    gm_stats_t s = fx_stats(&fx);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 4 * MiB, 8 * MiB, 8 * MiB, 4 * MiB);
    gm_alloc_reset_peak_stats(fx.a);
    s = fx_stats(&fx);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 4 * MiB, 4 * MiB, 8 * MiB, 4 * MiB);
    CHECK_EQ(s.allocation[GM_STAT_ALL].peak, 1);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].peak, 20 * MiB);
    CHECK_EQ(s.requested_bytes[GM_STAT_ALL].peak, 4 * MiB);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].peak, s.inactive_split[GM_STAT_ALL].current);
    uintptr_t c = MALLOC(&fx, 2 * MiB, S1);
    s = fx_stats(&fx);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].peak, 6 * MiB);
    gm_alloc_reset_accumulated_stats(fx.a);
    s = fx_stats(&fx);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 6 * MiB, 6 * MiB, 0, 0);
    CHECK_STAT(s.allocation[GM_STAT_ALL], 2, 2, 0, 0);
    CHECK_STAT(s.segment[GM_STAT_ALL], 1, 1, 0, 0);
    CHECK_EQ(s.num_device_alloc, 0);
    CHECK_EQ(s.num_alloc_retries, 0);
    CHECK_EQ(s.num_ooms, 0);
    FREE(&fx, b);
    FREE(&fx, c);
    s = fx_stats(&fx);
    CHECK_STAT(s.allocated_bytes[GM_STAT_ALL], 0, 6 * MiB, 0, 6 * MiB);
    CHECK_STAT(s.allocation[GM_STAT_ALL], 0, 2, 0, 2);
    fx_close(&fx);
}

TEST(stats_num_device_alloc_and_free) {
    /* plain segments: about the stats of cudaMalloc segments */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p[4];
    p[0] = MALLOC(&fx, 1000, S1);
    p[1] = MALLOC(&fx, 2000, S1); /* same segment */
    p[2] = MALLOC(&fx, 12 * MiB, S1);
    p[3] = MALLOC(&fx, 12 * MiB, S2);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_device_alloc, 3);
    CHECK_EQ(s.num_device_alloc, fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC]);
    for (int i = 0; i < 4; i++)
        FREE(&fx, p[i]);
    CHECK_EQ(fx_stats(&fx).num_device_free, 0);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    s = fx_stats(&fx);
    CHECK_EQ(s.num_device_free, 3);
    CHECK_EQ(s.num_device_free, fx_counters(&fx).calls[TDEV_FN_SEG_FREE]);
    fx_close(&fx);
}

TEST(stats_oversize_with_max_split_size) {
    /* plain segments: oversize_segments counts cudaMalloc segments */
    gm_settings_t st = settings_with(0);
    st.max_split_size = 40 * MiB;
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    CHECK_EQ(fx_stats(&fx).max_split_size, 40 * MiB);
    uintptr_t big = MALLOC(&fx, 70 * MiB, S1);
    uintptr_t mid = MALLOC(&fx, 30 * MiB, S1);
    gm_stats_t s = fx_stats(&fx);
    CHECK_STAT(s.oversize_allocations, 1, 1, 1, 0);
    CHECK_STAT(s.oversize_segments, 1, 1, 1, 0);
    FREE(&fx, big);
    s = fx_stats(&fx);
    CHECK_STAT(s.oversize_allocations, 0, 1, 1, 1);
    CHECK_EQ(s.oversize_segments.current, 1); /* cached, still reserved */
    /* 45 MiB would waste >= 20 MiB of the 70 MiB block: new segment, and
     * blocks >= max_split_size are not split */
    uintptr_t x = MALLOC(&fx, 45 * MiB, S1);
    CHECK_NE(x, big);
    CHECK_EQ(fx_block_size(&fx, x), 46 * MiB);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 3);
    /* 55 MiB may take it whole (rounding up by less than 20 MiB) */
    uintptr_t y = MALLOC(&fx, 55 * MiB, S1);
    CHECK_EQ(y, big);
    CHECK_EQ(fx_block_size(&fx, y), 70 * MiB);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 3);
    s = fx_stats(&fx);
    CHECK_EQ(s.oversize_allocations.current, 2);
    CHECK_EQ(s.oversize_segments.current, 2);
    FREE(&fx, y);
    /* a request below max_split_size never takes an oversize block */
    uintptr_t z = MALLOC(&fx, 20 * MiB, S1);
    CHECK_NE(z, big);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 4);
    FREE(&fx, x);
    FREE(&fx, z);
    FREE(&fx, mid);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    s = fx_stats(&fx);
    CHECK_EQ(s.oversize_allocations.current, 0);
    CHECK_EQ(s.oversize_segments.current, 0);
    CHECK_EQ(s.oversize_segments.freed, s.oversize_segments.allocated);
    fx_close(&fx);
}

/* Whether a block or segment is oversize is decided when it is allocated
 * or created and kept on it: changing max_split_size while blocks are live
 * never makes the oversize stats go negative or disagree with the blocks. */
TEST(stats_oversize_survives_max_split_change) {
    gm_settings_t st = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    /* Allocated while unlimited: not oversize. */
    uintptr_t p = MALLOC(&fx, 40 * MiB, S1);
    gm_settings_t lowered = st;
    lowered.max_split_size = 32 * MiB;
    REQUIRE(gm_alloc_set_settings(fx.a, &lowered) == 0);
    CHECK_EQ(fx_stats(&fx).max_split_size, 32 * MiB);
    FREE(&fx, p);
    gm_stats_t s = fx_stats(&fx);
    CHECK_STAT(s.oversize_allocations, 0, 0, 0, 0);
    CHECK_STAT(s.oversize_segments, 0, 0, 0, 0);
    CHECK_ALLOC(&fx);
    /* Created while limited: oversize, also after the limit is lifted. */
    uintptr_t q = MALLOC(&fx, 50 * MiB, S1);
    s = fx_stats(&fx);
    CHECK_STAT(s.oversize_allocations, 1, 1, 1, 0);
    CHECK_STAT(s.oversize_segments, 1, 1, 1, 0);
    REQUIRE(gm_alloc_set_settings(fx.a, &st) == 0);
    CHECK_EQ(fx_stats(&fx).max_split_size, -1);
    FREE(&fx, q);
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    s = fx_stats(&fx);
    CHECK_STAT(s.oversize_allocations, 0, 1, 1, 1);
    CHECK_STAT(s.oversize_segments, 0, 1, 1, 1);
    CHECK_EQ(s.segment[GM_STAT_ALL].current, 0);
    fx_close(&fx);
}

TEST(stats_max_split_releases_oversize_blocks_first) {
    /* release_available_cached_blocks: with max_split_size set, a refused
     * device allocation first frees the smallest cached oversize block that
     * is large enough, not the whole cache, and does not count a retry. */
    tdev_config_t cfg = dev_cfg(200 * MiB, TDEV_EVENTS_IMMEDIATE);
    gm_settings_t st = settings_with(0); /* plain segments: which segment goes back */
    st.max_split_size = 40 * MiB;
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    uintptr_t a = MALLOC(&fx, 60 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 100 * MiB, S1);
    uintptr_t keep = MALLOC(&fx, 4 * MiB, S1); /* 20 MiB segment */
    FREE(&fx, a);
    FREE(&fx, b);
    trace_clear(&fx);
    /* 75 MiB: b would waste >= 20 MiB, a is too small, the device has
     * 20 MiB free: b (100 MiB) goes back, a stays cached */
    uintptr_t c = MALLOC(&fx, 75 * MiB, S1);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 0);
    CHECK_EQ(s.num_ooms, 0);
    CHECK(trace_find(&fx, GM_ACT_SEGMENT_FREE, b) >= 0);
    CHECK_EQ(trace_find(&fx, GM_ACT_SEGMENT_FREE, a), -1);
    CHECK_EQ(fx_reserved(&fx), 60 * MiB + 20 * MiB + 76 * MiB);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 156 * MiB);
    FREE(&fx, c);
    FREE(&fx, keep);
    fx_close(&fx);
}
