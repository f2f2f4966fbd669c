/*
 * malloc.c - the allocator's operations on blocks: malloc (search, new
 * segment, release-and-retry, out of memory), free, record_stream,
 * block_size, and polling or waiting for events (gm_alloc.h).
 *
 * Policy is PyTorch's CUDACachingAllocator: best fit from the pool of the
 * request's size class on the request's stream; otherwise a new segment
 * (or expandable growth); otherwise release cached oversize blocks and
 * retry; otherwise release everything cached and retry once more; otherwise
 * out of memory, reported with the facts torch's message gives.
 * Every function takes the allocator lock and never the GIL.
 * Must not: abort, call Python, or call the backend without the lock.
 *
 * Note [Caching off]
 * Rationale: torch's caching_allocator_enable(False) and
 *   PYTORCH_NO_CUDA_MEMORY_CACHING send every request around torch's
 *   allocator, to cudaMalloc, with a deleter that calls cudaFree: none of
 *   that memory is in memory_stats() (requested_bytes, reserved_bytes,
 *   num_device_alloc, ... all stay as they were), in the trace or in the
 *   snapshot's segments, the memory fraction does not limit it, and
 *   record_stream ignores it. What was allocated before caching went off
 *   is freed into the cache as usual, and what was allocated while it was
 *   off goes back to the device when freed, whatever the switch says then.
 * Approach: while a->uncached, every request (routed to a private pool or
 *   not) is served from the uncached pool: a plain segment of its own
 *   rounded size, never reused. The pool is marked uncounted, and the one
 *   function of each transition in stats.h and the trace hook
 *   (gm_trace_pool_unlocked) skip its blocks, so the statistics, the trace
 *   and the snapshots (walk.c) never see them; check.c leaves them out of
 *   what it recomputes. A freed block of the pool goes straight back to
 *   the device (a synchronous free, as torch's cudaFree).
 * Limitations: a request that finds the device full still releases the
 *   cache and retries, and out of memory is counted and raised with
 *   torch's message (torch raises its CUDA error). During a CUDA graph
 *   capture a freed block stays in the uncached pool until the first event
 *   poll after it (Note [Capture-safe paths] in release.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devcall.h"
#include "events.h"
#include "expandable.h"
#include "malloc.h"
#include "pool.h"
#include "privpool.h"
#include "release.h"
#include "segment.h"
#include "sizes.h"
#include "stats.h"
#include "trace.h"

typedef struct request {
    size_t size;       /* rounded */
    size_t alloc_size; /* segment size if a new one is needed */
    uintptr_t stream;
    gm_pool_t *pool;
    gm_block_t *block; /* the block found or made, in no tree */
    int limit_hit;
} request_t;

/* New device memory for the request. 1 on success, 0 when out of memory
 * (the device's or the limit's), <0 on other errors. The uncached pool's
 * request gets a plain segment of its own size, as torch's uncached path
 * gets a cudaMalloc of its own, outside the limit (Note [Caching off]). */
static int alloc_block(gm_alloc_t *a, request_t *r, int is_retry, uint32_t ctx) {
    int counted = gm_pool_counted(r->pool);
    if (is_retry && counted)
        gm_stats_alloc_retry(a);
    if (counted && a->set_fraction &&
        gm_reserved_bytes(a) + r->alloc_size > a->allowed_memory_maximum) {
        r->limit_hit = 1;
        return 0;
    }
    if (gm_expandable_on(a) && counted)
        return gm_expandable_alloc_unlocked(a, r->stream, r->pool, r->size, ctx, &r->block);
    return gm_segment_alloc_unlocked(a, r->pool, r->stream, r->alloc_size, ctx, &r->block);
}

static int should_split(const gm_alloc_t *a, const gm_block_t *b, size_t size) {
    size_t remaining = b->size - size;
    if (b->pool->is_small || a->settings.expandable_segments)
        return remaining >= GM_MIN_BLOCK_SIZE;
    return !gm_size_is_oversize(&a->settings, size) && remaining > GM_SMALL_SIZE;
}

/* Hand out the found block, split when `split` says so (the malloc path:
 * when the rest is worth keeping). The active map has room for one more
 * entry (reserved by the caller). */
/* Always inlined into malloc's fast path (called out of line, as the compiler
 * chose once the checkpoint restore became a second caller, a malloc+free
 * pair measured 4-7% slower); the restore gets its own copy. */
__attribute__((always_inline)) static inline int
alloc_found_block(gm_alloc_t *a, request_t *r, size_t orig_size, uint32_t ctx, int split,
                  gm_block_t **out_block) {
    gm_block_t *b = r->block;
    GM_ASSERT(b->size >= r->size && b->in_tree == GM_IN_NONE && b->mapped,
              "found block cannot serve");
    gm_split_delta_t d = {0, 0};
    gm_split_count(&d, b, -1);
    if (split) {
        gm_block_t *rem = b;
        b = gm_block_new_unlocked(a, rem->ptr, r->size, rem->stream, rem->pool, rem->expseg, 1);
        if (!b) {
            gm_pool_insert_free_unlocked(rem);
            return GM_ENOMEM;
        }
        rem->ptr += r->size;
        rem->size -= r->size;
        gm_block_link_before(b, rem);
        gm_pool_insert_free_unlocked(rem);
        gm_split_count(&d, rem, +1);
    }
    b->allocated = 1;
    b->requested_size = orig_size;
    b->oversize = (uint8_t)gm_size_is_oversize(&a->settings, b->size);
    b->ctx = ctx;
    int rc = gm_ptrmap_put(&a->active, b->ptr, (uintptr_t)b);
    GM_ASSERT(rc == GM_OK, "the active map had room reserved");
    (void)rc;
    gm_trace_pool_unlocked(a, b->pool, GM_ACT_ALLOC, b->ptr, orig_size, b->stream, ctx);
    gm_stats_block_allocated(a, b, &d);
    *out_block = b;
    return GM_OK;
}

static size_t cached_bytes(const gm_pool_t *pool) {
    size_t n = 0;
    for (gm_tree_node_t *x = gm_tree_first(&pool->blocks); x; x = gm_tree_next(x))
        n += gm_block_of(x)->size;
    return n;
}

static void fill_oom(gm_alloc_t *a, const request_t *r, size_t orig, size_t dev_free,
                     size_t dev_total, gm_oom_info_t *oom) {
    memset(oom, 0, sizeof *oom);
    oom->requested = orig;
    oom->rounded = r->size;
    oom->alloc_size = r->alloc_size;
    oom->device_total = dev_total;
    oom->device_free = dev_free;
    oom->allocated = (size_t)a->stats.allocated_bytes[GM_STAT_ALL].current;
    oom->reserved = gm_reserved_bytes(a);
    oom->reserved_unallocated = oom->reserved - oom->allocated;
    oom->allowed = a->set_fraction ? a->allowed_memory_maximum : 0;
    oom->has_limit = a->set_fraction;
    oom->limit_hit = r->limit_hit;
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next)
        oom->private_pool_cached += cached_bytes(&p->small) + cached_bytes(&p->large);
}

/* Poll the events; then what the uncached pool still holds (freed during
 * a capture) goes back to the device. */
static int process_events(gm_alloc_t *a, uint32_t ctx) {
    int rc = gm_events_process_unlocked(a, ctx);
    if (rc == GM_OK && a->uncached_pool.blocks.count)
        rc = gm_release_pool_unlocked(a, &a->uncached_pool, ctx);
    return rc;
}

/* Find or make a block for r: 1, 0 (out of memory) or <0. With caching
 * off the request goes to the uncached pool: nothing cached is reused and
 * nothing is collected (Note [Caching off]). */
static int find_or_make(gm_alloc_t *a, request_t *r, uint32_t ctx) {
    if (a->uncached) {
        r->pool = &a->uncached_pool;
        r->alloc_size = r->size;
    } else {
        if ((r->block = gm_pool_find_free_unlocked(a, r->pool, r->stream, r->size)))
            return 1;
        if (a->set_fraction && a->settings.garbage_collection_threshold > 0.0)
            gm_release_gc_unlocked(a, ctx);
    }
    int found = alloc_block(a, r, 0, ctx);
    if (found == 0 && gm_release_oversize_unlocked(a, r->pool, r->stream, r->size, ctx))
        found = alloc_block(a, r, 0, ctx);
    if (found == 0 && !gm_capture_underway(a)) { /* torch: not while capturing */
        int rc = gm_release_all_unlocked(a, ctx);
        found = rc == GM_OK ? alloc_block(a, r, 1, ctx) : rc;
    }
    return found;
}

/* The pool a request is served from: the default pool of its size class,
 * or the private pool it was routed to (Note [Private pools]). */
static gm_pool_t *request_pool(gm_alloc_t *a, size_t rounded, const gm_mempool_id_t *id) {
    gm_private_pool_t *p = id ? gm_privpool_find_unlocked(a, *id) : NULL;
    if (!p)
        return gm_pool_for_size(a, rounded);
    return gm_sizes_is_small(rounded) ? &p->small : &p->large;
}

/* Shared by both entry points; the compiler keeps one copy, where the
 * default path pays one predictable test of pool_id (inlining it into both
 * measured slower: benchmarks/core_alloc.py). */
static inline int do_malloc(gm_alloc_t *a, size_t orig_size, uintptr_t stream, uint32_t ctx,
                            const gm_mempool_id_t *pool_id, uintptr_t *out_ptr,
                            gm_oom_info_t *oom) {
    if (!out_ptr)
        return GM_EINVAL;
    *out_ptr = 0;
    if (orig_size == 0)
        return GM_OK; /* like torch: a zero-size request gets no memory */
    if (orig_size > GM_MAX_REQUEST)
        return GM_EINVAL;
    gm_lock(a);
    /* No event may be queried while a private pool is allocating (a CUDA
     * graph may be capturing); the one extra branch of the fast path. */
    int rc = a->n_allocating ? GM_OK : process_events(a, ctx);
    if (rc == GM_OK && gm_ptrmap_reserve(&a->active, 1))
        rc = GM_ENOMEM;
    if (rc) {
        gm_unlock(a);
        return rc;
    }
    request_t r;
    memset(&r, 0, sizeof r);
    r.size = gm_sizes_round(&a->settings, orig_size);
    r.pool = pool_id ? request_pool(a, r.size, pool_id) : gm_pool_for_size(a, r.size);
    r.alloc_size = gm_sizes_segment(r.size);
    r.stream = stream;

    int found = find_or_make(a, &r, ctx);
    if (found < 0) {
        gm_unlock(a);
        return found;
    }
    if (!found) {
        size_t dev_free = 0, dev_total = 0;
        gm_dev_mem_get_info(a, &dev_free, &dev_total);
        gm_trace_unlocked(a, GM_ACT_OOM, dev_free, r.size, stream, ctx);
        gm_stats_oom(a);
        if (oom)
            fill_oom(a, &r, orig_size, dev_free, dev_total, oom);
        GM_DEEP_CHECK(a);
        gm_unlock(a);
        return GM_EOOM;
    }
    gm_block_t *b = NULL;
    rc = alloc_found_block(a, &r, orig_size, ctx, should_split(a, r.block, r.size), &b);
    if (rc == GM_OK) {
        *out_ptr = b->ptr;
        gm_dev_block_handed_out(a, b->ptr, orig_size);
    }
    GM_DEEP_CHECK(a);
    gm_unlock(a);
    return rc;
}

int gm_alloc_malloc(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx,
                    uintptr_t *out_ptr, gm_oom_info_t *oom) {
    return do_malloc(a, size, stream, ctx, NULL, out_ptr, oom);
}

int gm_alloc_malloc_pool(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx,
                         gm_mempool_id_t pool, uintptr_t *out_ptr, gm_oom_info_t *oom) {
    return do_malloc(a, size, stream, ctx, gm_mempool_id_is_default(pool) ? NULL : &pool,
                     out_ptr, oom);
}

static int lies_in_free_block(const gm_pool_t *pool, uintptr_t ptr) {
    for (gm_tree_node_t *n = gm_tree_first(&pool->blocks); n; n = gm_tree_next(n))
        if (ptr >= gm_block_of(n)->ptr && ptr < gm_block_of(n)->ptr + gm_block_of(n)->size)
            return 1;
    return 0;
}

/* Why a pointer is not live: freed already (it lies in free memory) or
 * never ours. */
static int classify_unknown(gm_alloc_t *a, uintptr_t ptr) {
    if (lies_in_free_block(&a->small_pool, ptr) || lies_in_free_block(&a->large_pool, ptr))
        return GM_EDOUBLEFREE;
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next)
        if (lies_in_free_block(&p->small, ptr) || lies_in_free_block(&p->large, ptr))
            return GM_EDOUBLEFREE;
    return GM_ENOTFOUND;
}

/* The live (allocated) block at exactly ptr, or NULL. */
static gm_block_t *live_block(gm_alloc_t *a, uintptr_t ptr) {
    uintptr_t v;
    if (!gm_ptrmap_get(&a->active, ptr, &v) || !((gm_block_t *)v)->allocated)
        return NULL;
    return (gm_block_t *)v;
}

/* Free a live block: stats, trace, events for its stream uses, back to its
 * pool when nothing waits on it. */
__attribute__((always_inline)) static inline int free_block(gm_alloc_t *a, gm_block_t *b,
                                                            uint32_t ctx) {
    b->allocated = 0;
    gm_stats_block_free_requested(a, b);
    /* Free now unless a stream still uses it: then the completion follows
     * with nothing between (gm_pool_return_unlocked's first act). */
    gm_trace_free_requested_unlocked(a, b->pool, b->ptr, b->requested_size, b->stream,
                                     ctx ? ctx : b->ctx, gm_block_is_free(b));
    int rc = GM_OK;
    if (b->n_uses) /* no event is recorded while a pool is allocating */
        rc = a->n_allocating ? gm_events_defer_unlocked(a, b) : gm_events_insert_unlocked(a, b);
    if (gm_block_is_free(b)) {
        gm_pool_return_unlocked(a, b, ctx);
        if (!gm_pool_counted(b->pool) && rc == GM_OK) /* tested here: no call per cached free */
            rc = gm_release_uncached_unlocked(a, b, ctx);
    }
    return rc;
}

int gm_alloc_free(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx) {
    if (ptr == 0)
        return GM_OK;
    gm_lock(a);
    uintptr_t v;
    if (!gm_ptrmap_get(&a->active, ptr, &v)) {
        int rc = classify_unknown(a, ptr);
        gm_unlock(a);
        return rc;
    }
    gm_block_t *b = (gm_block_t *)v;
    if (!b->allocated) {
        gm_unlock(a);
        return GM_EDOUBLEFREE;
    }
    int rc = free_block(a, b, ctx);
    GM_DEEP_CHECK(a);
    gm_unlock(a);
    return rc;
}

int gm_malloc_take_unlocked(gm_alloc_t *a, gm_block_t *b, size_t size, uint32_t ctx,
                            gm_block_t **out) {
    if (gm_ptrmap_reserve(&a->active, 1))
        return GM_ENOMEM;
    request_t r;
    memset(&r, 0, sizeof r);
    r.size = size;
    r.stream = b->stream;
    r.pool = b->pool;
    r.block = b;
    return alloc_found_block(a, &r, size, ctx, b->size > size, out);
}

int gm_malloc_free_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    return free_block(a, b, ctx);
}

int gm_alloc_block_size(gm_alloc_t *a, uintptr_t ptr, size_t *size, size_t *requested,
                        uintptr_t *stream) {
    gm_lock(a);
    gm_block_t *b = live_block(a, ptr);
    if (b) {
        if (size)
            *size = b->size;
        if (requested)
            *requested = b->requested_size;
        if (stream)
            *stream = b->stream;
    }
    gm_unlock(a);
    return b ? GM_OK : GM_ENOTFOUND;
}

int gm_alloc_record_stream(gm_alloc_t *a, uintptr_t ptr, uintptr_t stream) {
    gm_lock(a);
    gm_block_t *b = live_block(a, ptr);
    /* Uses on the allocation stream need no synchronisation, nor do those
     * of an uncached block: its free is synchronous (Note [Caching off]). */
    int rc = !b ? GM_ENOTFOUND
             : stream == b->stream || !gm_pool_counted(b->pool)
                 ? GM_OK
                 : gm_events_record_use_unlocked(a, b, stream);
    gm_unlock(a);
    return rc;
}

int gm_alloc_annotate(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx) {
    gm_lock(a);
    gm_block_t *b = live_block(a, ptr);
    if (b)
        gm_trace_pool_unlocked(a, b->pool, GM_ACT_ANNOTATE, b->ptr, b->requested_size, b->stream, ctx);
    gm_unlock(a);
    return b ? GM_OK : GM_ENOTFOUND;
}

int gm_alloc_process_events(gm_alloc_t *a, uint32_t ctx) {
    gm_lock(a);
    int rc = a->n_allocating ? GM_OK : process_events(a, ctx);
    gm_unlock(a);
    return rc;
}

int gm_alloc_empty_cache(gm_alloc_t *a, uint32_t ctx) {
    gm_lock(a);
    int rc = gm_release_all_unlocked(a, ctx);
    GM_DEEP_CHECK(a);
    gm_unlock(a);
    return rc;
}

int gm_alloc_empty_cache_pool(gm_alloc_t *a, gm_mempool_id_t id, uint32_t ctx) {
    if (gm_mempool_id_is_default(id))
        return gm_alloc_empty_cache(a, ctx);
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    int rc = GM_OK;
    /* torch: only a freeable pool gives memory back; nothing while a
     * capture may be underway (Note [Capture-safe paths] in release.c) */
    if (p && p->use_count == 0 && !gm_capture_underway(a)) {
        rc = gm_events_sync_all_unlocked(a, ctx);
        if (rc == GM_OK)
            rc = gm_release_freeable_pools_unlocked(a, p, ctx);
    }
    GM_DEEP_CHECK(a);
    gm_unlock(a);
    return rc;
}
