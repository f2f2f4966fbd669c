/*
 * helpers.h - fixtures shared by the C unit tests.
 *
 * A fixture (fx_t) is one test device (testdev.h: the virtual device, or
 * the CUDA driver backend over the fake libcuda with --backend=cuda) plus
 * one allocator on device 0, with a trace recorder attached. fx_close()
 * checks the invariants, destroys the allocator and then checks that the
 * device got everything back (no segment, mapping, reservation or event
 * left). The wrappers that are macros (MALLOC, FREE, ...) report the
 * caller's file:line on failure.
 *
 * Tests never call a backend's own test controls: fx_complete_events,
 * fx_set_event_mode, fx_set_failure and fx_counters dispatch on the
 * backend. Streams are S0 (the default stream) .. S3 and FX_STREAM(i) for
 * i < TDEV_NSTREAMS; on cuda they are real streams of the fake driver, so
 * they are only valid between fx_open and fx_close.
 *
 * Expandable segments: fx_open(.., NULL settings) and fx_settings() use
 * expandable_segments = fx_expandable_default, which the unit binary's
 * --expandable flag sets, so every test that does not pin the mode runs
 * in both. A test whose assertions are about one mode pins it with
 * settings_with(0|1).
 */
#ifndef GM_TEST_HELPERS_H
#define GM_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "core/gm_alloc.h"
#include "gmtest.h"
#include "testdev.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Streams used by the tests: filled by fx_open (tdev_stream). */
extern uintptr_t fx_streams[TDEV_NSTREAMS];
#define FX_STREAM(i) (fx_streams[(i)])
#define S0 ((uintptr_t)0)
#define S1 FX_STREAM(1)
#define S2 FX_STREAM(2)
#define S3 FX_STREAM(3)

/* The unit binary's --expandable flag (default settings of fx_open). */
extern int fx_expandable_default;

typedef struct trace_ev {
    int action;
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    uint32_t ctx;
    int device;
} trace_ev_t;

#define TRACE_MAX 8192
typedef struct trace_log {
    trace_ev_t ev[TRACE_MAX];
    int n;
    int dropped;
} trace_log_t;

typedef struct fx {
    tdev_t *dev;
    gm_alloc_t *a;
    const gm_backend_t *be;
    tdev_config_t cfg;
    gm_settings_t settings;
    trace_log_t *trace;
} fx_t;

/* cfg/settings may be NULL for the defaults. Returns 0 on success (and
 * records a failure otherwise). */
int fx_open_at(fx_t *fx, const tdev_config_t *cfg, const gm_settings_t *settings,
               const char *file, int line);
void fx_close_at(fx_t *fx, const char *file, int line);
#define fx_open(fx, cfg, settings) fx_open_at((fx), (cfg), (settings), __FILE__, __LINE__)
#define fx_close(fx) fx_close_at((fx), __FILE__, __LINE__)

/* Shorthand for a device config: defaults plus capacity (0 keeps the
 * default) and event mode (TDEV_EVENTS_*). */
tdev_config_t dev_cfg(size_t capacity, int event_mode);
/* Default settings with expandable segments set to `expandable`. */
gm_settings_t settings_with(int expandable);
/* Default settings with expandable segments as the --expandable flag says. */
gm_settings_t fx_settings(void);
/* 1 when the fixture runs on the CUDA backend (over the fake driver). */
int fx_on_cuda(void);

uintptr_t fx_malloc_at(fx_t *fx, size_t size, uintptr_t stream, const char *file, int line);
void fx_free_at(fx_t *fx, uintptr_t ptr, const char *file, int line);
void fx_check_at(fx_t *fx, const char *file, int line);
#define MALLOC(fx, size, stream) fx_malloc_at((fx), (size), (stream), __FILE__, __LINE__)
#define FREE(fx, ptr) fx_free_at((fx), (ptr), __FILE__, __LINE__)
#define CHECK_ALLOC(fx) fx_check_at((fx), __FILE__, __LINE__)

gm_stats_t fx_stats(fx_t *fx);
tdev_counters_t fx_counters(fx_t *fx); /* device 0 */
/* The device's test controls (testdev.h), whatever the backend. */
void fx_complete_events(fx_t *fx);
void fx_set_event_mode(fx_t *fx, int mode, int after_n);
void fx_set_failure(fx_t *fx, int fn, long nth, int code, size_t fail_above);
size_t fx_reserved(fx_t *fx);  /* reserved_bytes.all.current */
size_t fx_allocated(fx_t *fx); /* allocated_bytes.all.current */
size_t fx_block_size(fx_t *fx, uintptr_t ptr); /* 0 when not found */
size_t fx_device_free(fx_t *fx);

/* Trace recorder (attached by fx_open). */
void trace_clear(fx_t *fx);
int trace_count(fx_t *fx, int action);
/* Index of the first event with this action (and addr, unless addr is
 * TRACE_ANY), or -1. */
#define TRACE_ANY ((uintptr_t)-1)
int trace_find(fx_t *fx, int action, uintptr_t addr);

/* A copy of everything gm_alloc_walk reported. */
typedef struct walk_seg {
    gm_segment_info_t info; /* info.blocks points into blocks below */
    gm_block_info_t *blocks;
} walk_seg_t;

typedef struct walk {
    walk_seg_t *segs;
    size_t nsegs, cap;
} walk_t;

/* Collects the walk and checks its structural invariants: address order,
 * blocks tiling each segment exactly, and the per-segment sums. */
void walk_collect_at(fx_t *fx, walk_t *w, const char *file, int line);
#define walk_collect(fx, w) walk_collect_at((fx), (w), __FILE__, __LINE__)
void walk_free(walk_t *w);
/* The block starting at addr, or NULL; *seg receives its segment. */
const gm_block_info_t *walk_block(const walk_t *w, uintptr_t addr, const walk_seg_t **seg);
/* The segment containing addr, or NULL. */
const walk_seg_t *walk_segment(const walk_t *w, uintptr_t addr);

#endif /* GM_TEST_HELPERS_H */
