/*
 * vdev_internal.h - what the files of the virtual device share (vdev.c:
 * lifecycle, configuration, counters, test controls, events, the backend
 * table; vdev_memory.c: the simulated address space, plain segments, VMM
 * reservations and mappings; below both, vdev_call.c: call accounting and
 * errors). Private to csrc/device/vdev*.c.
 *
 * It holds the device set's state (struct gm_vdev), the per-device
 * bookkeeping, and the helpers every backend entry point uses: the lock
 * (GM_VDEV_ENTER / GM_VDEV_LEAVE), the last error text, failure injection.
 * Invariants: every field of struct gm_vdev and of its devices and events is
 * protected by its one mutex, taken by each backend entry point and test
 * control; the configuration's sizes and modes are immutable after create.
 * Must not: be included by anything but the virtual device's own files.
 */
#ifndef GM_DEVICE_VDEV_INTERNAL_H
#define GM_DEVICE_VDEV_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "vdev.h"

#define GM_VDEV_WINDOW ((uintptr_t)1 << 44) /* 16 TiB of addresses per device */

/* A device's address-space bookkeeping; the ranges' layout is vdev_memory.c's. */
typedef struct range range_t; /* a free range of addresses */
typedef struct used used_t;   /* a plain segment or a VA reservation */

typedef struct vdev_device {
    range_t *free_ranges; /* sorted, coalesced */
    size_t n_free, cap_free;
    used_t *used;
    size_t n_used, cap_used;
    gm_vdev_counters_t counters;
} vdev_device_t;

typedef struct vdev_event {
    int live;
    int recorded;
    int complete;
    int queries;
    int device;
} vdev_event_t;

struct gm_vdev {
    gm_backend_t backend;   /* immutable after create */
    pthread_mutex_t lock;
    gm_vdev_config_t cfg;    /* protected by: lock (event and failure settings change) */
    vdev_device_t *devs;     /* cfg.num_devices of them; protected by: lock */
    vdev_event_t *events;    /* protected by: lock */
    size_t n_events, cap_events;        /* protected by: lock */
    long calls[GM_VDEV_FN_COUNT];        /* all calls, for counters; protected by: lock */
    long inject_calls[GM_VDEV_FN_COUNT]; /* calls since the failure was set; protected by: lock */
    char last_error[128];               /* protected by: lock */
};

#define GM_VDEV_ENTER(s) pthread_mutex_lock(&(s)->lock)
#define GM_VDEV_LEAVE(s, rc)                                                    \
    do {                                                                       \
        int rc_ = (rc);                                                        \
        pthread_mutex_unlock(&(s)->lock);                                      \
        return rc_;                                                            \
    } while (0)

/* ------------------------------------------------------ vdev_call.c */

/* Keep `text` as the last error; returns `code`. */
int gm_vdev_set_error(gm_vdev_t *s, int code, const char *text);
/* Counts the call and applies failure injection: GM_OK, or the injected
 * failure's code. */
int gm_vdev_inject(gm_vdev_t *s, gm_vdev_fn_t fn, size_t size);
int gm_vdev_bad_device(gm_vdev_t *s, int device);
/* Make room for element n of the array *v of *cap elements; -1 without
 * host memory. */
int gm_vdev_grow(void **v, size_t *cap, size_t n, size_t elem);

/* ---------------------------------------------------- vdev_memory.c */

/* Give device `index` its window of addresses; GM_ENOMEM without host memory. */
int gm_vdev_space_init(vdev_device_t *d, int index);
/* Free everything the device still holds, and its bookkeeping. */
void gm_vdev_space_free(gm_vdev_t *s, vdev_device_t *d);

/* The backend table's memory entries (backend.h). */
int gm_vdev_mem_get_info(void *ctx, int device, size_t *free_b, size_t *total);
int gm_vdev_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out);
int gm_vdev_seg_free(void *ctx, int device, uintptr_t ptr, size_t size);
int gm_vdev_vmm_granularity(void *ctx, int device, size_t *out);
int gm_vdev_va_reserve(void *ctx, int device, size_t size, size_t alignment, uintptr_t *out);
int gm_vdev_va_free(void *ctx, int device, uintptr_t va, size_t size);
int gm_vdev_map(void *ctx, int device, uintptr_t va, size_t size);
int gm_vdev_unmap(void *ctx, int device, uintptr_t va, size_t size);

#endif /* GM_DEVICE_VDEV_INTERNAL_H */
