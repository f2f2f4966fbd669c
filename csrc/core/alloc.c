/*
 * alloc.c - the caching allocator: malloc, free, splitting, coalescing,
 * releasing and the out-of-memory path, for one device.
 *
 * Policy is PyTorch's CUDACachingAllocator (see gm_alloc.h). Invariants:
 *   - every block is in exactly one place (Note [Block states]);
 *   - blocks of a segment tile it exactly, linked by prev/next;
 *   - two free neighbours with the same `mapped` flag never coexist: they
 *     are merged when the second one becomes free;
 *   - the stats are changed only through gm_stat_inc/gm_stat_dec, at the
 *     points below, and always equal what gm_alloc_check recomputes.
 * Must not: abort, call Python, or call the backend without the lock.
 *
 * Note [Block states]
 * Rationale: torch keeps allocated and "pending free" blocks in one set and
 *   free blocks in per-pool ordered sets; we keep the same split so the
 *   best-fit search only ever sees reusable memory.
 * Approach: allocated, or freed but waiting on events -> `active` map keyed
 *   by address; free and mapped -> pool->blocks ordered by (stream, size,
 *   address); free address space of an expandable segment that has no
 *   physical memory -> pool->unmapped ordered by (stream, address).
 * Limitations: an interior pointer cannot be told apart from garbage; both
 *   give GM_ENOTFOUND.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_internal.h"

#define LOCK(a) pthread_mutex_lock(&(a)->lock)
#define UNLOCK(a) pthread_mutex_unlock(&(a)->lock)

#if GM_DEBUG >= 3
#define DEEP_CHECK(a)                                                          \
    do {                                                                       \
        char msg_[256];                                                        \
        if (gm_alloc_check_unlocked((a), msg_, sizeof msg_)) {                 \
            fprintf(stderr, "gpumem: invariant violated: %s\n", msg_);         \
            abort();                                                           \
        }                                                                      \
    } while (0)
int gm_alloc_check_unlocked(gm_alloc_t *a, char *msg, size_t msglen);
#else
#define DEEP_CHECK(a) ((void)0)
#endif

#define BLK(n) ((gm_block_t *)(void *)(n))

/* ---------------------------------------------------------------- stats */

void gm_stat_inc(gm_stat_t *s, int64_t amount) {
    s->current += amount;
    if (s->current > s->peak)
        s->peak = s->current;
    s->allocated += amount;
}

void gm_stat_dec(gm_stat_t *s, int64_t amount) {
    GM_ASSERT(s->current >= amount, "stat would go negative");
    s->current -= amount;
    s->freed += amount;
}

/* Apply to the aggregate and to the pool's own type. */
#define STAT_INC(arr, t, amount)                                               \
    do {                                                                       \
        gm_stat_inc(&(arr)[GM_STAT_ALL], (int64_t)(amount));                   \
        gm_stat_inc(&(arr)[(t)], (int64_t)(amount));                           \
    } while (0)
#define STAT_DEC(arr, t, amount)                                               \
    do {                                                                       \
        gm_stat_dec(&(arr)[GM_STAT_ALL], (int64_t)(amount));                   \
        gm_stat_dec(&(arr)[(t)], (int64_t)(amount));                           \
    } while (0)

/* ------------------------------------------------------- ordered sets */

static int cmp_size(const gm_tree_node_t *x, const gm_tree_node_t *y) {
    const gm_block_t *a = BLK(x), *b = BLK(y);
    if (a->stream != b->stream)
        return a->stream < b->stream ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    if (a->ptr != b->ptr)
        return a->ptr < b->ptr ? -1 : 1;
    return 0;
}

static int cmp_addr(const gm_tree_node_t *x, const gm_tree_node_t *y) {
    const gm_block_t *a = BLK(x), *b = BLK(y);
    if (a->stream != b->stream)
        return a->stream < b->stream ? -1 : 1;
    if (a->ptr != b->ptr)
        return a->ptr < b->ptr ? -1 : 1;
    return 0;
}

void gm_pool_insert_unlocked(gm_pool_t *pool, gm_block_t *b) {
    b->gc_count_base = pool->get_free_blocks_call_count;
    gm_tree_insert(&pool->blocks, &b->node);
    b->in_tree = 1;
}

void gm_pool_erase_unlocked(gm_pool_t *pool, gm_block_t *b) {
    gm_tree_erase(&pool->blocks, &b->node);
    b->in_tree = 0;
}

void gm_unmapped_insert_unlocked(gm_pool_t *pool, gm_block_t *b) {
    gm_tree_insert(&pool->unmapped, &b->node);
    b->in_tree = 2;
}

void gm_unmapped_erase_unlocked(gm_pool_t *pool, gm_block_t *b) {
    gm_tree_erase(&pool->unmapped, &b->node);
    b->in_tree = 0;
}

/* --------------------------------------------------------------- blocks */

gm_block_t *gm_block_new_unlocked(gm_alloc_t *a, uintptr_t ptr, size_t size, uintptr_t stream,
                                  gm_pool_t *pool) {
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
    b->mapped = 1;
    b->uses = b->uses_inline;
    b->cap_uses = 2;
    return b;
}

void gm_block_delete_unlocked(gm_alloc_t *a, gm_block_t *b) {
    if (b->uses != b->uses_inline)
        free(b->uses);
    b->next = a->free_structs;
    a->free_structs = b;
}

void gm_trace_unlocked(gm_alloc_t *a, gm_action_t act, uintptr_t addr, size_t size,
                       uintptr_t stream, uint32_t ctx) {
    if (a->trace_fn)
        a->trace_fn(a->trace_arg, a->device, act, addr, size, stream, ctx);
}

/* Merge src into dst if src is a free neighbour with the same mapping.
 * Returns the bytes subsumed, or 0. dst must not be in a tree. */
size_t gm_try_merge_unlocked(gm_alloc_t *a, gm_block_t *dst, gm_block_t *src) {
    GM_ASSERT(dst->in_tree == 0, "merge target must not be in a tree");
    if (!src || !gm_block_is_free(src) || dst->mapped != src->mapped)
        return 0;
    GM_ASSERT(src->in_tree != 0, "free neighbour missing from its tree");
    if (dst->prev == src) {
        dst->ptr = src->ptr;
        dst->prev = src->prev;
        if (dst->prev)
            dst->prev->next = dst;
        else
            dst->seg_ctx = src->seg_ctx;
    } else {
        dst->next = src->next;
        if (dst->next)
            dst->next->prev = dst;
    }
    size_t subsumed = src->size;
    dst->size += subsumed;
    if (src->mapped)
        gm_pool_erase_unlocked(src->pool, src);
    else
        gm_unmapped_erase_unlocked(src->pool, src);
    gm_block_delete_unlocked(a, src);
    return subsumed;
}

/* Return a block whose uses and events are over to its pool. */
void gm_free_block_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    GM_ASSERT(gm_block_is_free(b) && b->in_tree == 0, "freeing a block still in use");
    gm_trace_unlocked(a, GM_ACT_FREE_COMPLETED, b->ptr, b->requested_size, b->stream,
                      ctx ? ctx : b->ctx);
    b->ctx = 0;
    size_t orig_size = b->size, requested = b->requested_size;
    gm_pool_t *pool = b->pool;
    int t = gm_pool_type(pool);
    int64_t net_blocks = 0, net_bytes = 0;

    gm_ptrmap_del(&a->active, b->ptr, NULL);
    gm_block_t *cands[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        size_t sub = gm_try_merge_unlocked(a, b, cands[i]);
        if (sub) {
            net_blocks -= 1;
            net_bytes -= (int64_t)sub;
        }
    }
    gm_pool_insert_unlocked(pool, b);
    if (b->prev || b->next) {
        net_blocks += 1;
        net_bytes += (int64_t)b->size;
    }
    /* Expandable segments are left out of inactive_split, as in torch:
     * their wholly free granules can always be released. */
    if (!b->expseg) {
        if (net_blocks > 0)
            STAT_INC(a->stats.inactive_split, t, net_blocks);
        else if (net_blocks < 0)
            STAT_DEC(a->stats.inactive_split, t, -net_blocks);
        if (net_bytes > 0)
            STAT_INC(a->stats.inactive_split_bytes, t, net_bytes);
        else if (net_bytes < 0)
            STAT_DEC(a->stats.inactive_split_bytes, t, -net_bytes);
    }
    STAT_DEC(a->stats.active, t, 1);
    STAT_DEC(a->stats.active_bytes, t, orig_size);
    STAT_DEC(a->stats.requested_bytes, t, requested);
}

/* ------------------------------------------------------------- sizes */

static size_t pow2_floor(size_t x) { return (size_t)1 << (63 - __builtin_clzll((unsigned long long)x)); }

static size_t roundup_next_division(size_t size, size_t divisions) {
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor = pow2_floor(size);
    size_t step = floor >> (63 - __builtin_clzll((unsigned long long)divisions));
    if (step == 0)
        return floor << 1;
    size_t rf = size & ~(step - 1);
    return rf == size ? size : rf + step;
}

size_t gm_size_round(const gm_settings_t *s, size_t size) {
    if (size < GM_MIN_BLOCK_SIZE)
        return GM_MIN_BLOCK_SIZE;
    int idx = (63 - __builtin_clzll((unsigned long long)size)) - 20;
    if (idx < 0)
        idx = 0;
    if (idx >= GM_ROUNDUP_INTERVALS)
        idx = GM_ROUNDUP_INTERVALS - 1;
    size_t div = s->roundup_power2_divisions[idx];
    if (div > 1 && size > GM_MIN_BLOCK_SIZE * div)
        return roundup_next_division(size, div);
    return GM_MIN_BLOCK_SIZE * ((size + GM_MIN_BLOCK_SIZE - 1) / GM_MIN_BLOCK_SIZE);
}

int gm_size_is_small(size_t rounded) { return rounded <= GM_SMALL_SIZE; }

size_t gm_size_segment(size_t size) {
    if (size <= GM_SMALL_SIZE)
        return GM_SMALL_BUFFER;
    if (size < GM_MIN_LARGE_ALLOC)
        return GM_LARGE_BUFFER;
    return GM_ROUND_LARGE * ((size + GM_ROUND_LARGE - 1) / GM_ROUND_LARGE);
}

int gm_alloc_expandable_active(gm_alloc_t *a) {
    LOCK(a);
    int r = a->settings.expandable_segments && a->granularity > 0;
    UNLOCK(a);
    return r;
}

static int expandable_on(const gm_alloc_t *a) {
    return a->settings.expandable_segments && a->granularity > 0;
}

/* --------------------------------------------------------------- search */

typedef struct alloc_params {
    size_t size;       /* rounded */
    size_t alloc_size; /* segment size if a new one is needed */
    uintptr_t stream;
    gm_pool_t *pool;
    gm_block_t *block;
    int limit_hit;
} alloc_params_t;

static size_t expandable_size(const gm_block_t *b) {
    return b->size + ((b->next && !b->next->mapped) ? b->next->size : 0);
}

static int get_free_block(gm_alloc_t *a, alloc_params_t *p) {
    gm_pool_t *pool = p->pool;
    size_t max_split = a->settings.max_split_size;
    if (a->set_fraction && a->settings.garbage_collection_threshold > 0.0)
        pool->get_free_blocks_call_count++;
    gm_block_t key;
    key.stream = p->stream;
    key.size = p->size;
    key.ptr = 0;
    gm_tree_node_t *n = gm_tree_lower_bound(&pool->blocks, &key.node);
    if (!n || BLK(n)->stream != p->stream)
        return 0;
    if (BLK(n)->expseg) {
        if (a->settings.expandable_segments) {
            /* For best fit, a block followed by unmapped space counts with
             * the size it could grow to. */
            gm_tree_node_t *next = gm_tree_next(n);
            while (BLK(n)->expseg && next && BLK(next)->stream == p->stream &&
                   expandable_size(BLK(next)) < expandable_size(BLK(n))) {
                n = next;
                next = gm_tree_next(next);
            }
        } else {
            do {
                n = gm_tree_next(n);
            } while (n && BLK(n)->expseg && BLK(n)->stream == p->stream);
            if (!n || BLK(n)->stream != p->stream)
                return 0;
        }
    }
    gm_block_t *b = BLK(n);
    /* Oversize blocks serve only requests within 20 MiB of their size. */
    if (p->size < max_split && b->size >= max_split)
        return 0;
    if (p->size >= max_split && b->size >= p->size + GM_LARGE_BUFFER)
        return 0;
    gm_pool_erase_unlocked(pool, b);
    p->block = b;
    return 1;
}

/* --------------------------------------------------------- releasing */

static int release_block(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    int rc = a->be->seg_free(a->be->ctx, a->device, b->ptr, b->size);
    if (rc)
        return rc;
    gm_trace_unlocked(a, GM_ACT_SEGMENT_FREE, b->ptr, b->size, b->stream, ctx ? ctx : b->seg_ctx);
    a->stats.num_device_free++;
    a->total_allocated_memory -= b->size;
    int t = gm_pool_type(b->pool);
    STAT_DEC(a->stats.segment, t, 1);
    STAT_DEC(a->stats.reserved_bytes, t, b->size);
    if (b->size >= a->settings.max_split_size)
        gm_stat_dec(&a->stats.oversize_segments, 1);
    gm_pool_erase_unlocked(b->pool, b);
    gm_block_delete_unlocked(a, b);
    return GM_OK;
}

static int releasable(const gm_block_t *b) { return !b->expseg && !b->prev && !b->next; }

/* Free oversize cached blocks until `size` bytes are freed. */
static int release_available_cached_blocks(gm_alloc_t *a, const alloc_params_t *p, uint32_t ctx) {
    size_t max_split = a->settings.max_split_size;
    if (max_split == SIZE_MAX)
        return 0;
    gm_block_t key;
    key.stream = p->stream;
    key.size = p->size < max_split ? max_split : p->size;
    key.ptr = 0;
    gm_tree_node_t *n = gm_tree_lower_bound(&p->pool->blocks, &key.node);
    if (!n || BLK(n)->stream != p->stream) {
        gm_tree_node_t *m = n ? gm_tree_prev(n) : gm_tree_last(&p->pool->blocks);
        size_t released = 0;
        while (released < key.size && m && BLK(m)->size >= max_split &&
               BLK(m)->stream == p->stream && releasable(BLK(m))) {
            gm_block_t *cur = BLK(m);
            m = gm_tree_prev(m);
            size_t sz = cur->size;
            if (release_block(a, cur, ctx))
                return 0;
            released += sz;
        }
        return released >= key.size;
    }
    if (!releasable(BLK(n)))
        return 0;
    return release_block(a, BLK(n), ctx) == GM_OK;
}

static int release_pool_blocks(gm_alloc_t *a, gm_pool_t *pool, uint32_t ctx) {
    int rc = GM_OK;
    size_t n_exp = 0;
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n;) {
        gm_block_t *b = BLK(n);
        n = gm_tree_next(n);
        if (b->expseg)
            n_exp++;
        else if (!b->prev && !b->next && (rc = release_block(a, b, ctx)))
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
        if (BLK(n)->expseg)
            todo[k++] = BLK(n);
    for (size_t i = 0; i < k && rc == GM_OK; i++) {
        gm_block_t *b = todo[i];
        rc = gm_unmap_block_unlocked(a, b, ctx);
        if (rc == GM_OK && !b->mapped && !b->prev && !b->next)
            rc = gm_release_expseg_unlocked(a, b);
    }
    free(todo);
    return rc;
}

static int release_cached_blocks(gm_alloc_t *a, uint32_t ctx) {
    int rc = gm_sync_all_events_unlocked(a, ctx);
    if (rc)
        return rc;
    if ((rc = release_pool_blocks(a, &a->large_pool, ctx)))
        return rc;
    return release_pool_blocks(a, &a->small_pool, ctx);
}

/* Free large unsplit cached blocks older than average until enough is
 * reclaimed (garbage_collection_threshold, only with a memory limit). */
static void garbage_collect(gm_alloc_t *a, uint32_t ctx) {
    size_t threshold =
        (size_t)(a->settings.garbage_collection_threshold * (double)a->allowed_memory_maximum);
    if (a->total_allocated_memory <= threshold)
        return;
    size_t target = a->total_allocated_memory - threshold, reclaimed = 0;
    gm_pool_t *pool = &a->large_pool;
    double total_age = 0;
    int count = 0;
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n; n = gm_tree_next(n))
        if (releasable(BLK(n))) {
            total_age += (double)(pool->get_free_blocks_call_count - BLK(n)->gc_count_base);
            count++;
        }
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = total_age / count;
        freed = 0;
        for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n;) {
            gm_block_t *b = BLK(n);
            n = gm_tree_next(n);
            double age = (double)(pool->get_free_blocks_call_count - b->gc_count_base);
            if (releasable(b) && age >= age_threshold) {
                size_t sz = b->size;
                if (release_block(a, b, ctx))
                    return;
                freed = 1;
                reclaimed += sz;
                total_age -= age;
                count--;
            }
        }
    }
}

/* ---------------------------------------------------------- allocating */

/* 1 on success, 0 when out of memory, <0 on other errors. */
static int alloc_block(gm_alloc_t *a, alloc_params_t *p, int is_retry, uint32_t ctx) {
    size_t size = p->alloc_size;
    if (is_retry)
        a->stats.num_alloc_retries++;
    if (a->set_fraction && a->total_allocated_memory + size > a->allowed_memory_maximum) {
        p->limit_hit = 1;
        return 0;
    }
    if (expandable_on(a))
        return gm_expandable_alloc_unlocked(a, p->stream, p->pool, p->size, ctx, &p->block);
    uintptr_t ptr = 0;
    int rc = a->be->seg_alloc(a->be->ctx, a->device, size, &ptr);
    if (rc == GM_EOOM)
        return 0;
    if (rc)
        return rc;
    gm_block_t *b = gm_block_new_unlocked(a, ptr, size, p->stream, p->pool);
    if (!b) {
        a->be->seg_free(a->be->ctx, a->device, ptr, size);
        return GM_ENOMEM;
    }
    b->seg_ctx = ctx;
    a->total_allocated_memory += size;
    int t = gm_pool_type(p->pool);
    STAT_INC(a->stats.segment, t, 1);
    STAT_INC(a->stats.reserved_bytes, t, size);
    if (size >= a->settings.max_split_size)
        gm_stat_inc(&a->stats.oversize_segments, 1);
    a->stats.num_device_alloc++;
    gm_trace_unlocked(a, GM_ACT_SEGMENT_ALLOC, ptr, size, p->stream, ctx);
    p->block = b;
    return 1;
}

static int should_split(const gm_alloc_t *a, const gm_block_t *b, size_t size) {
    size_t remaining = b->size - size;
    if (b->pool->is_small || a->settings.expandable_segments)
        return remaining >= GM_MIN_BLOCK_SIZE;
    return size < a->settings.max_split_size && remaining > GM_SMALL_SIZE;
}

static int alloc_found_block(gm_alloc_t *a, alloc_params_t *p, size_t orig_size, uint32_t ctx,
                             uintptr_t *out_ptr) {
    gm_block_t *b = p->block;
    size_t size = p->size;
    gm_pool_t *pool = p->pool;
    int t = gm_pool_type(pool);
    int already_split = b->prev || b->next;
    GM_ASSERT(b->size >= size && b->in_tree == 0 && b->mapped, "found block cannot serve");

    if (should_split(a, b, size)) {
        gm_block_t *rem = b;
        b = gm_block_new_unlocked(a, rem->ptr, size, p->stream, pool);
        if (!b) {
            gm_pool_insert_unlocked(pool, rem);
            return GM_ENOMEM;
        }
        b->expseg = rem->expseg;
        b->prev = rem->prev;
        if (b->prev)
            b->prev->next = b;
        else {
            b->seg_ctx = rem->seg_ctx;
            rem->seg_ctx = 0;
        }
        b->next = rem;
        rem->prev = b;
        rem->ptr += size;
        rem->size -= size;
        gm_pool_insert_unlocked(pool, rem);
        if (!b->expseg) {
            if (already_split) {
                STAT_DEC(a->stats.inactive_split_bytes, t, b->size);
            } else {
                STAT_INC(a->stats.inactive_split_bytes, t, rem->size);
                STAT_INC(a->stats.inactive_split, t, 1);
            }
        }
    } else if (already_split && !b->expseg) {
        STAT_DEC(a->stats.inactive_split_bytes, t, b->size);
        STAT_DEC(a->stats.inactive_split, t, 1);
    }

    b->allocated = 1;
    b->requested_size = orig_size;
    b->ctx = ctx;
    if (gm_ptrmap_put(&a->active, b->ptr, (uintptr_t)b)) {
        /* Out of host memory for the map: give the block back. */
        b->allocated = 0;
        STAT_INC(a->stats.active, t, 1);
        STAT_INC(a->stats.active_bytes, t, b->size);
        STAT_INC(a->stats.requested_bytes, t, orig_size);
        gm_free_block_unlocked(a, b, ctx);
        return GM_ENOMEM;
    }
    gm_trace_unlocked(a, GM_ACT_ALLOC, b->ptr, orig_size, b->stream, ctx);
    STAT_INC(a->stats.allocation, t, 1);
    STAT_INC(a->stats.allocated_bytes, t, b->size);
    STAT_INC(a->stats.active, t, 1);
    STAT_INC(a->stats.active_bytes, t, b->size);
    STAT_INC(a->stats.requested_bytes, t, orig_size);
    if (b->size >= a->settings.max_split_size)
        gm_stat_inc(&a->stats.oversize_allocations, 1);
    *out_ptr = b->ptr;
    return GM_OK;
}

static void fill_oom(gm_alloc_t *a, const alloc_params_t *p, size_t orig, size_t dev_free,
                     size_t dev_total, gm_oom_info_t *oom) {
    memset(oom, 0, sizeof *oom);
    oom->requested = orig;
    oom->rounded = p->size;
    oom->alloc_size = p->alloc_size;
    oom->device_total = dev_total;
    oom->device_free = dev_free;
    oom->allocated = (size_t)a->stats.allocated_bytes[GM_STAT_ALL].current;
    oom->reserved = (size_t)a->stats.reserved_bytes[GM_STAT_ALL].current;
    oom->reserved_unallocated = oom->reserved - oom->allocated;
    oom->allowed = a->set_fraction ? a->allowed_memory_maximum : 0;
    oom->limit_hit = p->limit_hit;
}

int gm_alloc_malloc(gm_alloc_t *a, size_t orig_size, uintptr_t stream, uint32_t ctx,
                    uintptr_t *out_ptr, gm_oom_info_t *oom) {
    if (!out_ptr)
        return GM_EINVAL;
    *out_ptr = 0;
    if (orig_size == 0)
        return GM_OK; /* like torch: a zero-size request gets no memory */
    if (orig_size > ((size_t)1 << 62))
        return GM_EINVAL;
    LOCK(a);
    int rc = gm_process_events_unlocked(a, ctx);
    if (rc) {
        UNLOCK(a);
        return rc;
    }
    alloc_params_t p;
    memset(&p, 0, sizeof p);
    p.size = gm_size_round(&a->settings, orig_size);
    p.pool = gm_size_is_small(p.size) ? &a->small_pool : &a->large_pool;
    p.alloc_size = gm_size_segment(p.size);
    p.stream = stream;

    int found = get_free_block(a, &p);
    if (!found) {
        if (a->set_fraction && a->settings.garbage_collection_threshold > 0.0)
            garbage_collect(a, ctx);
        found = alloc_block(a, &p, 0, ctx);
        if (found == 0 && release_available_cached_blocks(a, &p, ctx))
            found = alloc_block(a, &p, 0, ctx);
        if (found == 0) {
            rc = release_cached_blocks(a, ctx);
            if (rc == GM_OK)
                found = alloc_block(a, &p, 1, ctx);
            else
                found = rc;
        }
    }
    if (found < 0) {
        UNLOCK(a);
        return found;
    }
    if (!found) {
        size_t dev_free = 0, dev_total = 0;
        a->be->mem_get_info(a->be->ctx, a->device, &dev_free, &dev_total);
        gm_trace_unlocked(a, GM_ACT_OOM, dev_free, p.size, stream, ctx);
        a->stats.num_ooms++;
        if (oom)
            fill_oom(a, &p, orig_size, dev_free, dev_total, oom);
        DEEP_CHECK(a);
        UNLOCK(a);
        return GM_EOOM;
    }
    rc = alloc_found_block(a, &p, orig_size, ctx, out_ptr);
    DEEP_CHECK(a);
    UNLOCK(a);
    return rc;
}

/* Why a pointer is not live: freed already (it lies in free memory) or
 * never ours. */
static int classify_unknown(gm_alloc_t *a, uintptr_t ptr) {
    gm_pool_t *pools[2] = {&a->small_pool, &a->large_pool};
    for (int i = 0; i < 2; i++)
        for (gm_tree_node_t *n = gm_tree_first(&pools[i]->blocks); n; n = gm_tree_next(n))
            if (ptr >= BLK(n)->ptr && ptr < BLK(n)->ptr + BLK(n)->size)
                return GM_EDOUBLEFREE;
    return GM_ENOTFOUND;
}

int gm_alloc_free(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx) {
    if (ptr == 0)
        return GM_OK;
    LOCK(a);
    uintptr_t v;
    if (!gm_ptrmap_get(&a->active, ptr, &v)) {
        int rc = classify_unknown(a, ptr);
        UNLOCK(a);
        return rc;
    }
    gm_block_t *b = (gm_block_t *)v;
    if (!b->allocated) {
        UNLOCK(a);
        return GM_EDOUBLEFREE;
    }
    int t = gm_pool_type(b->pool);
    b->allocated = 0;
    STAT_DEC(a->stats.allocation, t, 1);
    STAT_DEC(a->stats.allocated_bytes, t, b->size);
    gm_trace_unlocked(a, GM_ACT_FREE_REQUESTED, b->ptr, b->requested_size, b->stream,
                      ctx ? ctx : b->ctx);
    if (b->size >= a->settings.max_split_size)
        gm_stat_dec(&a->stats.oversize_allocations, 1);
    int rc = GM_OK;
    if (b->n_uses) {
        rc = gm_insert_events_unlocked(a, b);
        if (b->event_count == 0 && b->n_uses == 0)
            gm_free_block_unlocked(a, b, ctx);
    } else {
        gm_free_block_unlocked(a, b, ctx);
    }
    DEEP_CHECK(a);
    UNLOCK(a);
    return rc;
}

int gm_alloc_block_size(gm_alloc_t *a, uintptr_t ptr, size_t *size, size_t *requested,
                        uintptr_t *stream) {
    LOCK(a);
    uintptr_t v;
    int rc = GM_ENOTFOUND;
    if (gm_ptrmap_get(&a->active, ptr, &v) && ((gm_block_t *)v)->allocated) {
        gm_block_t *b = (gm_block_t *)v;
        if (size)
            *size = b->size;
        if (requested)
            *requested = b->requested_size;
        if (stream)
            *stream = b->stream;
        rc = GM_OK;
    }
    UNLOCK(a);
    return rc;
}

int gm_alloc_record_stream(gm_alloc_t *a, uintptr_t ptr, uintptr_t stream) {
    LOCK(a);
    uintptr_t v;
    int rc = GM_ENOTFOUND;
    if (gm_ptrmap_get(&a->active, ptr, &v) && ((gm_block_t *)v)->allocated) {
        gm_block_t *b = (gm_block_t *)v;
        /* Uses on the allocation stream need no synchronisation. */
        rc = stream == b->stream ? GM_OK : gm_record_use_unlocked(a, b, stream);
    }
    UNLOCK(a);
    return rc;
}

int gm_alloc_process_events(gm_alloc_t *a, uint32_t ctx) {
    LOCK(a);
    int rc = gm_process_events_unlocked(a, ctx);
    UNLOCK(a);
    return rc;
}

int gm_alloc_empty_cache(gm_alloc_t *a, uint32_t ctx) {
    LOCK(a);
    int rc = release_cached_blocks(a, ctx);
    DEEP_CHECK(a);
    UNLOCK(a);
    return rc;
}

int gm_alloc_set_memory_fraction(gm_alloc_t *a, double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return GM_EINVAL;
    LOCK(a);
    size_t dev_free = 0, dev_total = 0;
    int rc = a->be->mem_get_info(a->be->ctx, a->device, &dev_free, &dev_total);
    if (rc == GM_OK) {
        a->allowed_memory_maximum = (size_t)(fraction * (double)dev_total);
        a->set_fraction = 1;
    }
    UNLOCK(a);
    return rc;
}

int gm_alloc_set_memory_limit(gm_alloc_t *a, size_t bytes) {
    LOCK(a);
    a->allowed_memory_maximum = bytes;
    a->set_fraction = bytes != 0;
    UNLOCK(a);
    return GM_OK;
}

size_t gm_alloc_memory_limit(gm_alloc_t *a) {
    LOCK(a);
    size_t r = a->set_fraction ? a->allowed_memory_maximum : 0;
    UNLOCK(a);
    return r;
}

/* ------------------------------------------------------------ lifecycle */

int gm_alloc_create(const gm_backend_t *be, int device, const gm_settings_t *settings,
                    gm_alloc_t **out) {
    if (!be || !out)
        return GM_EINVAL;
    gm_settings_t s;
    if (settings)
        s = *settings;
    else
        gm_settings_default(&s);
    if (gm_settings_validate(&s, NULL, 0))
        return GM_EINVAL;
    gm_alloc_t *a = calloc(1, sizeof *a);
    if (!a)
        return GM_ENOMEM;
    if (gm_ptrmap_init(&a->active, 1024)) {
        free(a);
        return GM_ENOMEM;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->be = be;
    a->device = device;
    a->settings = s;
    gm_tree_init(&a->small_pool.blocks, cmp_size);
    gm_tree_init(&a->small_pool.unmapped, cmp_addr);
    gm_tree_init(&a->large_pool.blocks, cmp_size);
    gm_tree_init(&a->large_pool.unmapped, cmp_addr);
    a->small_pool.is_small = 1;
    size_t g = 0;
    int rc = be->vmm_granularity ? be->vmm_granularity(be->ctx, device, &g) : GM_ENOTSUP;
    if (rc == GM_OK && g > 0) {
        a->granularity = g;
    } else if (rc != GM_OK && rc != GM_ENOTSUP) {
        /* A device error, not a missing feature: do not silently fall back. */
        gm_ptrmap_free(&a->active);
        pthread_mutex_destroy(&a->lock);
        free(a);
        return rc;
    }
    a->stats.max_split_size = s.max_split_size == SIZE_MAX ? -1 : (int64_t)s.max_split_size;
    *out = a;
    return GM_OK;
}

void gm_alloc_destroy(gm_alloc_t *a) {
    if (!a)
        return;
    LOCK(a);
    gm_events_destroy_unlocked(a);
    /* Free every live block, then release everything that is cached. */
    /* One at a time, so a neighbour still marked live is never merged. */
    for (size_t i = 0; a->active.count && i <= a->active.mask;) {
        if (!a->active.slots[i].key) {
            i++;
            continue;
        }
        gm_block_t *b = (gm_block_t *)a->active.slots[i].value;
        if (b->allocated) {
            int t = gm_pool_type(b->pool);
            STAT_DEC(a->stats.allocation, t, 1);
            STAT_DEC(a->stats.allocated_bytes, t, b->size);
        }
        b->allocated = 0;
        b->n_uses = 0;
        b->event_count = 0;
        gm_free_block_unlocked(a, b, 0); /* removes slot i; re-read it */
    }
    release_pool_blocks(a, &a->large_pool, 0);
    release_pool_blocks(a, &a->small_pool, 0);
    gm_expandable_destroy_unlocked(a);
    gm_ptrmap_free(&a->active);
    while (a->free_structs) {
        gm_block_t *b = a->free_structs;
        a->free_structs = b->next;
        free(b);
    }
    UNLOCK(a);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int gm_alloc_device(const gm_alloc_t *a) { return a->device; }

const char *gm_alloc_last_error(const gm_alloc_t *a) {
    const char *e = a->be->last_error ? a->be->last_error(a->be->ctx) : NULL;
    return e ? e : "";
}

int gm_alloc_set_settings(gm_alloc_t *a, const gm_settings_t *s) {
    if (!s || gm_settings_validate(s, NULL, 0))
        return GM_EINVAL;
    LOCK(a);
    a->settings = *s;
    a->stats.max_split_size = s->max_split_size == SIZE_MAX ? -1 : (int64_t)s->max_split_size;
    UNLOCK(a);
    return GM_OK;
}

void gm_alloc_get_settings(gm_alloc_t *a, gm_settings_t *out) {
    LOCK(a);
    *out = a->settings;
    UNLOCK(a);
}

void gm_alloc_get_stats(gm_alloc_t *a, gm_stats_t *out) {
    LOCK(a);
    *out = a->stats;
    UNLOCK(a);
}

static void reset_peak(gm_stat_t *s) { s->peak = s->current; }
static void reset_acc(gm_stat_t *s) { s->allocated = s->freed = 0; }

#define FOR_EACH_ARRAY(st, fn)                                                 \
    for (int i_ = 0; i_ < GM_STAT_NTYPES; i_++) {                              \
        fn(&(st)->allocation[i_]);                                             \
        fn(&(st)->segment[i_]);                                                \
        fn(&(st)->active[i_]);                                                 \
        fn(&(st)->inactive_split[i_]);                                         \
        fn(&(st)->allocated_bytes[i_]);                                        \
        fn(&(st)->reserved_bytes[i_]);                                         \
        fn(&(st)->active_bytes[i_]);                                           \
        fn(&(st)->inactive_split_bytes[i_]);                                   \
        fn(&(st)->requested_bytes[i_]);                                        \
    }

void gm_alloc_reset_peak_stats(gm_alloc_t *a) {
    LOCK(a);
    FOR_EACH_ARRAY(&a->stats, reset_peak);
    reset_peak(&a->stats.oversize_allocations);
    reset_peak(&a->stats.oversize_segments);
    UNLOCK(a);
}

void gm_alloc_reset_accumulated_stats(gm_alloc_t *a) {
    LOCK(a);
    FOR_EACH_ARRAY(&a->stats, reset_acc);
    reset_acc(&a->stats.oversize_allocations);
    reset_acc(&a->stats.oversize_segments);
    a->stats.num_alloc_retries = 0;
    a->stats.num_ooms = 0;
    a->stats.num_sync_all_streams = 0;
    a->stats.num_device_alloc = 0;
    a->stats.num_device_free = 0;
    UNLOCK(a);
}

void gm_alloc_set_trace_hook(gm_alloc_t *a, gm_trace_fn fn, void *arg) {
    LOCK(a);
    a->trace_fn = fn;
    a->trace_arg = arg;
    UNLOCK(a);
}
