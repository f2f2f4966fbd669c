/*
 * walk.h - every block of an allocator, wherever it is kept (the free
 * trees, the unmapped trees, the active map), for the segment walk and the
 * invariant checker. Reading only.
 */
#ifndef GM_CORE_WALK_H
#define GM_CORE_WALK_H

#include "types.h"

typedef struct gm_block_list {
    gm_block_t **v;
    size_t n;
} gm_block_list_t;

/* Collect every block (unordered) into l->v, which the caller frees. 0 or
 * GM_ENOMEM. */
int gm_walk_gather_unlocked(gm_alloc_t *a, gm_block_list_t *l);
/* Sort blocks by address. */
void gm_walk_sort_by_ptr(gm_block_t **v, size_t n);

#endif /* GM_CORE_WALK_H */
