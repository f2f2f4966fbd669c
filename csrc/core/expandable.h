/*
 * expandable.h - expandable segments: one reserved virtual range per
 * (stream, pool), backed by device granules mapped on demand (Note
 * [Expandable segments] in expandable.c).
 */
#ifndef GM_CORE_EXPANDABLE_H
#define GM_CORE_EXPANDABLE_H

#include "types.h"

/* Expandable segments are in use: the settings ask for them and the device
 * has VMM. */
static inline int gm_expandable_on(const gm_alloc_t *a) {
    return a->settings.expandable_segments && a->granularity > 0;
}

/* Map enough granules for a block of `size` bytes on `stream` and hand it
 * out of the free tree (*out). 1, 0 when the device is out of memory, or <0
 * on other errors. */
int gm_expandable_alloc_unlocked(gm_alloc_t *a, uintptr_t stream, gm_pool_t *pool, size_t size,
                                 uint32_t ctx, gm_block_t **out);
/* Unmap every wholly free granule of free block b (in the free tree). */
int gm_expandable_unmap_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);
/* b is an expandable range with nothing mapped: give the range back. */
int gm_expandable_release_unlocked(gm_alloc_t *a, gm_block_t *b);
/* Teardown (destroy only): unmap and release every range, drop every
 * block still in the trees. */
void gm_expandable_destroy_unlocked(gm_alloc_t *a);

#endif /* GM_CORE_EXPANDABLE_H */
