/*
 * fakecuda_capture_rules.c - what stream capture means for the other calls
 * of the fake CUDA driver: work on a capturing stream becomes a node, and
 * the calls a capture forbids fail and invalidate it (Note [Stream capture]
 * in fakecuda_capture.c, which keeps the capture state and the entry points).
 *
 * Invariants: a node is added only to an active (not invalidated) capture,
 * depending on its stream's dependency set, which then becomes that node; a
 * call refused here has changed nothing but the captures it invalidated.
 *
 * Must not: run captured work, or call an exported cu* function (the lock
 * is not recursive).
 */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define KEY_LEGACY 1ull /* fakecuda_sync.c's key of the legacy stream */

CUresult fc_cap_work_unlocked(struct CUctx_st *sctx, uint64_t key, const struct CUgraphNode_st *proto,
                              int *captured)
{
    *captured = 0;
    if (key == KEY_LEGACY)
        return fc_cap_implicit_unlocked(sctx) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    fc_capstream_t *m = fc_cap_member_unlocked(key);
    if (!m || !proto)
        return CUDA_SUCCESS;
    if (m->cap->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    struct CUgraphNode_st *node = fc_graph_add_unlocked(m->cap->graph, proto, m->deps, m->ndeps);
    if (!node || fc_cap_set_deps(m, &node, 1) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *captured = 1;
    return CUDA_SUCCESS;
}

/* Which captures forbid this thread's potentially unsafe calls. */
static int forbids(const fc_capture_t *cap)
{
    int mine = pthread_equal(cap->thread, pthread_self());
    if (fc_cap_thread_mode() == CU_STREAM_CAPTURE_MODE_RELAXED)
        return 0;
    if (mine && cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return 1;
    return fc_cap_thread_mode() == CU_STREAM_CAPTURE_MODE_GLOBAL && !mine &&
           cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

CUresult fc_cap_unsafe_unlocked(void)
{
    int hit = 0;
    for (size_t i = 0; i < fc.captures.n; i++) {
        fc_capture_t *cap = fc.captures.v[i].val;
        if (forbids(cap)) {
            cap->invalidated = 1;
            hit = 1;
        }
    }
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult fc_cap_sync_call_unlocked(struct CUctx_st *c)
{
    CUresult res = fc_cap_unsafe_unlocked();
    if (res == CUDA_SUCCESS && fc_cap_implicit_unlocked(c))
        res = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return res;
}

CUresult fc_cap_sync_ctx_unlocked(struct CUctx_st *c)
{
    CUresult res = fc_cap_unsafe_unlocked();
    if (res != CUDA_SUCCESS || fc_cap_thread_mode() == CU_STREAM_CAPTURE_MODE_RELAXED)
        return res;
    int hit = 0;
    for (size_t i = 0; i < fc.captures.n; i++) {
        fc_capture_t *cap = fc.captures.v[i].val;
        if (cap->ctx == c) {
            cap->invalidated = 1;
            hit = 1;
        }
    }
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult fc_cap_sync_stream_unlocked(struct CUctx_st *sctx, uint64_t key)
{
    if (key == KEY_LEGACY)
        return fc_cap_implicit_unlocked(sctx) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    fc_capstream_t *m = fc_cap_member_unlocked(key);
    if (!m)
        return CUDA_SUCCESS;
    m->cap->invalidated = 1;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

void fc_cap_event_clear(fc_event_t *e)
{
    free(e->cap_deps);
    e->cap_deps = NULL;
    e->cap_ndeps = 0;
    e->cap_id = 0;
}

CUresult fc_cap_event_record_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key,
                                      unsigned int flags, int *captured)
{
    *captured = 0;
    if (key == KEY_LEGACY)
        return fc_cap_implicit_unlocked(sctx) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    fc_capstream_t *m = fc_cap_member_unlocked(key);
    if (!m) {
        fc_cap_event_clear(e);
        return CUDA_SUCCESS;
    }
    if (m->cap->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (flags & CU_EVENT_RECORD_EXTERNAL) { /* documented: a record node */
        struct CUgraphNode_st proto = {.type = FC_NODE_EVENT_RECORD, .u.event = e->handle};
        CUresult res = fc_cap_work_unlocked(sctx, key, &proto, captured);
        if (res != CUDA_SUCCESS)
            return res;
    }
    struct CUgraphNode_st **d = m->ndeps ? malloc(m->ndeps * sizeof *d) : NULL;
    if (m->ndeps && !d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (m->ndeps)
        memcpy(d, m->deps, m->ndeps * sizeof *d);
    fc_cap_event_clear(e);
    e->cap_id = m->cap->id;
    e->cap_deps = d;
    e->cap_ndeps = m->ndeps;
    *captured = 1;
    return CUDA_SUCCESS;
}

/* Union of m's set and n more nodes. */
static int merge_deps(fc_capstream_t *m, struct CUgraphNode_st *const *deps, size_t n)
{
    struct CUgraphNode_st **u = malloc((m->ndeps + n + 1) * sizeof *u);
    if (!u)
        return -1;
    size_t k = m->ndeps;
    memcpy(u, m->deps, k * sizeof *u);
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && u[j] != deps[i])
            j++;
        if (j == k)
            u[k++] = deps[i];
    }
    int r = fc_cap_set_deps(m, u, k);
    free(u);
    return r;
}

CUresult fc_cap_event_wait_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key,
                                    unsigned int flags, int *captured)
{
    *captured = 0;
    fc_capture_t *ecap = fc_cap_active_unlocked(e->cap_id);
    fc_capstream_t *m = key == KEY_LEGACY ? NULL : fc_cap_member_unlocked(key);
    if (key == KEY_LEGACY) {
        if (fc_cap_implicit_unlocked(sctx))
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        if (ecap) { /* the legacy stream cannot take part in a capture */
            ecap->invalidated = 1;
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        return CUDA_SUCCESS;
    }
    if (!ecap && !m)
        return CUDA_SUCCESS; /* no capture involved */
    if (m && m->cap->invalidated) /* an invalidated waiter */
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!ecap) { /* a capturing stream waits for uncaptured work */
        if (flags & CU_EVENT_WAIT_EXTERNAL) {
            struct CUgraphNode_st proto = {.type = FC_NODE_EVENT_WAIT, .u.event = e->handle};
            return fc_cap_work_unlocked(sctx, key, &proto, captured);
        }
        m->cap->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (m && m->cap != ecap) { /* two captures would merge: both invalidated */
        m->cap->invalidated = 1;
        ecap->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (ecap->invalidated) /* a stream not capturing cannot join it */
        return m ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_INVALID_VALUE;
    *captured = 1;
    if (m) /* join */
        return merge_deps(m, e->cap_deps, e->cap_ndeps) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    fc_stream_t *s = fc_vec_find(&fc.streams, key);
    int blocking = s && !(s->flags & CU_STREAM_NON_BLOCKING);
    return fc_cap_join_unlocked(ecap, key, blocking, e->cap_deps, e->cap_ndeps) ? CUDA_SUCCESS
                                                                         : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult fc_cap_event_use_unlocked(fc_event_t *e)
{
    fc_capture_t *cap = fc_cap_active_unlocked(e->cap_id);
    if (!cap) {
        if (e->cap_id) /* its capture ended: as if never recorded */
            fc_cap_event_clear(e);
        return CUDA_SUCCESS;
    }
    cap->invalidated = 1;
    return CUDA_ERROR_CAPTURED_EVENT;
}
