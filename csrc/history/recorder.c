/*
 * recorder.c - recording configuration, the per-device slots (registered
 * allocator + event ring), the trace hook that feeds the rings, and the
 * locked half of a snapshot.
 *
 * Invariants: a slot's ring only ever holds events of the allocator that
 * owns the slot (a takeover or a detach clears it), so every trace is a
 * suffix of the history that led to that allocator's current segments.
 * While recording is off no registered allocator has the history hook
 * installed (only its chain hook, if any), and capture returns at once.
 * Must not: call Python, or create/release anything but plain C memory
 * (the hook runs under an allocator lock).
 *
 * Note [History locks]
 * Rationale: the hook runs inside the core's allocator lock, snapshots walk
 *   the core under that same lock, and Python may be involved on either
 *   side; one fixed order keeps all of it deadlock free.
 * Approach: GIL -> registry lock -> allocator lock -> ring lock. The
 *   registry lock serialises configure/attach/detach/copy; the ring lock
 *   (per device) guards one ring and is taken last, by the hook and by
 *   readers. Capture never takes any of these (it runs before the allocator
 *   lock) and the intern lock is a leaf.
 *   The ring lock is a spin lock (ring_lock.h says why).
 * Limitations: a snapshot blocks allocations on a device while it copies
 *   that device's ring (a memcpy of at most max_entries events); an
 *   allocation that waits for a reader (a copy or a new bound's rebuild
 *   without its allocator lock) spins, yielding, instead of sleeping.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/grow.h"
#include "clock.h"
#include "hist.h"
#include "ring.h"
#include "ring_lock.h"
#include "sample.h"

typedef struct reg {
    gm_alloc_t *alloc;
    gm_trace_fn chain_fn; /* immutable while registered */
    void *chain_arg;
    struct slot *slot;
    /* 1 from a free_requested recorded with its completion (Note [Folded
     * frees] in ring.c) to that completion's hook call, which records
     * nothing. protected by: alloc's lock (both calls are under one hold) */
    int completion_recorded;
    struct reg *below; /* registered before this one on the device (protected by: registry lock) */
} reg_t;

/* The allocators registered on a device form a stack, newest on top: the
 * top one (owner) is recorded; when it is detached the one below it is
 * recorded again, from an empty ring. */
typedef struct slot {
    atomic_int ring_lock; /* gm_ring_lock_take / gm_ring_lock_drop */
    gm_ring_t ring; /* protected by: ring_lock */
    reg_t *owner;   /* protected by: registry lock (NULL: no allocator) */
} slot_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t slots_once = PTHREAD_ONCE_INIT;
static slot_t slots[GM_HIST_MAX_DEVICES]; /* immutable after init, except as marked */

/* Configuration: written under the registry lock, read lock-free. */
static atomic_int cfg_enabled;         /* GM_HIST_OFF/_STATE/_ALL */
static atomic_int cfg_context;         /* GM_HIST_CTX_* (0 while off) */
static atomic_int cfg_stacks_all;
static atomic_uint cfg_skip_mask;
static uint64_t cfg_max_entries = 1;   /* protected by: registry lock */
static int cfg_context_requested;      /* protected by: registry lock */

static _Thread_local uint32_t tls_metadata; /* this thread's user_metadata id */
static _Thread_local uint32_t tls_compile;  /* this thread's compile context id */
/* Set for good once any thread sets either of the two. Until then every
 * event's metadata and compile context are 0, and the hook reads neither
 * thread-local (each read is a call to __tls_get_addr from a shared
 * object). A thread that set its own reads the flag after its own store,
 * so it never misses it. */
static atomic_int thread_tags_used;

static void init_slots(void) {
    gm_clock_anchor(); /* before any event can be stamped */
    for (int d = 0; d < GM_HIST_MAX_DEVICES; d++) {
        atomic_init(&slots[d].ring_lock, 0);
        gm_ring_init(&slots[d].ring, 1);
    }
}

static void ensure_slots(void) { pthread_once(&slots_once, init_slots); }

int gm_hist_context_level(void) { return atomic_load_explicit(&cfg_context, memory_order_relaxed); }

int gm_hist_stacks_all(void) { return atomic_load_explicit(&cfg_stacks_all, memory_order_relaxed); }

void gm_hist_set_thread_metadata(uint32_t id) {
    if (id)
        atomic_store_explicit(&thread_tags_used, 1, memory_order_relaxed);
    tls_metadata = id;
}

uint32_t gm_hist_thread_metadata(void) { return tls_metadata; }

void gm_hist_set_thread_compile_context(uint32_t id) {
    if (id)
        atomic_store_explicit(&thread_tags_used, 1, memory_order_relaxed);
    tls_compile = id;
}

/* --------------------------------------------------------------- hook */

/* Record one event on slot s; takes its ring lock. `at_once`: a
 * free_requested recorded together with its completion. */
static void push_event(slot_t *s, gm_action_t action, uint64_t addr, uint64_t size,
                       uint64_t stream, uint32_t ctx, int at_once) {
    gm_hist_event_t e;
    e.addr = addr;
    e.size = size;
    e.stream = stream;
    e.time_us = gm_clock_ticks(); /* ticks in the ring; microseconds once copied */
    /* torch attaches a context to trace entries only from level ALLOC. */
    e.tb = gm_hist_context_level() >= GM_HIST_CTX_ALLOC ? ctx : 0;
    if (atomic_load_explicit(&thread_tags_used, memory_order_relaxed)) {
        e.meta = tls_metadata;
        e.compile = tls_compile;
    } else {
        e.meta = e.compile = 0;
    }
    e.action = (uint8_t)action;
    memset(e.folded, 0, sizeof e.folded);
    gm_ring_lock_take(&s->ring_lock);
    if (at_once)
        gm_ring_push_freed_at_once(&s->ring, &e); /* Note [Folded frees] in ring.c */
    else if (action == GM_ACT_FREE_COMPLETED)
        gm_ring_push_completed(&s->ring, &e);
    else
        gm_ring_push(&s->ring, &e);
    gm_ring_lock_drop(&s->ring_lock);
}

/* The core's trace hook while recording; runs under the allocator lock. */
static void hist_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                      uintptr_t stream, uint32_t ctx) {
    reg_t *r = arg;
    if (action == GM_ACT_FREE_COMPLETED && r->completion_recorded)
        r->completion_recorded = 0; /* recorded with its request */
    else if (atomic_load_explicit(&cfg_enabled, memory_order_relaxed)) {
        unsigned skip = atomic_load_explicit(&cfg_skip_mask, memory_order_relaxed);
        if (!(skip & (1u << action))) {
            /* A free returned at once: its completion goes in the same
             * slot now (Note [Folded frees] in ring.c). */
            int at_once = action == GM_ACT_FREE_REQUESTED &&
                          !(skip & (1u << GM_ACT_FREE_COMPLETED)) &&
                          gm_alloc_free_completes_at_once(r->alloc);
            push_event(r->slot, action, addr, size, stream, ctx, at_once);
            r->completion_recorded = at_once;
        }
    }
    if (r->chain_fn)
        r->chain_fn(r->chain_arg, device, action, addr, size, stream, ctx);
}

/* Caller holds the registry lock. Takes r->alloc's lock. */
static void install_hook_unlocked(reg_t *r, int recording) {
    if (recording)
        gm_alloc_set_trace_hook(r->alloc, hist_hook, r);
    else
        gm_alloc_set_trace_hook(r->alloc, r->chain_fn, r->chain_arg);
}

static void clear_ring(slot_t *s) {
    gm_ring_lock_take(&s->ring_lock);
    gm_ring_clear(&s->ring);
    gm_ring_lock_drop(&s->ring_lock);
}

/* ------------------------------------------------------ configuration */

int gm_hist_configure(const gm_hist_config_t *cfg) {
    if (cfg->enabled < GM_HIST_OFF || cfg->enabled > GM_HIST_ALL ||
        cfg->context < GM_HIST_CTX_NEVER || cfg->context > GM_HIST_CTX_ALL)
        return GM_EINVAL;
    ensure_slots();
    int on = cfg->enabled != GM_HIST_OFF;
    uint64_t max = cfg->enabled == GM_HIST_STATE ? 1 : (cfg->max_entries ? cfg->max_entries : 1);
    /* The ring grows on demand, so a huge bound (torch's default is
     * sys.maxsize) costs only what is recorded. */
    size_t ring_max = max > (uint64_t)SIZE_MAX / sizeof(gm_hist_event_t)
                          ? SIZE_MAX / sizeof(gm_hist_event_t)
                          : (size_t)max;
    if (on && cfg->stacks_all)
        gm_cframes_warmup(); /* before any lock: the unwinder may dlopen */
    int rc = GM_OK;
    pthread_mutex_lock(&registry_lock);
    if (!on) {
        /* Hooks off first (waits for in-flight operations), then clear. */
        atomic_store(&cfg_enabled, GM_HIST_OFF);
        atomic_store(&cfg_context, GM_HIST_CTX_NEVER);
        gm_hist_sampling_set(&(gm_hist_sampling_t){0, 0, 0});
        for (int d = 0; d < GM_HIST_MAX_DEVICES; d++)
            if (slots[d].owner)
                install_hook_unlocked(slots[d].owner, 0);
        for (int d = 0; d < GM_HIST_MAX_DEVICES; d++)
            clear_ring(&slots[d]);
    } else {
        for (int d = 0; d < GM_HIST_MAX_DEVICES; d++) {
            slot_t *s = &slots[d];
            gm_ring_lock_take(&s->ring_lock);
            if (cfg->clear_history)
                gm_ring_clear(&s->ring);
            if (gm_ring_set_max(&s->ring, ring_max))
                rc = GM_ENOMEM; /* keeps the old bound */
            gm_ring_lock_drop(&s->ring_lock);
        }
        atomic_store(&cfg_skip_mask, cfg->skip_mask);
        atomic_store(&cfg_stacks_all, cfg->stacks_all ? 1 : 0);
        gm_hist_sampling_set(&(gm_hist_sampling_t){cfg->sample_mean, cfg->sample_threshold,
                                                    cfg->sample_seed});
        /* Sampled: frees capture no stack (Note [Sampled recording]). */
        atomic_store(&cfg_context, cfg->sample_mean && cfg->context > GM_HIST_CTX_ALLOC
                                       ? GM_HIST_CTX_ALLOC
                                       : cfg->context);
        int was_on = atomic_exchange(&cfg_enabled, cfg->enabled) != GM_HIST_OFF;
        if (!was_on)
            for (int d = 0; d < GM_HIST_MAX_DEVICES; d++)
                if (slots[d].owner)
                    install_hook_unlocked(slots[d].owner, 1);
    }
    cfg_max_entries = on ? max : cfg_max_entries;
    cfg_context_requested = cfg->context;
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

void gm_hist_get_config(gm_hist_config_t *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&registry_lock);
    out->enabled = atomic_load(&cfg_enabled);
    out->context = out->enabled ? atomic_load(&cfg_context) : cfg_context_requested;
    out->stacks_all = atomic_load(&cfg_stacks_all);
    out->max_entries = cfg_max_entries;
    out->skip_mask = atomic_load(&cfg_skip_mask);
    gm_hist_sampling_t smp;
    gm_hist_sampling_get(&smp);
    out->sample_mean = smp.mean_bytes;
    out->sample_threshold = smp.threshold;
    out->sample_seed = smp.seed;
    pthread_mutex_unlock(&registry_lock);
}

/* ------------------------------------------------------------ registry */

int gm_hist_attach(gm_alloc_t *a, gm_trace_fn chain, void *chain_arg) {
    int device = gm_alloc_device(a);
    if (device < 0 || device >= GM_HIST_MAX_DEVICES) {
        gm_alloc_set_trace_hook(a, chain, chain_arg);
        return GM_EINVAL;
    }
    reg_t *r = calloc(1, sizeof *r);
    if (!r) {
        gm_alloc_set_trace_hook(a, chain, chain_arg);
        return GM_ENOMEM;
    }
    ensure_slots();
    slot_t *s = &slots[device];
    r->alloc = a;
    r->chain_fn = chain;
    r->chain_arg = chain_arg;
    r->slot = s;
    pthread_mutex_lock(&registry_lock);
    reg_t *old = s->owner;
    if (old) {
        /* The newest allocator on a device is the recorded one. */
        install_hook_unlocked(old, 0);
        clear_ring(s);
    }
    r->below = old;
    s->owner = r;
    install_hook_unlocked(r, atomic_load(&cfg_enabled) != GM_HIST_OFF);
    pthread_mutex_unlock(&registry_lock);
    return GM_OK;
}

void gm_hist_detach(gm_alloc_t *a) {
    ensure_slots();
    pthread_mutex_lock(&registry_lock);
    for (int d = 0; d < GM_HIST_MAX_DEVICES; d++) {
        for (reg_t **at = &slots[d].owner; *at; at = &(*at)->below) {
            reg_t *r = *at;
            if (r->alloc != a)
                continue;
            *at = r->below;
            if (at == &slots[d].owner) { /* the recorded one: the one below takes over */
                install_hook_unlocked(r, 0);
                clear_ring(&slots[d]);
                if (slots[d].owner)
                    install_hook_unlocked(slots[d].owner, atomic_load(&cfg_enabled) != GM_HIST_OFF);
            }
            free(r);
            pthread_mutex_unlock(&registry_lock);
            return;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

/* ------------------------------------------------------------ snapshot */

typedef struct walk_ctx {
    gm_hist_copy_t *out;
    size_t cap_seg, cap_blocks;
    slot_t *slot;
    int device;
    int ring_copied;
} walk_ctx_t;

/* Caller holds the ring lock. */
static int copy_ring_unlocked(walk_ctx_t *w) {
    const gm_ring_t *r = &w->slot->ring;
    size_t n = gm_ring_len(r);
    gm_hist_event_t *ev = NULL;
    if (n && !(ev = malloc(n * sizeof *ev)))
        return GM_ENOMEM;
    if (n) {
        gm_ring_copy(r, ev);
        gm_clock_conv_t conv;
        gm_clock_conv_now(&conv);
        for (size_t i = 0; i < n; i++)
            ev[i].time_us = gm_clock_to_us(&conv, ev[i].time_us);
    }
    w->out->ev[w->device] = ev;
    w->out->nev[w->device] = n;
    w->out->seq_end[w->device] = r->seq;
    w->ring_copied = 1;
    return GM_OK;
}

/* Runs under the allocator lock (from gm_alloc_walk). */
static int walk_cb(void *arg, const gm_segment_info_t *seg) {
    walk_ctx_t *w = arg;
    gm_hist_copy_t *o = w->out;
    if (!w->ring_copied) {
        /* Same allocator lock as the walk: trace and segments agree. */
        gm_ring_lock_take(&w->slot->ring_lock);
        int rc = copy_ring_unlocked(w);
        gm_ring_lock_drop(&w->slot->ring_lock);
        if (rc)
            return rc;
    }
    if (gm_grow((void **)&o->segs, &w->cap_seg, o->nseg + 1, sizeof *o->segs) ||
        gm_grow((void **)&o->blocks, &w->cap_blocks, o->nblocks + seg->nblocks, sizeof *o->blocks))
        return GM_ENOMEM;
    gm_hist_segment_t *s = &o->segs[o->nseg++];
    s->device = w->device;
    s->address = seg->address;
    s->total_size = seg->total_size;
    s->allocated_size = seg->allocated_size;
    s->active_size = seg->active_size;
    s->requested_size = seg->requested_size;
    s->stream = seg->stream;
    s->ctx = seg->ctx;
    s->is_small = (uint8_t)seg->is_small;
    s->is_expandable = (uint8_t)seg->is_expandable;
    s->pool_id = seg->pool_id;
    s->first_block = o->nblocks;
    s->nblocks = seg->nblocks;
    for (size_t i = 0; i < seg->nblocks; i++) {
        const gm_block_info_t *b = &seg->blocks[i];
        gm_hist_block_t *hb = &o->blocks[o->nblocks++];
        hb->address = b->address;
        hb->size = b->size;
        hb->requested_size = b->requested_size;
        hb->ctx = b->ctx;
        hb->state = (uint8_t)b->state;
    }
    return 0;
}

#define COPY_RETRIES 64

/* One registered device. Caller holds the registry lock. */
static int copy_device_unlocked(walk_ctx_t *w, gm_alloc_t *a) {
    gm_hist_copy_t *o = w->out;
    for (int attempt = 0;; attempt++) {
        size_t nseg0 = o->nseg, nblocks0 = o->nblocks;
        gm_ring_lock_take(&w->slot->ring_lock);
        uint64_t seq0 = w->slot->ring.seq;
        gm_ring_lock_drop(&w->slot->ring_lock);
        w->ring_copied = 0;
        int rc = gm_alloc_walk(a, walk_cb, w);
        if (rc)
            return rc;
        if (w->ring_copied)
            return GM_OK;
        /* No segment, so the ring was not copied under the walk's lock:
         * accept the copy only if no event happened since before the walk. */
        gm_ring_lock_take(&w->slot->ring_lock);
        int quiet = w->slot->ring.seq == seq0;
        if (quiet || attempt >= COPY_RETRIES)
            rc = copy_ring_unlocked(w);
        gm_ring_lock_drop(&w->slot->ring_lock);
        if (rc || quiet || attempt >= COPY_RETRIES)
            return rc;
        o->nseg = nseg0;
        o->nblocks = nblocks0;
    }
}

static int by_device_address(const void *x, const void *y) {
    const gm_hist_segment_t *a = x, *b = y;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    return a->address < b->address ? -1 : a->address > b->address;
}

int gm_hist_copy(gm_hist_copy_t *out) {
    memset(out, 0, sizeof *out);
    ensure_slots();
    walk_ctx_t w;
    memset(&w, 0, sizeof w);
    w.out = out;
    int rc = GM_OK;
    uint64_t active[GM_HIST_MAX_DEVICES] = {0};
    int recorded[GM_HIST_MAX_DEVICES] = {0};
    pthread_mutex_lock(&registry_lock);
    int on = atomic_load(&cfg_enabled) != GM_HIST_OFF;
    for (int d = 0; d < GM_HIST_MAX_DEVICES && rc == GM_OK; d++) {
        slot_t *s = &slots[d];
        w.slot = s;
        w.device = d;
        if (s->owner) {
            size_t first = out->nseg;
            rc = copy_device_unlocked(&w, s->owner->alloc);
            for (size_t i = first; i < out->nseg; i++)
                active[d] += out->segs[i].active_size;
            recorded[d] = 1;
            if (!out->has_settings) {
                gm_alloc_get_settings(s->owner->alloc, &out->settings);
                out->has_settings = 1;
            }
        } else {
            gm_ring_lock_take(&s->ring_lock);
            rc = copy_ring_unlocked(&w);
            gm_ring_lock_drop(&s->ring_lock);
        }
        if (s->owner || out->nev[d])
            out->ndev = d + 1;
    }
    /* The marker goes in after the copy, so a snapshot never holds its own
     * marker (torch's order). */
    if (rc == GM_OK && on)
        for (int d = 0; d < GM_HIST_MAX_DEVICES; d++)
            if (recorded[d] && !(atomic_load(&cfg_skip_mask) & (1u << GM_ACT_SNAPSHOT)))
                push_event(&slots[d], GM_ACT_SNAPSHOT, 0, active[d], 0, 0, 0);
    pthread_mutex_unlock(&registry_lock);
    if (rc) {
        gm_hist_copy_free(out);
        return rc;
    }
    if (out->nseg > 1)
        qsort(out->segs, out->nseg, sizeof *out->segs, by_device_address);
    return GM_OK;
}

void gm_hist_copy_free(gm_hist_copy_t *c) {
    free(c->segs);
    free(c->blocks);
    for (int d = 0; d < GM_HIST_MAX_DEVICES; d++)
        free(c->ev[d]);
    memset(c, 0, sizeof *c);
}

uint64_t gm_hist_seq(int device) {
    if (device < 0 || device >= GM_HIST_MAX_DEVICES)
        return 0;
    ensure_slots();
    gm_ring_lock_take(&slots[device].ring_lock);
    uint64_t n = slots[device].ring.seq;
    gm_ring_lock_drop(&slots[device].ring_lock);
    return n;
}

size_t gm_hist_ring_bytes(void) {
    ensure_slots();
    size_t b = 0;
    for (int d = 0; d < GM_HIST_MAX_DEVICES; d++) {
        gm_ring_lock_take(&slots[d].ring_lock);
        b += gm_ring_bytes(&slots[d].ring);
        gm_ring_lock_drop(&slots[d].ring_lock);
    }
    return b;
}
