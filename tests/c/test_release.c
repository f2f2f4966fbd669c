/*
 * test_release.c - empty_cache, memory limits, out-of-memory handling and
 * failure injection.
 *
 * Torch's malloc path: search the pool; else cudaMalloc; else (limit or
 * device refused) free all cached segments and retry once, counting
 * num_alloc_retries; else record an "oom" trace entry, count num_ooms and
 * report requested/rounded/segment size, device total/free, allocated,
 * reserved and reserved-but-unallocated. Errors other than out-of-memory
 * are passed up without a retry. The allocator stays consistent throughout.
 */
#include <string.h>

#include "helpers.h"

static int try_malloc(fx_t *fx, size_t size, uintptr_t stream, uintptr_t *p, gm_oom_info_t *oom) {
    memset(oom, 0, sizeof *oom);
    *p = 0;
    return gm_alloc_malloc(fx->a, size, stream, 0, p, oom);
}

TEST(empty_cache_returns_wholly_free_segments) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t small_used = MALLOC(&fx, 1000, S1);
    uintptr_t small_free = MALLOC(&fx, 1000, S2);   /* own 2 MiB segment */
    uintptr_t big_free = MALLOC(&fx, 30 * MiB, S1); /* own 30 MiB segment */
    uintptr_t part_a = MALLOC(&fx, 4 * MiB, S3);    /* 20 MiB segment ... */
    uintptr_t part_b = MALLOC(&fx, 4 * MiB, S3);    /* ... partly freed */
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 2 * MiB + 2 * MiB + 30 * MiB + 20 * MiB);
    FREE(&fx, small_free);
    FREE(&fx, big_free);
    FREE(&fx, part_b);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 54 * MiB); /* cached, not returned */
    trace_clear(&fx);
    gm_stats_t before = fx_stats(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    gm_stats_t after = fx_stats(&fx);
    tdev_counters_t c = fx_counters(&fx);
    CHECK_EQ(c.bytes_allocated, 2 * MiB + 20 * MiB);
    CHECK_EQ(c.live_segments, 2);
    CHECK_EQ(after.reserved_bytes[GM_STAT_ALL].current, 22 * MiB);
    CHECK_EQ(after.segment[GM_STAT_ALL].current, 2);
    CHECK_EQ(after.num_device_free - before.num_device_free, 2);
    CHECK_EQ(trace_count(&fx, GM_ACT_SEGMENT_FREE), 2);
    int i = trace_find(&fx, GM_ACT_SEGMENT_FREE, big_free);
    CHECK(i >= 0);
    if (i >= 0)
        CHECK_EQ(fx.trace->ev[i].size, 30 * MiB);
    CHECK(trace_find(&fx, GM_ACT_SEGMENT_FREE, small_free) >= 0);
    /* the partly used segment still works */
    uintptr_t again = MALLOC(&fx, 4 * MiB, S3);
    CHECK_EQ(again, part_b);
    /* a second empty_cache with nothing cached changes nothing */
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 22 * MiB);
    FREE(&fx, again);
    FREE(&fx, part_a);
    FREE(&fx, small_used);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    c = fx_counters(&fx);
    CHECK_EQ(c.bytes_allocated, 0);
    CHECK_EQ(c.live_segments, 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

TEST(memory_fraction_limits_reserved) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    CHECK_EQ(gm_alloc_memory_limit(fx.a), 0);
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 0.5), 0);
    CHECK_EQ(gm_alloc_memory_limit(fx.a), 32 * MiB);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    uintptr_t p;
    gm_oom_info_t oom;
    /* 4 MiB needs a 20 MiB segment: 30 + 20 > 32 */
    CHECK_EQ(try_malloc(&fx, 4 * MiB, S1, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.limit_hit, 1);
    CHECK_EQ(oom.allowed, 32 * MiB);
    CHECK_EQ(oom.requested, 4 * MiB);
    CHECK_EQ(oom.rounded, 4 * MiB);
    CHECK_EQ(oom.alloc_size, 20 * MiB);
    CHECK_EQ(oom.reserved, 30 * MiB);
    CHECK_EQ(oom.allocated, 30 * MiB);
    CHECK_EQ(oom.device_total, 64 * MiB);
    CHECK_EQ(oom.device_free, 34 * MiB);
    CHECK_EQ(fx_stats(&fx).num_ooms, 1);
    /* a 2 MiB small segment reaches the limit exactly, which is allowed */
    uintptr_t b = MALLOC(&fx, 1000, S1);
    CHECK_EQ(fx_reserved(&fx), 32 * MiB);
    CHECK_EQ(try_malloc(&fx, 1 * MiB, S2, &p, &oom), GM_EOOM); /* 34 > 32 */
    CHECK_EQ(oom.limit_hit, 1);
    /* lifting the limit */
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 0), 0);
    CHECK_EQ(gm_alloc_memory_limit(fx.a), 0);
    uintptr_t c = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(fx_reserved(&fx), 52 * MiB);
    /* bad fractions are refused and leave the limit alone */
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 1.5), GM_EINVAL);
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, -0.1), GM_EINVAL);
    CHECK_EQ(gm_alloc_memory_limit(fx.a), 0);
    CHECK_ALLOC(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    fx_close(&fx);
}

TEST(memory_limit_releases_cache_then_retries) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 40 * MiB), 0);
    CHECK_EQ(gm_alloc_memory_limit(fx.a), 40 * MiB);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, a);
    /* 36 MiB: the cached 30 MiB segment is too small, 30 + 36 > 40; the
     * retry after releasing the cache fits. */
    uintptr_t b = MALLOC(&fx, 36 * MiB, S1);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 1);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 36 * MiB);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 36 * MiB);
    /* lowering the limit below what is reserved keeps live memory */
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 10 * MiB), 0);
    uintptr_t p;
    gm_oom_info_t oom;
    CHECK_EQ(try_malloc(&fx, 1000, S1, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.limit_hit, 1);
    CHECK_EQ(oom.allowed, 10 * MiB);
    CHECK_EQ(fx_reserved(&fx), 36 * MiB);
    FREE(&fx, b);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(oom_frees_cache_and_retries) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 30 * MiB, S1);
    FREE(&fx, a);
    trace_clear(&fx);
    /* 40 MiB: the device has 34 MiB free; releasing the cached 30 MiB
     * segment makes room. */
    uintptr_t b = MALLOC(&fx, 40 * MiB, S1);
    CHECK(b != 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 1);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.num_device_free, 1);
    CHECK_EQ(s.num_device_alloc, 2);
    int sf = trace_find(&fx, GM_ACT_SEGMENT_FREE, a);
    int sa = trace_find(&fx, GM_ACT_SEGMENT_ALLOC, b);
    CHECK(sf >= 0 && sa > sf);
    CHECK_EQ(trace_count(&fx, GM_ACT_OOM), 0);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 40 * MiB);
    FREE(&fx, b);
    fx_close(&fx);
}

TEST(oom_reports_details_and_stays_usable) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    uintptr_t small = MALLOC(&fx, 4 * MiB, S1); /* 20 MiB segment, 16 MiB unused */
    uintptr_t big = MALLOC(&fx, 40 * MiB, S1);  /* 40 MiB segment */
    uintptr_t cached = MALLOC(&fx, 1000, S2);   /* a 2 MiB segment, freed: cached */
    FREE(&fx, cached);
    CHECK_EQ(fx_reserved(&fx), 62 * MiB);
    trace_clear(&fx);
    uintptr_t p = 0;
    gm_oom_info_t oom;
    /* 17 MiB does not fit the 16 MiB left in small's segment */
    int rc = try_malloc(&fx, 17 * MiB + 1, S1, &p, &oom);
    CHECK_EQ(rc, GM_EOOM);
    CHECK_EQ(p, 0);
    CHECK_EQ(oom.requested, 17 * MiB + 1);
    CHECK_EQ(oom.rounded, 17 * MiB + 512);
    CHECK_EQ(oom.alloc_size, 18 * MiB);
    CHECK_EQ(oom.device_total, 64 * MiB);
    CHECK_EQ(oom.device_free, 4 * MiB); /* after the cached segment went back */
    CHECK_EQ(oom.allocated, 44 * MiB);
    CHECK_EQ(oom.reserved, 60 * MiB);
    CHECK_EQ(oom.reserved_unallocated, 16 * MiB);
    CHECK_EQ(oom.limit_hit, 0);
    CHECK_EQ(oom.allowed, 0);
    CHECK_EQ(oom.device_free, fx_device_free(&fx));
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_ooms, 1);
    CHECK_EQ(s.num_alloc_retries, 1);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 60 * MiB);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 2);
    int i = trace_find(&fx, GM_ACT_OOM, TRACE_ANY);
    CHECK(i >= 0);
    if (i >= 0) {
        CHECK_EQ(fx.trace->ev[i].addr, 4 * MiB); /* device free bytes */
        CHECK_EQ(fx.trace->ev[i].size, 17 * MiB + 512);
        CHECK_EQ(fx.trace->ev[i].stream, S1);
    }
    CHECK(trace_find(&fx, GM_ACT_SEGMENT_FREE, cached) >= 0);
    CHECK_ALLOC(&fx);
    /* still usable: what fits still works, and freeing makes room */
    uintptr_t q = MALLOC(&fx, 8 * MiB, S1); /* from the 16 MiB left in small's segment */
    CHECK_EQ(q, small + 4 * MiB);
    FREE(&fx, big);
    uintptr_t r = MALLOC(&fx, 17 * MiB + 1, S1); /* reuses big's 40 MiB block */
    CHECK_EQ(r, big);
    CHECK_EQ(fx_stats(&fx).num_ooms, 1);
    FREE(&fx, q);
    FREE(&fx, r);
    FREE(&fx, small);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(oom_request_larger_than_device) {
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p;
    gm_oom_info_t oom;
    CHECK_EQ(try_malloc(&fx, 65 * MiB, S1, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.alloc_size, 66 * MiB);
    CHECK_EQ(oom.device_free, 64 * MiB);
    CHECK_EQ(oom.reserved, 0);
    /* the oom pointer is optional */
    CHECK_EQ(gm_alloc_malloc(fx.a, (size_t)1 << 40, S1, 0, &p, NULL), GM_EOOM);
    CHECK_EQ(fx_stats(&fx).num_ooms, 2);
    uintptr_t q = MALLOC(&fx, 64 * MiB, S1);
    FREE(&fx, q);
    fx_close(&fx);
}

TEST(fail_nth_seg_alloc_with_oom_retries) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_IMMEDIATE);
    cfg.fail_fn = TDEV_FN_SEG_ALLOC;
    cfg.fail_nth = 2;
    cfg.fail_code = GM_EOOM;
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 1000, S1);     /* call 1 */
    uintptr_t b = MALLOC(&fx, 4 * MiB, S1);  /* call 2 fails, call 3 succeeds */
    CHECK(b != 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 1);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 3);
    CHECK_ALLOC(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    fx_close(&fx);
}

TEST(fail_nth_seg_alloc_with_device_error_propagates) {
    /* plain segments: about segment sizes and seg_alloc/seg_free calls */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_IMMEDIATE);
    cfg.fail_fn = TDEV_FN_SEG_ALLOC;
    cfg.fail_nth = 2;
    cfg.fail_code = GM_EDEVICE;
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 1000, S1);
    uintptr_t p = 0;
    gm_oom_info_t oom;
    CHECK_EQ(try_malloc(&fx, 4 * MiB, S1, &p, &oom), GM_EDEVICE);
    CHECK_EQ(p, 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 0);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 1);
    CHECK_EQ(s.segment[GM_STAT_ALL].current, 1);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 2);
    CHECK_EQ(trace_count(&fx, GM_ACT_OOM), 0);
    CHECK_ALLOC(&fx);
    /* the next call goes through */
    uintptr_t b = MALLOC(&fx, 4 * MiB, S1);
    CHECK(b != 0);
    FREE(&fx, a);
    FREE(&fx, b);
    fx_close(&fx);
}

TEST(failure_injection_at_run_time) {
    SKIP_IF(fx_on_cuda() && fx_expandable_default,
            "fail_above refuses one device allocation above a size; the CUDA backend maps "
            "expandable segments one granule-sized cuMemCreate at a time, so no call is large");
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    /* fail_above: any segment over 100 MiB is refused as out of memory */
    fx_set_failure(&fx, -1, 0, GM_EOOM, 100 * MiB);
    uintptr_t p;
    gm_oom_info_t oom;
    CHECK_EQ(try_malloc(&fx, 200 * MiB, S1, &p, &oom), GM_EOOM);
    CHECK_EQ(oom.limit_hit, 0);
    CHECK_EQ(oom.alloc_size, 200 * MiB);
    uintptr_t a = MALLOC(&fx, 100 * MiB, S1);
    fx_set_failure(&fx, -1, 0, GM_EOOM, 0);
    uintptr_t b = MALLOC(&fx, 200 * MiB, S1);
    CHECK_EQ(fx_stats(&fx).num_ooms, 1);
    FREE(&fx, a);
    FREE(&fx, b);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(failing_seg_free_and_events_keep_state_consistent) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t a = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, a, S2), 0);
    /* the event record of this free fails: whatever free returns, the
     * allocator must stay consistent and clean up on destroy */
    /* (a failure set at run time counts calls from then on) */
    fx_set_failure(&fx, TDEV_FN_EVENT_RECORD, 1, GM_EDEVICE, 0);
    int rc = gm_alloc_free(fx.a, a, 0);
    CHECK(rc == 0 || rc == GM_EDEVICE);
    CHECK_ALLOC(&fx);
    fx_set_failure(&fx, -1, 0, GM_EOOM, 0);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_ALLOC(&fx);
    /* a failing seg_free during empty_cache is reported, not fatal */
    uintptr_t b = MALLOC(&fx, 30 * MiB, S3);
    FREE(&fx, b);
    fx_set_failure(&fx, TDEV_FN_SEG_FREE, 1, GM_EDEVICE, 0);
    rc = gm_alloc_empty_cache(fx.a, 0);
    CHECK(rc == 0 || rc == GM_EDEVICE);
    CHECK_ALLOC(&fx);
    fx_set_failure(&fx, -1, 0, GM_EOOM, 0);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

/* garbage_collection_threshold (only with a memory limit): before asking
 * the device, cached unsplit large blocks are released until reserved
 * memory is back under threshold x limit, so no OOM retry is needed. */
static void gc_case(double threshold, int expect_retries) {
    tdev_config_t cfg = dev_cfg(1024 * MiB, TDEV_EVENTS_IMMEDIATE);
    /* plain segments: with expandable ones the four freed 100 MiB blocks
     * coalesce into one free range that serves 120 MiB without any release */
    gm_settings_t st = settings_with(0);
    st.garbage_collection_threshold = threshold;
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    CHECK_EQ(gm_alloc_set_memory_fraction(fx.a, 0.5), 0); /* 512 MiB allowed */
    uintptr_t p[4];
    for (int i = 0; i < 4; i++)
        p[i] = MALLOC(&fx, 100 * MiB, S1);
    for (int i = 0; i < 4; i++)
        FREE(&fx, p[i]);
    CHECK_EQ(fx_reserved(&fx), 400 * MiB);
    /* 120 MiB fits no cached block; 400 + 120 > 512 */
    uintptr_t q = MALLOC(&fx, 120 * MiB, S1);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, expect_retries);
    CHECK_EQ(s.num_ooms, 0);
    if (threshold > 0) /* at least 400 - 256 MiB went back before the device call */
        CHECK_LE(fx_reserved(&fx), 400 * MiB - 144 * MiB + 120 * MiB);
    else
        CHECK_EQ(fx_reserved(&fx), 120 * MiB); /* the retry released everything */
    FREE(&fx, q);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(garbage_collection_threshold_avoids_retry) { gc_case(0.5, 0); }
TEST(without_garbage_collection_the_retry_releases_all) { gc_case(0.0, 1); }
