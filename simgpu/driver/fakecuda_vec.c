/*
 * fakecuda_vec.c - the sorted vector of (key, value) pairs every table of
 * the fake driver uses (allocations, streams, events, modules, graphs, ...).
 *
 * Invariants: keys are strictly increasing; the caller holds fc.mu for a
 * vector inside fc.
 */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* sorted vector                                                        */

size_t fc_vec_lower(const fc_vec_t *vec, uint64_t key)
{
    size_t lo = 0, hi = vec->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (vec->v[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void *fc_vec_find(const fc_vec_t *vec, uint64_t key)
{
    size_t i = fc_vec_lower(vec, key);
    return (i < vec->n && vec->v[i].key == key) ? vec->v[i].val : NULL;
}

int fc_vec_insert(fc_vec_t *vec, uint64_t key, void *val)
{
    if (vec->n == vec->cap) {
        size_t cap = vec->cap ? vec->cap * 2 : 64;
        fc_kv_t *v = realloc(vec->v, cap * sizeof *v);
        if (!v)
            return -1;
        vec->v = v;
        vec->cap = cap;
    }
    size_t i = fc_vec_lower(vec, key);
    memmove(&vec->v[i + 1], &vec->v[i], (vec->n - i) * sizeof *vec->v);
    vec->v[i].key = key;
    vec->v[i].val = val;
    vec->n++;
    return 0;
}

void fc_vec_remove_at(fc_vec_t *vec, size_t idx)
{
    memmove(&vec->v[idx], &vec->v[idx + 1], (vec->n - idx - 1) * sizeof *vec->v);
    vec->n--;
}

void *fc_vec_remove(fc_vec_t *vec, uint64_t key)
{
    size_t i = fc_vec_lower(vec, key);
    if (i >= vec->n || vec->v[i].key != key)
        return NULL;
    void *val = vec->v[i].val;
    fc_vec_remove_at(vec, i);
    return val;
}
