/*
 * stats.c - gm_stats_t as torch.cuda.memory_stats()'s flat dict: one key
 * "<family>.<pool>.<current|peak|allocated|freed>" per counter (pools all,
 * small_pool, large_pool), then the oversize and num_* counters.
 *
 * Used by Allocator.stats() and, through core_api.h, by the torch shim, so
 * both report the same keys. Pure conversion: the caller copies the stats
 * out of the core first (gm_alloc_get_stats), so no allocator lock is held
 * here. Must not: invent or rename keys torch does not have.
 */
#include <stdint.h>

#include "stats.h"

static int put_int(PyObject *d, const char *key, int64_t v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (!o)
        return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

static int put_stat(PyObject *d, const char *prefix, const gm_stat_t *s) {
    char key[96];
    const char *names[4] = {"current", "peak", "allocated", "freed"};
    int64_t vals[4] = {s->current, s->peak, s->allocated, s->freed};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", prefix, names[i]);
        if (put_int(d, key, vals[i]))
            return -1;
    }
    return 0;
}

PyObject *gm_py_stats_dict(const gm_stats_t *st) {
    static const char *const types[GM_STAT_NTYPES] = {"all", "small_pool", "large_pool"};
    struct {
        const char *name;
        const gm_stat_t *arr;
    } fams[] = {{"allocation", st->allocation},
                {"segment", st->segment},
                {"active", st->active},
                {"inactive_split", st->inactive_split},
                {"allocated_bytes", st->allocated_bytes},
                {"reserved_bytes", st->reserved_bytes},
                {"active_bytes", st->active_bytes},
                {"inactive_split_bytes", st->inactive_split_bytes},
                {"requested_bytes", st->requested_bytes}};
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    char prefix[64];
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
        for (int t = 0; t < GM_STAT_NTYPES; t++) {
            snprintf(prefix, sizeof prefix, "%s.%s", fams[f].name, types[t]);
            if (put_stat(d, prefix, &fams[f].arr[t]))
                goto fail;
        }
    if (put_stat(d, "oversize_allocations", &st->oversize_allocations) ||
        put_stat(d, "oversize_segments", &st->oversize_segments) ||
        put_int(d, "num_alloc_retries", st->num_alloc_retries) ||
        put_int(d, "num_ooms", st->num_ooms) ||
        put_int(d, "num_sync_all_streams", st->num_sync_all_streams) ||
        put_int(d, "num_device_alloc", st->num_device_alloc) ||
        put_int(d, "num_device_free", st->num_device_free) ||
        put_int(d, "max_split_size", st->max_split_size))
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}
