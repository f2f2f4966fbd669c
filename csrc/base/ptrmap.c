/*
 * ptrmap.c - address -> pointer hash map (see ptrmap.h).
 *
 * Load factor is kept at or below 1/2; the hash and the lookup are inline in
 * ptrmap.h.
 */
#include "ptrmap.h"

#include <stdlib.h>

#include "errors.h"

int gm_ptrmap_init(gm_ptrmap_t *m, size_t initial_capacity) {
    size_t cap = 16;
    while (cap < initial_capacity * 2)
        cap <<= 1;
    m->slots = calloc(cap, sizeof(*m->slots));
    if (!m->slots)
        return GM_ENOMEM;
    m->mask = cap - 1;
    m->count = 0;
    return GM_OK;
}

void gm_ptrmap_free(gm_ptrmap_t *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->count = 0;
}

static int grow(gm_ptrmap_t *m, size_t cap) {
    size_t old_cap = m->mask + 1;
    gm_ptrmap_slot_t *old = m->slots, *slots = calloc(cap, sizeof(*slots));
    if (!slots)
        return GM_ENOMEM;
    m->slots = slots;
    m->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].key)
            continue;
        size_t j = gm_ptrmap_slot_of(m, old[i].key);
        while (slots[j].key)
            j = (j + 1) & m->mask;
        slots[j] = old[i];
    }
    free(old);
    return GM_OK;
}

int gm_ptrmap_grow_for(gm_ptrmap_t *m, size_t n) {
    size_t cap = m->mask + 1;
    while ((m->count + n) * 2 > cap)
        cap <<= 1;
    return cap == m->mask + 1 ? GM_OK : grow(m, cap);
}

int gm_ptrmap_put(gm_ptrmap_t *m, uintptr_t key, uintptr_t value) {
    if (key == 0)
        return GM_EINVAL;
    int rc = gm_ptrmap_reserve(m, 1);
    if (rc)
        return rc;
    size_t i = gm_ptrmap_slot_of(m, key);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    if (!m->slots[i].key)
        m->count++;
    m->slots[i].key = key;
    m->slots[i].value = value;
    return GM_OK;
}

int gm_ptrmap_del(gm_ptrmap_t *m, uintptr_t key, uintptr_t *value) {
    size_t i = gm_ptrmap_slot_of(m, key);
    for (;;) {
        uintptr_t k = m->slots[i].key;
        if (!k)
            return 0;
        if (k == key)
            break;
        i = (i + 1) & m->mask;
    }
    if (value)
        *value = m->slots[i].value;
    /* Backward-shift: move later entries of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t home = gm_ptrmap_slot_of(m, m->slots[j].key);
        /* Entry j may move to hole if home is not in (hole, j] cyclically. */
        int movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].value = 0;
    m->count--;
    return 1;
}
