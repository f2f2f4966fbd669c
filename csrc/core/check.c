/*
 * check.c - the invariant walker (check.h).
 *
 * It gathers every block from the three places a block can be and checks
 * each against the rules of types.h and pool.c's Note [Block states]; then
 * it recomputes every statistic from the blocks, with the same predicates
 * stats.c's callers use (block.h), and compares. Must not modify allocator
 * state.
 */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "walk.h"

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
    if (b->in_tree == GM_IN_FREE && !(b->mapped && gm_block_is_free(b)))
        violation(c, "block in free tree is not free and mapped", b);
    if (b->in_tree == GM_IN_UNMAPPED && !(!b->mapped && gm_block_is_free(b) && b->expseg))
        violation(c, "block in unmapped tree is mapped or in use", b);
    if (b->prev && (b->seg.ctx || b->seg.oversize))
        violation(c, "segment facts on a block that is not first in its segment", b);
    if (b->expseg && b->seg.oversize)
        violation(c, "expandable segment marked oversize", b);
    if (b->in_tree == GM_IN_NONE &&
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

static int pool_trees_bad(const gm_pool_t *p) {
    return gm_tree_check(&p->blocks) || gm_tree_check(&p->unmapped);
}

/* Each private pool: well-formed trees, its pools point back at it, a sane
 * use count; the allocating count and the deferred blocks agree with the
 * pools and the blocks (Note [Private pools]). */
static void check_private_pools(checker_t *c, gm_alloc_t *a) {
    int allocating = 0;
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next) {
        if (pool_trees_bad(&p->small) || pool_trees_bad(&p->large))
            violation(c, "ordered tree of a private pool is malformed", NULL);
        if (p->small.owner != p || p->large.owner != p || !p->small.is_small || p->large.is_small)
            violation(c, "private pool's pools do not point back at it", NULL);
        if (p->use_count < 0 || gm_mempool_id_is_default(p->id))
            violation(c, "private pool with a negative use count or the default id", NULL);
        for (gm_private_pool_t *q = p->next; q; q = q->next)
            if (gm_mempool_id_eq(p->id, q->id))
                violation(c, "two private pools share an id", NULL);
        allocating += p->allocating != 0;
    }
    if (allocating != a->n_allocating)
        violation(c, "count of allocating pools disagrees with the pools", NULL);
    for (size_t i = 0; i < a->events.n_deferred; i++) {
        const gm_block_t *b = a->events.deferred[i];
        if (b->allocated || !b->n_uses || b->in_tree != GM_IN_NONE)
            violation(c, "deferred block is allocated, unused elsewhere or cached", b);
    }
}

/* Each private pool's reserved bytes are the mapped bytes of its blocks. */
static void check_pool_reserved(checker_t *c, gm_alloc_t *a, const gm_block_list_t *l) {
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next) {
        int64_t mapped = 0;
        for (size_t i = 0; i < l->n; i++)
            if (l->v[i]->pool->owner == p && l->v[i]->mapped)
                mapped += (int64_t)l->v[i]->size;
        if (mapped != p->reserved)
            violation(c, "private pool's reserved bytes disagree with its blocks", NULL);
    }
}

int gm_check_unlocked(gm_alloc_t *a, char *msg, size_t msglen) {
    checker_t c = {0, msg, msglen};
    if (msg && msglen)
        msg[0] = 0;
    if (pool_trees_bad(&a->small_pool) || pool_trees_bad(&a->large_pool) ||
        pool_trees_bad(&a->uncached_pool))
        violation(&c, "ordered tree is malformed", NULL);
    check_private_pools(&c, a);
    gm_block_list_t l;
    if (gm_walk_gather_unlocked(a, &l)) {
        violation(&c, "out of host memory while checking", NULL);
        return c.bad;
    }
    gm_stats_t want;
    memset(&want, 0, sizeof want);
    long events = 0;
    for (size_t i = 0; i < l.n; i++) {
        gm_block_t *b = l.v[i];
        check_block(&c, a, b);
        if (!gm_pool_counted(b->pool)) { /* outside the stats: Note [Caching off] */
            if (b->prev || b->next || b->expseg || b->n_uses || b->event_count)
                violation(&c, "uncached block split, expandable or waiting on events", b);
            continue;
        }
        int t = gm_pool_stat_type(b->pool);
        int st = gm_block_state(b);
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
            if (gm_block_is_inactive_split(b)) {
                want.inactive_split[ty].current++;
                want.inactive_split_bytes[ty].current += (int64_t)b->size;
            }
        }
        if (b->allocated && b->oversize)
            want.oversize_allocations.current++;
        if (!b->expseg && !b->prev && b->seg.oversize)
            want.oversize_segments.current++;
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
    check_pool_reserved(&c, a, &l);
    long queued = 0;
    for (size_t i = 0; i < a->events.n_queues; i++)
        queued += (long)a->events.queues[i].len;
    if (queued + a->events.n_stuck != events)
        violation(&c, "queued events disagree with block event counts", NULL);
    /* Segments must not overlap. */
    size_t nheads = 0;
    for (size_t i = 0; i < l.n; i++)
        if (!l.v[i]->prev)
            l.v[nheads++] = l.v[i];
    gm_walk_sort_by_ptr(l.v, nheads);
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
    gm_lock(a);
    int bad = gm_check_unlocked(a, msg, msglen);
    gm_unlock(a);
    return bad;
}
