/*
 * test_uncached.c - caching turned off (torch's caching_allocator_enable(
 * False), PYTORCH_NO_CUDA_MEMORY_CACHING), and the edges of the memory
 * fraction (0 bytes allowed, the whole device meaning no limit).
 *
 * With caching off every request gets a plain segment of its own rounded
 * size from the uncached pool, nothing cached is reused, and the memory
 * goes back to the device when freed; as in torch, where that memory goes
 * around the allocator, it changes no statistic, no trace event and no
 * snapshot segment (Note [Caching off] in core/malloc.c). What was
 * allocated while caching was on is cached as usual when freed.
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
    gm_stats_t s0 = fx_stats(&fx);
    trace_clear(&fx);
    uintptr_t a = MALLOC(&fx, 40 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 1000, S1);       /* small: a 1 KiB segment, not 2 MiB */
    uintptr_t c = MALLOC(&fx, 5 * MiB, S1);    /* not a 20 MiB one */
    CHECK_EQ(free0 - fx_device_free(&fx), 40 * MiB + 1024 + 5 * MiB);
    CHECK_EQ(fx_block_size(&fx, b), 1024);
    /* outside the statistics, the trace and the walk, as torch's cudaMalloc */
    gm_stats_t s = fx_stats(&fx);
    CHECK(memcmp(&s, &s0, sizeof s) == 0);
    CHECK_EQ(fx.trace->n, 0);
    walk_t w;
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 0);
    walk_free(&w);
    CHECK_EQ(gm_alloc_record_stream(fx.a, a, S2), 0); /* ignored: the free is synchronous */
    FREE(&fx, a);
    FREE(&fx, b);
    CHECK_EQ(free0 - fx_device_free(&fx), 5 * MiB);
    FREE(&fx, c);
    CHECK_EQ(fx_device_free(&fx), free0);
    s = fx_stats(&fx);
    CHECK(memcmp(&s, &s0, sizeof s) == 0);
    CHECK_EQ(fx.trace->n, 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(uncached_reuses_nothing_and_keeps_what_is_cached) {
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t keep = MALLOC(&fx, 4 * MiB, S1);  /* a 20 MiB segment, 16 MiB free in it */
    uintptr_t cached = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, cached);                          /* cached while caching is on */
    gm_alloc_set_caching(fx.a, 0);
    size_t free0 = fx_device_free(&fx);
    uintptr_t x = MALLOC(&fx, 4 * MiB, S1);     /* not the free 16 MiB next to `keep` */
    CHECK(x < keep || x >= keep + 20 * MiB);
    CHECK_EQ(fx_block_size(&fx, x), 4 * MiB);
    CHECK_EQ(free0 - fx_device_free(&fx), 4 * MiB);
    /* the cache stays as it was, and counted */
    CHECK_EQ(fx_reserved(&fx), 20 * MiB + 30 * MiB);
    CHECK_EQ(fx_allocated(&fx), 4 * MiB);
    FREE(&fx, keep);                            /* allocated while on: cached, as in torch */
    CHECK_EQ(fx_reserved(&fx), 50 * MiB);
    CHECK_EQ(fx_allocated(&fx), 0);
    gm_alloc_set_caching(fx.a, 1);
    FREE(&fx, x);                               /* allocated while off: back to the device */
    CHECK_EQ(fx_device_free(&fx), free0);
    uintptr_t y = MALLOC(&fx, 4 * MiB, S1);
    CHECK(y >= keep && y < keep + 20 * MiB);    /* cached memory reused again */
    FREE(&fx, y);
    CHECK_EQ(fx_reserved(&fx), 50 * MiB);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(uncached_requests_ignore_the_memory_fraction) {
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 0.25), 0);
    gm_alloc_set_caching(fx.a, 0);
    uintptr_t a = MALLOC(&fx, 40 * MiB, S1);     /* over the 16 MiB limit, as cudaMalloc is */
    CHECK_EQ(fx_reserved(&fx), 0);
    FREE(&fx, a);
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
