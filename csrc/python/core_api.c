/*
 * core_api.c - publishes the allocator core to code outside this extension
 * (the torch shim, and the test-only extension under tests/ext) as the
 * capsule gpumem._C._core_api (see core_api.h).
 *
 * Only adapters live here: the driver handle is shared with
 * gpumem._C.Allocator (cuda_driver.c), the out-of-memory text (errors.c),
 * the stats dict (stats.c) and settings (settings.c) with the Python layer,
 * so the shim and Python can never disagree. Nothing here takes the GIL or
 * an allocator lock of its own.
 */
#include "../device/cuda_backend.h"
#include "../history/hist.h"
#include "allocator.h"
#include "core_api.h"
#include "cuda_driver.h"
#include "errors.h"
#include "settings.h"
#include "stats.h"

static int api_cuda_device_count(int *count, char *err, size_t errlen) {
    gm_cuda_t *c = NULL;
    int rc = gm_py_cuda_handle(NULL, &c, err, errlen);
    if (rc)
        return rc;
    return gm_cuda_device_count(c, count);
}

static int api_cuda_create(int device, const gm_settings_t *settings, gm_alloc_t **out,
                           char *err, size_t errlen) {
    gm_cuda_t *c = NULL;
    int rc = gm_py_cuda_handle(NULL, &c, err, errlen);
    if (rc)
        return rc;
    int n = 0;
    gm_cuda_device_count(c, &n);
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "device %d does not exist; the CUDA driver reports %d device(s)",
                 device, n);
        return GM_EINVAL;
    }
    rc = gm_alloc_create(gm_cuda_backend(c), device, settings, out);
    if (rc) {
        const char *why = gm_cuda_backend(c)->last_error(c);
        snprintf(err, errlen, "could not create gpumem's allocator for device %d: %s%s%s", device,
                 gm_strerror(rc), why && why[0] ? ": " : "", why ? why : "");
    }
    return rc;
}

static int api_mem_get_info(int device, size_t *free_b, size_t *total, char *err,
                            size_t errlen) {
    gm_cuda_t *c = NULL;
    int rc = gm_py_cuda_handle(NULL, &c, err, errlen);
    if (rc)
        return rc;
    const gm_backend_t *be = gm_cuda_backend(c);
    rc = be->mem_get_info(be->ctx, device, free_b, total);
    if (rc)
        snprintf(err, errlen, "%s", be->last_error(be->ctx));
    return rc;
}

static int api_hist_enabled(void) {
    gm_hist_config_t c;
    gm_hist_get_config(&c);
    return c.enabled != GM_HIST_OFF;
}

static PyObject *api_stats_dict(const gm_stats_t *st) { return gm_py_stats_dict(st); }

static int api_settings_from_obj(PyObject *obj, gm_settings_t *out) {
    return gm_py_settings_from_obj(obj, out);
}

static const gm_core_api_t core_api = {
    .version = GM_CORE_API_VERSION,
    .size = (uint32_t)sizeof(gm_core_api_t),
    .cuda_device_count = api_cuda_device_count,
    .cuda_create = api_cuda_create,
    .mem_get_info = api_mem_get_info,
    .destroy = gm_alloc_destroy,
    .malloc = gm_alloc_malloc,
    .free = gm_alloc_free,
    .record_stream = gm_alloc_record_stream,
    .empty_cache = gm_alloc_empty_cache,
    .set_memory_fraction = gm_alloc_set_memory_fraction,
    .memory_limit = gm_alloc_memory_limit,
    .get_stats = gm_alloc_get_stats,
    .reset_peak_stats = gm_alloc_reset_peak_stats,
    .reset_accumulated_stats = gm_alloc_reset_accumulated_stats,
    .last_error = gm_alloc_last_error,
    .walk = gm_alloc_walk,
    .strerror = gm_strerror,
    .expandable_active = gm_alloc_expandable_active,
    .hist_enabled = api_hist_enabled,
    .format_size = gm_format_size,
    .format_oom = gm_py_format_oom,
    .stats_dict = api_stats_dict,
    .settings_from_obj = api_settings_from_obj,
    .allocator_core = gm_py_allocator_core,
    .raise_error = gm_py_raise,
    .set_settings = gm_alloc_set_settings,
    .get_settings = gm_alloc_get_settings,
    .get_memory_limit = gm_alloc_get_memory_limit,
    .set_caching = gm_alloc_set_caching,
    .caching = gm_alloc_caching,
    .block_size = gm_alloc_block_size,
    .settings_dict = gm_py_settings_to_dict,
    .annotate = gm_alloc_annotate,
    .malloc_pool = gm_alloc_malloc_pool,
    .pool_create_or_incref = gm_alloc_pool_create_or_incref,
    .pool_begin = gm_alloc_pool_begin,
    .pool_end = gm_alloc_pool_end,
    .pool_release = gm_alloc_pool_release,
    .pool_use_count = gm_alloc_pool_use_count,
    .empty_cache_pool = gm_alloc_empty_cache_pool,
    .walk_pool = gm_alloc_walk_pool,
    .pool_restore = gm_alloc_pool_restore,
    .action_name = gm_action_name,
};

int gm_py_core_api_init(PyObject *module) {
    PyObject *cap = PyCapsule_New((void *)&core_api, GM_CORE_API_CAPSULE, NULL);
    if (!cap || PyModule_AddObject(module, "_core_api", cap) < 0) {
        Py_XDECREF(cap);
        return -1;
    }
    return PyModule_AddIntConstant(module, "CORE_API_VERSION", GM_CORE_API_VERSION);
}
