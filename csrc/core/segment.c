/*
 * segment.c - plain segments in and out of the device (segment.h).
 *
 * Each creation and release is one backend call, one trace event and one
 * stats transition. The segment's facts (its context and whether it was
 * oversize when created) go on its first block, so releasing it later
 * undoes exactly what creating it counted.
 */
#include "segment.h"

#include "devcall.h"
#include "pool.h"
#include "sizes.h"
#include "stats.h"
#include "trace.h"

int gm_segment_alloc_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                              uint32_t ctx, gm_block_t **out) {
    uintptr_t ptr = 0;
    int rc = gm_dev_seg_alloc(a, size, &ptr);
    if (rc == GM_EOOM)
        return 0;
    if (rc)
        return rc;
    gm_block_t *b = gm_block_new_unlocked(a, ptr, size, stream, pool, NULL, 1);
    if (!b) {
        gm_dev_seg_free(a, ptr, size);
        return GM_ENOMEM;
    }
    b->seg.ctx = ctx;
    b->seg.oversize = (uint8_t)gm_size_is_oversize(&a->settings, size);
    gm_stats_segment_mapped(a, pool, size, &b->seg);
    gm_trace_pool_unlocked(a, pool, GM_ACT_SEGMENT_ALLOC, ptr, size, stream, ctx);
    *out = b;
    return 1;
}

int gm_segment_release_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    GM_ASSERT(gm_segment_is_releasable(b) && gm_block_is_free(b), "releasing a segment in use");
    GM_ASSERT(!gm_capture_underway(a), "freeing a segment while capturing");
    int rc = gm_dev_seg_free(a, b->ptr, b->size);
    if (rc)
        return rc;
    gm_trace_pool_unlocked(a, b->pool, GM_ACT_SEGMENT_FREE, b->ptr, b->size, b->stream, ctx ? ctx : b->seg.ctx);
    gm_stats_segment_unmapped(a, b->pool, b->size, &b->seg);
    gm_pool_remove_unlocked(b);
    gm_block_delete_unlocked(a, b);
    return GM_OK;
}
