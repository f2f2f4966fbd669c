/*
 * stats.h - the allocator's statistics (torch.cuda.memory_stats families),
 * changed in exactly one function per transition.
 *
 * Every path that allocates or frees a block, or maps or unmaps device
 * memory, calls the one function below for its transition; no other file
 * writes a->stats. The transitions of the malloc/free fast path are inline
 * here, the rest in stats.c. What a block counts for is defined once, by the
 * predicates of block.h, and check.c recomputes every family from them.
 *
 * inactive_split is kept as torch keeps it: a transition that splits or
 * merges blocks passes the net change in the set of inactive split blocks it
 * touched (gm_split_delta_t: subtract each touched block as it was before,
 * add each as it is after), so accumulated counts match torch's.
 *
 * The blocks and segments of the uncached pool change nothing here (torch
 * counts none of what it allocates while caching is off): each transition
 * returns first for them (Note [Caching off] in malloc.c).
 */
#ifndef GM_CORE_STATS_H
#define GM_CORE_STATS_H

#include "block.h"

typedef struct gm_split_delta {
    int64_t blocks, bytes;
} gm_split_delta_t;

/* Count free block b into d with sign +1 (as it is after) or -1 (as it was
 * before). Every block a transition touches is free at that moment. */
static inline void gm_split_count(gm_split_delta_t *d, const gm_block_t *b, int sign) {
    if (gm_free_block_is_split(b)) {
        d->blocks += sign;
        d->bytes += sign * (int64_t)b->size;
    }
}

/* ---- the hot transitions, inline: one definition each, here ---- */

static inline void gm_stat_inc(gm_stat_t *s, int64_t amount) {
    s->current += amount;
    if (s->current > s->peak)
        s->peak = s->current;
    s->allocated += amount;
}

static inline void gm_stat_dec(gm_stat_t *s, int64_t amount) {
    GM_ASSERT(s->current >= amount, "stat would go negative");
    s->current -= amount;
    s->freed += amount;
}

/* A family is updated for the aggregate and for the pool's own type. */
static inline void gm_stat_fam_inc(gm_stat_t *fam, int type, int64_t amount) {
    gm_stat_inc(&fam[GM_STAT_ALL], amount);
    gm_stat_inc(&fam[type], amount);
}

static inline void gm_stat_fam_dec(gm_stat_t *fam, int type, int64_t amount) {
    gm_stat_dec(&fam[GM_STAT_ALL], amount);
    gm_stat_dec(&fam[type], amount);
}

static inline void gm_stat_fam_add(gm_stat_t *fam, int type, int64_t delta) {
    if (delta > 0)
        gm_stat_fam_inc(fam, type, delta);
    else if (delta < 0)
        gm_stat_fam_dec(fam, type, -delta);
}

static inline void gm_stats_split_changed(gm_stats_t *st, int type, const gm_split_delta_t *d) {
    gm_stat_fam_add(st->inactive_split, type, d->blocks);
    gm_stat_fam_add(st->inactive_split_bytes, type, d->bytes);
}

/* b was handed to a caller (b->allocated, size, requested_size, oversize
 * already set); d: inactive split blocks of its segment, net. */
/* Always inlined: malloc's fast path and the checkpoint restore both
 * inline their caller, and an out-of-line copy cost a pair about 5%. */
__attribute__((always_inline)) static inline void
gm_stats_block_allocated(gm_alloc_t *a, const gm_block_t *b, const gm_split_delta_t *d) {
    if (!gm_pool_counted(b->pool))
        return;
    gm_stats_t *st = &a->stats;
    int t = gm_pool_stat_type(b->pool);
    gm_stats_split_changed(st, t, d);
    gm_stat_fam_inc(st->allocation, t, 1);
    gm_stat_fam_inc(st->allocated_bytes, t, (int64_t)b->size);
    gm_stat_fam_inc(st->active, t, 1);
    gm_stat_fam_inc(st->active_bytes, t, (int64_t)b->size);
    gm_stat_fam_inc(st->requested_bytes, t, (int64_t)b->requested_size);
    if (b->oversize)
        gm_stat_inc(&st->oversize_allocations, 1);
}

/* The caller freed b (it stays active until its events complete). */
static inline void gm_stats_block_free_requested(gm_alloc_t *a, const gm_block_t *b) {
    if (!gm_pool_counted(b->pool))
        return;
    gm_stats_t *st = &a->stats;
    int t = gm_pool_stat_type(b->pool);
    gm_stat_fam_dec(st->allocation, t, 1);
    gm_stat_fam_dec(st->allocated_bytes, t, (int64_t)b->size);
    if (b->oversize)
        gm_stat_dec(&st->oversize_allocations, 1);
}

/* A freed block of `size` bytes (requested: `requested`) went back to its
 * pool; d: net change of inactive split blocks from merging. */
static inline void gm_stats_block_free_completed(gm_alloc_t *a, const gm_pool_t *pool,
                                                 size_t size, size_t requested,
                                                 const gm_split_delta_t *d) {
    if (!gm_pool_counted(pool))
        return;
    gm_stats_t *st = &a->stats;
    int t = gm_pool_stat_type(pool);
    gm_stats_split_changed(st, t, d);
    gm_stat_fam_dec(st->active, t, 1);
    gm_stat_fam_dec(st->active_bytes, t, (int64_t)size);
    gm_stat_fam_dec(st->requested_bytes, t, (int64_t)requested);
}

/* ---- the others ---- */

/* Device memory came in or went out: a whole plain segment (facts non-NULL)
 * or granules of an expandable segment (facts NULL). */
void gm_stats_segment_mapped(gm_alloc_t *a, const gm_pool_t *pool, size_t bytes,
                             const gm_seg_facts_t *facts);
void gm_stats_segment_unmapped(gm_alloc_t *a, const gm_pool_t *pool, size_t bytes,
                               const gm_seg_facts_t *facts);

/* Event counters. */
void gm_stats_alloc_retry(gm_alloc_t *a);
void gm_stats_oom(gm_alloc_t *a);
void gm_stats_sync_all_streams(gm_alloc_t *a);

/* The max_split_size stat follows the settings. */
void gm_stats_settings_changed(gm_alloc_t *a);
void gm_stats_reset_peak(gm_alloc_t *a);
void gm_stats_reset_accumulated(gm_alloc_t *a);

#endif /* GM_CORE_STATS_H */
