/*
 * ring.c - the bounded event ring (see ring.h).
 *
 * Layout: logical event i (0 = oldest) lives at physical index
 * (head + i) % count; physical index p lives in chunks[p >> SHIFT]. Until
 * the ring is full, head is 0 and pushes append; once count == max, a push
 * overwrites physical index head and advances it.
 * Invariants: count <= max; nchunks * CHUNK >= count; head < max (and
 * head == 0 whenever count < max); the events held (one per slot, two
 * per folded slot) are a suffix of those pushed since the last clear, at
 * least the newest min(max, pushed) of them.
 * Must not: call Python or take locks (callers hold the ring lock).
 *
 * Note [Folded frees]
 * Rationale: most frees complete at once (no stream still uses the block),
 *   and torch records each as two trace entries, free_requested and
 *   free_completed, of the same block, stream and context: a third of a
 *   cached allocation's events, each a slot written while the allocator
 *   lock is held.
 * Approach: a free_completed whose free_requested is the newest slot,
 *   alone, with the same address, size, stream, context, user metadata and
 *   compile context, is stored in that slot: `folded` holds 1 + the ticks
 *   between the two stamps (24 bits). A copy expands the slot into the two
 *   events torch records, each with its own time, so a snapshot holds what
 *   it would hold without folding. A free that the allocator returns at
 *   once (gm_alloc_free_completes_at_once: the completion is the next
 *   event, under the same lock hold) is stored folded when its request is
 *   recorded, and its completion's own hook call records nothing: one
 *   slot, one ring lock and one clock read for the two events, the
 *   completion stamped with the request's time (they are nanoseconds
 *   apart: the same microsecond in a snapshot unless a microsecond
 *   boundary falls between them). A deferred completion (a stream still
 *   used the block) folds only if nothing was recorded in between, and
 *   then keeps its own time too. Because a slot may hold two events, `max`
 *   bounds slots and events alike: a copy yields only the newest `max`
 *   events, torch's max_entries.
 * Limitations: a completion more than 2^24 - 2 ticks (some milliseconds)
 *   after its request takes a slot of its own, as does every one while
 *   another event lies between them.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ring.h"

#define CHUNK_MASK (GM_RING_CHUNK - 1)

static inline gm_hist_event_t *slot(const gm_ring_t *r, size_t p) {
    return &r->chunks[p >> GM_RING_CHUNK_SHIFT][p & CHUNK_MASK];
}

void gm_ring_init(gm_ring_t *r, size_t max) {
    memset(r, 0, sizeof *r);
    r->max = max ? max : 1;
}

/* Map the pages of a new chunk now, in one call, rather than one page
 * fault at a time as pushes first touch them: a fault costs more than the
 * push that takes it (about 48 pushes write a page). Best effort: kernels
 * before 5.14 lack MADV_POPULATE_WRITE, and then the faults remain. */
static void populate(void *p, size_t len) {
#ifdef MADV_POPULATE_WRITE
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + len) & ~(page - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)len;
#endif
}

/* Storage for physical index p. 0 or -1. */
static int ensure(gm_ring_t *r, size_t p) {
    size_t need = (p >> GM_RING_CHUNK_SHIFT) + 1;
    while (r->nchunks < need) {
        if (r->nchunks == r->cap_chunks) {
            size_t cap = r->cap_chunks ? r->cap_chunks * 2 : 8;
            gm_hist_event_t **c = realloc(r->chunks, cap * sizeof *c);
            if (!c)
                return -1;
            r->chunks = c;
            r->cap_chunks = cap;
        }
        /* The last chunk of a small ring holds only what the bound allows. */
        size_t first = r->nchunks << GM_RING_CHUNK_SHIFT;
        size_t n = r->max - first < GM_RING_CHUNK ? r->max - first : GM_RING_CHUNK;
        gm_hist_event_t *chunk = malloc(n * sizeof *chunk);
        if (!chunk)
            return -1;
        populate(chunk, n * sizeof *chunk);
        r->chunks[r->nchunks++] = chunk;
    }
    return 0;
}

#define FOLD_MAX ((UINT32_C(1) << 24) - 1) /* largest `folded` value: 1 + ticks */

static inline uint32_t folded_get(const gm_hist_event_t *e) {
    return (uint32_t)e->folded[0] | (uint32_t)e->folded[1] << 8 | (uint32_t)e->folded[2] << 16;
}

static inline void folded_set(gm_hist_event_t *e, uint32_t v) {
    e->folded[0] = (uint8_t)v;
    e->folded[1] = (uint8_t)(v >> 8);
    e->folded[2] = (uint8_t)(v >> 16);
}

void gm_ring_push(gm_ring_t *r, const gm_hist_event_t *e) {
    r->seq++;
    if (r->count < r->max) {
        if (ensure(r, r->count)) {
            r->dropped++;
            return;
        }
        *slot(r, r->count) = *e;
        r->count++;
        return;
    }
    *slot(r, r->head) = *e;
    r->head = r->head + 1 == r->max ? 0 : r->head + 1;
}

void gm_ring_push_freed_at_once(gm_ring_t *r, const gm_hist_event_t *e) {
    gm_hist_event_t f = *e;
    folded_set(&f, 1); /* 1 + 0 ticks */
    gm_ring_push(r, &f);
    r->seq++; /* the completion */
}

static gm_hist_event_t *newest(gm_ring_t *r) {
    if (!r->count)
        return NULL;
    size_t p = r->count < r->max ? r->count : r->head;
    return slot(r, (p ? p : r->max) - 1);
}

void gm_ring_push_completed(gm_ring_t *r, const gm_hist_event_t *e) {
    gm_hist_event_t *q = newest(r);
    if (q && q->action == GM_ACT_FREE_REQUESTED && !folded_get(q) && q->addr == e->addr &&
        q->size == e->size && q->stream == e->stream && q->tb == e->tb && q->meta == e->meta &&
        q->compile == e->compile && e->time_us >= q->time_us &&
        e->time_us - q->time_us < FOLD_MAX) {
        folded_set(q, (uint32_t)(e->time_us - q->time_us) + 1);
        r->seq++;
        return;
    }
    gm_ring_push(r, e);
}

/* The held slots, oldest first, a run of adjacent storage at a time:
 * [head, count) then [0, head), each chunk by chunk. */
typedef struct runs {
    const gm_ring_t *r;
    int second; /* in [0, head) */
    size_t p;   /* next physical index */
} runs_t;

static runs_t runs_of(const gm_ring_t *r) { return (runs_t){r, 0, r->head}; }

/* The next run in *e; its length, 0 at the end. */
static size_t next_run(runs_t *it, const gm_hist_event_t **e) {
    for (;;) {
        size_t end = it->second ? it->r->head : it->r->count;
        if (it->p < end) {
            size_t in_chunk = GM_RING_CHUNK - (it->p & CHUNK_MASK);
            size_t n = end - it->p < in_chunk ? end - it->p : in_chunk;
            *e = slot(it->r, it->p);
            it->p += n;
            return n;
        }
        if (it->second)
            return 0;
        it->second = 1;
        it->p = 0;
    }
}

/* Events held: one per slot, two per folded slot (counted here, not on
 * each push: a push that overwrites a slot would have to read it first). */
static size_t held(const gm_ring_t *r) {
    size_t n = r->count, m;
    const gm_hist_event_t *e;
    for (runs_t it = runs_of(r); (m = next_run(&it, &e)) != 0;)
        for (size_t i = 0; i < m; i++)
            n += folded_get(&e[i]) != 0;
    return n;
}

size_t gm_ring_len(const gm_ring_t *r) {
    size_t n = held(r);
    return n < r->max ? n : r->max;
}

static void free_chunks(gm_ring_t *r) {
    for (size_t i = 0; i < r->nchunks; i++)
        free(r->chunks[i]);
    free(r->chunks);
    r->chunks = NULL;
    r->nchunks = r->cap_chunks = 0;
}

void gm_ring_clear(gm_ring_t *r) {
    free_chunks(r);
    r->count = 0;
    r->head = 0;
}

/* Append the events of slot e to out, skipping the first *skip of them. */
static gm_hist_event_t *expand(const gm_hist_event_t *e, gm_hist_event_t *out, size_t *skip) {
    uint32_t f = folded_get(e);
    if (*skip)
        --*skip;
    else {
        *out = *e;
        folded_set(out++, 0);
    }
    if (!f)
        return out;
    if (*skip) {
        --*skip;
        return out;
    }
    *out = *e;
    folded_set(out, 0);
    out->action = GM_ACT_FREE_COMPLETED;
    out->time_us += f - 1;
    return out + 1;
}

void gm_ring_copy(const gm_ring_t *r, gm_hist_event_t *out) {
    size_t n_held = held(r);
    size_t skip = n_held - (n_held < r->max ? n_held : r->max);
    size_t n;
    const gm_hist_event_t *e;
    for (runs_t it = runs_of(r); (n = next_run(&it, &e)) != 0;)
        for (size_t i = 0; i < n; i++)
            out = expand(&e[i], out, &skip);
}

int gm_ring_set_max(gm_ring_t *r, size_t max) {
    if (max == 0)
        max = 1;
    if (max == r->max)
        return 0;
    /* Rebuild: keep the newest min(len, max) events, oldest first, one a
     * slot (a grown bound must not bring back events beyond the old one). */
    size_t len = gm_ring_len(r);
    size_t keep = len < max ? len : max;
    gm_hist_event_t *tmp = NULL;
    if (len) {
        tmp = malloc(len * sizeof *tmp);
        if (!tmp)
            return GM_ENOMEM;
        gm_ring_copy(r, tmp);
    }
    gm_ring_t fresh;
    gm_ring_init(&fresh, max);
    fresh.seq = r->seq;
    fresh.dropped = r->dropped;
    for (size_t i = len - keep; i < len; i++) {
        if (ensure(&fresh, fresh.count)) {
            free_chunks(&fresh);
            free(tmp);
            return GM_ENOMEM;
        }
        *slot(&fresh, fresh.count++) = tmp[i];
    }
    free(tmp);
    free_chunks(r);
    *r = fresh;
    return 0;
}

size_t gm_ring_bytes(const gm_ring_t *r) {
    size_t b = r->cap_chunks * sizeof *r->chunks;
    for (size_t i = 0; i < r->nchunks; i++) {
        size_t first = i << GM_RING_CHUNK_SHIFT;
        size_t n = r->max - first < GM_RING_CHUNK ? r->max - first : GM_RING_CHUNK;
        b += n * sizeof(gm_hist_event_t);
    }
    return b;
}
