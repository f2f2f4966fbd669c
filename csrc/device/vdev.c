/*
 * vdev.c - the virtual device backend (see vdev.h): its life and
 * configuration, counters and test controls, events, and the backend table.
 * Memory (the simulated address space, plain segments, VMM reservations and
 * mappings) is in vdev_memory.c; the call accounting both use (failure
 * injection, the last error, device checks) is in vdev_call.c, below both;
 * what the three share is declared in vdev_internal.h.
 *
 * Events are indices into a table (handle = index + 1, never 0); their
 * completion follows event_mode, which tests may change at run time, and
 * gm_vdev_complete_events. Every backend entry point and test control takes
 * the device set's mutex; failure injection counts calls per function.
 * Must not: call into the allocator, or touch device memory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vdev_internal.h"

void gm_vdev_config_default(gm_vdev_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->num_devices = 1;
    cfg->capacity = (size_t)80 << 30;
    cfg->granularity = (size_t)2 << 20;
    cfg->mode = GM_VDEV_VIRTUAL;
    cfg->event_mode = GM_VDEV_EVENTS_IMMEDIATE;
    cfg->fail_fn = -1;
    cfg->fail_code = GM_EOOM;
}

/* ------------------------------------------------------------- events */

static int vdev_event_create(void *ctx, int device, uintptr_t *out) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_EVENT_CREATE, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    size_t i = 0;
    while (i < s->n_events && s->events[i].live)
        i++;
    if (i == s->n_events) {
        if (gm_vdev_grow((void **)&s->events, &s->cap_events, s->n_events, sizeof(vdev_event_t)))
            GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ENOMEM, "host out of memory"));
        s->n_events++;
    }
    s->events[i] = (vdev_event_t){1, 0, 1, 0, device};
    s->devs[gm_vdev_bad_device(s, device) ? 0 : device].counters.live_events++;
    *out = (uintptr_t)i + 1; /* never 0 */
    GM_VDEV_LEAVE(s, GM_OK);
}

static vdev_event_t *get_event(gm_vdev_t *s, uintptr_t ev) {
    if (ev == 0 || ev > s->n_events || !s->events[ev - 1].live)
        return NULL;
    return &s->events[ev - 1];
}

static int vdev_event_destroy(void *ctx, int device, uintptr_t ev) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    vdev_event_t *e = get_event(s, ev);
    if (!e)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid event handle"));
    s->devs[gm_vdev_bad_device(s, e->device) ? 0 : e->device].counters.live_events--;
    e->live = 0;
    GM_VDEV_LEAVE(s, GM_OK);
}

static int vdev_event_record(void *ctx, int device, uintptr_t ev, uintptr_t stream) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_EVENT_RECORD, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    vdev_event_t *e = get_event(s, ev);
    if (!e)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid event handle"));
    e->recorded = 1;
    e->queries = 0;
    e->complete = s->cfg.event_mode == GM_VDEV_EVENTS_IMMEDIATE;
    GM_VDEV_LEAVE(s, GM_OK);
}

static int vdev_event_query(void *ctx, int device, uintptr_t ev) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_EVENT_QUERY, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    vdev_event_t *e = get_event(s, ev);
    if (!e)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid event handle"));
    if (!e->complete && s->cfg.event_mode == GM_VDEV_EVENTS_AFTER_N &&
        ++e->queries > s->cfg.event_after_n)
        e->complete = 1;
    if (!e->complete && s->cfg.event_mode == GM_VDEV_EVENTS_IMMEDIATE)
        e->complete = 1;
    GM_VDEV_LEAVE(s, e->complete ? GM_OK : GM_ENOTREADY);
}

static int vdev_event_synchronize(void *ctx, int device, uintptr_t ev) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    vdev_event_t *e = get_event(s, ev);
    if (!e)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid event handle"));
    e->complete = 1; /* the host waits; the simulated GPU finishes */
    GM_VDEV_LEAVE(s, GM_OK);
}

/* Event completion is controlled by the test (event_mode), so waiting for a
 * stream completes nothing here; the virtual device has no work queued. */
static int vdev_stream_synchronize(void *ctx, int device, uintptr_t stream) { return GM_OK; }

static const char *vdev_last_error(void *ctx) { return ((gm_vdev_t *)ctx)->last_error; }

/* ------------------------------------------------------------ lifecycle */

int gm_vdev_create(const gm_vdev_config_t *cfg, gm_vdev_t **out) {
    gm_vdev_config_t c;
    if (cfg)
        c = *cfg;
    else
        gm_vdev_config_default(&c);
    if (c.num_devices < 1 || c.num_devices > 64 || c.capacity == 0 ||
        (c.granularity && (c.granularity & (c.granularity - 1))) ||
        (c.mode != GM_VDEV_VIRTUAL && c.mode != GM_VDEV_HOST) ||
        c.event_mode < GM_VDEV_EVENTS_IMMEDIATE || c.event_mode > GM_VDEV_EVENTS_AFTER_N ||
        (c.mode == GM_VDEV_VIRTUAL && c.capacity + c.capacity / 4 > GM_VDEV_WINDOW))
        return GM_EINVAL;
    gm_vdev_t *s = calloc(1, sizeof *s);
    if (!s)
        return GM_ENOMEM;
    s->cfg = c;
    pthread_mutex_init(&s->lock, NULL); /* first: gm_vdev_destroy destroys it */
    s->devs = calloc((size_t)c.num_devices, sizeof *s->devs);
    if (!s->devs) {
        gm_vdev_destroy(s);
        return GM_ENOMEM;
    }
    for (int i = 0; i < c.num_devices; i++) {
        if (gm_vdev_space_init(&s->devs[i], i)) {
            gm_vdev_destroy(s);
            return GM_ENOMEM;
        }
    }
    gm_backend_t *b = &s->backend;
    b->ctx = s;
    b->name = "virtual";
    b->mem_get_info = gm_vdev_mem_get_info;
    b->seg_alloc = gm_vdev_seg_alloc;
    b->seg_free = gm_vdev_seg_free;
    b->event_create = vdev_event_create;
    b->event_destroy = vdev_event_destroy;
    b->event_record = vdev_event_record;
    b->event_query = vdev_event_query;
    b->event_synchronize = vdev_event_synchronize;
    b->vmm_granularity = gm_vdev_vmm_granularity;
    b->va_reserve = gm_vdev_va_reserve;
    b->va_free = gm_vdev_va_free;
    b->map = gm_vdev_map;
    b->unmap = gm_vdev_unmap;
    b->stream_synchronize = vdev_stream_synchronize;
    b->last_error = vdev_last_error;
    *out = s;
    return GM_OK;
}

void gm_vdev_destroy(gm_vdev_t *s) {
    if (!s)
        return;
    for (int i = 0; s->devs && i < s->cfg.num_devices; i++)
        gm_vdev_space_free(s, &s->devs[i]);
    free(s->devs);
    free(s->events);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const gm_backend_t *gm_vdev_backend(gm_vdev_t *s) { return &s->backend; }

void gm_vdev_get_counters(gm_vdev_t *s, int device, gm_vdev_counters_t *out) {
    pthread_mutex_lock(&s->lock);
    memset(out, 0, sizeof *out);
    if (!gm_vdev_bad_device(s, device))
        *out = s->devs[device].counters;
    memcpy(out->calls, s->calls, sizeof s->calls);
    pthread_mutex_unlock(&s->lock);
}

void gm_vdev_complete_events(gm_vdev_t *s) {
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n_events; i++)
        if (s->events[i].live)
            s->events[i].complete = 1;
    pthread_mutex_unlock(&s->lock);
}

void gm_vdev_set_event_mode(gm_vdev_t *s, int mode, int after_n) {
    pthread_mutex_lock(&s->lock);
    s->cfg.event_mode = mode;
    s->cfg.event_after_n = after_n;
    pthread_mutex_unlock(&s->lock);
}

void gm_vdev_set_failure(gm_vdev_t *s, int fn, long nth, int code, size_t fail_above) {
    pthread_mutex_lock(&s->lock);
    s->cfg.fail_fn = fn;
    s->cfg.fail_nth = nth;
    s->cfg.fail_code = code ? code : GM_EOOM;
    s->cfg.fail_above = fail_above;
    memset(s->inject_calls, 0, sizeof s->inject_calls);
    pthread_mutex_unlock(&s->lock);
}
