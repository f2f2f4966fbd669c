/*
 * vdev.h - the virtual device: a backend that needs no GPU.
 *
 * Two memory modes:
 *   GM_VDEV_VIRTUAL: addresses are handed out without touching memory, so an
 *                   80 GiB device can be replayed on a small machine. The
 *                   addresses must never be dereferenced.
 *   GM_VDEV_HOST:    segments are host mmap(MAP_NORESERVE) ranges, so the
 *                   memory is real and may be written.
 * Capacity, VMM granularity, event completion and failure injection are
 * configurable. Counters let tests see what the core asked for.
 * Thread-safe: one mutex per virtual device set.
 */
#ifndef GM_DEVICE_VDEV_H
#define GM_DEVICE_VDEV_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GM_VDEV_VIRTUAL = 0, GM_VDEV_HOST = 1 };

/* Event completion policy. */
enum {
    GM_VDEV_EVENTS_IMMEDIATE = 0, /* every query says complete */
    GM_VDEV_EVENTS_NEVER = 1,     /* not ready until gm_vdev_complete_events() */
    GM_VDEV_EVENTS_AFTER_N = 2    /* the first N queries of a recorded event say
                                    "not ready"; query N+1 completes it */
};

/* Functions whose Nth call can be made to fail. */
typedef enum gm_vdev_fn {
    GM_VDEV_FN_SEG_ALLOC = 0,
    GM_VDEV_FN_SEG_FREE,
    GM_VDEV_FN_EVENT_CREATE,
    GM_VDEV_FN_EVENT_RECORD,
    GM_VDEV_FN_EVENT_QUERY,
    GM_VDEV_FN_MAP,
    GM_VDEV_FN_UNMAP,
    GM_VDEV_FN_VA_RESERVE,
    GM_VDEV_FN_COUNT
} gm_vdev_fn_t;

typedef struct gm_vdev_config {
    int num_devices;     /* default 1 */
    size_t capacity;     /* bytes per device; default 80 GiB */
    size_t granularity;  /* VMM granularity; default 2 MiB; 0 = no VMM */
    int mode;            /* GM_VDEV_VIRTUAL (default) or GM_VDEV_HOST */
    int event_mode;      /* GM_VDEV_EVENTS_* */
    int event_after_n;   /* for GM_VDEV_EVENTS_AFTER_N */
    size_t fail_above;   /* seg_alloc/map of more than this fails with OOM; 0 = off */
    int fail_fn;         /* gm_vdev_fn_t, or -1 */
    long fail_nth;       /* the 1-based call number of fail_fn that fails */
    int fail_code;       /* the code returned (default GM_EOOM) */
} gm_vdev_config_t;

typedef struct gm_vdev_counters {
    long calls[GM_VDEV_FN_COUNT];
    size_t bytes_allocated; /* plain segments live now */
    size_t bytes_mapped;    /* VMM granules mapped now */
    size_t bytes_reserved_va;
    long live_segments;
    long live_events;
    long live_reservations;
    size_t peak_used;       /* peak of allocated + mapped */
} gm_vdev_counters_t;

typedef struct gm_vdev gm_vdev_t;

void gm_vdev_config_default(gm_vdev_config_t *cfg);
int gm_vdev_create(const gm_vdev_config_t *cfg, gm_vdev_t **out);
/* Frees everything still held (a leak is still visible in counters first). */
void gm_vdev_destroy(gm_vdev_t *vdev);
const gm_backend_t *gm_vdev_backend(gm_vdev_t *vdev);

void gm_vdev_get_counters(gm_vdev_t *vdev, int device, gm_vdev_counters_t *out);
/* Mark every recorded event complete. */
void gm_vdev_complete_events(gm_vdev_t *vdev);
void gm_vdev_set_event_mode(gm_vdev_t *vdev, int mode, int after_n);
/* Change the failure injection at run time (fn = -1 disables). The "Nth
 * call" count restarts from zero when this is called; the counters in
 * gm_vdev_counters_t (all calls) are not reset. */
void gm_vdev_set_failure(gm_vdev_t *vdev, int fn, long nth, int code, size_t fail_above);

#ifdef __cplusplus
}
#endif
#endif /* GM_DEVICE_VDEV_H */
