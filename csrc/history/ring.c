/*
 * ring.c - the bounded event ring (see ring.h).
 *
 * Layout: logical event i (0 = oldest) lives at physical index
 * (head + i) % count; physical index p lives in chunks[p >> SHIFT]. Until
 * the ring is full, head is 0 and pushes append; once count == max, a push
 * overwrites physical index head and advances it.
 * Invariants: count <= max; nchunks * CHUNK >= count; head < max (and
 * head == 0 whenever count < max).
 * Must not: call Python or take locks (callers hold the ring lock).
 */
#include <stdlib.h>
#include <string.h>

#include "ring.h"

#define CHUNK_MASK (GM_RING_CHUNK - 1)

static inline gm_hist_event_t *slot(const gm_ring_t *r, size_t p) {
    return &r->chunks[p >> GM_RING_CHUNK_SHIFT][p & CHUNK_MASK];
}

void gm_ring_init(gm_ring_t *r, size_t max) {
    memset(r, 0, sizeof *r);
    r->max = max ? max : 1;
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
        r->chunks[r->nchunks++] = chunk;
    }
    return 0;
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

void gm_ring_copy(const gm_ring_t *r, gm_hist_event_t *out) {
    /* Two runs: [head, count) then [0, head), each chunk by chunk. */
    size_t runs[2][2] = {{r->head, r->count}, {0, r->head}};
    for (int k = 0; k < 2; k++)
        for (size_t p = runs[k][0]; p < runs[k][1];) {
            size_t in_chunk = GM_RING_CHUNK - (p & CHUNK_MASK);
            size_t n = runs[k][1] - p < in_chunk ? runs[k][1] - p : in_chunk;
            memcpy(out, slot(r, p), n * sizeof *out);
            out += n;
            p += n;
        }
}

int gm_ring_set_max(gm_ring_t *r, size_t max) {
    if (max == 0)
        max = 1;
    if (max == r->max)
        return 0;
    /* Rebuild: keep the newest min(count, max) events, oldest first. */
    size_t keep = r->count < max ? r->count : max;
    gm_hist_event_t *tmp = NULL;
    if (r->count) {
        tmp = malloc(r->count * sizeof *tmp);
        if (!tmp)
            return GM_ENOMEM;
        gm_ring_copy(r, tmp);
    }
    gm_ring_t fresh;
    gm_ring_init(&fresh, max);
    fresh.seq = r->seq;
    fresh.dropped = r->dropped;
    for (size_t i = r->count - keep; i < r->count; i++) {
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
