/*
 * alloc.c - an allocator's life and configuration: creation, destruction,
 * settings, memory limits and reading the stats (gm_alloc.h). The
 * operations on blocks are malloc.c's.
 *
 * Every function takes the allocator lock (once created, a->be, a->device
 * and a->granularity never change and are read without it).
 */
#include <stdlib.h>
#include <string.h>

#include "devcall.h"
#include "events.h"
#include "expandable.h"
#include "pool.h"
#include "privpool.h"
#include "stats.h"
#include "walk.h"

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
    size_t g = 0;
    int rc = gm_dev_granularity(be, device, &g);
    if (rc != GM_OK && rc != GM_ENOTSUP)
        return rc; /* a device error, not a missing feature: do not silently fall back */
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
    a->granularity = rc == GM_OK ? g : 0;
    a->settings = s;
    gm_pool_init(&a->small_pool, 1);
    gm_pool_init(&a->large_pool, 0);
    gm_pool_init(&a->uncached_pool, 0);
    a->uncached_pool.uncounted = 1;
    gm_stats_settings_changed(a);
    *out = a;
    return GM_OK;
}

/* Every plain segment goes back to the device as it is, live blocks and
 * all; then every expandable range. Stats and traces are not kept up to
 * date on the way out: nothing reads them afterwards. */
static void release_everything(gm_alloc_t *a) {
    gm_block_list_t l;
    if (gm_walk_gather_unlocked(a, &l) == GM_OK) {
        for (size_t i = 0; i < l.n; i++) {
            gm_block_t *b = l.v[i];
            if (b->expseg || b->prev)
                continue;
            size_t size = 0;
            for (gm_block_t *x = b; x; x = x->next)
                size += x->size;
            gm_dev_seg_free(a, b->ptr, size);
        }
        for (size_t i = 0; i < l.n; i++) {
            if (l.v[i]->in_tree != GM_IN_NONE)
                gm_pool_remove_unlocked(l.v[i]);
            gm_block_delete_unlocked(a, l.v[i]);
        }
        free(l.v);
    }
    gm_expandable_destroy_unlocked(a);
    gm_privpool_destroy_unlocked(a);
}

void gm_alloc_destroy(gm_alloc_t *a) {
    if (!a)
        return;
    gm_lock(a);
    gm_events_destroy_unlocked(a);
    release_everything(a);
    gm_ptrmap_free(&a->active);
    gm_block_drain_unlocked(a);
    gm_unlock(a);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int gm_alloc_device(const gm_alloc_t *a) { return a->device; }

const char *gm_alloc_last_error(const gm_alloc_t *a) {
    return gm_dev_last_error(a->be);
}

int gm_alloc_set_settings(gm_alloc_t *a, const gm_settings_t *s) {
    if (!s || gm_settings_validate(s, NULL, 0))
        return GM_EINVAL;
    gm_lock(a);
    a->settings = *s;
    gm_stats_settings_changed(a);
    gm_unlock(a);
    return GM_OK;
}

void gm_alloc_get_settings(gm_alloc_t *a, gm_settings_t *out) {
    gm_lock(a);
    *out = a->settings;
    gm_unlock(a);
}

int gm_alloc_expandable_active(gm_alloc_t *a) {
    gm_lock(a);
    int r = gm_expandable_on(a);
    gm_unlock(a);
    return r;
}

int gm_alloc_set_memory_fraction(gm_alloc_t *a, double fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return GM_EINVAL;
    gm_lock(a);
    size_t dev_free = 0, dev_total = 0;
    int rc = gm_dev_mem_get_info(a, &dev_free, &dev_total);
    if (rc == GM_OK) {
        /* torch: the whole device is no limit at all */
        a->set_fraction = fraction < 1.0;
        a->allowed_memory_maximum = a->set_fraction ? (size_t)(fraction * (double)dev_total) : 0;
    }
    gm_unlock(a);
    return rc;
}

int gm_alloc_set_memory_limit(gm_alloc_t *a, size_t bytes) {
    gm_lock(a);
    a->allowed_memory_maximum = bytes;
    a->set_fraction = bytes != 0;
    gm_unlock(a);
    return GM_OK;
}

size_t gm_alloc_memory_limit(gm_alloc_t *a) {
    gm_lock(a);
    size_t r = a->set_fraction ? a->allowed_memory_maximum : 0;
    gm_unlock(a);
    return r;
}

int gm_alloc_get_memory_limit(gm_alloc_t *a, size_t *bytes) {
    gm_lock(a);
    int set = a->set_fraction;
    if (bytes)
        *bytes = set ? a->allowed_memory_maximum : 0;
    gm_unlock(a);
    return set;
}

void gm_alloc_set_caching(gm_alloc_t *a, int enabled) {
    gm_lock(a);
    a->uncached = !enabled;
    gm_unlock(a);
}

int gm_alloc_caching(gm_alloc_t *a) {
    gm_lock(a);
    int on = !a->uncached;
    gm_unlock(a);
    return on;
}

void gm_alloc_get_stats(gm_alloc_t *a, gm_stats_t *out) {
    gm_lock(a);
    *out = a->stats;
    gm_unlock(a);
}

void gm_alloc_reset_peak_stats(gm_alloc_t *a) {
    gm_lock(a);
    gm_stats_reset_peak(a);
    gm_unlock(a);
}

void gm_alloc_reset_accumulated_stats(gm_alloc_t *a) {
    gm_lock(a);
    gm_stats_reset_accumulated(a);
    gm_unlock(a);
}
