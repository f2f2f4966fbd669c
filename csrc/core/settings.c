/*
 * settings.c - allocator settings, error texts, action names and size
 * formatting: small pure functions with no allocator state.
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

const char *gm_strerror(int code) {
    switch (code) {
    case GM_OK: return "success";
    case GM_EOOM: return "out of memory";
    case GM_EINVAL: return "invalid argument";
    case GM_ENOTFOUND: return "pointer was not allocated by this allocator";
    case GM_EDOUBLEFREE: return "pointer was already freed";
    case GM_ENOTREADY: return "event not ready";
    case GM_ENOTSUP: return "not supported by this device";
    case GM_EDEVICE: return "device error";
    case GM_ENOMEM: return "out of host memory";
    case GM_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}

static const char *const action_names[GM_ACT_COUNT] = {
    "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",  "snapshot",       "oom"};

const char *gm_action_name(int action) {
    if (action < 0 || action >= GM_ACT_COUNT)
        return "unknown";
    return action_names[action];
}

void gm_format_size(size_t bytes, char *buf, size_t buflen) {
    if (bytes <= 1024)
        snprintf(buf, buflen, "%zu bytes", bytes);
    else if (bytes <= ((size_t)1 << 20))
        snprintf(buf, buflen, "%.2f KiB", (double)bytes / 1024.0);
    else if (bytes <= ((size_t)1 << 30))
        snprintf(buf, buflen, "%.2f MiB", (double)bytes / 1048576.0);
    else
        snprintf(buf, buflen, "%.2f GiB", (double)bytes / 1073741824.0);
}
