/*
 * block.h - blocks and the chain of neighbours that tiles a segment.
 *
 * A block is a contiguous piece of a segment, free or in use. Its state is
 * derived from three fields (allocated, event_count, n_uses) by the
 * predicates below, the only definitions of "free", "state" and "inactive
 * split" in gpumem: stats.h, check.c and walk.c all use them.
 * Block structs are recycled through the allocator's free list, never given
 * back to the C heap until the allocator is destroyed. Everything here is
 * inline: it is the malloc/free fast path.
 * Must not: touch trees, stats or the device (pool.h, stats.h, segment.h).
 */
#ifndef GM_CORE_BLOCK_H
#define GM_CORE_BLOCK_H

#include <stdlib.h>
#include <string.h>

#include "types.h"

/* A new block, linked to nothing, in no tree. NULL when host memory ran out. */
static inline gm_block_t *gm_block_new_unlocked(gm_alloc_t *a, uintptr_t ptr, size_t size,
                                                uintptr_t stream, gm_pool_t *pool,
                                                gm_expseg_t *expseg, int mapped) {
    gm_block_t *b = a->free_structs;
    if (b)
        a->free_structs = b->next;
    else if (!(b = malloc(sizeof *b)))
        return NULL;
    memset(b, 0, sizeof *b);
    b->ptr = ptr;
    b->size = size;
    b->stream = stream;
    b->pool = pool;
    b->expseg = expseg;
    b->mapped = (uint8_t)mapped;
    b->uses = b->uses_inline;
    b->cap_uses = 2;
    return b;
}

static inline void gm_block_delete_unlocked(gm_alloc_t *a, gm_block_t *b) {
    GM_ASSERT(b->in_tree == GM_IN_NONE, "deleting a block that is still in a tree");
    if (b->uses != b->uses_inline)
        free(b->uses);
    b->next = a->free_structs;
    a->free_structs = b;
}

/* Give every recycled struct back to the C heap (destroy only). */
static inline void gm_block_drain_unlocked(gm_alloc_t *a) {
    while (a->free_structs) {
        gm_block_t *b = a->free_structs;
        a->free_structs = b->next;
        free(b);
    }
}

/* Every place that puts a block into a segment or takes one out goes
 * through these three, so the segment's facts (gm_seg_facts_t) always sit
 * on its first block and nowhere else. */

/* Link nb into b's segment right before b (nb ends where b starts); if b
 * was the first block, nb becomes first and takes the segment's facts. */
static inline void gm_block_link_before(gm_block_t *nb, gm_block_t *b) {
    GM_ASSERT(nb->ptr + nb->size == b->ptr, "a block linked before another must end at its start");
    nb->prev = b->prev;
    nb->next = b;
    if (nb->prev) {
        nb->prev->next = nb;
    } else {
        nb->seg = b->seg;
        memset(&b->seg, 0, sizeof b->seg);
    }
    b->prev = nb;
}

/* Link nb into b's segment right after b (nb starts where b ends). */
static inline void gm_block_link_after(gm_block_t *b, gm_block_t *nb) {
    GM_ASSERT(b->ptr + b->size == nb->ptr, "a block linked after another must start at its end");
    nb->prev = b;
    nb->next = b->next;
    if (nb->next)
        nb->next->prev = nb;
    b->next = nb;
}

/* Take b out of its segment's chain (to delete it: its own links are left
 * as they were); if b was first, the next block becomes first and takes the
 * segment's facts. */
static inline void gm_block_unlink(gm_block_t *b) {
    if (b->prev)
        b->prev->next = b->next;
    else if (b->next)
        b->next->seg = b->seg;
    if (b->next)
        b->next->prev = b->prev;
}

/* The block a tree node is embedded in (the node is its first member). */
static inline gm_block_t *gm_block_of(const gm_tree_node_t *n) {
    return (gm_block_t *)(void *)n;
}

static inline int gm_block_is_free(const gm_block_t *b) {
    return !b->allocated && b->event_count == 0 && b->n_uses == 0;
}

/* GM_BLOCK_ACTIVE_ALLOCATED, GM_BLOCK_ACTIVE_PENDING_FREE (freed, waiting on
 * events) or GM_BLOCK_INACTIVE (free). */
static inline int gm_block_state(const gm_block_t *b) {
    if (b->allocated)
        return GM_BLOCK_ACTIVE_ALLOCATED;
    return gm_block_is_free(b) ? GM_BLOCK_INACTIVE : GM_BLOCK_ACTIVE_PENDING_FREE;
}

/* A free piece of a split plain segment: what torch's inactive_split counts.
 * Expandable segments are left out, as in torch: their wholly free granules
 * can always be released. The first form is for a block known to be free
 * (the fast path knows); both are the same rule. */
static inline int gm_free_block_is_split(const gm_block_t *b) {
    GM_ASSERT(gm_block_is_free(b), "asked whether a block in use is an inactive split");
    return !b->expseg && (b->prev || b->next);
}

static inline int gm_block_is_inactive_split(const gm_block_t *b) {
    return gm_block_is_free(b) && gm_free_block_is_split(b);
}

/* Whether a pool's blocks count in the statistics and the trace (all but
 * the uncached pool: Note [Caching off] in malloc.c). */
static inline int gm_pool_counted(const gm_pool_t *p) { return __builtin_expect(!p->uncounted, 1); }

static inline int gm_pool_stat_type(const gm_pool_t *p) {
    return p->is_small ? GM_STAT_SMALL : GM_STAT_LARGE;
}

#endif /* GM_CORE_BLOCK_H */
