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
int gm_ptrmap_grow_for(gm_ptrmap_t *m, size_t n);

/* Make room for n more keys: after it succeeds, the next n puts of new
 * keys cannot fail. 0 or GM_ENOMEM (inline: a check on the fast path). */
static inline int gm_ptrmap_reserve(gm_ptrmap_t *m, size_t n) {
    return (m->count + n) * 2 <= m->mask + 1 ? 0 : gm_ptrmap_grow_for(m, n);
}
/* Insert or overwrite. 0, GM_ENOMEM, or GM_EINVAL for key 0. */
int gm_ptrmap_put(gm_ptrmap_t *m, uintptr_t key, uintptr_t value);
/* The home slot of a key. Addresses are 512-byte aligned in practice, so
 * the hash multiplies by a 64-bit odd constant and takes high bits, which
 * spreads aligned keys well. */
static inline size_t gm_ptrmap_slot_of(const gm_ptrmap_t *m, uintptr_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 29) & m->mask;
}

/* 1 and *value if found, else 0 (inline: every free looks its block up). */
static inline int gm_ptrmap_get(const gm_ptrmap_t *m, uintptr_t key, uintptr_t *value) {
    size_t i = gm_ptrmap_slot_of(m, key);
    for (;;) {
        uintptr_t k = m->slots[i].key;
        if (!k) /* checked first: key 0 is the empty slot, never an entry */
            return 0;
        if (k == key) {
            *value = m->slots[i].value;
            return 1;
        }
        i = (i + 1) & m->mask;
    }
}
/* 1 and *value if removed, else 0. */
int gm_ptrmap_del(gm_ptrmap_t *m, uintptr_t key, uintptr_t *value);

#endif /* GM_BASE_PTRMAP_H */
