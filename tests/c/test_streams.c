/*
 * test_streams.c - per-stream free lists, record_stream and events.
 *
 * Torch's rules: a block freed on stream A is only reused by allocations on
 * A. record_stream(ptr, B) with B != the block's stream makes free() record
 * an event on B and keep the block "active_pending_free" until the event
 * completes (process_events, run at the start of every malloc). Uses on
 * the allocation stream itself are ignored. empty_cache and the OOM retry
 * path synchronize outstanding events first.
 */
#include "helpers.h"

static int block_state(fx_t *fx, uintptr_t p) {
    walk_t w;
    walk_collect(fx, &w);
    const gm_block_info_t *b = walk_block(&w, p, NULL);
    int st = b ? b->state : -1;
    walk_free(&w);
    return st;
}

TEST(free_lists_are_per_stream) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    uintptr_t p1 = MALLOC(&fx, 1000, S1);
    FREE(&fx, p1);
    uintptr_t p2 = MALLOC(&fx, 1000, S2);
    CHECK_NE(p2, p1);
    /* one segment (plain) or one reserved range (expandable) per stream */
    if (fx.settings.expandable_segments)
        CHECK_EQ(fx_counters(&fx).live_reservations, 2);
    else
        CHECK_EQ(fx_stats(&fx).segment[GM_STAT_SMALL].current, 2);
    uintptr_t p3 = MALLOC(&fx, 1000, S1);
    CHECK_EQ(p3, p1);
    /* the same for the large pool */
    uintptr_t l1 = MALLOC(&fx, 4 * MiB, S1);
    FREE(&fx, l1);
    uintptr_t l2 = MALLOC(&fx, 4 * MiB, S2);
    CHECK_NE(l2, l1);
    if (fx.settings.expandable_segments)
        CHECK_EQ(fx_counters(&fx).live_reservations, 4);
    else
        CHECK_EQ(fx_stats(&fx).segment[GM_STAT_LARGE].current, 2);
    uintptr_t l3 = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(l3, l1);
    walk_t w;
    walk_collect(&fx, &w);
    const walk_seg_t *seg = walk_segment(&w, l2);
    CHECK(seg != NULL);
    if (seg)
        CHECK_EQ(seg->info.stream, S2);
    seg = walk_segment(&w, p1);
    CHECK(seg != NULL);
    if (seg) {
        CHECK_EQ(seg->info.stream, S1);
        CHECK_EQ(seg->info.is_small, 1);
    }
    walk_free(&w);
    FREE(&fx, p2);
    FREE(&fx, p3);
    FREE(&fx, l2);
    FREE(&fx, l3);
    fx_close(&fx);
}

TEST(record_stream_defers_reuse_until_events_complete) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0);
    trace_clear(&fx);
    FREE(&fx, p);
    CHECK(trace_find(&fx, GM_ACT_FREE_REQUESTED, p) >= 0);
    CHECK_EQ(trace_find(&fx, GM_ACT_FREE_COMPLETED, p), -1);
    CHECK_GE(fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD], 1);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_ACTIVE_PENDING_FREE);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.active[GM_STAT_ALL].current, 1);
    CHECK_EQ(s.active_bytes[GM_STAT_ALL].current, 1024);
    CHECK_EQ(s.requested_bytes[GM_STAT_ALL].current, 1000); /* until free_block */
    /* the block is not handed out again, even on its own stream */
    uintptr_t q = MALLOC(&fx, 1000, S1);
    CHECK_NE(q, p);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_ACTIVE_PENDING_FREE);
    uintptr_t r = MALLOC(&fx, 1000, S1);
    CHECK_NE(r, p);
    CHECK_ALLOC(&fx);
    /* complete the events: the next poll frees the block */
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    int i = trace_find(&fx, GM_ACT_FREE_COMPLETED, p);
    CHECK(i >= 0);
    if (i >= 0) {
        CHECK_EQ(fx.trace->ev[i].size, 1000);
        CHECK_EQ(fx.trace->ev[i].stream, S1);
    }
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_INACTIVE);
    s = fx_stats(&fx);
    CHECK_EQ(s.active[GM_STAT_ALL].current, 2);
    CHECK_EQ(s.requested_bytes[GM_STAT_ALL].current, 2000);
    uintptr_t t = MALLOC(&fx, 1000, S1);
    CHECK_EQ(t, p);
    FREE(&fx, q);
    FREE(&fx, r);
    FREE(&fx, t);
    fx_close(&fx);
}

TEST(record_stream_on_own_stream_is_ignored) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S1), 0);
    trace_clear(&fx);
    FREE(&fx, p);
    CHECK(trace_find(&fx, GM_ACT_FREE_COMPLETED, p) >= 0);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD], 0);
    CHECK_EQ(fx_stats(&fx).active[GM_STAT_ALL].current, 0);
    uintptr_t q = MALLOC(&fx, 1000, S1);
    CHECK_EQ(q, p);
    FREE(&fx, q);
    fx_close(&fx);
}

TEST(record_stream_several_streams) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 8 * MiB, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S3), 0);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0); /* a repeat is harmless */
    FREE(&fx, p);
    CHECK_GE(fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD], 2);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_ACTIVE_PENDING_FREE);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_INACTIVE);
    CHECK_EQ(fx_stats(&fx).active_bytes[GM_STAT_ALL].current, 0);
    fx_close(&fx);
}

TEST(events_after_n_queries) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_AFTER_N);
    cfg.event_after_n = 3;
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0);
    FREE(&fx, p);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_ACTIVE_PENDING_FREE);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_ACTIVE_PENDING_FREE); /* 1 query < 3 */
    int polls = 1;
    while (block_state(&fx, p) != GM_BLOCK_INACTIVE && polls < 10) {
        CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
        polls++;
    }
    CHECK_EQ(block_state(&fx, p), GM_BLOCK_INACTIVE);
    CHECK_GE(polls, 2);
    CHECK_LE(polls, 5);
    CHECK_GE(fx_counters(&fx).calls[TDEV_FN_EVENT_QUERY], 2);
    uintptr_t q = MALLOC(&fx, 1000, S1);
    CHECK_EQ(q, p);
    FREE(&fx, q);
    /* the mode can be changed at run time */
    fx_set_event_mode(&fx, TDEV_EVENTS_IMMEDIATE, 0);
    uintptr_t r = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, r, S3), 0);
    FREE(&fx, r);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    CHECK_EQ(block_state(&fx, r), GM_BLOCK_INACTIVE);
    fx_close(&fx);
}

TEST(pending_block_is_not_coalesced) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t a = MALLOC(&fx, 1000, S1);
    uintptr_t b = MALLOC(&fx, 1000, S1);
    uintptr_t c = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, b, S2), 0);
    FREE(&fx, b);
    FREE(&fx, a);
    FREE(&fx, c);
    walk_t w;
    walk_collect(&fx, &w);
    const gm_block_info_t *ba = walk_block(&w, a, NULL);
    const gm_block_info_t *bb = walk_block(&w, b, NULL);
    const gm_block_info_t *bc = walk_block(&w, c, NULL);
    CHECK(ba && bb && bc);
    if (ba && bb && bc) {
        CHECK_EQ(ba->state, GM_BLOCK_INACTIVE);
        CHECK_EQ(ba->size, 1024);
        CHECK_EQ(bb->state, GM_BLOCK_ACTIVE_PENDING_FREE);
        CHECK_EQ(bc->state, GM_BLOCK_INACTIVE);
        CHECK_EQ(bc->size, 2 * MiB - 2048); /* merged with the tail */
    }
    walk_free(&w);
    CHECK_ALLOC(&fx);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 1);
    if (w.nsegs == 1)
        CHECK_EQ(w.segs[0].info.nblocks, 1);
    walk_free(&w);
    fx_close(&fx);
}

TEST(empty_cache_waits_for_events) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0);
    FREE(&fx, p);
    trace_clear(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    int fc = trace_find(&fx, GM_ACT_FREE_COMPLETED, p);
    /* the segment is freed (plain) or its granules unmapped (expandable) */
    int sf = trace_find(&fx, fx.settings.expandable_segments ? GM_ACT_SEGMENT_UNMAP
                                                             : GM_ACT_SEGMENT_FREE, p);
    CHECK(fc >= 0);
    CHECK(sf >= 0);
    CHECK_LT(fc, sf);
    CHECK_EQ(fx_counters(&fx).bytes_allocated, 0);
    CHECK_EQ(fx_counters(&fx).bytes_mapped, 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

TEST(oom_retry_synchronizes_pending_frees) {
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 40 * MiB, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S2), 0);
    FREE(&fx, p);
    /* 40 MiB more does not fit beside the pending block; the retry path
     * waits for its events, releases it and succeeds. */
    uintptr_t q = MALLOC(&fx, 40 * MiB, S1);
    CHECK(q != 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.num_alloc_retries, 1);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 40 * MiB);
    CHECK_EQ(s.active[GM_STAT_ALL].current, 1);
    FREE(&fx, q);
    fx_close(&fx);
}

TEST(record_stream_unknown_pointer) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_record_stream(fx.a, (uintptr_t)0xdead000, S2), GM_ENOTFOUND);
    uintptr_t p = MALLOC(&fx, 4096, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p + 512, S2), GM_ENOTFOUND);
    FREE(&fx, p);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}
