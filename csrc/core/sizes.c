/*
 * sizes.c - the size policy of sizes.h, exported for tools (gm_alloc.h).
 * Pure functions: no allocator state, no locks.
 */
#include "sizes.h"

size_t gm_size_round(const gm_settings_t *s, size_t size) { return gm_sizes_round(s, size); }

int gm_size_is_small(size_t rounded) { return gm_sizes_is_small(rounded); }

size_t gm_size_segment(size_t rounded) { return gm_sizes_segment(rounded); }
