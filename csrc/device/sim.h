/*
 * sim.h - the simulated device: a backend that needs no GPU.
 *
 * Two memory modes:
 *   GM_SIM_VIRTUAL: addresses are handed out without touching memory, so an
 *                   80 GiB device can be replayed on a small machine. The
 *                   addresses must never be dereferenced.
 *   GM_SIM_HOST:    segments are host mmap(MAP_NORESERVE) ranges, so the
 *                   memory is real and may be written.
 * Capacity, VMM granularity, event completion and failure injection are
 * configurable. Counters let tests see what the core asked for.
 * Thread-safe: one mutex per simulated device set.
 */
#ifndef GM_DEVICE_SIM_H
#define GM_DEVICE_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GM_SIM_VIRTUAL = 0, GM_SIM_HOST = 1 };

/* Event completion policy. */
enum {
    GM_SIM_EVENTS_IMMEDIATE = 0, /* every query says complete */
    GM_SIM_EVENTS_NEVER = 1,     /* not ready until gm_sim_complete_events() */
    GM_SIM_EVENTS_AFTER_N = 2    /* the first N queries of a recorded event say
                                    "not ready"; query N+1 completes it */
};

/* Functions whose Nth call can be made to fail. */
typedef enum gm_sim_fn {
    GM_SIM_FN_SEG_ALLOC = 0,
    GM_SIM_FN_SEG_FREE,
    GM_SIM_FN_EVENT_CREATE,
    GM_SIM_FN_EVENT_RECORD,
    GM_SIM_FN_EVENT_QUERY,
    GM_SIM_FN_MAP,
    GM_SIM_FN_UNMAP,
    GM_SIM_FN_VA_RESERVE,
    GM_SIM_FN_COUNT
} gm_sim_fn_t;

typedef struct gm_sim_config {
    int num_devices;     /* default 1 */
    size_t capacity;     /* bytes per device; default 80 GiB */
    size_t granularity;  /* VMM granularity; default 2 MiB; 0 = no VMM */
    int mode;            /* GM_SIM_VIRTUAL (default) or GM_SIM_HOST */
    int event_mode;      /* GM_SIM_EVENTS_* */
    int event_after_n;   /* for GM_SIM_EVENTS_AFTER_N */
    size_t fail_above;   /* seg_alloc/map of more than this fails with OOM; 0 = off */
    int fail_fn;         /* gm_sim_fn_t, or -1 */
    long fail_nth;       /* the 1-based call number of fail_fn that fails */
    int fail_code;       /* the code returned (default GM_EOOM) */
} gm_sim_config_t;

typedef struct gm_sim_counters {
    long calls[GM_SIM_FN_COUNT];
    size_t bytes_allocated; /* plain segments live now */
    size_t bytes_mapped;    /* VMM granules mapped now */
    size_t bytes_reserved_va;
    long live_segments;
    long live_events;
    long live_reservations;
    size_t peak_used;       /* peak of allocated + mapped */
} gm_sim_counters_t;

typedef struct gm_sim gm_sim_t;

void gm_sim_config_default(gm_sim_config_t *cfg);
int gm_sim_create(const gm_sim_config_t *cfg, gm_sim_t **out);
/* Frees everything still held (a leak is still visible in counters first). */
void gm_sim_destroy(gm_sim_t *sim);
const gm_backend_t *gm_sim_backend(gm_sim_t *sim);

void gm_sim_get_counters(gm_sim_t *sim, int device, gm_sim_counters_t *out);
/* Mark every recorded event complete. */
void gm_sim_complete_events(gm_sim_t *sim);
void gm_sim_set_event_mode(gm_sim_t *sim, int mode, int after_n);
/* Change the failure injection at run time (fn = -1 disables). The "Nth
 * call" count restarts from zero when this is called; the counters in
 * gm_sim_counters_t (all calls) are not reset. */
void gm_sim_set_failure(gm_sim_t *sim, int fn, long nth, int code, size_t fail_above);

#ifdef __cplusplus
}
#endif
#endif /* GM_DEVICE_SIM_H */
