/*
 * sim.c - the simulated device backend (see sim.h).
 *
 * Address space: each device owns a 16 TiB window of fake device
 * addresses (virtual mode) starting at 0x7f0000000000-style values below
 * 2^53, handed out by a first-fit range allocator with 2 MiB alignment, so
 * addresses are reused after frees like a real driver's. In host mode the
 * memory is mmap(MAP_NORESERVE) and the address is the host address.
 * Capacity counts plain segments plus mapped granules; anything beyond it
 * fails with GM_EOOM, as cudaMalloc/cuMemCreate do.
 * Events are indices into a table; their completion follows event_mode.
 * Must not: call into the allocator, or touch memory in virtual mode.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SIM_ALIGN ((size_t)2 << 20)
#define SIM_WINDOW ((uintptr_t)1 << 44)   /* 16 TiB per device */
#define SIM_BASE ((uintptr_t)0x7f << 40)  /* 0x7f0000000000 */

typedef struct range {
    uintptr_t start;
    size_t size;
} range_t;

/* A used range: a plain segment or a VA reservation. */
typedef struct used {
    uintptr_t start;
    size_t size;
    int is_va;
    uint8_t *mapped; /* VA reservations: one byte per granule */
} used_t;

typedef struct sim_device {
    range_t *free_ranges; /* sorted, coalesced */
    size_t n_free, cap_free;
    used_t *used;
    size_t n_used, cap_used;
    gm_sim_counters_t counters;
} sim_device_t;

typedef struct sim_event {
    int live;
    int recorded;
    int complete;
    int queries;
    int device;
} sim_event_t;

struct gm_sim {
    gm_backend_t backend;
    pthread_mutex_t lock;
    gm_sim_config_t cfg;
    sim_device_t *devs;
    sim_event_t *events;
    size_t n_events, cap_events;
    long calls[GM_SIM_FN_COUNT];        /* all calls, for counters */
    long inject_calls[GM_SIM_FN_COUNT]; /* calls since the failure was set */
    char last_error[128];
};

void gm_sim_config_default(gm_sim_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->num_devices = 1;
    cfg->capacity = (size_t)80 << 30;
    cfg->granularity = (size_t)2 << 20;
    cfg->mode = GM_SIM_VIRTUAL;
    cfg->event_mode = GM_SIM_EVENTS_IMMEDIATE;
    cfg->fail_fn = -1;
    cfg->fail_code = GM_EOOM;
}

/* ------------------------------------------------------------ helpers */

static int set_error(gm_sim_t *s, int code, const char *text) {
    strncpy(s->last_error, text, sizeof s->last_error - 1);
    s->last_error[sizeof s->last_error - 1] = 0;
    return code;
}

/* Counts the call and applies failure injection. */
static int inject(gm_sim_t *s, gm_sim_fn_t fn, size_t size) {
    s->calls[fn]++;
    long n = ++s->inject_calls[fn];
    if (s->cfg.fail_fn == (int)fn && s->cfg.fail_nth == n)
        return set_error(s, s->cfg.fail_code ? s->cfg.fail_code : GM_EOOM, "injected failure");
    if (s->cfg.fail_above && size > s->cfg.fail_above &&
        (fn == GM_SIM_FN_SEG_ALLOC || fn == GM_SIM_FN_MAP))
        return set_error(s, GM_EOOM, "injected failure: size above limit");
    return GM_OK;
}

static int bad_device(gm_sim_t *s, int device) {
    return device < 0 || device >= s->cfg.num_devices;
}

static size_t used_bytes(const sim_device_t *d) {
    return d->counters.bytes_allocated + d->counters.bytes_mapped;
}

static int grow(void **v, size_t *cap, size_t n, size_t elem) {
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*v, c * elem);
    if (!p)
        return -1;
    *v = p;
    *cap = c;
    return 0;
}

/* First-fit carve of an aligned range from the free list. */
static int range_take(sim_device_t *d, size_t size, uintptr_t *out) {
    size = (size + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    for (size_t i = 0; i < d->n_free; i++) {
        if (d->free_ranges[i].size >= size) {
            *out = d->free_ranges[i].start;
            d->free_ranges[i].start += size;
            d->free_ranges[i].size -= size;
            if (d->free_ranges[i].size == 0) {
                memmove(&d->free_ranges[i], &d->free_ranges[i + 1],
                        (d->n_free - i - 1) * sizeof(range_t));
                d->n_free--;
            }
            return 0;
        }
    }
    return -1;
}

static int range_give(sim_device_t *d, uintptr_t start, size_t size) {
    size = (size + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    size_t i = 0;
    while (i < d->n_free && d->free_ranges[i].start < start)
        i++;
    int merge_prev = i > 0 && d->free_ranges[i - 1].start + d->free_ranges[i - 1].size == start;
    int merge_next = i < d->n_free && start + size == d->free_ranges[i].start;
    if (merge_prev && merge_next) {
        d->free_ranges[i - 1].size += size + d->free_ranges[i].size;
        memmove(&d->free_ranges[i], &d->free_ranges[i + 1], (d->n_free - i - 1) * sizeof(range_t));
        d->n_free--;
    } else if (merge_prev) {
        d->free_ranges[i - 1].size += size;
    } else if (merge_next) {
        d->free_ranges[i].start = start;
        d->free_ranges[i].size += size;
    } else {
        if (grow((void **)&d->free_ranges, &d->cap_free, d->n_free, sizeof(range_t)))
            return -1;
        memmove(&d->free_ranges[i + 1], &d->free_ranges[i], (d->n_free - i) * sizeof(range_t));
        d->free_ranges[i].start = start;
        d->free_ranges[i].size = size;
        d->n_free++;
    }
    return 0;
}

static used_t *find_used(sim_device_t *d, uintptr_t start, int is_va) {
    for (size_t i = 0; i < d->n_used; i++)
        if (d->used[i].start == start && d->used[i].is_va == is_va)
            return &d->used[i];
    return NULL;
}

/* The VA reservation containing [va, va+size). */
static used_t *find_va(sim_device_t *d, uintptr_t va, size_t size) {
    for (size_t i = 0; i < d->n_used; i++) {
        used_t *u = &d->used[i];
        if (u->is_va && va >= u->start && va + size <= u->start + u->size)
            return u;
    }
    return NULL;
}

static void drop_used(sim_device_t *d, used_t *u) {
    free(u->mapped);
    *u = d->used[--d->n_used];
}

/* Obtain address space: a window address (virtual) or host memory. */
static int get_space(gm_sim_t *s, sim_device_t *d, size_t size, uintptr_t *out) {
    if (s->cfg.mode == GM_SIM_HOST) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return set_error(s, GM_EOOM, "mmap failed");
        *out = (uintptr_t)p;
        return GM_OK;
    }
    if (range_take(d, size, out))
        return set_error(s, GM_EOOM, "simulated address space exhausted");
    return GM_OK;
}

static void put_space(gm_sim_t *s, sim_device_t *d, uintptr_t start, size_t size) {
    if (s->cfg.mode == GM_SIM_HOST)
        munmap((void *)start, size);
    else
        range_give(d, start, size);
}

static void note_peak(sim_device_t *d) {
    if (used_bytes(d) > d->counters.peak_used)
        d->counters.peak_used = used_bytes(d);
}

/* ---------------------------------------------------------- backend ops */

#define ENTER(s) pthread_mutex_lock(&(s)->lock)
#define LEAVE(s, rc) do { int rc_ = (rc); pthread_mutex_unlock(&(s)->lock); return rc_; } while (0)

static int sim_mem_get_info(void *ctx, int device, size_t *free_b, size_t *total) {
    gm_sim_t *s = ctx;
    ENTER(s);
    if (bad_device(s, device))
        LEAVE(s, set_error(s, GM_EINVAL, "invalid device ordinal"));
    size_t used = used_bytes(&s->devs[device]);
    *total = s->cfg.capacity;
    *free_b = used < s->cfg.capacity ? s->cfg.capacity - used : 0;
    LEAVE(s, GM_OK);
}

static int sim_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_SEG_ALLOC, size);
    if (rc)
        LEAVE(s, rc);
    if (bad_device(s, device) || size == 0)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid argument"));
    sim_device_t *d = &s->devs[device];
    if (size > s->cfg.capacity - (used_bytes(d) < s->cfg.capacity ? used_bytes(d) : s->cfg.capacity))
        LEAVE(s, set_error(s, GM_EOOM, "out of memory"));
    if (grow((void **)&d->used, &d->cap_used, d->n_used, sizeof(used_t)))
        LEAVE(s, set_error(s, GM_ENOMEM, "host out of memory"));
    uintptr_t p;
    if ((rc = get_space(s, d, size, &p)))
        LEAVE(s, rc);
    d->used[d->n_used++] = (used_t){p, size, 0, NULL};
    d->counters.bytes_allocated += size;
    d->counters.live_segments++;
    note_peak(d);
    *out = p;
    LEAVE(s, GM_OK);
}

static int sim_seg_free(void *ctx, int device, uintptr_t ptr, size_t size) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_SEG_FREE, 0);
    if (rc)
        LEAVE(s, rc);
    if (bad_device(s, device))
        LEAVE(s, set_error(s, GM_EINVAL, "invalid device ordinal"));
    sim_device_t *d = &s->devs[device];
    used_t *u = find_used(d, ptr, 0);
    if (!u)
        LEAVE(s, set_error(s, GM_EINVAL, "free of an address that is not a live segment"));
    size = u->size;
    put_space(s, d, ptr, size);
    drop_used(d, u);
    d->counters.bytes_allocated -= size;
    d->counters.live_segments--;
    LEAVE(s, GM_OK);
}

static int sim_event_create(void *ctx, int device, uintptr_t *out) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_EVENT_CREATE, 0);
    if (rc)
        LEAVE(s, rc);
    size_t i = 0;
    while (i < s->n_events && s->events[i].live)
        i++;
    if (i == s->n_events) {
        if (grow((void **)&s->events, &s->cap_events, s->n_events, sizeof(sim_event_t)))
            LEAVE(s, set_error(s, GM_ENOMEM, "host out of memory"));
        s->n_events++;
    }
    s->events[i] = (sim_event_t){1, 0, 1, 0, device};
    s->devs[bad_device(s, device) ? 0 : device].counters.live_events++;
    *out = (uintptr_t)i + 1; /* never 0 */
    LEAVE(s, GM_OK);
}

static sim_event_t *get_event(gm_sim_t *s, uintptr_t ev) {
    if (ev == 0 || ev > s->n_events || !s->events[ev - 1].live)
        return NULL;
    return &s->events[ev - 1];
}

static int sim_event_destroy(void *ctx, int device, uintptr_t ev) {
    gm_sim_t *s = ctx;
    ENTER(s);
    sim_event_t *e = get_event(s, ev);
    if (!e)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid event handle"));
    s->devs[bad_device(s, e->device) ? 0 : e->device].counters.live_events--;
    e->live = 0;
    LEAVE(s, GM_OK);
}

static int sim_event_record(void *ctx, int device, uintptr_t ev, uintptr_t stream) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_EVENT_RECORD, 0);
    if (rc)
        LEAVE(s, rc);
    sim_event_t *e = get_event(s, ev);
    if (!e)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid event handle"));
    e->recorded = 1;
    e->queries = 0;
    e->complete = s->cfg.event_mode == GM_SIM_EVENTS_IMMEDIATE;
    LEAVE(s, GM_OK);
}

static int sim_event_query(void *ctx, int device, uintptr_t ev) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_EVENT_QUERY, 0);
    if (rc)
        LEAVE(s, rc);
    sim_event_t *e = get_event(s, ev);
    if (!e)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid event handle"));
    if (!e->complete && s->cfg.event_mode == GM_SIM_EVENTS_AFTER_N &&
        ++e->queries > s->cfg.event_after_n)
        e->complete = 1;
    if (!e->complete && s->cfg.event_mode == GM_SIM_EVENTS_IMMEDIATE)
        e->complete = 1;
    LEAVE(s, e->complete ? GM_OK : GM_ENOTREADY);
}

static int sim_event_synchronize(void *ctx, int device, uintptr_t ev) {
    gm_sim_t *s = ctx;
    ENTER(s);
    sim_event_t *e = get_event(s, ev);
    if (!e)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid event handle"));
    e->complete = 1; /* the host waits; the simulated GPU finishes */
    LEAVE(s, GM_OK);
}

static int sim_vmm_granularity(void *ctx, int device, size_t *out) {
    gm_sim_t *s = ctx;
    if (!s->cfg.granularity)
        return GM_ENOTSUP;
    *out = s->cfg.granularity;
    return GM_OK;
}

static int sim_va_reserve(void *ctx, int device, size_t size, size_t alignment, uintptr_t *out) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_VA_RESERVE, 0);
    if (rc)
        LEAVE(s, rc);
    if (bad_device(s, device) || !s->cfg.granularity || size % s->cfg.granularity)
        LEAVE(s, set_error(s, GM_EINVAL, "invalid reservation"));
    sim_device_t *d = &s->devs[device];
    if (grow((void **)&d->used, &d->cap_used, d->n_used, sizeof(used_t)))
        LEAVE(s, set_error(s, GM_ENOMEM, "host out of memory"));
    uint8_t *m = calloc(size / s->cfg.granularity, 1);
    if (!m)
        LEAVE(s, set_error(s, GM_ENOMEM, "host out of memory"));
    uintptr_t va;
    if ((rc = get_space(s, d, size, &va))) {
        free(m);
        LEAVE(s, rc);
    }
    d->used[d->n_used++] = (used_t){va, size, 1, m};
    d->counters.bytes_reserved_va += size;
    d->counters.live_reservations++;
    *out = va;
    LEAVE(s, GM_OK);
}

static int sim_va_free(void *ctx, int device, uintptr_t va, size_t size) {
    gm_sim_t *s = ctx;
    ENTER(s);
    if (bad_device(s, device))
        LEAVE(s, set_error(s, GM_EINVAL, "invalid device ordinal"));
    sim_device_t *d = &s->devs[device];
    used_t *u = find_used(d, va, 1);
    if (!u || u->size != size)
        LEAVE(s, set_error(s, GM_EINVAL, "free of an address range that is not reserved"));
    for (size_t k = 0; k < size / s->cfg.granularity; k++)
        if (u->mapped[k])
            LEAVE(s, set_error(s, GM_ESTATE, "address range still has mapped memory"));
    put_space(s, d, va, size);
    drop_used(d, u);
    d->counters.bytes_reserved_va -= size;
    d->counters.live_reservations--;
    LEAVE(s, GM_OK);
}

static int sim_map(void *ctx, int device, uintptr_t va, size_t size) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_MAP, size);
    if (rc)
        LEAVE(s, rc);
    if (bad_device(s, device))
        LEAVE(s, set_error(s, GM_EINVAL, "invalid device ordinal"));
    sim_device_t *d = &s->devs[device];
    size_t g = s->cfg.granularity;
    used_t *u = find_va(d, va, size);
    if (!u || size == 0 || (va - u->start) % g || size % g)
        LEAVE(s, set_error(s, GM_EINVAL, "map outside a reservation or not granule aligned"));
    size_t first = (va - u->start) / g, n = size / g;
    for (size_t k = first; k < first + n; k++)
        if (u->mapped[k])
            LEAVE(s, set_error(s, GM_ESTATE, "address already mapped"));
    if (used_bytes(d) + size > s->cfg.capacity)
        LEAVE(s, set_error(s, GM_EOOM, "out of memory"));
    memset(u->mapped + first, 1, n);
    d->counters.bytes_mapped += size;
    note_peak(d);
    LEAVE(s, GM_OK);
}

static int sim_unmap(void *ctx, int device, uintptr_t va, size_t size) {
    gm_sim_t *s = ctx;
    ENTER(s);
    int rc = inject(s, GM_SIM_FN_UNMAP, 0);
    if (rc)
        LEAVE(s, rc);
    if (bad_device(s, device))
        LEAVE(s, set_error(s, GM_EINVAL, "invalid device ordinal"));
    sim_device_t *d = &s->devs[device];
    size_t g = s->cfg.granularity;
    used_t *u = find_va(d, va, size);
    if (!u || size == 0 || (va - u->start) % g || size % g)
        LEAVE(s, set_error(s, GM_EINVAL, "unmap outside a reservation or not granule aligned"));
    size_t first = (va - u->start) / g, n = size / g;
    for (size_t k = first; k < first + n; k++)
        if (!u->mapped[k])
            LEAVE(s, set_error(s, GM_ESTATE, "unmap of memory that is not mapped"));
    memset(u->mapped + first, 0, n);
    if (s->cfg.mode == GM_SIM_HOST)
        madvise((void *)va, size, MADV_DONTNEED); /* contents are gone, as on a GPU */
    d->counters.bytes_mapped -= size;
    LEAVE(s, GM_OK);
}

/* Event completion is controlled by the test (event_mode), so waiting for a
 * stream completes nothing here; the simulated device has no work queued. */
static int sim_stream_synchronize(void *ctx, int device, uintptr_t stream) { return GM_OK; }

static const char *sim_last_error(void *ctx) { return ((gm_sim_t *)ctx)->last_error; }

/* ------------------------------------------------------------ lifecycle */

int gm_sim_create(const gm_sim_config_t *cfg, gm_sim_t **out) {
    gm_sim_config_t c;
    if (cfg)
        c = *cfg;
    else
        gm_sim_config_default(&c);
    if (c.num_devices < 1 || c.num_devices > 64 || c.capacity == 0 ||
        (c.granularity && (c.granularity & (c.granularity - 1))) ||
        (c.mode != GM_SIM_VIRTUAL && c.mode != GM_SIM_HOST) ||
        c.event_mode < GM_SIM_EVENTS_IMMEDIATE || c.event_mode > GM_SIM_EVENTS_AFTER_N ||
        (c.mode == GM_SIM_VIRTUAL && c.capacity + c.capacity / 4 > SIM_WINDOW))
        return GM_EINVAL;
    gm_sim_t *s = calloc(1, sizeof *s);
    if (!s)
        return GM_ENOMEM;
    s->cfg = c;
    s->devs = calloc((size_t)c.num_devices, sizeof *s->devs);
    if (!s->devs) {
        free(s);
        return GM_ENOMEM;
    }
    for (int i = 0; i < c.num_devices; i++) {
        sim_device_t *d = &s->devs[i];
        if (range_give(d, SIM_BASE + (uintptr_t)i * SIM_WINDOW, SIM_WINDOW)) {
            gm_sim_destroy(s);
            return GM_ENOMEM;
        }
    }
    pthread_mutex_init(&s->lock, NULL);
    gm_backend_t *b = &s->backend;
    b->ctx = s;
    b->name = "sim";
    b->mem_get_info = sim_mem_get_info;
    b->seg_alloc = sim_seg_alloc;
    b->seg_free = sim_seg_free;
    b->event_create = sim_event_create;
    b->event_destroy = sim_event_destroy;
    b->event_record = sim_event_record;
    b->event_query = sim_event_query;
    b->event_synchronize = sim_event_synchronize;
    b->vmm_granularity = sim_vmm_granularity;
    b->va_reserve = sim_va_reserve;
    b->va_free = sim_va_free;
    b->map = sim_map;
    b->unmap = sim_unmap;
    b->stream_synchronize = sim_stream_synchronize;
    b->last_error = sim_last_error;
    *out = s;
    return GM_OK;
}

void gm_sim_destroy(gm_sim_t *s) {
    if (!s)
        return;
    for (int i = 0; s->devs && i < s->cfg.num_devices; i++) {
        sim_device_t *d = &s->devs[i];
        for (size_t k = 0; k < d->n_used; k++) {
            if (s->cfg.mode == GM_SIM_HOST)
                munmap((void *)d->used[k].start, d->used[k].size);
            free(d->used[k].mapped);
        }
        free(d->used);
        free(d->free_ranges);
    }
    free(s->devs);
    free(s->events);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const gm_backend_t *gm_sim_backend(gm_sim_t *s) { return &s->backend; }

void gm_sim_get_counters(gm_sim_t *s, int device, gm_sim_counters_t *out) {
    pthread_mutex_lock(&s->lock);
    memset(out, 0, sizeof *out);
    if (!bad_device(s, device))
        *out = s->devs[device].counters;
    memcpy(out->calls, s->calls, sizeof s->calls);
    pthread_mutex_unlock(&s->lock);
}

void gm_sim_complete_events(gm_sim_t *s) {
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n_events; i++)
        if (s->events[i].live)
            s->events[i].complete = 1;
    pthread_mutex_unlock(&s->lock);
}

void gm_sim_set_event_mode(gm_sim_t *s, int mode, int after_n) {
    pthread_mutex_lock(&s->lock);
    s->cfg.event_mode = mode;
    s->cfg.event_after_n = after_n;
    pthread_mutex_unlock(&s->lock);
}

void gm_sim_set_failure(gm_sim_t *s, int fn, long nth, int code, size_t fail_above) {
    pthread_mutex_lock(&s->lock);
    s->cfg.fail_fn = fn;
    s->cfg.fail_nth = nth;
    s->cfg.fail_code = code ? code : GM_EOOM;
    s->cfg.fail_above = fail_above;
    memset(s->inject_calls, 0, sizeof s->inject_calls);
    pthread_mutex_unlock(&s->lock);
}
