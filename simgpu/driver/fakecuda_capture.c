/*
 * fakecuda_capture.c - stream capture of the fake CUDA driver: the capture
 * state, begin/end, capture status and information, and the per-thread
 * capture mode (Note [Stream capture]). What a capture means for the other
 * calls (nodes, forbidden calls) is fakecuda_capture_rules.c's.
 *
 * Invariants: a stream key is in fc.capstreams iff the stream takes part in
 * a capture in fc.captures; a capture's origin stream takes part until the
 * capture ends; capture ids are nonzero and never reused; a captured node's
 * dependencies are nodes of the same graph, created before it.
 *
 * Must not: run captured work (the caller does, at cuGraphLaunch), or call
 * an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>

/*
 * Note [Stream capture]
 * Rationale: torch.cuda.graph, make_graphed_callables and cudagraph trees
 *   record work once and replay it; what they allocate, and which calls
 *   they make while capturing, must behave as on a GPU.
 * Approach: as the CUDA Programming Guide ("CUDA Graphs", "Stream Capture")
 *   and cuda.h describe it. A capture begins on a stream (never the legacy
 *   one) and records into a new graph; every stream taking part has a
 *   dependency set, the nodes its next node depends on. Work on a taking
 *   part stream becomes a node depending on that set, which then becomes
 *   that node. cuEventRecord in a capture stores the stream's set in the
 *   event; cuStreamWaitEvent on such an event joins the waiting stream into
 *   the capture (fork) or merges the sets (join). cuStreamEndCapture on
 *   the origin stream hands out the graph, unless the capture was
 *   invalidated or a joined stream's last nodes are not ancestors of the
 *   origin's (unjoined work). Forbidden calls fail and invalidate:
 *   synchronising or querying a capturing stream, or an event recorded in
 *   a capture (CAPTURED_EVENT); cuCtxSynchronize while a capture runs in
 *   the context (allowed to a thread in relaxed mode: only uncaptured work
 *   is waited for); the legacy stream while a blocking stream of its
 *   context captures (IMPLICIT); waiting on an uncaptured event (ISOLATION,
 *   unless CU_EVENT_WAIT_EXTERNAL makes it a node); and the "potentially
 *   unsafe" calls (cuMemAlloc, cuMemFree, synchronous copies and memsets)
 *   in a thread whose mode forbids them: global forbids them while this
 *   thread captures in a non-relaxed mode or any thread captures in global
 *   mode, thread-local only the former, relaxed never.
 * Limitations: the per-thread default stream counts as non-blocking for
 *   the implicit-synchronisation rule; an event recorded in a capture that
 *   has ended keeps the state of its last record outside a capture (never
 *   recorded: complete); graphs cannot be launched into
 *   a capture (no child-graph nodes); no capture into an existing graph
 *   (cuStreamBeginCaptureToGraph), no cuStreamUpdateCaptureDependencies;
 *   dependency sets are not reduced (after a join a set may hold a node
 *   and its ancestor); a context reset leaves captures and graphs alone.
 */

/* This thread's CUstreamCaptureMode (cuThreadExchangeStreamCaptureMode);
 * thread-local, so no lock. */
static __thread int tls_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

#define KEY_LEGACY 1ull /* fakecuda_sync.c's key of the legacy stream */

fc_capstream_t *fc_cap_member_unlocked(uint64_t key) { return fc_vec_find(&fc.capstreams, key); }

int fc_cap_thread_mode(void) { return tls_mode; }

int fc_cap_is_capturing_unlocked(uint64_t key) { return fc_cap_member_unlocked(key) != NULL; }

/* Replace m's dependency set with n nodes (copied); -1 out of memory. */
int fc_cap_set_deps(fc_capstream_t *m, struct CUgraphNode_st *const *deps, size_t n)
{
    struct CUgraphNode_st **d = NULL;
    CUgraphEdgeData *e = NULL;
    if (n) {
        d = malloc(n * sizeof *d);
        e = calloc(n, sizeof *e);
        if (!d || !e) {
            free(d);
            free(e);
            return -1;
        }
        memcpy(d, deps, n * sizeof *d);
    }
    free(m->deps);
    free(m->edges);
    m->deps = d;
    m->edges = e;
    m->ndeps = n;
    return 0;
}

fc_capstream_t *fc_cap_join_unlocked(fc_capture_t *cap, uint64_t key, int blocking,
                                     struct CUgraphNode_st *const *deps, size_t n)
{
    fc_capstream_t *m = calloc(1, sizeof *m);
    if (!m || fc_cap_set_deps(m, deps, n) != 0 || fc_vec_insert(&fc.capstreams, key, m) != 0) {
        if (m)
            fc_cap_set_deps(m, NULL, 0);
        free(m);
        return NULL;
    }
    m->key = key;
    m->cap = cap;
    m->blocking = blocking;
    return m;
}

static void leave_unlocked(size_t idx)
{
    fc_capstream_t *m = fc.capstreams.v[idx].val;
    fc_vec_remove_at(&fc.capstreams, idx);
    fc_cap_set_deps(m, NULL, 0);
    free(m);
}

/* Ends cap: every stream leaves it; the graph stays (the caller decides). */
static void end_unlocked(fc_capture_t *cap)
{
    for (size_t i = fc.capstreams.n; i-- > 0;)
        if (((fc_capstream_t *)fc.capstreams.v[i].val)->cap == cap)
            leave_unlocked(i);
    fc_vec_remove(&fc.captures, cap->id);
    cap->graph->capture_id = 0;
    free(cap);
}

fc_capture_t *fc_cap_active_unlocked(uint64_t id) { return id ? fc_vec_find(&fc.captures, id) : NULL; }

/* Does a blocking stream of ctx take part in a capture? Invalidates it. */
int fc_cap_implicit_unlocked(struct CUctx_st *ctx)
{
    int hit = 0;
    for (size_t i = 0; i < fc.capstreams.n; i++) {
        fc_capstream_t *m = fc.capstreams.v[i].val;
        if (m->blocking && m->cap->ctx == ctx) {
            m->cap->invalidated = 1;
            hit = 1;
        }
    }
    return hit;
}

/* ------------------------------------------------------------------ */
/* entry points                                                         */

FC_API CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FC_BEGIN(FN_cuThreadExchangeStreamCaptureMode, 1);
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    int old = tls_mode;
    tls_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    FC_BEGIN(FN_cuStreamBeginCapture_v2, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (key == KEY_LEGACY) /* documented: the legacy stream cannot be captured */
        FC_FAIL(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (fc_cap_member_unlocked(key))
        FC_FAIL(CUDA_ERROR_ILLEGAL_STATE);
    fc_capture_t *cap = calloc(1, sizeof *cap);
    struct CUgraph_st *g = cap ? fc_graph_new_unlocked() : NULL;
    if (!g || fc_vec_insert(&fc.captures, fc.next_capture_id + 1, cap) != 0) {
        if (g)
            fc_graph_free_unlocked(g);
        free(cap);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    cap->id = ++fc.next_capture_id;
    cap->mode = mode;
    cap->thread = pthread_self();
    cap->ctx = sctx;
    cap->origin = key;
    cap->graph = g;
    g->capture_id = cap->id;
    fc_stream_t *s = fc_vec_find(&fc.streams, key);
    if (!fc_cap_join_unlocked(cap, key, s && !(s->flags & CU_STREAM_NON_BLOCKING), NULL, 0)) {
        fc_vec_remove(&fc.captures, cap->id);
        fc_graph_free_unlocked(g);
        free(cap);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    FC_END();
}

/* Is every node of m's set the origin's set or one of its ancestors? */
static int joined_unlocked(const fc_capstream_t *origin, const fc_capstream_t *m)
{
    size_t n = origin->cap->graph->n;
    unsigned char *anc = calloc(n ? n : 1, 1);
    if (!anc)
        return 0;
    for (size_t i = 0; i < origin->ndeps; i++)
        anc[origin->deps[i]->index] = 1;
    for (size_t i = n; i-- > 0;) { /* nodes are in topological order */
        const struct CUgraphNode_st *node = origin->cap->graph->nodes[i];
        if (anc[i])
            for (size_t j = 0; j < node->ndeps; j++)
                anc[node->deps[j]->index] = 1;
    }
    int ok = 1;
    for (size_t i = 0; i < m->ndeps && ok; i++)
        ok = anc[m->deps[i]->index];
    free(anc);
    return ok;
}

FC_API CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    FC_BEGIN(FN_cuStreamEndCapture, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    if (!phGraph)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_capstream_t *m = key == KEY_LEGACY ? NULL : fc_cap_member_unlocked(key);
    if (!m)
        FC_FAIL(CUDA_ERROR_ILLEGAL_STATE);
    fc_capture_t *cap = m->cap;
    if (cap->origin != key) {
        cap->invalidated = 1;
        FC_FAIL(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    }
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(cap->thread, pthread_self()))
        FC_FAIL(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    res = cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    for (size_t i = 0; i < fc.capstreams.n && res == CUDA_SUCCESS; i++) {
        const fc_capstream_t *o = fc.capstreams.v[i].val;
        if (o->cap == cap && o != m && !joined_unlocked(m, o))
            res = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    }
    struct CUgraph_st *g = cap->graph;
    end_unlocked(cap);
    if (res != CUDA_SUCCESS) {
        fc_graph_free_unlocked(g);
        *phGraph = NULL;
    } else {
        *phGraph = g;
    }
    FC_END();
}

/* Status, id, graph and dependency set of the capture hStream takes part in. */
static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps,
                             const CUgraphEdgeData **edges, size_t *ndeps)
{
    struct CUctx_st *c, *sctx;
    uint64_t key;
    CUresult res;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        return res;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    if (key == KEY_LEGACY && fc_cap_implicit_unlocked(sctx))
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    fc_capstream_t *m = key == KEY_LEGACY ? NULL : fc_cap_member_unlocked(key);
    *status = !m ? CU_STREAM_CAPTURE_STATUS_NONE
              : m->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                    : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    int active = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id)
        *id = m ? m->cap->id : 0;
    if (graph)
        *graph = active ? m->cap->graph : NULL;
    if (deps)
        *deps = active ? (const CUgraphNode *)m->deps : NULL;
    if (edges)
        *edges = active ? m->edges : NULL;
    if (ndeps)
        *ndeps = active ? m->ndeps : 0;
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FC_BEGIN(FN_cuStreamIsCapturing, 1);
    res = capture_info(hStream, captureStatus, NULL, NULL, NULL, NULL, NULL);
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                  cuuint64_t *id_out, CUgraph *graph_out,
                                                  const CUgraphNode **dependencies_out,
                                                  const CUgraphEdgeData **edgeData_out,
                                                  size_t *numDependencies_out)
{
    FC_BEGIN(FN_cuStreamGetCaptureInfo_v3, 1);
    res = capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                       numDependencies_out);
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                  cuuint64_t *id_out, CUgraph *graph_out,
                                                  const CUgraphNode **dependencies_out,
                                                  size_t *numDependencies_out)
{
    FC_BEGIN(FN_cuStreamGetCaptureInfo_v2, 1);
    res = capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                       numDependencies_out);
    FC_END();
}
