/*
 * test_walk_trace.c - gm_alloc_walk (segments in address order, blocks
 * tiling each segment, states, sums) and the trace hook (every action with
 * torch's addr/size meaning: alloc and free_* carry the requested size,
 * segment_* the segment size, oom the device free bytes and rounded size).
 */
#include <string.h>

#include "helpers.h"

TEST(walk_lists_segments_and_blocks) {
    /* plain segments: about segment layout and segment_* trace events */
    gm_settings_t plain = settings_with(0);
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &plain) == 0);
    uintptr_t a = 0;
    CHECK_EQ(gm_alloc_malloc(fx.a, 1000, S1, 7, &a, NULL), 0); /* ctx 7 */
    uintptr_t b = MALLOC(&fx, 3000, S1);
    uintptr_t c = MALLOC(&fx, 5000, S1);
    uintptr_t l = MALLOC(&fx, 6 * MiB + 100, S2);
    uintptr_t h = MALLOC(&fx, 30 * MiB, S3);
    CHECK_EQ(gm_alloc_record_stream(fx.a, b, S2), 0);
    FREE(&fx, b); /* pending */
    walk_t w;
    walk_collect(&fx, &w); /* also checks tiling, order and sums */
    CHECK_EQ(w.nsegs, 3);
    const walk_seg_t *ss = walk_segment(&w, a);
    const walk_seg_t *ls = walk_segment(&w, l);
    const walk_seg_t *hs = walk_segment(&w, h);
    REQUIRE(ss && ls && hs);
    CHECK_EQ(ss->info.address, a);
    CHECK_EQ(ss->info.total_size, 2 * MiB);
    CHECK_EQ(ss->info.is_small, 1);
    CHECK_EQ(ss->info.is_expandable, 0);
    CHECK_EQ(ss->info.stream, S1);
    CHECK_EQ(ss->info.ctx, 7);
    CHECK_EQ(ss->info.nblocks, 4);
    CHECK_EQ(ss->info.allocated_size, 1024 + 5120);
    CHECK_EQ(ss->info.active_size, 1024 + 3072 + 5120);
    CHECK_EQ(ss->info.requested_size, 1000 + 3000 + 5000);
    if (ss->info.nblocks == 4) {
        const gm_block_info_t *bl = ss->blocks;
        CHECK_EQ(bl[0].address, a);
        CHECK_EQ(bl[0].size, 1024);
        CHECK_EQ(bl[0].requested_size, 1000);
        CHECK_EQ(bl[0].state, GM_BLOCK_ACTIVE_ALLOCATED);
        CHECK_EQ(bl[0].ctx, 7);
        CHECK_EQ(bl[1].address, b);
        CHECK_EQ(bl[1].state, GM_BLOCK_ACTIVE_PENDING_FREE);
        CHECK_EQ(bl[1].requested_size, 3000);
        CHECK_EQ(bl[2].address, c);
        CHECK_EQ(bl[2].state, GM_BLOCK_ACTIVE_ALLOCATED);
        CHECK_EQ(bl[3].state, GM_BLOCK_INACTIVE);
        CHECK_EQ(bl[3].size, 2 * MiB - 1024 - 3072 - 5120);
    }
    CHECK_EQ(ls->info.total_size, 20 * MiB);
    CHECK_EQ(ls->info.is_small, 0);
    CHECK_EQ(ls->info.stream, S2);
    CHECK_EQ(ls->info.nblocks, 2);
    CHECK_EQ(ls->info.allocated_size, 6 * MiB + 512);
    CHECK_EQ(ls->info.requested_size, 6 * MiB + 100);
    CHECK_EQ(hs->info.total_size, 30 * MiB);
    CHECK_EQ(hs->info.nblocks, 1);
    CHECK_EQ(hs->info.allocated_size, 30 * MiB);
    walk_free(&w);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    FREE(&fx, a);
    FREE(&fx, c);
    FREE(&fx, l);
    FREE(&fx, h);
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 3);
    for (size_t i = 0; i < w.nsegs; i++) {
        CHECK_EQ(w.segs[i].info.nblocks, 1);
        CHECK_EQ(w.segs[i].info.allocated_size, 0);
        CHECK_EQ(w.segs[i].info.active_size, 0);
        CHECK_EQ(w.segs[i].info.requested_size, 0);
    }
    walk_free(&w);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 0);
    walk_free(&w);
    fx_close(&fx);
}

static int stop_after_first(void *arg, const gm_segment_info_t *seg) {
    (*(int *)arg)++;
    return 7;
}

TEST(walk_stops_early_and_orders_many_segments) {
    /* plain segments: about segment layout and segment_* trace events */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p[40];
    for (int i = 0; i < 40; i++) /* mixed sizes and streams, out of order */
        p[i] = MALLOC(&fx, (size_t)((i * 7919) % 23 + 1) * MiB, FX_STREAM(4 + i % 3));
    for (int i = 0; i < 40; i += 3)
        FREE(&fx, p[i]);
    int calls = 0;
    CHECK_EQ(gm_alloc_walk(fx.a, stop_after_first, &calls), 7);
    CHECK_EQ(calls, 1);
    walk_t w;
    walk_collect(&fx, &w);
    size_t reserved = 0, allocated = 0;
    for (size_t i = 0; i < w.nsegs; i++) {
        reserved += w.segs[i].info.total_size;
        allocated += w.segs[i].info.allocated_size;
    }
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(reserved, s.reserved_bytes[GM_STAT_ALL].current);
    CHECK_EQ(allocated, s.allocated_bytes[GM_STAT_ALL].current);
    CHECK_EQ(w.nsegs, s.segment[GM_STAT_ALL].current);
    walk_free(&w);
    for (int i = 0; i < 40; i++)
        if (i % 3)
            FREE(&fx, p[i]);
    fx_close(&fx);
}

TEST(trace_hook_events) {
    /* plain segments: about segment layout and segment_* trace events */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    trace_clear(&fx);
    uintptr_t p = 0;
    CHECK_EQ(gm_alloc_malloc(fx.a, 1000, S1, 11, &p, NULL), 0);
    REQUIRE(fx.trace->n == 2);
    trace_ev_t *e = fx.trace->ev;
    CHECK_EQ(e[0].action, GM_ACT_SEGMENT_ALLOC);
    CHECK_EQ(e[0].addr, p);
    CHECK_EQ(e[0].size, 2 * MiB);
    CHECK_EQ(e[0].stream, S1);
    CHECK_EQ(e[0].ctx, 11);
    CHECK_EQ(e[0].device, 0);
    CHECK_EQ(e[1].action, GM_ACT_ALLOC);
    CHECK_EQ(e[1].addr, p);
    CHECK_EQ(e[1].size, 1000); /* the requested size */
    CHECK_EQ(e[1].stream, S1);
    CHECK_EQ(e[1].ctx, 11);
    trace_clear(&fx);
    CHECK_EQ(gm_alloc_free(fx.a, p, 12), 0);
    REQUIRE(fx.trace->n == 2);
    CHECK_EQ(e[0].action, GM_ACT_FREE_REQUESTED);
    CHECK_EQ(e[0].addr, p);
    CHECK_EQ(e[0].size, 1000);
    CHECK_EQ(e[0].stream, S1);
    CHECK_EQ(e[1].action, GM_ACT_FREE_COMPLETED);
    CHECK_EQ(e[1].addr, p);
    CHECK_EQ(e[1].size, 1000);
    trace_clear(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 13), 0);
    REQUIRE(fx.trace->n == 1);
    CHECK_EQ(e[0].action, GM_ACT_SEGMENT_FREE);
    CHECK_EQ(e[0].addr, p);
    CHECK_EQ(e[0].size, 2 * MiB);
    CHECK_EQ(e[0].stream, S1);
    /* oom: addr is the device's free bytes, size the rounded request */
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 8 * MiB), 0);
    trace_clear(&fx);
    uintptr_t q = 0;
    CHECK_EQ(gm_alloc_malloc(fx.a, 9 * MiB + 1, S2, 14, &q, NULL), GM_EOOM);
    int i = trace_find(&fx, GM_ACT_OOM, TRACE_ANY);
    CHECK(i >= 0);
    if (i >= 0) {
        CHECK_EQ(e[i].addr, fx_device_free(&fx));
        CHECK_EQ(e[i].size, 9 * MiB + 512);
        CHECK_EQ(e[i].stream, S2);
    }
    CHECK_EQ(trace_count(&fx, GM_ACT_ALLOC), 0);
    /* removing the hook stops the events */
    gm_alloc_set_trace_hook(fx.a, NULL, NULL);
    CHECK_EQ(gm_alloc_set_memory_limit(fx.a, 0), 0);
    trace_clear(&fx);
    uintptr_t r = MALLOC(&fx, 1000, S1);
    FREE(&fx, r);
    CHECK_EQ(fx.trace->n, 0);
    fx_close(&fx);
}

TEST(trace_split_blocks_report_their_own_sizes) {
    /* plain segments: about segment layout and segment_* trace events */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t a = MALLOC(&fx, 3 * MiB, S1);
    trace_clear(&fx);
    uintptr_t b = MALLOC(&fx, 5 * MiB + 7, S1);
    CHECK_EQ(fx.trace->n, 1); /* no segment_alloc: served from the cache */
    CHECK_EQ(fx.trace->ev[0].action, GM_ACT_ALLOC);
    CHECK_EQ(fx.trace->ev[0].size, 5 * MiB + 7);
    trace_clear(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    CHECK_EQ(trace_count(&fx, GM_ACT_FREE_REQUESTED), 2);
    CHECK_EQ(trace_count(&fx, GM_ACT_FREE_COMPLETED), 2);
    int i = trace_find(&fx, GM_ACT_FREE_COMPLETED, b);
    CHECK(i >= 0);
    if (i >= 0)
        CHECK_EQ(fx.trace->ev[i].size, 5 * MiB + 7);
    fx_close(&fx);
}

TEST(action_names_match_torch) {
    CHECK_STR(gm_action_name(GM_ACT_ALLOC), "alloc");
    CHECK_STR(gm_action_name(GM_ACT_FREE_REQUESTED), "free_requested");
    CHECK_STR(gm_action_name(GM_ACT_FREE_COMPLETED), "free_completed");
    CHECK_STR(gm_action_name(GM_ACT_SEGMENT_ALLOC), "segment_alloc");
    CHECK_STR(gm_action_name(GM_ACT_SEGMENT_FREE), "segment_free");
    CHECK_STR(gm_action_name(GM_ACT_SEGMENT_MAP), "segment_map");
    CHECK_STR(gm_action_name(GM_ACT_SEGMENT_UNMAP), "segment_unmap");
    CHECK_STR(gm_action_name(GM_ACT_SNAPSHOT), "snapshot");
    CHECK_STR(gm_action_name(GM_ACT_OOM), "oom");
    CHECK_STR(gm_action_name(GM_ACT_ANNOTATE), "annotate");
    CHECK(gm_action_name(GM_ACT_COUNT) != NULL);
    CHECK(gm_action_name(-1) != NULL);
}

/* What gm_alloc_free_completes_at_once says during each free_requested. */
typedef struct at_once_log {
    gm_alloc_t *a;
    int n, at_once[4];
    int completed_next; /* the event after each free_requested was its completion */
} at_once_log_t;

static void log_at_once(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                        uintptr_t stream, uint32_t ctx) {
    (void)device, (void)addr, (void)size, (void)stream, (void)ctx;
    at_once_log_t *l = arg;
    if (l->completed_next == -1)
        l->completed_next = action == GM_ACT_FREE_COMPLETED;
    if (action == GM_ACT_FREE_REQUESTED && l->n < 4) {
        l->at_once[l->n++] = gm_alloc_free_completes_at_once(l->a);
        l->completed_next = -1;
    }
}

TEST(trace_tells_a_free_completed_at_once) {
    /* a plain free completes in the same call, with nothing between; one
     * whose block a stream still uses does not */
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    at_once_log_t l = {fx.a, 0, {-1, -1, -1, -1}, 0};
    gm_alloc_set_trace_hook(fx.a, log_at_once, &l);
    uintptr_t p = 0, q = 0;
    CHECK_EQ(gm_alloc_malloc(fx.a, 1000, S1, 0, &p, NULL), 0);
    CHECK_EQ(gm_alloc_free(fx.a, p, 0), 0);
    CHECK_EQ(l.n, 1);
    CHECK_EQ(l.at_once[0], 1);
    CHECK_EQ(l.completed_next, 1);
    CHECK_EQ(gm_alloc_malloc(fx.a, 1000, S1, 0, &q, NULL), 0);
    CHECK_EQ(gm_alloc_record_stream(fx.a, q, S2), 0);
    CHECK_EQ(gm_alloc_free(fx.a, q, 0), 0);
    CHECK_EQ(l.n, 2);
    CHECK_EQ(l.at_once[1], 0);
    CHECK_EQ(l.completed_next, -1); /* nothing followed: pending on S2 */
    gm_alloc_set_trace_hook(fx.a, NULL, NULL);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    fx_close(&fx);
}
