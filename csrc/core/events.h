/*
 * events.h - cross-stream reuse: streams recorded on a block
 * (record_stream), the events that end those uses when the block is freed,
 * and their per-stream queues.
 */
#ifndef GM_CORE_EVENTS_H
#define GM_CORE_EVENTS_H

#include "types.h"

/* b (allocated) is also used on `stream`. */
int gm_events_record_use_unlocked(gm_alloc_t *a, gm_block_t *b, uintptr_t stream);
/* b was just freed: turn its stream uses into recorded events. */
int gm_events_insert_unlocked(gm_alloc_t *a, gm_block_t *b);
/* b was just freed while a private pool is allocating: its stream uses
 * become events only once no pool is (Note [Private pools]). */
int gm_events_defer_unlocked(gm_alloc_t *a, gm_block_t *b);
/* Record the deferred blocks' events, then poll the queues; blocks whose
 * last event completed return to their pool. Never while a private pool
 * is allocating. (Inline: every malloc polls, and usually there is nothing
 * queued or deferred.) */
int gm_events_poll_unlocked(gm_alloc_t *a, uint32_t ctx);
static inline int gm_events_process_unlocked(gm_alloc_t *a, uint32_t ctx) {
    return (a->events.n_queues | a->events.n_deferred) ? gm_events_poll_unlocked(a, ctx) : GM_OK;
}
/* Wait for every queued event, deferred ones first (empty_cache, the
 * out-of-memory path); never while a private pool is allocating. */
int gm_events_sync_all_unlocked(gm_alloc_t *a, uint32_t ctx);
/* Destroy every event; blocks still waiting keep their event counts at 0. */
void gm_events_destroy_unlocked(gm_alloc_t *a);

#endif /* GM_CORE_EVENTS_H */
