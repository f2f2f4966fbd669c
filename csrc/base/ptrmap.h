/*
 * ptrmap.h - open-addressing hash map from a non-zero address to a pointer.
 *
 * Used for the allocator's live blocks (address -> block) and by the trace
 * replayer (trace address -> device address). Linear probing with
 * backward-shift deletion, so there are no tombstones and lookups stay
 * short however many deletions happen. Key 0 is reserved as "empty": it is
 * never stored, and looking it up or deleting it finds nothing.
 * Not thread-safe: the owner's lock protects it.
 */
#ifndef GM_BASE_PTRMAP_H
#define GM_BASE_PTRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct gm_ptrmap_slot {
    uintptr_t key;
    uintptr_t value;
} gm_ptrmap_slot_t;

typedef struct gm_ptrmap {
    gm_ptrmap_slot_t *slots;
    size_t mask; /* capacity - 1 (capacity is a power of two) */
    size_t count;
} gm_ptrmap_t;

int gm_ptrmap_init(gm_ptrmap_t *m, size_t initial_capacity); /* 0 or GM_ENOMEM */
void gm_ptrmap_free(gm_ptrmap_t *m);
/* Make room for n more keys: after it succeeds, the next n puts of new
 * keys cannot fail. 0 or GM_ENOMEM. */
int gm_ptrmap_reserve(gm_ptrmap_t *m, size_t n);
/* Insert or overwrite. 0, GM_ENOMEM, or GM_EINVAL for key 0. */
int gm_ptrmap_put(gm_ptrmap_t *m, uintptr_t key, uintptr_t value);
/* 1 and *value if found, else 0. */
int gm_ptrmap_get(const gm_ptrmap_t *m, uintptr_t key, uintptr_t *value);
/* 1 and *value if removed, else 0. */
int gm_ptrmap_del(gm_ptrmap_t *m, uintptr_t key, uintptr_t *value);

#endif /* GM_BASE_PTRMAP_H */
