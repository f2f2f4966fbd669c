/*
 * core_api.h - the allocator core as a table of function pointers, published
 * by gpumem._C as the capsule "gpumem._C._core_api".
 *
 * The torch shim (csrc/torch, C++) links only against torch: it reaches the
 * core through this table, so one copy of the core (the one inside
 * gpumem._C) serves both Python and torch, with one set of stats and one
 * memory history. The table is versioned: a consumer checks `version` (the
 * layout's major number; a change to an existing member bumps it) and that
 * `size` covers every member it uses (members are only ever appended).
 *
 * Rules for callers:
 *   - The core functions (malloc .. walk) take the allocator lock and never
 *     the GIL; call them with or without the GIL, but never from inside a
 *     walk callback.
 *   - cuda_create/cuda_device_count/mem_get_info load the CUDA driver on
 *     first use ($GPUMEM_LIBCUDA or libcuda.so.1) under a process-wide
 *     mutex; they do not need the GIL either.
 *   - The Python helpers (stats_dict, settings_from_obj, allocator_core,
 *     raise_error) need the GIL.
 * Nothing here allocates a Python object while an allocator lock is held.
 */
#ifndef GM_PYTHON_CORE_API_H
#define GM_PYTHON_CORE_API_H

#include <stddef.h>
#include <stdint.h>

#include "../core/gm_alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GM_CORE_API_VERSION 1
#define GM_CORE_API_CAPSULE "gpumem._C._core_api"

/* Allocator(device_backend=obj) runs the core on a device that obj owns:
 * obj.gm_backend is a capsule of this name holding a const gm_backend_t *
 * (device/backend.h). The Allocator keeps obj alive for as long as its core
 * may call the backend, and never frees the backend. The backend follows
 * backend.h's rules (thread-safe, never takes the GIL). */
#define GM_BACKEND_CAPSULE "gpumem.backend"

struct _object; /* PyObject, without requiring Python.h here */

typedef struct gm_core_api {
    uint32_t version; /* GM_CORE_API_VERSION */
    uint32_t size;    /* sizeof(gm_core_api_t) of the publisher */

    /* ---- the CUDA driver backend (shared with gpumem._C.Allocator) ---- */
    /* Number of devices the driver reports; loads the driver if needed.
     * On failure: a GM_E* code and one sentence in err. */
    int (*cuda_device_count)(int *count, char *err, size_t errlen);
    /* A new core for `device` on the driver backend (settings NULL: the
     * defaults). The caller attaches it to memory history if it wants. */
    int (*cuda_create)(int device, const gm_settings_t *settings, gm_alloc_t **out, char *err,
                       size_t errlen);
    /* Free and total bytes of the device, from the driver. */
    int (*mem_get_info)(int device, size_t *free_bytes, size_t *total_bytes, char *err,
                        size_t errlen);

    /* ---- the core (gm_alloc.h) ---- */
    void (*destroy)(gm_alloc_t *a);
    int (*malloc)(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx, uintptr_t *out_ptr,
                  gm_oom_info_t *oom);
    int (*free)(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx);
    int (*record_stream)(gm_alloc_t *a, uintptr_t ptr, uintptr_t stream);
    int (*empty_cache)(gm_alloc_t *a, uint32_t ctx);
    int (*set_memory_fraction)(gm_alloc_t *a, double fraction);
    size_t (*memory_limit)(gm_alloc_t *a);
    void (*get_stats)(gm_alloc_t *a, gm_stats_t *out);
    void (*reset_peak_stats)(gm_alloc_t *a);
    void (*reset_accumulated_stats)(gm_alloc_t *a);
    const char *(*last_error)(const gm_alloc_t *a);
    int (*walk)(gm_alloc_t *a, gm_segment_fn fn, void *arg);
    const char *(*strerror)(int code);
    /* 1 if expandable segments are in use (settings ask and the device has VMM). */
    int (*expandable_active)(gm_alloc_t *a);

    /* 1 while memory history is being recorded (any level), else 0. */
    int (*hist_enabled)(void);

    /* ---- text ---- */
    void (*format_size)(size_t bytes, char *buf, size_t buflen);
    /* The out-of-memory message gpumem raises, in torch's layout. */
    void (*format_oom)(int device, const gm_oom_info_t *oom, char *buf, size_t buflen);

    /* ---- Python helpers (GIL held) ---- */
    /* torch.cuda.memory_stats()-style flat dict; new reference or NULL. */
    struct _object *(*stats_dict)(const gm_stats_t *st);
    /* dict (or None) -> settings: 0, or -1 with a Python exception set. */
    int (*settings_from_obj)(struct _object *obj, gm_settings_t *out);

    /* ---- appended: for code that drives a gpumem._C.Allocator (tests) ---- */
    /* The core of a gpumem._C.Allocator (borrowed: valid while the object
     * lives), or NULL with a Python exception set. GIL held. */
    gm_alloc_t *(*allocator_core)(struct _object *allocator);
    /* Set the exception gpumem raises for a GM_E* code (detail may be NULL)
     * and return NULL, as gpumem._C's own functions do. GIL held. */
    struct _object *(*raise_error)(int code, const char *detail);

    /* ---- appended: what torch's allocator interface needs besides ---- */
    /* Settings changed at run time (torch's _set_allocator_settings). */
    int (*set_settings)(gm_alloc_t *a, const gm_settings_t *settings);
    void (*get_settings)(gm_alloc_t *a, gm_settings_t *out);
    /* 1 and the limit in *bytes when one is in force (even of 0 bytes). */
    int (*get_memory_limit)(gm_alloc_t *a, size_t *bytes);
    /* torch's caching_allocator_enable. */
    void (*set_caching)(gm_alloc_t *a, int enabled);
    int (*caching)(gm_alloc_t *a);
    /* Size of the live block at ptr (for the profiler's memory events). */
    int (*block_size)(gm_alloc_t *a, uintptr_t ptr, size_t *size, size_t *requested,
                      uintptr_t *stream);
    /* settings -> the settings dict of gpumem._C; new reference. GIL held. */
    struct _object *(*settings_dict)(const gm_settings_t *s);
    /* An `annotate` event for the live allocation at ptr. */
    int (*annotate)(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx);

    /* ---- appended: private pools (CUDA graphs, torch.cuda.MemPool) ---- */
    int (*malloc_pool)(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx,
                       gm_mempool_id_t pool, uintptr_t *out_ptr, gm_oom_info_t *oom);
    int (*pool_create_or_incref)(gm_alloc_t *a, gm_mempool_id_t id);
    int (*pool_begin)(gm_alloc_t *a, gm_mempool_id_t id);
    int (*pool_end)(gm_alloc_t *a, gm_mempool_id_t id);
    int (*pool_release)(gm_alloc_t *a, gm_mempool_id_t id);
    int (*pool_use_count)(gm_alloc_t *a, gm_mempool_id_t id, int *out);
    int (*empty_cache_pool)(gm_alloc_t *a, gm_mempool_id_t id, uint32_t ctx);
    int (*walk_pool)(gm_alloc_t *a, gm_mempool_id_t pool, gm_segment_fn fn, void *arg);

    /* ---- appended: private pool checkpoints (CUDA graph trees) ---- */
    int (*pool_restore)(gm_alloc_t *a, gm_mempool_id_t id, const gm_ckpt_block_t *blocks,
                        size_t n, gm_ckpt_ptr_fn freed, void *arg, uint32_t ctx);

    /* ---- appended: trace hooks outside gpumem._C (tests' recorder) ---- */
    /* A gm_action_t's name ("alloc", "free_requested", ...; torch's). */
    const char *(*action_name)(int action);
} gm_core_api_t;

/* gpumem._C only (core_api.c): publish the table as the capsule. */
int gm_py_core_api_init(struct _object *module);

#ifdef __cplusplus
}
#endif
#endif /* GM_PYTHON_CORE_API_H */
