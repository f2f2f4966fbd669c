/*
 * events.c - cross-stream reuse: record_stream uses, end-of-life events and
 * their per-stream queues, and the pool of reusable event handles.
 *
 * A block used on other streams (record_stream) is not reusable when it is
 * freed: one event is recorded on each of those streams, and the block
 * returns to its pool only when all of them have completed. Queues are per
 * stream and FIFO, so one slow stream does not hold up the others; polling
 * stops at a stream's first incomplete event, as work on a stream completes
 * in order. Event handles come from the backend, created once and reused.
 * While a private pool is allocating (a CUDA graph capture may be underway)
 * events must be neither recorded nor queried: a freed block with stream
 * uses waits in the deferred list, and its events are recorded at the next
 * poll or wait after the last pool stopped allocating (torch's
 * insert_events_deferred_until_no_capture; Note [Private pools]).
 * Everything here runs under the allocator lock.
 */
#include "events.h"

#include <stdlib.h>
#include <string.h>

#include "devcall.h"
#include "pool.h"
#include "stats.h"

int gm_events_record_use_unlocked(gm_alloc_t *a, gm_block_t *b, uintptr_t stream) {
    (void)a;
    for (uint32_t i = 0; i < b->n_uses; i++)
        if (b->uses[i] == stream)
            return GM_OK;
    if (b->n_uses == b->cap_uses) {
        uint32_t cap = b->cap_uses * 2;
        uintptr_t *u = malloc(cap * sizeof *u);
        if (!u)
            return GM_ENOMEM;
        memcpy(u, b->uses, b->n_uses * sizeof *u);
        if (b->uses != b->uses_inline)
            free(b->uses);
        b->uses = u;
        b->cap_uses = cap;
    }
    b->uses[b->n_uses++] = stream;
    return GM_OK;
}

static gm_event_queue_t *queue_for(gm_alloc_t *a, uintptr_t stream) {
    for (size_t i = 0; i < a->events.n_queues; i++)
        if (a->events.queues[i].stream == stream)
            return &a->events.queues[i];
    if (a->events.n_queues == a->events.cap_queues) {
        size_t cap = a->events.cap_queues ? a->events.cap_queues * 2 : 4;
        gm_event_queue_t *q = realloc(a->events.queues, cap * sizeof *q);
        if (!q)
            return NULL;
        a->events.queues = q;
        a->events.cap_queues = cap;
    }
    gm_event_queue_t *q = &a->events.queues[a->events.n_queues++];
    memset(q, 0, sizeof *q);
    q->stream = stream;
    return q;
}

static int queue_push(gm_event_queue_t *q, uintptr_t event, gm_block_t *b) {
    if (q->len == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        gm_event_item_t *items = malloc(cap * sizeof *items);
        if (!items)
            return GM_ENOMEM;
        for (size_t i = 0; i < q->len; i++)
            items[i] = q->items[(q->head + i) % q->cap];
        free(q->items);
        q->items = items;
        q->cap = cap;
        q->head = 0;
    }
    q->items[(q->head + q->len) % q->cap].event = event;
    q->items[(q->head + q->len) % q->cap].block = b;
    q->len++;
    return GM_OK;
}

static int event_get(gm_alloc_t *a, uintptr_t *ev) {
    if (a->events.n_pool) {
        *ev = a->events.pool[--a->events.n_pool];
        return GM_OK;
    }
    return gm_dev_event_create(a, ev);
}

static void event_put(gm_alloc_t *a, uintptr_t ev) {
    if (a->events.n_pool == a->events.cap_pool) {
        size_t cap = a->events.cap_pool ? a->events.cap_pool * 2 : 16;
        uintptr_t *p = realloc(a->events.pool, cap * sizeof *p);
        if (!p) {
            gm_dev_event_destroy(a, ev);
            return;
        }
        a->events.pool = p;
        a->events.cap_pool = cap;
    }
    a->events.pool[a->events.n_pool++] = ev;
}

/* Record an end-of-life event for one stream use, or, if no event can be
 * recorded or tracked, wait for the stream instead: either way the block is
 * never reused while that stream may still touch it. */
static int insert_event(gm_alloc_t *a, gm_block_t *b, uintptr_t stream) {
    uintptr_t ev = 0;
    gm_event_queue_t *q = queue_for(a, stream);
    int rc = q ? event_get(a, &ev) : GM_ENOMEM;
    if (rc == GM_OK) {
        rc = gm_dev_event_record(a, ev, stream);
        if (rc == GM_OK && (rc = queue_push(q, ev, b)) == GM_OK) {
            b->event_count++;
            return GM_OK;
        }
        event_put(a, ev);
    }
    return gm_dev_stream_synchronize(a, stream);
}

/* Move the block's stream uses into recorded events. A use that could be
 * neither recorded nor waited for leaves the block pending forever (its
 * memory is lost, never reused unsafely) and the error is returned. */
int gm_events_insert_unlocked(gm_alloc_t *a, gm_block_t *b) {
    int first = GM_OK;
    for (uint32_t i = 0; i < b->n_uses; i++) {
        int rc = insert_event(a, b, b->uses[i]);
        if (rc != GM_OK) {
            if (first == GM_OK)
                first = rc;
            b->event_count++; /* never completes: see above */
            a->events.n_stuck++;
        }
    }
    b->n_uses = 0;
    return first;
}

int gm_events_defer_unlocked(gm_alloc_t *a, gm_block_t *b) {
    gm_events_t *e = &a->events;
    if (e->n_deferred == e->cap_deferred) {
        size_t cap = e->cap_deferred ? e->cap_deferred * 2 : 8;
        gm_block_t **v = realloc(e->deferred, cap * sizeof *v);
        if (!v)
            return GM_ENOMEM;
        e->deferred = v;
        e->cap_deferred = cap;
    }
    e->deferred[e->n_deferred++] = b;
    return GM_OK;
}

/* Record the events of every deferred block; one whose uses all ended
 * without an event (the stream was waited for) returns to its pool. */
static int insert_deferred(gm_alloc_t *a, uint32_t ctx) {
    int first = GM_OK;
    for (size_t i = 0; i < a->events.n_deferred; i++) {
        gm_block_t *b = a->events.deferred[i];
        int rc = gm_events_insert_unlocked(a, b);
        if (rc != GM_OK && first == GM_OK)
            first = rc;
        if (gm_block_is_free(b))
            gm_pool_return_unlocked(a, b, ctx);
    }
    a->events.n_deferred = 0;
    return first;
}

static void event_done(gm_alloc_t *a, gm_event_item_t *it, uint32_t ctx) {
    event_put(a, it->event);
    gm_block_t *b = it->block;
    if (--b->event_count == 0)
        gm_pool_return_unlocked(a, b, ctx);
}

/* Hand back, per stream in FIFO order, every block whose events completed:
 * wait=0 asks each event (gm_dev_event_query) and stops a stream at the
 * first one still pending; wait=1 waits for each (gm_dev_event_synchronize)
 * and so empties every queue. The one loop behind poll and sync_all. */
static int drain(gm_alloc_t *a, uint32_t ctx, int wait) {
    int rc0 = a->events.n_deferred ? insert_deferred(a, ctx) : GM_OK;
    if (rc0)
        return rc0;
    for (size_t i = 0; i < a->events.n_queues; i++) {
        gm_event_queue_t *q = &a->events.queues[i];
        while (q->len) {
            gm_event_item_t it = q->items[q->head];
            int rc = wait ? gm_dev_event_synchronize(a, it.event)
                          : gm_dev_event_query(a, it.event);
            if (rc == GM_ENOTREADY && !wait)
                break;
            if (rc)
                return rc;
            q->head = (q->head + 1) % q->cap;
            q->len--;
            event_done(a, &it, ctx);
        }
    }
    return GM_OK;
}

int gm_events_poll_unlocked(gm_alloc_t *a, uint32_t ctx) { return drain(a, ctx, 0); }

int gm_events_sync_all_unlocked(gm_alloc_t *a, uint32_t ctx) {
    gm_stats_sync_all_streams(a);
    return drain(a, ctx, 1);
}

void gm_events_destroy_unlocked(gm_alloc_t *a) {
    for (size_t i = 0; i < a->events.n_queues; i++) {
        gm_event_queue_t *q = &a->events.queues[i];
        for (size_t k = 0; k < q->len; k++) {
            gm_event_item_t *it = &q->items[(q->head + k) % q->cap];
            gm_dev_event_destroy(a, it->event);
            it->block->event_count--;
        }
        free(q->items);
    }
    free(a->events.queues);
    a->events.queues = NULL;
    a->events.n_queues = a->events.cap_queues = 0;
    for (size_t i = 0; i < a->events.n_pool; i++)
        gm_dev_event_destroy(a, a->events.pool[i]);
    free(a->events.pool);
    a->events.pool = NULL;
    free(a->events.deferred);
    a->events.deferred = NULL;
    a->events.n_deferred = a->events.cap_deferred = 0;
    a->events.n_pool = a->events.cap_pool = 0;
}
