/*
 * ring.h - a bounded ring of gm_hist_event_t, grown in fixed chunks.
 *
 * Holds at most `max` events; once full, each push overwrites the oldest
 * (torch's alloc_trace behaviour). Storage grows one chunk at a time up to
 * the bound, so max_entries = sys.maxsize costs only what is recorded, and a
 * push never moves recorded events. Not thread-safe: the owner (recorder.c)
 * guards each ring with its ring lock. Plain C only: a push may run under an
 * allocator lock.
 *
 * A slot holds one event, or two: a free_requested and the free_completed
 * that followed it at once (Note [Folded frees] in ring.c). `max` bounds
 * the events a copy yields, as torch's max_entries does; a ring holds at
 * most `max` slots.
 */
#ifndef GM_HISTORY_RING_H
#define GM_HISTORY_RING_H

#include <stddef.h>
#include <stdint.h>

#include "hist.h"

#define GM_RING_CHUNK_SHIFT 12
#define GM_RING_CHUNK ((size_t)1 << GM_RING_CHUNK_SHIFT) /* events per chunk */

typedef struct gm_ring {
    gm_hist_event_t **chunks;
    size_t nchunks, cap_chunks;
    size_t max;       /* bound on count, >= 1 */
    size_t count;     /* slots held */
    size_t head;      /* physical index of the oldest event (0 until full) */
    uint64_t seq;     /* events pushed since creation; never reset */
    uint64_t dropped; /* pushes lost to host memory exhaustion */
} gm_ring_t;

void gm_ring_init(gm_ring_t *r, size_t max);
void gm_ring_push(gm_ring_t *r, const gm_hist_event_t *e);
/* Push a free_completed: into the newest slot when that holds its
 * free_requested alone (Note [Folded frees]), else as gm_ring_push. */
void gm_ring_push_completed(gm_ring_t *r, const gm_hist_event_t *e);
/* Push a free_requested together with its free_completed, which follows
 * it at once: one slot, both events stamped with e's time. */
void gm_ring_push_freed_at_once(gm_ring_t *r, const gm_hist_event_t *e);
/* Events a copy yields: the newest min(max, events held). O(count). */
size_t gm_ring_len(const gm_ring_t *r);
/* Drop every event and return the storage. */
void gm_ring_clear(gm_ring_t *r);
/* Change the bound, keeping the newest events. 0 or GM_ENOMEM (then the
 * ring is unchanged). */
int gm_ring_set_max(gm_ring_t *r, size_t max);
/* Copy the newest gm_ring_len(r) events, oldest first, into out, folded
 * slots expanded into their two events. */
void gm_ring_copy(const gm_ring_t *r, gm_hist_event_t *out);
size_t gm_ring_bytes(const gm_ring_t *r);

#endif /* GM_HISTORY_RING_H */
