/*
 * sizes.h - size classes, torch's policy: how a request is rounded, which
 * pool serves it, how large a new segment for it is, and what is
 * "oversize" under max_split_size. The one definition of each, inline for
 * the malloc fast path; sizes.c exports the first three (gm_alloc.h:
 * gm_size_round, gm_size_is_small, gm_size_segment) for tools that must
 * size blocks as the allocator does.
 *
 * Rounding is to 512-byte multiples, or, where roundup_power2_divisions
 * sets N divisions for the power-of-two interval of the size (intervals
 * start at 1 MiB; the last covers 32 GiB and up), to the next of N equal
 * steps between the surrounding powers of two, as torch's round_size does.
 */
#ifndef GM_CORE_SIZES_H
#define GM_CORE_SIZES_H

#include "gm_alloc.h"

static inline int gm_sizes_log2_floor(size_t x) {
    return 63 - __builtin_clzll((unsigned long long)x);
}

static inline size_t gm_sizes_round(const gm_settings_t *s, size_t size) {
    if (size < GM_MIN_BLOCK_SIZE)
        return GM_MIN_BLOCK_SIZE;
    int idx = gm_sizes_log2_floor(size) - 20;
    if (idx < 0)
        idx = 0;
    if (idx >= GM_ROUNDUP_INTERVALS)
        idx = GM_ROUNDUP_INTERVALS - 1;
    size_t div = s->roundup_power2_divisions[idx];
    if (div > 1 && size > GM_MIN_BLOCK_SIZE * div) {
        if ((size & (size - 1)) == 0)
            return size;
        size_t floor = (size_t)1 << gm_sizes_log2_floor(size);
        size_t step = floor >> gm_sizes_log2_floor(div);
        if (step == 0)
            return floor << 1;
        size_t rf = size & ~(step - 1);
        return rf == size ? size : rf + step;
    }
    return GM_MIN_BLOCK_SIZE * ((size + GM_MIN_BLOCK_SIZE - 1) / GM_MIN_BLOCK_SIZE);
}

static inline int gm_sizes_is_small(size_t rounded) { return rounded <= GM_SMALL_SIZE; }

static inline size_t gm_sizes_segment(size_t rounded) {
    if (rounded <= GM_SMALL_SIZE)
        return GM_SMALL_BUFFER;
    if (rounded < GM_MIN_LARGE_ALLOC)
        return GM_LARGE_BUFFER;
    return GM_ROUND_LARGE * ((rounded + GM_ROUND_LARGE - 1) / GM_ROUND_LARGE);
}

/* A block or segment this large is "oversize": never split, served only to
 * requests close to its size, and counted in oversize_* stats. */
static inline int gm_size_is_oversize(const gm_settings_t *s, size_t size) {
    return size >= s->max_split_size;
}

/* May a free oversize block of `block` bytes serve a `request` (both
 * rounded)? Only a request that is itself oversize, and within 20 MiB. */
static inline int gm_size_oversize_fits(const gm_settings_t *s, size_t request, size_t block) {
    if (!gm_size_is_oversize(s, request))
        return !gm_size_is_oversize(s, block);
    return block < request + GM_LARGE_BUFFER;
}

#endif /* GM_CORE_SIZES_H */
