/*
 * trace.c - trace action names and the hook's installation (trace.h).
 */
#include "trace.h"

static const char *const action_names[GM_ACT_COUNT] = {
    "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",  "snapshot",       "oom",           "annotate"};

const char *gm_action_name(int action) {
    if (action < 0 || action >= GM_ACT_COUNT)
        return "unknown";
    return action_names[action];
}

int gm_alloc_free_completes_at_once(const gm_alloc_t *a) { return a->trace_free_at_once; }

void gm_alloc_set_trace_hook(gm_alloc_t *a, gm_trace_fn fn, void *arg) {
    gm_lock(a);
    a->trace_fn = fn;
    a->trace_arg = arg;
    gm_unlock(a);
}
