/*
 * stats.c - every write to the allocator's statistics (stats.h).
 *
 * Each stat follows torch's c10::CachingAllocator::Stat: current, peak,
 * allocated (sum of increases) and freed (sum of decreases); a family is an
 * array over GM_STAT_ALL and the pool's own type, updated together.
 * Must not: decide anything about blocks; callers say what happened.
 */
#include "stats.h"

#include <stdint.h>

void gm_stats_segment_mapped(gm_alloc_t *a, const gm_pool_t *pool, size_t bytes,
                             const gm_seg_facts_t *facts) {
    if (!gm_pool_counted(pool))
        return;
    gm_stats_t *st = &a->stats;
    int t = gm_pool_stat_type(pool);
    gm_stat_fam_inc(st->reserved_bytes, t, (int64_t)bytes);
    if (pool->owner) /* what a private pool holds decides when it may go */
        pool->owner->reserved += (int64_t)bytes;
    st->num_device_alloc++;
    if (facts) { /* expandable segments are left out of segment.*, as in torch */
        gm_stat_fam_inc(st->segment, t, 1);
        if (facts->oversize)
            gm_stat_inc(&st->oversize_segments, 1);
    }
}

void gm_stats_segment_unmapped(gm_alloc_t *a, const gm_pool_t *pool, size_t bytes,
                               const gm_seg_facts_t *facts) {
    if (!gm_pool_counted(pool))
        return;
    gm_stats_t *st = &a->stats;
    int t = gm_pool_stat_type(pool);
    gm_stat_fam_dec(st->reserved_bytes, t, (int64_t)bytes);
    if (pool->owner)
        pool->owner->reserved -= (int64_t)bytes;
    st->num_device_free++;
    if (facts) {
        gm_stat_fam_dec(st->segment, t, 1);
        if (facts->oversize)
            gm_stat_dec(&st->oversize_segments, 1);
    }
}

void gm_stats_alloc_retry(gm_alloc_t *a) { a->stats.num_alloc_retries++; }
void gm_stats_oom(gm_alloc_t *a) { a->stats.num_ooms++; }
void gm_stats_sync_all_streams(gm_alloc_t *a) { a->stats.num_sync_all_streams++; }

void gm_stats_settings_changed(gm_alloc_t *a) {
    size_t m = a->settings.max_split_size;
    a->stats.max_split_size = m == SIZE_MAX ? -1 : (int64_t)m;
}

static void reset_peak(gm_stat_t *s) { s->peak = s->current; }
static void reset_acc(gm_stat_t *s) { s->allocated = s->freed = 0; }

static void for_each_stat(gm_stats_t *st, void (*fn)(gm_stat_t *)) {
    gm_stat_t *fams[] = {st->allocation,     st->segment,         st->active,
                         st->inactive_split, st->allocated_bytes, st->reserved_bytes,
                         st->active_bytes,   st->inactive_split_bytes, st->requested_bytes};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
        for (int t = 0; t < GM_STAT_NTYPES; t++)
            fn(&fams[f][t]);
    fn(&st->oversize_allocations);
    fn(&st->oversize_segments);
}

void gm_stats_reset_peak(gm_alloc_t *a) { for_each_stat(&a->stats, reset_peak); }

void gm_stats_reset_accumulated(gm_alloc_t *a) {
    gm_stats_t *st = &a->stats;
    for_each_stat(st, reset_acc);
    st->num_alloc_retries = 0;
    st->num_ooms = 0;
    st->num_sync_all_streams = 0;
    st->num_device_alloc = 0;
    st->num_device_free = 0;
}
