/*
 * release.c - cached memory back to the device (release.h), with torch's
 * policies: release_available_cached_blocks, release_cached_blocks and
 * garbage_collect.
 *
 * Only whole plain segments go back (a split one stays until its blocks
 * merge again); expandable segments give back their wholly free granules,
 * and a range with nothing mapped is released with its address space.
 * Must not: release anything that is in use or waiting on events.
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
    if (max_split == SIZE_MAX)
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
    if (!a->uncached)
        return GM_OK;
    if (!b->expseg)
        return gm_segment_is_releasable(b) ? gm_segment_release_unlocked(a, b, ctx) : GM_OK;
    int rc = gm_expandable_unmap_unlocked(a, b, ctx);
    if (rc == GM_OK && !b->mapped && !b->prev && !b->next)
        rc = gm_expandable_release_unlocked(a, b);
    return rc;
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
    return rc ? rc : gm_release_pool_unlocked(a, &a->small_pool, ctx);
}

/* torch's release_cached_blocks({0, 0}): the default pools only while no
 * private pool is allocating (waiting for events is not allowed during a
 * capture), then every freeable private pool (Note [Private pools]). */
int gm_release_all_unlocked(gm_alloc_t *a, uint32_t ctx) {
    if (!a->n_allocating) {
        int rc = gm_events_sync_all_unlocked(a, ctx);
        if (rc == GM_OK)
            rc = gm_release_free_unlocked(a, ctx);
        if (rc)
            return rc;
    }
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
    if (reserved <= threshold)
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
