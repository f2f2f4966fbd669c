/*
 * test_expandable.c - expandable segments (settings.expandable_segments).
 *
 * Each (stream, pool) reserves one virtual range and maps 2 MiB granules
 * on demand, so allocations of a stream are contiguous and freed holes
 * can be unmapped granule by granule (gpumem may also recycle free granules
 * of holes while a range grows, where torch waits for empty_cache or an
 * OOM: the tests accept both). Blocks split whenever the remainder
 * is >= 512 bytes. Without VMM (granularity 0) the allocator falls back to
 * plain segments. Torch counts every map in num_device_alloc and every
 * unmap in num_device_free, and traces them as segment_map/segment_unmap.
 */
#include <string.h>

#include "helpers.h"

static gm_settings_t expandable(void) { return settings_with(1); }

TEST(expandable_allocations_share_one_range) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    CHECK_EQ(gm_alloc_expandable_active(fx.a), 1);
    trace_clear(&fx);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    tdev_counters_t c = fx_counters(&fx);
    CHECK_EQ(c.bytes_mapped, 30 * MiB);
    CHECK_EQ(c.bytes_allocated, 0);
    CHECK_EQ(c.calls[TDEV_FN_SEG_ALLOC], 0);
    CHECK_EQ(c.live_reservations, 1);
    CHECK_GE(c.bytes_reserved_va, 30 * MiB);
    int i = trace_find(&fx, GM_ACT_SEGMENT_MAP, a);
    CHECK(i >= 0);
    if (i >= 0) {
        CHECK_EQ(fx.trace->ev[i].size, 30 * MiB);
        CHECK_EQ(fx.trace->ev[i].stream, S1);
    }
    CHECK_EQ(fx_reserved(&fx), 30 * MiB);
    uintptr_t b = MALLOC(&fx, 30 * MiB, S1);
    uintptr_t cc = MALLOC(&fx, 30 * MiB, S1);
    CHECK_EQ(b, a + 30 * MiB);
    CHECK_EQ(cc, a + 60 * MiB);
    c = fx_counters(&fx);
    CHECK_EQ(c.bytes_mapped, 90 * MiB);
    CHECK_EQ(c.live_reservations, 1);
    /* free the middle one and ask for twice its size: the range grows at
     * its end by no more than the request. (torch keeps b's hole mapped
     * until empty_cache or an OOM; gpumem may recycle it while growing,
     * see Note [Expandable segments]. Either way the hole is unmapped by
     * the end of the empty_cache below.) */
    FREE(&fx, b);
    size_t before = fx_reserved(&fx);
    uintptr_t e = MALLOC(&fx, 60 * MiB, S1);
    CHECK_EQ(e, cc + 30 * MiB);
    CHECK_LE(fx_reserved(&fx), before + 60 * MiB + 2 * MiB);
    c = fx_counters(&fx);
    CHECK_EQ(c.bytes_mapped, fx_reserved(&fx));
    CHECK_EQ(c.live_reservations, 1);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    i = trace_find(&fx, GM_ACT_SEGMENT_UNMAP, b);
    CHECK(i >= 0);
    if (i >= 0)
        CHECK_EQ(fx.trace->ev[i].size, 30 * MiB);
    CHECK_EQ(trace_count(&fx, GM_ACT_SEGMENT_UNMAP), 1);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 120 * MiB);
    CHECK_EQ(fx_reserved(&fx), 120 * MiB);
    /* the walk shows one segment per contiguous mapped range */
    walk_t w;
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 2);
    if (w.nsegs == 2) {
        CHECK_EQ(w.segs[0].info.address, a);
        CHECK_EQ(w.segs[0].info.total_size, 30 * MiB);
        CHECK_EQ(w.segs[1].info.address, cc);
        CHECK_EQ(w.segs[1].info.total_size, 90 * MiB);
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(w.segs[k].info.is_expandable, 1);
            CHECK_EQ(w.segs[k].info.is_small, 0);
            CHECK_EQ(w.segs[k].info.stream, S1);
        }
    }
    walk_free(&w);
    /* the hole is mapped again on demand */
    uintptr_t f = MALLOC(&fx, 20 * MiB, S1);
    CHECK_EQ(f, b);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 140 * MiB);
    FREE(&fx, a);
    FREE(&fx, cc);
    FREE(&fx, e);
    FREE(&fx, f);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    c = fx_counters(&fx);
    CHECK_EQ(c.bytes_mapped, 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 0);
    CHECK_GE(s.reserved_bytes[GM_STAT_LARGE].peak, 120 * MiB);
    CHECK_LE(s.reserved_bytes[GM_STAT_LARGE].peak, 150 * MiB);
    fx_close(&fx);
}

TEST(expandable_one_range_per_stream) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    CHECK_EQ(fx_counters(&fx).live_reservations, 1);
    uintptr_t b = MALLOC(&fx, 30 * MiB, S2);
    CHECK_EQ(fx_counters(&fx).live_reservations, 2);
    uintptr_t c = MALLOC(&fx, 30 * MiB, S1);
    CHECK_EQ(c, a + 30 * MiB);
    CHECK_EQ(fx_counters(&fx).live_reservations, 2);
    /* a freed block is not reused by another stream */
    FREE(&fx, c);
    uintptr_t d = MALLOC(&fx, 30 * MiB, S2);
    CHECK_EQ(d, b + 30 * MiB);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 120 * MiB);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, d);
    fx_close(&fx);
}

TEST(expandable_granules_and_partial_unmap) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    trace_clear(&fx);
    uintptr_t a = MALLOC(&fx, 3 * MiB, S1);
    CHECK_EQ(fx_block_size(&fx, a), 3 * MiB); /* split: remainder >= 512 */
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 4 * MiB);
    CHECK_EQ(fx_reserved(&fx), 4 * MiB);
    int i = trace_find(&fx, GM_ACT_SEGMENT_MAP, a);
    CHECK(i >= 0);
    if (i >= 0)
        CHECK_EQ(fx.trace->ev[i].size, 4 * MiB);
    /* the next one starts in the free MiB and maps one more granule */
    uintptr_t b = MALLOC(&fx, 1 * MiB + 512, S1);
    CHECK_EQ(b, a + 3 * MiB);
    CHECK_EQ(fx_block_size(&fx, b), 1 * MiB + 512);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 6 * MiB);
    /* small requests map 2 MiB granules of their own range */
    uintptr_t s = MALLOC(&fx, 1000, S1);
    CHECK_EQ(fx_block_size(&fx, s), 1024);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 8 * MiB);
    CHECK_EQ(fx_stats(&fx).reserved_bytes[GM_STAT_SMALL].current, 2 * MiB);
    /* freeing b leaves [3 MiB, 6 MiB) free: only the granule [4, 6) is
     * wholly free, [2, 4) still holds part of a */
    FREE(&fx, b);
    trace_clear(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    i = trace_find(&fx, GM_ACT_SEGMENT_UNMAP, a + 4 * MiB);
    CHECK(i >= 0);
    if (i >= 0)
        CHECK_EQ(fx.trace->ev[i].size, 2 * MiB);
    CHECK_EQ(trace_count(&fx, GM_ACT_SEGMENT_UNMAP), 1);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 6 * MiB);
    CHECK_EQ(fx_reserved(&fx), 6 * MiB);
    CHECK_ALLOC(&fx);
    FREE(&fx, a);
    FREE(&fx, s);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 0);
    fx_close(&fx);
}

/* 25 x 4 MiB, then free all but every fifth: 20 MiB live spread over
 * 100 MiB. A 40 MiB request on a 128 MiB device must fail with plain
 * segments (no segment is wholly free) and succeed with expandable ones
 * (the free granules are unmapped and the range grows). */
static void fragmentation_case(int expandable_on) {
    tdev_config_t cfg = dev_cfg(128 * MiB, TDEV_EVENTS_IMMEDIATE);
    gm_settings_t st = settings_with(expandable_on);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    uintptr_t p[25];
    for (int i = 0; i < 25; i++)
        p[i] = MALLOC(&fx, 4 * MiB, S1);
    for (int i = 0; i < 25; i++)
        if (i % 5 != 4)
            FREE(&fx, p[i]);
    CHECK_EQ(fx_allocated(&fx), 20 * MiB);
    CHECK_EQ(fx_reserved(&fx), 100 * MiB);
    uintptr_t q = 0;
    gm_oom_info_t oom;
    memset(&oom, 0, sizeof oom);
    int rc = gm_alloc_malloc(fx.a, 40 * MiB, S1, 0, &q, &oom);
    gm_stats_t s = fx_stats(&fx);
    if (expandable_on) {
        /* torch unmaps the free granules on the OOM retry; gpumem may
         * already recycle them while growing (no retry counted then) */
        CHECK_EQ(rc, 0);
        CHECK_EQ(q, p[0] + 100 * MiB);
        CHECK_EQ(s.num_ooms, 0);
        CHECK_LE(s.num_alloc_retries, 1);
        CHECK_LE(fx_reserved(&fx), 128 * MiB);
        CHECK_GE(fx_reserved(&fx), 60 * MiB);
        CHECK_EQ(fx_counters(&fx).bytes_mapped, fx_reserved(&fx));
        if (rc == 0)
            FREE(&fx, q);
    } else {
        CHECK_EQ(rc, GM_EOOM);
        CHECK_EQ(s.num_alloc_retries, 1);
        CHECK_EQ(s.num_ooms, 1);
        CHECK_EQ(oom.reserved, 100 * MiB);
        CHECK_EQ(oom.reserved_unallocated, 80 * MiB);
        CHECK_EQ(oom.device_free, 28 * MiB);
    }
    CHECK_ALLOC(&fx);
    for (int i = 4; i < 25; i += 5)
        FREE(&fx, p[i]);
    fx_close(&fx);
}

TEST(fragmentation_strands_plain_segments) { fragmentation_case(0); }
TEST(fragmentation_does_not_strand_expandable) { fragmentation_case(1); }

TEST(expandable_falls_back_without_vmm) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_IMMEDIATE);
    cfg.granularity = 0;
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    CHECK_EQ(gm_alloc_expandable_active(fx.a), 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    tdev_counters_t c = fx_counters(&fx);
    CHECK_EQ(c.calls[TDEV_FN_SEG_ALLOC], 1);
    CHECK_EQ(c.bytes_allocated, 30 * MiB);
    CHECK_EQ(c.bytes_mapped, 0);
    CHECK_EQ(c.live_reservations, 0);
    walk_t w;
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 1);
    if (w.nsegs == 1)
        CHECK_EQ(w.segs[0].info.is_expandable, 0);
    walk_free(&w);
    FREE(&fx, a);
    fx_close(&fx);
}

TEST(expandable_device_counters_match_trace) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    trace_clear(&fx);
    uintptr_t p[6];
    for (int i = 0; i < 6; i++)
        p[i] = MALLOC(&fx, (size_t)(i + 1) * 3 * MiB, i % 2 ? S1 : S2);
    for (int i = 0; i < 6; i += 2)
        FREE(&fx, p[i]);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    for (int i = 1; i < 6; i += 2)
        FREE(&fx, p[i]);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_device_alloc,
             trace_count(&fx, GM_ACT_SEGMENT_MAP) + trace_count(&fx, GM_ACT_SEGMENT_ALLOC));
    CHECK_EQ(s.num_device_free,
             trace_count(&fx, GM_ACT_SEGMENT_UNMAP) + trace_count(&fx, GM_ACT_SEGMENT_FREE));
    CHECK_GE(s.num_device_alloc, 1);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 0);
    /* every byte mapped was unmapped again */
    size_t mapped = 0, unmapped = 0;
    for (int i = 0; i < fx.trace->n; i++) {
        if (fx.trace->ev[i].action == GM_ACT_SEGMENT_MAP)
            mapped += fx.trace->ev[i].size;
        if (fx.trace->ev[i].action == GM_ACT_SEGMENT_UNMAP)
            unmapped += fx.trace->ev[i].size;
    }
    CHECK_EQ(mapped, unmapped);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].allocated, mapped);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].freed, unmapped);
    fx_close(&fx);
}

TEST(expandable_memory_limit) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 70 * MiB), 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 30 * MiB, S1);
    uintptr_t p = 0;
    gm_oom_info_t oom;
    memset(&oom, 0, sizeof oom);
    CHECK_EQ(gm_alloc_malloc(fx.a, 30 * MiB, S1, 0, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.limit_hit, 1);
    CHECK_EQ(oom.allowed, 70 * MiB);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 60 * MiB);
    uintptr_t c = MALLOC(&fx, 10 * MiB, S1); /* 70 MiB exactly */
    CHECK_EQ(c, b + 30 * MiB);
    CHECK_EQ(fx_reserved(&fx), 70 * MiB);
    CHECK_ALLOC(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    fx_close(&fx);
}

TEST(expandable_map_failures) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 8 * MiB, S1); /* map 1 */
    /* the next map is refused for lack of memory (on cuda: its first
     * cuMemCreate; the backend maps granule by granule) */
    fx_set_failure(&fx, TDEV_FN_MAP, 1, GM_EOOM, 0);
    uintptr_t b = MALLOC(&fx, 20 * MiB, S1); /* map 2 refused, retried */
    CHECK_EQ(b, a + 8 * MiB);
    CHECK_EQ(fx_stats(&fx).num_alloc_retries, 1);
    CHECK_EQ(fx_stats(&fx).num_ooms, 0);
    CHECK_ALLOC(&fx);
    /* a device error while mapping is passed up, no retry */
    fx_set_failure(&fx, TDEV_FN_MAP, 1, GM_EDEVICE, 0); /* the next map */
    uintptr_t p = 0;
    CHECK_EQ(gm_alloc_malloc(fx.a, 20 * MiB, S1, 0, &p, NULL), GM_EDEVICE);
    CHECK_EQ(fx_stats(&fx).num_alloc_retries, 1);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 28 * MiB);
    CHECK_ALLOC(&fx);
    fx_set_failure(&fx, -1, 0, GM_EOOM, 0);
    uintptr_t c = MALLOC(&fx, 20 * MiB, S1);
    CHECK_EQ(c, b + 20 * MiB);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    fx_close(&fx);
}

TEST(expandable_can_be_switched_at_run_time) {
    /* torch: when expandable segments are turned off, blocks of existing
     * expandable segments are no longer handed out (and vice versa the
     * plain segments stay usable). */
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, a);
    gm_settings_t off = settings_with(0);
    CHECK_EQ(gm_alloc_set_settings(fx.a, &off), 0);
    CHECK_EQ(gm_alloc_expandable_active(fx.a), 0);
    uintptr_t b = MALLOC(&fx, 30 * MiB, S1);
    CHECK_NE(b, a);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    walk_t w;
    walk_collect(&fx, &w);
    const walk_seg_t *sb = walk_segment(&w, b);
    CHECK(sb && !sb->info.is_expandable);
    walk_free(&w);
    FREE(&fx, b);
    CHECK_EQ(gm_alloc_set_settings(fx.a, &st), 0);
    CHECK_EQ(gm_alloc_expandable_active(fx.a), 1);
    uintptr_t c = MALLOC(&fx, 30 * MiB, S1);
    CHECK(c == a || c == b); /* either cached block may serve it */
    FREE(&fx, c);
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

/* A failed unmap must leave the range as it was (the core then keeps the
 * granules mapped and counts them as reserved), so a later empty_cache can
 * release them and the device ends clean. The first of several granules
 * fails to unmap here. */
TEST(expandable_unmap_failure_leaves_the_range_mapped) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, a);
    fx_set_failure(&fx, TDEV_FN_UNMAP, 1, GM_EDEVICE, 0);
    int rc = gm_alloc_empty_cache(fx.a, 0);
    CHECK(rc == 0 || rc == GM_EDEVICE);
    CHECK_ALLOC(&fx);
    /* what the allocator counts as reserved is what the device has mapped */
    CHECK_EQ(fx_counters(&fx).bytes_mapped, fx_reserved(&fx));
    fx_set_failure(&fx, -1, 0, GM_EOOM, 0);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_ALLOC(&fx);
    CHECK_EQ(fx_reserved(&fx), 30 * MiB);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 30 * MiB);
    FREE(&fx, b);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

/* While a capture is underway (a private pool allocating; on cuda a real
 * global-mode capture in the fake driver), growth with wholly free
 * granules in a hole maps new granules and neither unmaps nor waits for
 * the stream, and empty_cache gives nothing back, not even a freeable
 * pool's cache: a capture forbids both (Note [Capture-safe paths]). The
 * capture survives, and the memory goes back once it has ended. */
TEST(expandable_growth_during_capture_is_capture_safe) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    const gm_mempool_id_t G = {7, 0}, P = {0, 3};
    uintptr_t p = 0, a = 0, b = 0, c = 0;
    /* A freeable pool with cached memory, which empty_cache would release. */
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P), GM_OK);
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 8 * MiB, S2, 0, P, &p, NULL), GM_OK);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P), GM_OK);
    FREE(&fx, p);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P), GM_OK);

    CHECK_EQ(gm_alloc_pool_begin(fx.a, G), GM_OK);
    CHECK_EQ(tdev_capture_begin(fx.dev, S1), 0);
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 24 * MiB, S1, 0, G, &a, NULL), GM_OK);
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 24 * MiB, S1, 0, G, &b, NULL), GM_OK);
    FREE(&fx, a); /* a hole of 12 wholly free granules before b */
    tdev_counters_t c0 = fx_counters(&fx);
    long syncs = tdev_sync_calls(fx.dev);
    size_t reserved = fx_reserved(&fx);
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 48 * MiB, S1, 0, G, &c, NULL), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    tdev_counters_t c1 = fx_counters(&fx);
    CHECK_EQ(c1.calls[TDEV_FN_UNMAP], c0.calls[TDEV_FN_UNMAP]);
    CHECK_EQ(c1.calls[TDEV_FN_SEG_FREE], c0.calls[TDEV_FN_SEG_FREE]);
    CHECK_EQ(tdev_sync_calls(fx.dev), syncs);
    CHECK_EQ(fx_reserved(&fx), reserved + 48 * MiB); /* grown, nothing recycled */
    CHECK_EQ(tdev_capture_end(fx.dev, S1), 0);       /* not invalidated */
    CHECK_EQ(gm_alloc_pool_end(fx.a, G), GM_OK);

    FREE(&fx, b);
    FREE(&fx, c);
    CHECK_EQ(gm_alloc_pool_release(fx.a, G), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

/* Growth that free granules in holes cannot cover alone recycles none of
 * them, so each hole keeps the size it was freed with and the next request
 * of that size lands in it, as in torch (which unmaps only on empty_cache
 * and the out-of-memory retry). Unmapping the one whole granule of a 4 MiB
 * hole here sent the next 4 MiB request into a 16 MiB hole instead, and
 * torchtitan's Llama 3.1 8B reserved 48 MiB more than under torch. */
TEST(expandable_partial_recycling_keeps_holes_whole) {
    gm_settings_t st = expandable();
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 3 * MiB, S1); /* later blocks start 1 MiB into a granule */
    uintptr_t b = MALLOC(&fx, 4 * MiB, S1);
    uintptr_t c = MALLOC(&fx, 8 * MiB, S1);
    CHECK_EQ(b, a + 3 * MiB);
    FREE(&fx, b); /* a 4 MiB hole holding one whole granule */
    long unmaps = fx_counters(&fx).calls[TDEV_FN_UNMAP];
    uintptr_t d = MALLOC(&fx, 64 * MiB, S1);  /* grows by 32 granules */
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_UNMAP], unmaps);
    uintptr_t e = MALLOC(&fx, 16 * MiB, S1);
    FREE(&fx, e); /* 16 MiB free at the end */
    size_t reserved = fx_reserved(&fx);
    uintptr_t g = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(g, b); /* best fit: b's hole, not e's */
    CHECK_EQ(fx_reserved(&fx), reserved);
    FREE(&fx, a);
    FREE(&fx, c);
    FREE(&fx, d);
    FREE(&fx, g);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}
