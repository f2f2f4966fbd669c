/*
 * test_uncached.c - caching turned off (torch's caching_allocator_enable(
 * False), PYTORCH_NO_CUDA_MEMORY_CACHING), and the edges of the memory
 * fraction (0 bytes allowed, the whole device meaning no limit).
 *
 * With caching off every request gets a plain segment of its own rounded
 * size, nothing cached is reused, and memory goes back to the device as
 * soon as its segment is wholly free (also when a pending free completes
 * later); every step goes through the ordinary transitions, so the stats
 * and the trace stay consistent. Turning caching on again restores the
 * ordinary policy.
 */
#include <string.h>

#include "helpers.h"

TEST(uncached_frees_go_back_to_the_device) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_caching(fx.a), 1);
    gm_alloc_set_caching(fx.a, 0);
    CHECK_EQ(gm_alloc_caching(fx.a), 0);
    size_t free0 = fx_device_free(&fx);
    uintptr_t a = MALLOC(&fx, 40 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 1000, S1);       /* small: a 1 KiB segment, not 2 MiB */
    uintptr_t c = MALLOC(&fx, 5 * MiB, S1);    /* not a 20 MiB one */
    CHECK_EQ(fx_reserved(&fx), 40 * MiB + 1024 + 5 * MiB);
    CHECK_EQ(free0 - fx_device_free(&fx), 40 * MiB + 1024 + 5 * MiB);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.segment[GM_STAT_ALL].current, 3);
    CHECK_EQ(s.segment[GM_STAT_SMALL].current, 1);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].current, 40 * MiB + 1024 + 5 * MiB);
    trace_clear(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    CHECK_EQ(fx_reserved(&fx), 5 * MiB);
    CHECK_EQ(trace_count(&fx, GM_ACT_FREE_COMPLETED), 2);
    CHECK_EQ(trace_count(&fx, GM_ACT_SEGMENT_FREE), 2);
    FREE(&fx, c);
    s = fx_stats(&fx);
    CHECK_EQ(fx_device_free(&fx), free0);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.segment[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.num_device_alloc, s.num_device_free);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(uncached_reuses_nothing_and_caching_comes_back) {
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t keep = MALLOC(&fx, 4 * MiB, S1);  /* a 20 MiB segment, 16 MiB free in it */
    uintptr_t cached = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, cached);                          /* cached while caching is on */
    gm_alloc_set_caching(fx.a, 0);
    uintptr_t x = MALLOC(&fx, 4 * MiB, S1);     /* not the free 16 MiB next to `keep` */
    CHECK(x < keep || x >= keep + 20 * MiB);
    CHECK_EQ(fx_block_size(&fx, x), 4 * MiB);
    /* the segment cached before caching went off was released on the way */
    CHECK_EQ(fx_reserved(&fx), 20 * MiB + 4 * MiB);
    FREE(&fx, x);
    FREE(&fx, keep);                            /* its 20 MiB segment is whole again: released */
    CHECK_EQ(fx_reserved(&fx), 0);
    gm_alloc_set_caching(fx.a, 1);
    uintptr_t y = MALLOC(&fx, 4 * MiB, S1);
    FREE(&fx, y);
    CHECK_EQ(fx_reserved(&fx), 20 * MiB);       /* cached again */
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(uncached_pending_free_goes_back_when_its_event_completes) {
    tdev_config_t cfg = dev_cfg(GiB, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    gm_alloc_set_caching(fx.a, 0);
    uintptr_t a = MALLOC(&fx, 8 * MiB, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, a, S2), 0);
    FREE(&fx, a);
    CHECK_EQ(fx_reserved(&fx), 8 * MiB);        /* still in use on S2 */
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(memory_fraction_edges) {
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    size_t limit = 1;
    CHECK_EQ(gm_alloc_get_memory_limit(fx.a, &limit), 0);
    CHECK_EQ(limit, 0);
    /* 0: a limit of 0 bytes, which refuses everything */
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 0.0), 0);
    CHECK_EQ(gm_alloc_get_memory_limit(fx.a, &limit), 1);
    CHECK_EQ(limit, 0);
    gm_oom_info_t oom;
    uintptr_t p = 0;
    memset(&oom, 0, sizeof oom);
    CHECK_EQ(gm_alloc_malloc(fx.a, 100, S1, 0, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.has_limit, 1);
    CHECK_EQ(oom.limit_hit, 1);
    CHECK_EQ(oom.allowed, 0);
    /* the whole device is no limit at all */
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 1.0), 0);
    CHECK_EQ(gm_alloc_get_memory_limit(fx.a, &limit), 0);
    memset(&oom, 0, sizeof oom);
    CHECK_EQ(gm_alloc_malloc(fx.a, 100 * MiB, S1, 0, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.has_limit, 0);
    CHECK_EQ(oom.limit_hit, 0);
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 0.25), 0);
    CHECK_EQ(gm_alloc_get_memory_limit(fx.a, &limit), 1);
    CHECK_EQ(limit, 16 * MiB);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}
