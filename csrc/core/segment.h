/*
 * segment.h - plain segments: one device allocation (cuMemAlloc) each,
 * tiled by blocks, returned to the device only when wholly free and
 * unsplit. Expandable segments are expandable.h's.
 */
#ifndef GM_CORE_SEGMENT_H
#define GM_CORE_SEGMENT_H

#include "block.h"

/* A new plain segment of `size` bytes for `stream` in `pool`, as one free
 * block in no tree (*out). 1 on success, 0 when the device is out of
 * memory, <0 on other errors. */
int gm_segment_alloc_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                              uint32_t ctx, gm_block_t **out);

/* A free block that is a whole plain segment (unsplit) can go back. */
static inline int gm_segment_is_releasable(const gm_block_t *b) {
    return !b->expseg && !b->prev && !b->next;
}

/* Give such a block (in the free tree) back to the device. */
int gm_segment_release_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);

#endif /* GM_CORE_SEGMENT_H */
