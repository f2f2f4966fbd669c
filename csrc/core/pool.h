/*
 * pool.h - the small and large pools: their free and unmapped trees, the
 * best-fit search, merging of free neighbours, and a freed block's return
 * to its pool (Note [Block states] in pool.c).
 */
#ifndef GM_CORE_POOL_H
#define GM_CORE_POOL_H

#include "block.h"
#include "sizes.h"
#include "stats.h"

void gm_pool_init(gm_pool_t *pool, int is_small);

static inline gm_pool_t *gm_pool_for_size(gm_alloc_t *a, size_t rounded) {
    return gm_sizes_is_small(rounded) ? &a->small_pool : &a->large_pool;
}

/* The free tree (free and mapped) and the unmapped tree (expandable address
 * space with no memory); insert_free also restarts the block's age for the
 * garbage collector. */
static inline void gm_pool_insert_free_unlocked(gm_block_t *b) {
    GM_ASSERT(b->in_tree == GM_IN_NONE && b->mapped, "only a mapped block outside the trees may be cached");
    b->gc_count_base = b->pool->get_free_blocks_call_count;
    gm_tree_insert(&b->pool->blocks, &b->node);
    b->in_tree = GM_IN_FREE;
}

static inline void gm_pool_insert_unmapped_unlocked(gm_block_t *b) {
    GM_ASSERT(b->in_tree == GM_IN_NONE && !b->mapped, "only an unmapped block may enter the unmapped tree");
    gm_tree_insert(&b->pool->unmapped, &b->node);
    b->in_tree = GM_IN_UNMAPPED;
}

/* Take b out of whichever tree holds it. */
static inline void gm_pool_remove_unlocked(gm_block_t *b) {
    GM_ASSERT(b->in_tree != GM_IN_NONE, "removing a block that is in no tree");
    gm_tree_erase(b->in_tree == GM_IN_FREE ? &b->pool->blocks : &b->pool->unmapped, &b->node);
    b->in_tree = GM_IN_NONE;
}

/* Best fit for a rounded request of `size` bytes on `stream`, taken out of
 * the free tree; NULL when no cached block may serve it. */
gm_block_t *gm_pool_find_free_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream,
                                       size_t size);

/* Merge src into dst if src is a free neighbour with the same mapping:
 * src leaves its tree and is deleted. dst must be in no tree. Returns the
 * bytes gained (0: no merge). A merged src is counted out of d if d is set. */
static inline size_t gm_pool_try_merge_unlocked(gm_alloc_t *a, gm_block_t *dst, gm_block_t *src,
                                                gm_split_delta_t *d) {
    GM_ASSERT(dst->in_tree == GM_IN_NONE, "merge target must not be in a tree");
    if (!src || !gm_block_is_free(src) || dst->mapped != src->mapped)
        return 0;
    GM_ASSERT(src->in_tree != GM_IN_NONE, "free neighbour missing from its tree");
    if (d)
        gm_split_count(d, src, -1);
    size_t gained = src->size;
    if (src == dst->prev)
        dst->ptr = src->ptr;
    dst->size += gained;
    gm_pool_remove_unlocked(src);
    gm_block_unlink(src);
    gm_block_delete_unlocked(a, src);
    return gained;
}

/* Merge b (in no tree) with its free neighbours of the same mapping, then
 * file it in the tree its mapping says; merged neighbours are counted out
 * of d if d is set. */
static inline void gm_pool_merge_and_file_unlocked(gm_alloc_t *a, gm_block_t *b,
                                                   gm_split_delta_t *d) {
    gm_pool_try_merge_unlocked(a, b, b->prev, d);
    gm_pool_try_merge_unlocked(a, b, b->next, d);
    if (b->mapped)
        gm_pool_insert_free_unlocked(b);
    else
        gm_pool_insert_unmapped_unlocked(b);
}

/* A freed block whose uses and events are over goes back to its pool:
 * leaves the active map, merges with free neighbours, enters the free tree.
 * This is the "free completed" transition. */
void gm_pool_return_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);

#endif /* GM_CORE_POOL_H */
