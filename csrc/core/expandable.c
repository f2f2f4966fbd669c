/*
 * expandable.c - expandable segments: one reserved virtual range per
 * (stream, pool), backed by physical granules mapped on demand.
 *
 * Note [Expandable segments]
 * Rationale: with plain segments, a request slightly larger than every free
 *   hole needs a new segment, and the slivers left at segment ends strand
 *   memory. If each stream owns one large virtual range, new memory is
 *   appended right after the free space at the end and blocks tile into it.
 * Approach: the range covers 9/8 of the device's memory, so pages freed in
 *   the middle can be mapped again at the end. Free address space without
 *   physical memory is an `unmapped` block. To grow, the lowest-addressed
 *   run of free + unmapped blocks that is large enough is mapped (only the
 *   granules needed) and merged with its free neighbours. Before growing,
 *   gpumem first unmaps as many wholly free granules from holes between
 *   live blocks (largest holes first), so growth reuses physical memory
 *   that fragmentation left idle instead of adding to it; torch only does
 *   this on OOM. When the holes cannot cover the growth, holes with a
 *   single whole granule are not touched: unmapping it left a 4 MiB hole
 *   unfit for the next 4 MiB request, which split a larger hole instead,
 *   and torchtitan's Llama 3.1 8B reserved 48 MiB more than under torch
 *   (docs/benchmarks.md). empty_cache and the out-of-memory path unmap
 *   every wholly free granule.
 * Limitations: recycling costs an unmap (and a stream synchronize) while a
 *   segment is growing; a steady state that does not grow pays nothing.
 *   While a CUDA graph capture may be underway (a private pool is
 *   allocating) nothing is recycled: a segment grows by new granules only,
 *   as torch's does, since a capture forbids the synchronize (Note
 *   [Capture-safe paths] in release.c).
 *   gpumem maps at the device's granularity (2 MiB) in both
 *   pools, where torch maps 20 MiB pages for its large pool: finer pages
 *   mean more map calls but less memory held in partly used pages. Free
 *   blocks smaller than a granule stay mapped. Segment counts
 *   (segment.*) exclude expandable segments, as in torch; their memory is
 *   in reserved_bytes.
 */
#include "expandable.h"

#include <stdlib.h>
#include <string.h>

#include "devcall.h"
#include "pool.h"
#include "stats.h"
#include "trace.h"

static int recycle_holes(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                         uint32_t ctx);

/* The first run of free (+ unmapped) space on `stream` large enough for
 * `size` bytes, or a new reserved range. */
static gm_block_t *find_expandable_block(gm_alloc_t *a, uintptr_t stream, gm_pool_t *pool,
                                         size_t size, int *rc) {
    gm_block_t key;
    key.stream = stream;
    key.ptr = 0;
    for (gm_tree_node_t *n = gm_tree_lower_bound(&pool->unmapped, &key.node); n;
         n = gm_tree_next(n)) {
        gm_block_t *c = gm_block_of(n);
        if (c->stream != stream)
            break;
        /* A free block right before the unmapped range counts too. */
        if (c->prev && gm_block_is_free(c->prev))
            c = c->prev;
        size_t bytes = 0;
        for (gm_block_t *b = c; b && bytes < size && gm_block_is_free(b); b = b->next)
            bytes += b->size;
        if (bytes >= size)
            return c;
    }
    size_t dev_free = 0, dev_total = 0;
    if ((*rc = gm_dev_mem_get_info(a, &dev_free, &dev_total)))
        return NULL;
    size_t g = a->granularity;
    size_t va_size = (dev_total + dev_total / 8 + g - 1) / g * g;
    if (va_size < size) { /* more than the device could ever map: out of memory */
        *rc = GM_EOOM;
        return NULL;
    }
    gm_expseg_t *es = calloc(1, sizeof *es);
    if (!es) {
        *rc = GM_ENOMEM;
        return NULL;
    }
    es->n_granules = va_size / g;
    es->mapped = calloc(es->n_granules, 1);
    gm_block_t *c = gm_block_new_unlocked(a, 0, va_size, stream, pool, es, 0);
    if (!es->mapped || !c) {
        free(es->mapped);
        free(es);
        if (c)
            gm_block_delete_unlocked(a, c);
        *rc = GM_ENOMEM;
        return NULL;
    }
    if ((*rc = gm_dev_va_reserve(a, va_size, g, &es->va))) {
        free(es->mapped);
        free(es);
        gm_block_delete_unlocked(a, c);
        return NULL;
    }
    es->va_size = va_size;
    es->granule = g;
    es->stream = stream;
    es->pool = pool;
    es->next_seg = a->expsegs;
    a->expsegs = es;
    c->ptr = es->va;
    gm_pool_insert_unmapped_unlocked(c);
    return c;
}

/* Map the granules covering [to_map->ptr, +size). 1, 0 (OOM) or <0. */
static int map_block(gm_alloc_t *a, gm_block_t *to_map, size_t size, uint32_t ctx) {
    gm_expseg_t *es = to_map->expseg;
    size_t g = es->granule;
    size_t begin = (to_map->ptr - es->va) / g;
    size_t end = (to_map->ptr + size - es->va + g - 1) / g;
    uintptr_t range = es->va + begin * g;
    size_t mapped = (end - begin) * g;
    gm_block_t *rem = NULL;
    if (mapped < to_map->size &&
        !(rem = gm_block_new_unlocked(a, to_map->ptr + mapped, to_map->size - mapped,
                                      to_map->stream, to_map->pool, es, 0)))
        return GM_ENOMEM;
    int rc = gm_dev_map(a, range, mapped);
    if (rc) {
        if (rem)
            gm_block_delete_unlocked(a, rem);
        return rc == GM_EOOM ? 0 : rc;
    }
    memset(es->mapped + begin, 1, end - begin);

    gm_pool_remove_unlocked(to_map);
    to_map->mapped = 1;
    if (rem) {
        to_map->size = mapped;
        gm_block_link_after(to_map, rem);
        gm_pool_insert_unmapped_unlocked(rem);
    }
    gm_pool_merge_and_file_unlocked(a, to_map, NULL);

    gm_stats_segment_mapped(a, to_map->pool, mapped, NULL);
    gm_trace_unlocked(a, GM_ACT_SEGMENT_MAP, range, mapped, to_map->stream, ctx);
    if (!to_map->prev && !to_map->seg.ctx)
        to_map->seg.ctx = ctx;
    return 1;
}

int gm_expandable_alloc_unlocked(gm_alloc_t *a, uintptr_t stream, gm_pool_t *pool, size_t size,
                                 uint32_t ctx, gm_block_t **out) {
    /* Recycling unmaps, and an unmap waits for the stream: not while a
     * capture may be underway (Note [Capture-safe paths]). */
    int rc = gm_capture_underway(a) ? GM_OK : recycle_holes(a, pool, stream, size, ctx);
    if (rc)
        return rc;
    gm_block_t *c = find_expandable_block(a, stream, pool, size, &rc);
    if (!c)
        return rc == GM_EOOM ? 0 : rc;
    /* c is: unmapped -> ..., or free -> unmapped -> ... */
    if (!c->mapped) {
        rc = map_block(a, c, c->size < size ? c->size : size, ctx);
        if (rc <= 0)
            return rc;
    }
    while (c->size < size) {
        gm_block_t *nc = c->next;
        size_t remaining = size - c->size;
        rc = map_block(a, nc, remaining < nc->size ? remaining : nc->size, ctx);
        if (rc <= 0)
            return rc;
        c = nc; /* map_block merged c into nc */
    }
    gm_pool_remove_unlocked(c);
    *out = c;
    return 1;
}

/* Unmap the wholly free granules of free block b; with max_granules > 0,
 * only that many, taken from the block's high end. */
static int unmap_part(gm_alloc_t *a, gm_block_t *b, size_t max_granules, uint32_t ctx) {
    gm_expseg_t *es = b->expseg;
    size_t g = es->granule;
    size_t begin = (b->ptr - es->va + g - 1) / g;
    size_t end = (b->ptr + b->size - es->va) / g;
    if (begin >= end)
        return GM_OK;
    if (max_granules && end - begin > max_granules)
        begin = end - max_granules;
    uintptr_t range = es->va + begin * g;
    size_t size = (end - begin) * g;
    size_t before = range - b->ptr, after = b->size - before - size;
    gm_block_t *bf = NULL, *af = NULL;
    if ((before && !(bf = gm_block_new_unlocked(a, b->ptr, before, b->stream, b->pool, es, 1))) ||
        (after && !(af = gm_block_new_unlocked(a, range + size, after, b->stream, b->pool, es, 1)))) {
        if (bf)
            gm_block_delete_unlocked(a, bf);
        return GM_ENOMEM;
    }
    /* Unmapping does not wait for the GPU: finish the stream's work first. */
    int rc = gm_dev_stream_synchronize(a, b->stream);
    if (rc == GM_OK || rc == GM_ENOTSUP) /* no stream_synchronize: nothing to wait for */
        rc = gm_dev_unmap(a, range, size);
    if (rc) {
        if (bf)
            gm_block_delete_unlocked(a, bf);
        if (af)
            gm_block_delete_unlocked(a, af);
        return rc;
    }
    memset(es->mapped + begin, 0, end - begin);
    gm_pool_remove_unlocked(b);
    b->ptr = range;
    b->size = size;
    b->mapped = 0;
    if (bf) {
        gm_block_link_before(bf, b);
        gm_pool_insert_free_unlocked(bf);
    }
    if (af) {
        gm_block_link_after(b, af);
        gm_pool_insert_free_unlocked(af);
    }
    gm_pool_merge_and_file_unlocked(a, b, NULL);

    gm_stats_segment_unmapped(a, b->pool, size, NULL);
    gm_trace_unlocked(a, GM_ACT_SEGMENT_UNMAP, range, size, b->stream, ctx ? ctx : b->seg.ctx);
    return GM_OK;
}

int gm_expandable_unmap_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx) {
    return unmap_part(a, b, 0, ctx);
}
/* How many granules free block b covers wholly. */
static size_t whole_granules(const gm_block_t *b, size_t g) {
    size_t lo = (b->ptr - b->expseg->va + g - 1) / g, hi = (b->ptr + b->size - b->expseg->va) / g;
    return lo < hi ? hi - lo : 0;
}

static int by_size_desc(const void *x, const void *y) {
    size_t a = (*(gm_block_t *const *)x)->size, b = (*(gm_block_t *const *)y)->size;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Before mapping new granules for `size` bytes, unmap up to as many wholly
 * free granules from holes of the same pool and stream, largest holes
 * first, so the segment grows by reusing physical memory instead of adding
 * to it. Holes next to unmapped space are left alone: growth would map
 * them straight back. See Note [Expandable segments]. */
static int recycle_holes(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                         uint32_t ctx) {
    size_t g = a->granularity, need = (size + g - 1) / g, n = 0;
    gm_block_t **cand = NULL;
    size_t cap = 0;
    for (gm_tree_node_t *nd = gm_tree_first(&pool->blocks); nd; nd = gm_tree_next(nd)) {
        gm_block_t *b = gm_block_of(nd);
        if (!b->expseg || b->stream != stream || (b->prev && !b->prev->mapped) ||
            (b->next && !b->next->mapped) || b->size < g)
            continue;
        if (!whole_granules(b, g))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            gm_block_t **c2 = realloc(cand, cap * sizeof *c2);
            if (!c2) {
                free(cand);
                return GM_ENOMEM;
            }
            cand = c2;
        }
        cand[n++] = b;
    }
    /* When the holes cannot cover the growth, unmapping part of it still
     * grows the segment: then a hole with a single whole granule (a small
     * one, often misaligned) is left whole, so the next request of the
     * size that freed it fits there as in torch, instead of splitting a
     * larger hole. See Note [Expandable segments]. */
    size_t avail = 0;
    for (size_t i = 0; i < n && avail < need; i++)
        avail += whole_granules(cand[i], g);
    if (avail < need) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (whole_granules(cand[i], g) >= 2)
                cand[k++] = cand[i];
        n = k;
    }
    if (n > 1)
        qsort(cand, n, sizeof *cand, by_size_desc);
    int rc = GM_OK;
    for (size_t i = 0; i < n && need > 0 && rc == GM_OK; i++) {
        size_t before = gm_reserved_bytes(a);
        rc = unmap_part(a, cand[i], need, ctx);
        size_t got = (before - gm_reserved_bytes(a)) / g;
        need = got >= need ? 0 : need - got;
    }
    free(cand);
    return rc;
}

static void unlink_expseg(gm_alloc_t *a, gm_expseg_t *es) {
    for (gm_expseg_t **p = &a->expsegs; *p; p = &(*p)->next_seg)
        if (*p == es) {
            *p = es->next_seg;
            return;
        }
}

int gm_expandable_release_unlocked(gm_alloc_t *a, gm_block_t *b) {
    gm_expseg_t *es = b->expseg;
    GM_ASSERT(!b->mapped && !b->prev && !b->next, "releasing a range that is not wholly unmapped");
    int rc = gm_dev_va_free(a, es->va, es->va_size);
    if (rc)
        return rc;
    gm_pool_remove_unlocked(b);
    gm_block_delete_unlocked(a, b);
    unlink_expseg(a, es);
    free(es->mapped);
    free(es);
    return GM_OK;
}

static void drop_blocks(gm_alloc_t *a, gm_pool_t *pool) {
    gm_tree_node_t *n;
    while ((n = gm_tree_first(&pool->blocks)) || (n = gm_tree_first(&pool->unmapped))) {
        gm_pool_remove_unlocked(gm_block_of(n));
        gm_block_delete_unlocked(a, gm_block_of(n));
    }
}

/* Teardown: drop every block left in the trees, then unmap and free every
 * range still held. Only gm_alloc_destroy calls this. */
void gm_expandable_destroy_unlocked(gm_alloc_t *a) {
    drop_blocks(a, &a->small_pool);
    drop_blocks(a, &a->large_pool);
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next) {
        drop_blocks(a, &p->small);
        drop_blocks(a, &p->large);
    }
    while (a->expsegs) {
        gm_expseg_t *es = a->expsegs;
        a->expsegs = es->next_seg;
        for (size_t k = 0; k < es->n_granules; k++)
            if (es->mapped[k])
                gm_dev_unmap(a, es->va + k * es->granule, es->granule);
        gm_dev_va_free(a, es->va, es->va_size);
        free(es->mapped);
        free(es);
    }
}
