/*
 * pool.c - pools: ordered sets of cached blocks, the best-fit search, and
 * merging (pool.h).
 *
 * Note [Block states]
 * Rationale: torch keeps allocated and "pending free" blocks in one set and
 *   free blocks in per-pool ordered sets; we keep the same split so the
 *   best-fit search only ever sees reusable memory.
 * Approach: allocated, or freed but waiting on events -> the allocator's
 *   `active` map keyed by address; free and mapped -> pool->blocks ordered
 *   by (stream, size, address); free address space of an expandable segment
 *   that has no physical memory -> pool->unmapped ordered by (stream,
 *   address). `in_tree` says which tree holds a block.
 * Limitations: an interior pointer cannot be told apart from garbage; both
 *   give GM_ENOTFOUND.
 *
 * Invariant: two free neighbours with the same `mapped` flag never coexist;
 * they are merged when the second one becomes free (or mapped, unmapped).
 */
#include "pool.h"

#include "sizes.h"
#include "trace.h"

static int cmp_size(const gm_tree_node_t *x, const gm_tree_node_t *y) {
    const gm_block_t *a = gm_block_of(x), *b = gm_block_of(y);
    if (a->stream != b->stream)
        return a->stream < b->stream ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    if (a->ptr != b->ptr)
        return a->ptr < b->ptr ? -1 : 1;
    return 0;
}

static int cmp_addr(const gm_tree_node_t *x, const gm_tree_node_t *y) {
    const gm_block_t *a = gm_block_of(x), *b = gm_block_of(y);
    if (a->stream != b->stream)
        return a->stream < b->stream ? -1 : 1;
    if (a->ptr != b->ptr)
        return a->ptr < b->ptr ? -1 : 1;
    return 0;
}

void gm_pool_init(gm_pool_t *pool, int is_small) {
    gm_tree_init(&pool->blocks, cmp_size);
    gm_tree_init(&pool->unmapped, cmp_addr);
    pool->is_small = is_small;
    pool->get_free_blocks_call_count = 0;
}

/* For best fit, a free expandable block followed by unmapped space counts
 * with the size it could grow to. */
static size_t growable_size(const gm_block_t *b) {
    return b->size + ((b->next && !b->next->mapped) ? b->next->size : 0);
}

gm_block_t *gm_pool_find_free_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream,
                                       size_t size) {
    if (a->set_fraction && a->settings.garbage_collection_threshold > 0.0)
        pool->get_free_blocks_call_count++;
    gm_block_t key;
    key.stream = stream;
    key.size = size;
    key.ptr = 0;
    gm_tree_node_t *n = gm_tree_lower_bound(&pool->blocks, &key.node);
    if (!n || gm_block_of(n)->stream != stream)
        return NULL;
    if (gm_block_of(n)->expseg) {
        if (a->settings.expandable_segments) {
            gm_tree_node_t *next = gm_tree_next(n);
            while (gm_block_of(n)->expseg && next && gm_block_of(next)->stream == stream &&
                   growable_size(gm_block_of(next)) < growable_size(gm_block_of(n))) {
                n = next;
                next = gm_tree_next(next);
            }
        } else {
            do {
                n = gm_tree_next(n);
            } while (n && gm_block_of(n)->expseg && gm_block_of(n)->stream == stream);
            if (!n || gm_block_of(n)->stream != stream)
                return NULL;
        }
    }
    gm_block_t *b = gm_block_of(n);
    if (!gm_size_oversize_fits(&a->settings, size, b->size))
        return NULL;
    gm_pool_remove_unlocked(b);
    return b;
}

void gm_pool_return_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    GM_ASSERT(gm_block_is_free(b) && b->in_tree == GM_IN_NONE, "returning a block still in use");
    gm_trace_pool_unlocked(a, b->pool, GM_ACT_FREE_COMPLETED, b->ptr, b->requested_size, b->stream,
                      ctx ? ctx : b->ctx);
    b->ctx = 0;
    size_t size = b->size, requested = b->requested_size;
    gm_split_delta_t d = {0, 0};
    gm_ptrmap_del(&a->active, b->ptr, NULL);
    gm_pool_merge_and_file_unlocked(a, b, &d);
    gm_split_count(&d, b, +1);
    gm_stats_block_free_completed(a, b->pool, size, requested, &d);
}
