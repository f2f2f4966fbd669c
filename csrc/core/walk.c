/*
 * walk.c - the segment walk used by snapshots (gm_alloc_walk) and the block
 * gathering it shares with the invariant checker (walk.h).
 *
 * One gm_segment_info_t is reported per plain segment and per contiguous
 * mapped range of an expandable segment, in address order, under the
 * allocator lock; the uncached pool's segments are left out. Must not
 * modify allocator state.
 */
#include "walk.h"

#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "privpool.h"

static void add_tree(gm_block_list_t *l, const gm_tree_t *t) {
    for (gm_tree_node_t *n = gm_tree_first(t); n; n = gm_tree_next(n))
        l->v[l->n++] = gm_block_of(n);
}

static size_t pool_count(const gm_pool_t *p) { return p->blocks.count + p->unmapped.count; }

static void add_pool(gm_block_list_t *l, const gm_pool_t *p) {
    add_tree(l, &p->blocks);
    add_tree(l, &p->unmapped);
}

int gm_walk_gather_unlocked(gm_alloc_t *a, gm_block_list_t *l) {
    size_t total = pool_count(&a->small_pool) + pool_count(&a->large_pool) +
                   pool_count(&a->uncached_pool) + a->active.count;
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next)
        total += pool_count(&p->small) + pool_count(&p->large);
    l->n = 0;
    l->v = malloc((total + 1) * sizeof *l->v);
    if (!l->v)
        return GM_ENOMEM;
    add_pool(l, &a->small_pool);
    add_pool(l, &a->large_pool);
    add_pool(l, &a->uncached_pool);
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next) {
        add_pool(l, &p->small);
        add_pool(l, &p->large);
    }
    for (size_t i = 0; i <= a->active.mask; i++)
        if (a->active.slots[i].key)
            l->v[l->n++] = (gm_block_t *)a->active.slots[i].value;
    return GM_OK;
}

static int by_ptr(const void *x, const void *y) {
    uintptr_t a = (*(gm_block_t *const *)x)->ptr, b = (*(gm_block_t *const *)y)->ptr;
    return a < b ? -1 : a > b;
}

void gm_walk_sort_by_ptr(gm_block_t **v, size_t n) { qsort(v, n, sizeof *v, by_ptr); }

/* Every segment, or those of one private pool (filter non-NULL). */
static int walk(gm_alloc_t *a, const gm_mempool_id_t *filter, gm_segment_fn fn, void *arg) {
    gm_lock(a);
    gm_block_list_t l;
    int rc = gm_walk_gather_unlocked(a, &l);
    gm_block_info_t *infos = NULL;
    if (rc == GM_OK && !(infos = malloc((l.n + 1) * sizeof *infos)))
        rc = GM_ENOMEM;
    if (rc) {
        free(l.v);
        gm_unlock(a);
        return rc;
    }
    /* One segment per contiguous mapped range; none for the uncached pool,
     * which torch's snapshots never show (Note [Caching off] in malloc.c). */
    size_t nheads = 0;
    for (size_t i = 0; i < l.n; i++)
        if (l.v[i]->mapped && !(l.v[i]->prev && l.v[i]->prev->mapped) &&
            gm_pool_counted(l.v[i]->pool) &&
            (!filter || gm_mempool_id_eq(gm_privpool_id_of(l.v[i]->pool), *filter)))
            l.v[nheads++] = l.v[i];
    gm_walk_sort_by_ptr(l.v, nheads);
    for (size_t h = 0; h < nheads && rc == 0; h++) {
        gm_segment_info_t seg;
        memset(&seg, 0, sizeof seg);
        gm_block_t *head = l.v[h];
        seg.address = head->ptr;
        seg.stream = head->stream;
        seg.is_small = head->pool->is_small;
        seg.is_expandable = head->expseg != NULL;
        seg.ctx = head->seg.ctx;
        seg.pool_id = gm_privpool_id_of(head->pool);
        for (gm_block_t *b = head; b && b->mapped; b = b->next) {
            gm_block_info_t *bi = &infos[seg.nblocks++];
            bi->address = b->ptr;
            bi->size = b->size;
            bi->requested_size = b->requested_size;
            bi->state = gm_block_state(b);
            bi->ctx = b->ctx; /* kept until the free completes, as torch does */
            seg.total_size += b->size;
            if (b->allocated)
                seg.allocated_size += b->size;
            if (bi->state != GM_BLOCK_INACTIVE) {
                seg.active_size += b->size;
                seg.requested_size += b->requested_size;
            }
        }
        seg.blocks = infos;
        rc = fn(arg, &seg);
    }
    free(infos);
    free(l.v);
    gm_unlock(a);
    return rc;
}

int gm_alloc_walk(gm_alloc_t *a, gm_segment_fn fn, void *arg) { return walk(a, NULL, fn, arg); }

int gm_alloc_walk_pool(gm_alloc_t *a, gm_mempool_id_t pool, gm_segment_fn fn, void *arg) {
    return walk(a, gm_mempool_id_is_default(pool) ? NULL : &pool, fn, arg);
}
