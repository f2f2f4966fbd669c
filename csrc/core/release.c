/*
 * release.c - cached memory back to the device (release.h), with torch's
 * policies: release_available_cached_blocks, release_cached_blocks and
 * garbage_collect.
 *
 * Only whole plain segments go back (a split one stays until its blocks
 * merge again); expandable segments give back their wholly free granules,
 * and a range with nothing mapped is released with its address space.
 * Must not: release anything that is in use or waiting on events.
 *
 * Note [Capture-safe paths]
 * Rationale: while a CUDA graph is being captured, a synchronize (of a
 *   stream, the context or an event), an event query, and a free or unmap
 *   of device memory (which must first wait for the GPU) either fail or
 *   invalidate the capture, and the user's step dies at capture with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. torch's allocator makes none of
 *   them while captures_underway is non-empty: it defers end-of-life
 *   events, skips release_cached_blocks on the out-of-memory path, and
 *   asserts that no synchronize happens.
 * Approach: gm_capture_underway() (a private pool is allocating, torch's
 *   captures_underway) guards every path here that gives memory back:
 *   release of everything (empty_cache, the out-of-memory retry), of
 *   oversize blocks, the garbage collector, and caching-off frees; they
 *   do nothing while it holds, and the memory stays cached for the next
 *   release after the capture. Expandable growth does not recycle holes
 *   then (expandable.c), and events are deferred (events.c). Device
 *   allocations (cuMemAlloc, cuMemCreate/cuMemMap) stay allowed, in relaxed
 *   capture mode (devcall.h), as torch's cudaMallocMaybeCapturing does.
 * Limitations: the core knows of a capture only through its pools: a
 *   capture begun without a private pool allocating (cudaStreamBeginCapture
 *   by hand) is not seen, as torch does not see it either. Where torch
 *   frees oversize blocks or runs the garbage collector during a capture
 *   (and the capture then fails), gpumem keeps them and may report out of
 *   memory instead. With caching off, a block freed during a capture is
 *   given back at the first event poll after it.
 */
#include "release.h"

#include <stdlib.h>

#include "events.h"
#include "expandable.h"
#include "pool.h"
#include "privpool.h"
#include "segment.h"
#include "sizes.h"

int gm_release_oversize_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                                 uint32_t ctx) {
    size_t max_split = a->settings.max_split_size;
    if (max_split == SIZE_MAX || gm_capture_underway(a))
        return 0;
    gm_block_t key;
    key.stream = stream;
    key.size = size < max_split ? max_split : size;
    key.ptr = 0;
    gm_tree_node_t *n = gm_tree_lower_bound(&pool->blocks, &key.node);
    if (n && gm_block_of(n)->stream == stream) {
        /* The smallest oversize block that is large enough. */
        if (!gm_segment_is_releasable(gm_block_of(n)))
            return 0;
        return gm_segment_release_unlocked(a, gm_block_of(n), ctx) == GM_OK;
    }
    /* None is large enough alone: release the largest ones until enough. */
    gm_tree_node_t *m = n ? gm_tree_prev(n) : gm_tree_last(&pool->blocks);
    size_t released = 0;
    while (released < key.size && m && gm_size_is_oversize(&a->settings, gm_block_of(m)->size) &&
           gm_block_of(m)->stream == stream && gm_segment_is_releasable(gm_block_of(m))) {
        gm_block_t *cur = gm_block_of(m);
        m = gm_tree_prev(m);
        size_t sz = cur->size;
        if (gm_segment_release_unlocked(a, cur, ctx))
            return 0;
        released += sz;
    }
    return released >= key.size;
}

int gm_release_uncached_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    if (gm_pool_counted(b->pool) || gm_capture_underway(a) || !gm_segment_is_releasable(b))
        return GM_OK;
    return gm_segment_release_unlocked(a, b, ctx);
}

int gm_release_pool_unlocked(gm_alloc_t *a, gm_pool_t *pool, uint32_t ctx) {
    int rc = GM_OK;
    size_t n_exp = 0;
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n;) {
        gm_block_t *b = gm_block_of(n);
        n = gm_tree_next(n);
        if (b->expseg)
            n_exp++;
        else if (gm_segment_is_releasable(b) && (rc = gm_segment_release_unlocked(a, b, ctx)))
            return rc;
    }
    if (!n_exp)
        return GM_OK;
    /* Unmapping changes the tree: collect first. */
    gm_block_t **todo = malloc(n_exp * sizeof *todo);
    if (!todo)
        return GM_ENOMEM;
    size_t k = 0;
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n && k < n_exp; n = gm_tree_next(n))
        if (gm_block_of(n)->expseg)
            todo[k++] = gm_block_of(n);
    for (size_t i = 0; i < k && rc == GM_OK; i++) {
        gm_block_t *b = todo[i];
        rc = gm_expandable_unmap_unlocked(a, b, ctx);
        if (rc == GM_OK && !b->mapped && !b->prev && !b->next)
            rc = gm_expandable_release_unlocked(a, b);
    }
    free(todo);
    return rc;
}

int gm_release_free_unlocked(gm_alloc_t *a, uint32_t ctx) {
    int rc = gm_release_pool_unlocked(a, &a->large_pool, ctx);
    if (rc == GM_OK)
        rc = gm_release_pool_unlocked(a, &a->small_pool, ctx);
    return rc ? rc : gm_release_pool_unlocked(a, &a->uncached_pool, ctx);
}

/* torch's release_cached_blocks({0, 0}): the default pools, then every
 * freeable private pool (Note [Private pools]); nothing while a capture
 * may be underway (Note [Capture-safe paths]). */
int gm_release_all_unlocked(gm_alloc_t *a, uint32_t ctx) {
    if (gm_capture_underway(a))
        return GM_OK;
    int rc = gm_events_sync_all_unlocked(a, ctx);
    if (rc == GM_OK)
        rc = gm_release_free_unlocked(a, ctx);
    if (rc)
        return rc;
    return a->private_pools ? gm_release_freeable_pools_unlocked(a, NULL, ctx) : GM_OK;
}

int gm_release_freeable_pools_unlocked(gm_alloc_t *a, gm_private_pool_t *only, uint32_t ctx) {
    for (gm_private_pool_t *p = a->private_pools, *next; p; p = next) {
        next = p->next;
        if (p->use_count != 0 || (only && p != only))
            continue;
        int rc = gm_release_pool_unlocked(a, &p->large, ctx);
        if (rc == GM_OK)
            rc = gm_release_pool_unlocked(a, &p->small, ctx);
        if (rc)
            return rc;
        gm_privpool_delete_if_done_unlocked(a, p);
    }
    return GM_OK;
}

void gm_release_gc_unlocked(gm_alloc_t *a, uint32_t ctx) {
    size_t threshold =
        (size_t)(a->settings.garbage_collection_threshold * (double)a->allowed_memory_maximum);
    size_t reserved = gm_reserved_bytes(a);
    if (reserved <= threshold || gm_capture_underway(a))
        return;
    size_t target = reserved - threshold, reclaimed = 0;
    gm_pool_t *pool = &a->large_pool;
    double total_age = 0;
    int count = 0;
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n; n = gm_tree_next(n))
        if (gm_segment_is_releasable(gm_block_of(n))) {
            total_age += (double)(pool->get_free_blocks_call_count - gm_block_of(n)->gc_count_base);
            count++;
        }
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = total_age / count;
        freed = 0;
        for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n;) {
            gm_block_t *b = gm_block_of(n);
            n = gm_tree_next(n);
            double age = (double)(pool->get_free_blocks_call_count - b->gc_count_base);
            if (gm_segment_is_releasable(b) && age >= age_threshold) {
                size_t sz = b->size;
                if (gm_segment_release_unlocked(a, b, ctx))
                    return;
                freed = 1;
                reclaimed += sz;
                total_age -= age;
                count--;
            }
        }
    }
}
