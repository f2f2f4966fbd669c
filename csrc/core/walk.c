/*
 * walk.c - reading the allocator's whole state: the segment walk used by
 * snapshots, and the invariant checker used by tests and GM_DEBUG=3.
 *
 * Both gather every block from the three places a block can be (free tree,
 * unmapped tree, active map). The checker recomputes everything that is
 * derived (stats, tiling, merging, mapping) and counts disagreements
 * instead of aborting, so tests can assert on the count (tlsf_check style).
 * Neither modifies allocator state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_internal.h"

#define BLK(n) ((gm_block_t *)(void *)(n))

typedef struct block_list {
    gm_block_t **v;
    size_t n;
} block_list_t;

static void add_tree(block_list_t *l, const gm_tree_t *t) {
    for (gm_tree_node_t *n = gm_tree_first(t); n; n = gm_tree_next(n))
        l->v[l->n++] = BLK(n);
}

static int gather(gm_alloc_t *a, block_list_t *l) {
    size_t total = a->small_pool.blocks.count + a->small_pool.unmapped.count +
                   a->large_pool.blocks.count + a->large_pool.unmapped.count + a->active.count;
    l->n = 0;
    l->v = malloc((total + 1) * sizeof *l->v);
    if (!l->v)
        return GM_ENOMEM;
    add_tree(l, &a->small_pool.blocks);
    add_tree(l, &a->small_pool.unmapped);
    add_tree(l, &a->large_pool.blocks);
    add_tree(l, &a->large_pool.unmapped);
    for (size_t i = 0; i <= a->active.mask; i++)
        if (a->active.slots[i].key)
            l->v[l->n++] = (gm_block_t *)a->active.slots[i].value;
    return GM_OK;
}

static int by_ptr(const void *x, const void *y) {
    uintptr_t a = (*(gm_block_t *const *)x)->ptr, b = (*(gm_block_t *const *)y)->ptr;
    return a < b ? -1 : a > b;
}

static int block_state(const gm_block_t *b) {
    if (b->allocated)
        return GM_BLOCK_ACTIVE_ALLOCATED;
    if (b->event_count > 0 || b->n_uses > 0)
        return GM_BLOCK_ACTIVE_PENDING_FREE;
    return GM_BLOCK_INACTIVE;
}

int gm_alloc_walk(gm_alloc_t *a, gm_segment_fn fn, void *arg) {
    pthread_mutex_lock(&a->lock);
    block_list_t l;
    int rc = gather(a, &l);
    gm_block_info_t *infos = NULL;
    if (rc == GM_OK && !(infos = malloc((l.n + 1) * sizeof *infos)))
        rc = GM_ENOMEM;
    if (rc) {
        free(l.v);
        pthread_mutex_unlock(&a->lock);
        return rc;
    }
    /* One segment per contiguous mapped range. */
    size_t nheads = 0;
    for (size_t i = 0; i < l.n; i++)
        if (l.v[i]->mapped && !(l.v[i]->prev && l.v[i]->prev->mapped))
            l.v[nheads++] = l.v[i];
    qsort(l.v, nheads, sizeof *l.v, by_ptr);
    for (size_t h = 0; h < nheads && rc == 0; h++) {
        gm_segment_info_t seg;
        memset(&seg, 0, sizeof seg);
        gm_block_t *head = l.v[h];
        seg.address = head->ptr;
        seg.stream = head->stream;
        seg.is_small = head->pool->is_small;
        seg.is_expandable = head->expseg != NULL;
        seg.ctx = head->seg_ctx;
        for (gm_block_t *b = head; b && b->mapped; b = b->next) {
            gm_block_info_t *bi = &infos[seg.nblocks++];
            bi->address = b->ptr;
            bi->size = b->size;
            bi->requested_size = b->requested_size;
            bi->state = block_state(b);
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
    pthread_mutex_unlock(&a->lock);
    return rc;
}

typedef struct checker {
    int bad;
    char *msg;
    size_t msglen;
} checker_t;

static void violation(checker_t *c, const char *what, const gm_block_t *b) {
    if (c->bad++ == 0 && c->msg && c->msglen) {
        if (b)
            snprintf(c->msg, c->msglen, "%s (block 0x%llx, size %zu)", what,
                     (unsigned long long)b->ptr, b->size);
        else
            snprintf(c->msg, c->msglen, "%s", what);
    }
}

static void check_block(checker_t *c, gm_alloc_t *a, gm_block_t *b) {
    uintptr_t v;
    if (b->in_tree == 1 && !(b->mapped && gm_block_is_free(b)))
        violation(c, "block in free tree is not free and mapped", b);
    if (b->in_tree == 2 && !(!b->mapped && gm_block_is_free(b) && b->expseg))
        violation(c, "block in unmapped tree is mapped or in use", b);
    if (b->in_tree == 0 &&
        !(gm_ptrmap_get(&a->active, b->ptr, &v) && v == (uintptr_t)b && !gm_block_is_free(b)))
        violation(c, "active block missing from active map or not active", b);
    if (!b->expseg && !b->mapped)
        violation(c, "plain segment block is unmapped", b);
    if (b->next) {
        if (b->next->prev != b)
            violation(c, "next->prev does not point back", b);
        if (b->ptr + b->size != b->next->ptr)
            violation(c, "blocks do not tile the segment", b);
        if (b->next->pool != b->pool || b->next->stream != b->stream ||
            b->next->expseg != b->expseg)
            violation(c, "neighbours differ in pool, stream or segment", b);
        if (gm_block_is_free(b) && gm_block_is_free(b->next) && b->mapped == b->next->mapped)
            violation(c, "two free neighbours were not merged", b);
    }
    if (b->prev && b->prev->next != b)
        violation(c, "prev->next does not point back", b);
    if (b->expseg) {
        gm_expseg_t *es = b->expseg;
        size_t g = es->granule;
        if (b->ptr < es->va || b->ptr + b->size > es->va + es->va_size) {
            violation(c, "block outside its expandable range", b);
            return;
        }
        size_t first = (b->ptr - es->va) / g, last = (b->ptr + b->size - 1 - es->va) / g;
        if (!b->mapped && ((b->ptr - es->va) % g || b->size % g))
            violation(c, "unmapped block not granule aligned", b);
        for (size_t k = first; k <= last; k++)
            if (es->mapped[k] != b->mapped) {
                violation(c, "granule mapping disagrees with block", b);
                break;
            }
    }
}

/* Caller holds the lock. */
int gm_alloc_check_unlocked(gm_alloc_t *a, char *msg, size_t msglen) {
    checker_t c = {0, msg, msglen};
    if (msg && msglen)
        msg[0] = 0;
    if (gm_tree_check(&a->small_pool.blocks) || gm_tree_check(&a->large_pool.blocks) ||
        gm_tree_check(&a->small_pool.unmapped) || gm_tree_check(&a->large_pool.unmapped))
        violation(&c, "ordered tree is malformed", NULL);
    block_list_t l;
    if (gather(a, &l)) {
        violation(&c, "out of host memory while checking", NULL);
        return c.bad;
    }
    gm_stats_t want;
    memset(&want, 0, sizeof want);
    long events = 0;
    for (size_t i = 0; i < l.n; i++) {
        gm_block_t *b = l.v[i];
        check_block(&c, a, b);
        int t = gm_pool_type(b->pool);
        int st = block_state(b);
        events += b->event_count;
        for (int k = 0; k < 2; k++) {
            int ty = k ? t : GM_STAT_ALL;
            if (b->allocated) {
                want.allocation[ty].current++;
                want.allocated_bytes[ty].current += (int64_t)b->size;
            }
            if (st != GM_BLOCK_INACTIVE) {
                want.active[ty].current++;
                want.active_bytes[ty].current += (int64_t)b->size;
                want.requested_bytes[ty].current += (int64_t)b->requested_size;
            }
            if (b->mapped)
                want.reserved_bytes[ty].current += (int64_t)b->size;
            if (!b->expseg && !b->prev)
                want.segment[ty].current++;
            if (!b->expseg && st == GM_BLOCK_INACTIVE && (b->prev || b->next)) {
                want.inactive_split[ty].current++;
                want.inactive_split_bytes[ty].current += (int64_t)b->size;
            }
        }
        if (b->allocated && b->size >= a->settings.max_split_size)
            want.oversize_allocations.current++;
        if (!b->expseg && !b->prev) {
            size_t seg = 0;
            for (gm_block_t *x = b; x; x = x->next)
                seg += x->size;
            if (seg >= a->settings.max_split_size)
                want.oversize_segments.current++;
        }
    }
#define CMP(field)                                                             \
    for (int ty = 0; ty < GM_STAT_NTYPES; ty++)                                \
        if (want.field[ty].current != a->stats.field[ty].current)              \
            violation(&c, "stat " #field " disagrees with the blocks", NULL);
    CMP(allocation)
    CMP(allocated_bytes)
    CMP(active)
    CMP(active_bytes)
    CMP(requested_bytes)
    CMP(reserved_bytes)
    CMP(segment)
    CMP(inactive_split)
    CMP(inactive_split_bytes)
#undef CMP
    if (want.oversize_allocations.current != a->stats.oversize_allocations.current ||
        want.oversize_segments.current != a->stats.oversize_segments.current)
        violation(&c, "oversize stats disagree with the blocks", NULL);
    if ((int64_t)a->total_allocated_memory != a->stats.reserved_bytes[GM_STAT_ALL].current)
        violation(&c, "device bytes disagree with reserved_bytes", NULL);
    long queued = 0;
    for (size_t i = 0; i < a->n_queues; i++)
        queued += (long)a->queues[i].len;
    if (queued + a->n_stuck_events != events)
        violation(&c, "queued events disagree with block event counts", NULL);
    /* Segments must not overlap. */
    size_t nheads = 0;
    for (size_t i = 0; i < l.n; i++)
        if (!l.v[i]->prev)
            l.v[nheads++] = l.v[i];
    qsort(l.v, nheads, sizeof *l.v, by_ptr);
    uintptr_t end = 0;
    for (size_t i = 0; i < nheads; i++) {
        gm_block_t *h = l.v[i];
        size_t len = 0;
        for (gm_block_t *x = h; x; x = x->next)
            len += x->size;
        if (h->expseg && (h->ptr != h->expseg->va || len != h->expseg->va_size))
            violation(&c, "expandable range not covered by its blocks", h);
        if (i && h->ptr < end)
            violation(&c, "segments overlap", h);
        end = h->ptr + len;
    }
    free(l.v);
    return c.bad;
}

int gm_alloc_check(gm_alloc_t *a, char *msg, size_t msglen) {
    pthread_mutex_lock(&a->lock);
    int bad = gm_alloc_check_unlocked(a, msg, msglen);
    pthread_mutex_unlock(&a->lock);
    return bad;
}
