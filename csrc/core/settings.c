/*
 * settings.c - allocator settings: defaults and validation. Pure functions
 * with no allocator state (alloc.c applies settings to an allocator).
 */
#include <stdint.h>
#include <stdio.h>

#include "gm_alloc.h"

void gm_settings_default(gm_settings_t *s) {
    s->expandable_segments = 0;
    s->max_split_size = SIZE_MAX;
    s->garbage_collection_threshold = 0.0;
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
        s->roundup_power2_divisions[i] = 0;
}

static int fail(char *msg, size_t msglen, const char *text) {
    if (msg && msglen)
        snprintf(msg, msglen, "%s", text);
    return GM_EINVAL;
}

int gm_settings_validate(const gm_settings_t *s, char *msg, size_t msglen) {
    if (s->expandable_segments != 0 && s->expandable_segments != 1)
        return fail(msg, msglen, "expandable_segments must be 0 or 1");
    if (s->max_split_size != SIZE_MAX && s->max_split_size < GM_LARGE_BUFFER)
        return fail(msg, msglen, "max_split_size must be at least 20 MiB (or unlimited)");
    if (!(s->garbage_collection_threshold >= 0.0 && s->garbage_collection_threshold < 1.0))
        return fail(msg, msglen, "garbage_collection_threshold must be in [0, 1)");
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) {
        uint32_t d = s->roundup_power2_divisions[i];
        if (d > 1 && (d & (d - 1)))
            return fail(msg, msglen, "roundup_power2_divisions must be powers of two");
    }
    return GM_OK;
}
