/*
 * helpers.c - fixtures shared by the C unit tests (see helpers.h).
 *
 * Everything here reports failures through gmtest with the caller's
 * file:line, so a failing helper points at the test line that used it.
 */
#include "helpers.h"

#include <stdlib.h>
#include <string.h>

uintptr_t fx_streams[TDEV_NSTREAMS];
int fx_expandable_default;

static void record_trace(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                         uintptr_t stream, uint32_t ctx) {
    trace_log_t *log = arg;
    if (log->n >= TRACE_MAX) {
        log->dropped++;
        return;
    }
    trace_ev_t *e = &log->ev[log->n++];
    e->action = (int)action;
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    e->ctx = ctx;
    e->device = device;
}

tdev_config_t dev_cfg(size_t capacity, int event_mode) {
    tdev_config_t cfg;
    tdev_config_default(&cfg);
    if (capacity)
        cfg.capacity = capacity;
    cfg.event_mode = event_mode;
    return cfg;
}

gm_settings_t settings_with(int expandable) {
    gm_settings_t s;
    gm_settings_default(&s);
    s.expandable_segments = expandable;
    return s;
}

gm_settings_t fx_settings(void) { return settings_with(fx_expandable_default); }

int fx_on_cuda(void) { return tdev_kind() == TDEV_CUDA; }

int fx_open_at(fx_t *fx, const tdev_config_t *cfg, const gm_settings_t *settings,
               const char *file, int line) {
    memset(fx, 0, sizeof(*fx));
    if (cfg)
        fx->cfg = *cfg;
    else
        tdev_config_default(&fx->cfg);
    if (settings)
        fx->settings = *settings;
    else
        fx->settings = fx_settings();
    char err[512];
    int rc = tdev_open(&fx->cfg, &fx->dev, err, sizeof err);
    if (rc != 0 || !fx->dev) {
        gmtest_fail(file, line, "opening the %s device failed: %d (%s): %s", tdev_kind_name(),
                    rc, gm_strerror(rc), err);
        return -1;
    }
    for (int i = 0; i < TDEV_NSTREAMS; i++)
        fx_streams[i] = tdev_stream(fx->dev, i);
    fx->be = tdev_backend(fx->dev);
    rc = gm_alloc_create(fx->be, 0, &fx->settings, &fx->a);
    if (rc != 0 || !fx->a) {
        gmtest_fail(file, line, "gm_alloc_create failed: %d (%s)", rc, gm_strerror(rc));
        tdev_close(fx->dev, err, sizeof err);
        fx->dev = NULL;
        return -1;
    }
    fx->trace = calloc(1, sizeof(*fx->trace));
    if (!fx->trace) {
        gmtest_fail(file, line, "out of host memory");
        return -1;
    }
    gm_alloc_set_trace_hook(fx->a, record_trace, fx->trace);
    return 0;
}

void fx_check_at(fx_t *fx, const char *file, int line) {
    char msg[512] = "";
    int n = gm_alloc_check(fx->a, msg, sizeof msg);
    if (n != 0)
        gmtest_fail(file, line, "gm_alloc_check found %d violation(s): %s", n, msg);
}

void fx_close_at(fx_t *fx, const char *file, int line) {
    if (fx->a) {
        fx_check_at(fx, file, line);
        gm_alloc_set_trace_hook(fx->a, NULL, NULL);
        gm_alloc_destroy(fx->a);
        fx->a = NULL;
    }
    if (fx->dev) {
        char err[1024];
        if (tdev_close(fx->dev, err, sizeof err) != 0)
            gmtest_fail(file, line, "%s device not clean after gm_alloc_destroy: %s",
                        tdev_kind_name(), err);
        fx->dev = NULL;
    }
    memset(fx_streams, 0, sizeof fx_streams);
    free(fx->trace);
    fx->trace = NULL;
}

uintptr_t fx_malloc_at(fx_t *fx, size_t size, uintptr_t stream, const char *file, int line) {
    uintptr_t p = 0;
    gm_oom_info_t oom;
    memset(&oom, 0, sizeof oom);
    int rc = gm_alloc_malloc(fx->a, size, stream, 0, &p, &oom);
    if (rc != 0) {
        gmtest_fail(file, line, "malloc(%zu, stream %#lx) failed: %d (%s)", size,
                    (unsigned long)stream, rc, gm_strerror(rc));
        return 0;
    }
    if (p == 0)
        gmtest_fail(file, line, "malloc(%zu) returned 0 with success", size);
    return p;
}

void fx_free_at(fx_t *fx, uintptr_t ptr, const char *file, int line) {
    int rc = gm_alloc_free(fx->a, ptr, 0);
    if (rc != 0)
        gmtest_fail(file, line, "free(%#lx) failed: %d (%s)", (unsigned long)ptr, rc,
                    gm_strerror(rc));
}

gm_stats_t fx_stats(fx_t *fx) {
    gm_stats_t s;
    memset(&s, 0, sizeof s);
    gm_alloc_get_stats(fx->a, &s);
    return s;
}

tdev_counters_t fx_counters(fx_t *fx) {
    tdev_counters_t c;
    tdev_counters(fx->dev, 0, &c);
    return c;
}

void fx_complete_events(fx_t *fx) { tdev_complete_events(fx->dev); }

void fx_set_event_mode(fx_t *fx, int mode, int after_n) {
    tdev_set_event_mode(fx->dev, mode, after_n);
}

void fx_set_failure(fx_t *fx, int fn, long nth, int code, size_t fail_above) {
    tdev_set_failure(fx->dev, fn, nth, code, fail_above);
}

size_t fx_reserved(fx_t *fx) { return (size_t)fx_stats(fx).reserved_bytes[GM_STAT_ALL].current; }

size_t fx_allocated(fx_t *fx) {
    return (size_t)fx_stats(fx).allocated_bytes[GM_STAT_ALL].current;
}

size_t fx_block_size(fx_t *fx, uintptr_t ptr) {
    size_t size = 0, req = 0;
    uintptr_t stream = 0;
    if (gm_alloc_block_size(fx->a, ptr, &size, &req, &stream) != 0)
        return 0;
    return size;
}

size_t fx_device_free(fx_t *fx) {
    size_t free_b = 0, total = 0;
    fx->be->mem_get_info(fx->be->ctx, 0, &free_b, &total);
    return free_b;
}

void trace_clear(fx_t *fx) {
    fx->trace->n = 0;
    fx->trace->dropped = 0;
}

int trace_count(fx_t *fx, int action) {
    int n = 0;
    for (int i = 0; i < fx->trace->n; i++)
        n += fx->trace->ev[i].action == action;
    return n;
}

int trace_find(fx_t *fx, int action, uintptr_t addr) {
    for (int i = 0; i < fx->trace->n; i++)
        if (fx->trace->ev[i].action == action && (addr == TRACE_ANY || fx->trace->ev[i].addr == addr))
            return i;
    return -1;
}

/* ---- walking ---- */

typedef struct walk_ctx {
    walk_t *w;
    int oom;
} walk_ctx_t;

static int collect_seg(void *arg, const gm_segment_info_t *seg) {
    walk_ctx_t *ctx = arg;
    walk_t *w = ctx->w;
    if (w->nsegs == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        walk_seg_t *n = realloc(w->segs, cap * sizeof(*n));
        if (!n) {
            ctx->oom = 1;
            return 1;
        }
        w->segs = n;
        w->cap = cap;
    }
    walk_seg_t *s = &w->segs[w->nsegs];
    s->info = *seg;
    s->blocks = NULL;
    if (seg->nblocks) {
        s->blocks = malloc(seg->nblocks * sizeof(gm_block_info_t));
        if (!s->blocks) {
            ctx->oom = 1;
            return 1;
        }
        memcpy(s->blocks, seg->blocks, seg->nblocks * sizeof(gm_block_info_t));
    }
    s->info.blocks = s->blocks;
    w->nsegs++;
    return 0;
}

void walk_collect_at(fx_t *fx, walk_t *w, const char *file, int line) {
    memset(w, 0, sizeof(*w));
    walk_ctx_t ctx = {w, 0};
    int rc = gm_alloc_walk(fx->a, collect_seg, &ctx);
    if (rc != 0 || ctx.oom) {
        gmtest_fail(file, line, "gm_alloc_walk returned %d (host oom %d)", rc, ctx.oom);
        return;
    }
    for (size_t i = 0; i < w->nsegs; i++) {
        const gm_segment_info_t *s = &w->segs[i].info;
        if (i > 0) {
            const gm_segment_info_t *p = &w->segs[i - 1].info;
            if (p->address + p->total_size > s->address)
                gmtest_fail(file, line, "walk: segment %zu at %#lx not after segment %zu (%#lx+%zu)",
                            i, (unsigned long)s->address, i - 1, (unsigned long)p->address,
                            p->total_size);
        }
        if (s->nblocks == 0) {
            gmtest_fail(file, line, "walk: segment %zu has no blocks", i);
            continue;
        }
        uintptr_t at = s->address;
        size_t alloc_sum = 0, active_sum = 0, req_sum = 0;
        for (size_t j = 0; j < s->nblocks; j++) {
            const gm_block_info_t *b = &s->blocks[j];
            if (b->address != at)
                gmtest_fail(file, line, "walk: segment %zu block %zu at %#lx, expected %#lx", i, j,
                            (unsigned long)b->address, (unsigned long)at);
            if (b->size == 0 || b->size % GM_MIN_BLOCK_SIZE)
                gmtest_fail(file, line, "walk: segment %zu block %zu has size %zu", i, j, b->size);
            if (b->state != GM_BLOCK_INACTIVE && b->state != GM_BLOCK_ACTIVE_ALLOCATED &&
                b->state != GM_BLOCK_ACTIVE_PENDING_FREE)
                gmtest_fail(file, line, "walk: segment %zu block %zu has state %d", i, j, b->state);
            if (b->state == GM_BLOCK_ACTIVE_ALLOCATED)
                alloc_sum += b->size;
            if (b->state != GM_BLOCK_INACTIVE) {
                active_sum += b->size;
                req_sum += b->requested_size;
                if (b->requested_size > b->size)
                    gmtest_fail(file, line, "walk: block %#lx requested %zu > size %zu",
                                (unsigned long)b->address, b->requested_size, b->size);
            }
            at += b->size;
        }
        if (at - s->address != s->total_size)
            gmtest_fail(file, line, "walk: segment %zu blocks sum to %zu, total_size %zu", i,
                        (size_t)(at - s->address), s->total_size);
        if (alloc_sum != s->allocated_size)
            gmtest_fail(file, line, "walk: segment %zu allocated_size %zu, blocks say %zu", i,
                        s->allocated_size, alloc_sum);
        if (active_sum != s->active_size)
            gmtest_fail(file, line, "walk: segment %zu active_size %zu, blocks say %zu", i,
                        s->active_size, active_sum);
        if (req_sum != s->requested_size)
            gmtest_fail(file, line, "walk: segment %zu requested_size %zu, blocks say %zu", i,
                        s->requested_size, req_sum);
    }
}

void walk_free(walk_t *w) {
    for (size_t i = 0; i < w->nsegs; i++)
        free(w->segs[i].blocks);
    free(w->segs);
    memset(w, 0, sizeof(*w));
}

const gm_block_info_t *walk_block(const walk_t *w, uintptr_t addr, const walk_seg_t **seg) {
    for (size_t i = 0; i < w->nsegs; i++)
        for (size_t j = 0; j < w->segs[i].info.nblocks; j++)
            if (w->segs[i].blocks[j].address == addr) {
                if (seg)
                    *seg = &w->segs[i];
                return &w->segs[i].blocks[j];
            }
    return NULL;
}

const walk_seg_t *walk_segment(const walk_t *w, uintptr_t addr) {
    for (size_t i = 0; i < w->nsegs; i++) {
        const gm_segment_info_t *s = &w->segs[i].info;
        if (addr >= s->address && addr < s->address + s->total_size)
            return &w->segs[i];
    }
    return NULL;
}
