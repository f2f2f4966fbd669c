/*
 * fakecuda_sync.c - streams and events of the fake CUDA driver, and
 * cuCtxSynchronize.
 *
 * No work ever runs. In the timeline mode (the default) work has a
 * simulated duration and an event completes when the host's simulated clock
 * reaches its stream's time at the record (Note [Device timeline] in
 * fakecuda_timeline.c). In the other modes "work in a stream" is
 * represented only by the events recorded on it, and when a recorded event
 * completes is set by the event mode (GPUMEM_FAKECUDA_EVENTS,
 * fakecuda_set_event_mode) in force when it was recorded: see Note [Event
 * completion].
 *
 * Invariants: streams and events belong to the context that was current when
 * they were created and die with it; handles are never reused; the special
 * streams 0 (legacy), CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are always
 * valid and mean the current context's stream.
 *
 * Must not: treat NOT_READY as an error (it is a normal query answer).
 */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <time.h>

/*
 * Note [Event completion]
 * Rationale: an allocator that reuses memory freed on another stream must
 * wait for an event; tests need that wait to be observable and
 * deterministic.
 * Approach: cuEventRecord captures the mode. "timeline": complete when the
 * simulated host clock reaches the time the record was given (Note [Device
 * timeline]); host waits move that clock. "immediate": complete at once.
 * "never": incomplete until cuEventSynchronize, cuStreamSynchronize of its
 * stream, cuCtxSynchronize of its context, or fakecuda_complete_events().
 * "after:N": the first N polls answer CUDA_ERROR_NOT_READY and the next one
 * completes it. A poll is a cuEventQuery of the event or a cuStreamQuery of
 * the stream it was recorded on. An event never recorded is complete
 * (documented: it "represents an empty set of work"); re-recording starts
 * over with the mode in force then.
 * Limitations: outside the timeline mode, the legacy stream's implicit
 * synchronisation with blocking streams is not modelled; synchronising one
 * stream completes only the events recorded on that very stream.
 */

#define KEY_LEGACY 1ull
#define KEY_PER_THREAD_BIT (1ull << 63)

static __thread uint64_t tls_per_thread_key; /* this thread's CU_STREAM_PER_THREAD */
static uint64_t next_per_thread = 1;          /* protected by fc.mu */

/* Which stream `h` means, as a key events remember, and its context. */
CUresult fc_resolve_stream_unlocked(CUstream h, struct CUctx_st *cur, uint64_t *key,
                                        struct CUctx_st **sctx)
{
    if (h == NULL || h == CU_STREAM_LEGACY) {
        *key = KEY_LEGACY;
        *sctx = cur;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        if (!tls_per_thread_key)
            tls_per_thread_key = KEY_PER_THREAD_BIT | next_per_thread++;
        *key = tls_per_thread_key;
        *sctx = cur;
        return CUDA_SUCCESS;
    }
    fc_stream_t *s = fc_vec_find(&fc.streams, (uint64_t)(uintptr_t)h);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    *key = s->handle;
    *sctx = s->ctx;
    return CUDA_SUCCESS;
}

/* One poll of an event; returns 1 when it is complete. */
static int poll_unlocked(fc_event_t *e)
{
    if (!e->recorded || e->complete)
        return 1;
    if (e->timed)
        return e->complete = fc.host_ns >= e->t_ns;
    if (e->remaining > 0) {
        e->remaining--;
        return 0;
    }
    if (e->remaining == 0) {
        e->complete = 1;
        return 1;
    }
    return 0; /* "never" */
}

static int pending(const fc_event_t *e)
{
    return e->recorded && !e->complete && !(e->timed && fc.host_ns >= e->t_ns);
}

/* Complete (ctx, key) events; key 0 means every event of ctx. */
static void complete_unlocked(struct CUctx_st *ctx, uint64_t key)
{
    for (size_t i = 0; i < fc.events.n; i++) {
        fc_event_t *e = fc.events.v[i].val;
        if (e->ctx == ctx && (key == 0 || e->stream_key == key))
            e->complete = 1;
    }
}

void fc_sync_complete_all_unlocked(void)
{
    for (int d = 0; d < fc.ndev; d++) /* the host waits for every device */
        fc_tl_host_wait_unlocked(fc.dev[d].ctx.tl_all);
    for (size_t i = 0; i < fc.events.n; i++)
        ((fc_event_t *)fc.events.v[i].val)->complete = 1;
}

size_t fc_sync_pending_events_unlocked(int dev)
{
    size_t n = 0;
    for (size_t i = 0; i < fc.events.n; i++) {
        const fc_event_t *e = fc.events.v[i].val;
        n += e->ctx->device == dev && pending(e);
    }
    return n;
}

void fc_sync_reset_ctx_unlocked(struct CUctx_st *ctx)
{
    for (size_t i = fc.streams.n; i-- > 0;) {
        fc_stream_t *s = fc.streams.v[i].val;
        if (s->ctx != ctx)
            continue;
        fc_vec_remove_at(&fc.streams, i);
        fc.dev[ctx->device].n_streams--;
        fc.reclaimed.streams++;
        free(s);
    }
    for (size_t i = fc.events.n; i-- > 0;) {
        fc_event_t *e = fc.events.v[i].val;
        if (e->ctx != ctx)
            continue;
        fc_vec_remove_at(&fc.events, i);
        fc.dev[ctx->device].n_events--;
        fc.reclaimed.events++;
        free(e);
    }
}

/* ------------------------------------------------------------------ */
/* streams                                                              */

static CUresult stream_create(int fn, CUstream *phStream, unsigned int Flags, int priority)
{
    FC_BEGIN(fn, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!phStream || (Flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_stream_t *s = malloc(sizeof *s);
    uint64_t hv = FC_HANDLE_STREAM | (fc_new_id_unlocked() << 4);
    if (!s || fc_vec_insert(&fc.streams, hv, s) != 0) {
        free(s);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    s->handle = hv;
    s->ctx = c;
    s->flags = Flags;
    s->tl_ready = 0;
    /* documented: priorities outside the range are clamped into it */
    s->priority = priority > FC_PRIO_LEAST      ? FC_PRIO_LEAST
                  : priority < FC_PRIO_GREATEST ? FC_PRIO_GREATEST
                                                : priority;
    fc.dev[c->device].n_streams++;
    *phStream = (CUstream)(uintptr_t)hv;
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return stream_create(FN_cuStreamCreate, phStream, Flags, 0);
}

FC_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
                                                   int priority)
{
    return stream_create(FN_cuStreamCreateWithPriority, phStream, flags, priority);
}

FC_API CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    FC_BEGIN(FN_cuCtxGetStreamPriorityRange, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (leastPriority)
        *leastPriority = FC_PRIO_LEAST;
    if (greatestPriority)
        *greatestPriority = FC_PRIO_GREATEST;
    FC_END();
}

/* The live stream record for h, or NULL for a special stream (0, legacy,
 * per-thread), which the caller answers itself. INVALID_HANDLE otherwise. */
static CUresult stream_info_unlocked(CUstream h, fc_stream_t **out, struct CUctx_st **ctx,
                                     uint64_t *key)
{
    struct CUctx_st *c, *sctx;
    CUresult res = fc_current_ctx_unlocked(&c);
    if (res != CUDA_SUCCESS)
        return res;
    if ((res = fc_resolve_stream_unlocked(h, c, key, &sctx)) != CUDA_SUCCESS)
        return res;
    *out = fc_vec_find(&fc.streams, (uint64_t)(uintptr_t)h);
    *ctx = sctx;
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority)
{
    FC_BEGIN(FN_cuStreamGetPriority, 1);
    fc_stream_t *s;
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = stream_info_unlocked(hStream, &s, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (!priority)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *priority = s ? s->priority : 0;
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    FC_BEGIN(FN_cuStreamGetFlags, 1);
    fc_stream_t *s;
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = stream_info_unlocked(hStream, &s, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (!flags)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *flags = s ? s->flags : 0;
    FC_END();
}

/* Created streams: their handle number; the legacy stream 0; a per-thread
 * stream its per-thread key. Unique among live streams. */
FC_API CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
    FC_BEGIN(FN_cuStreamGetId, 1);
    fc_stream_t *s;
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = stream_info_unlocked(hStream, &s, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (!streamId)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *streamId = s ? (s->handle & ~FC_HANDLE_STREAM) >> 4 : key == KEY_LEGACY ? 0 : key;
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
    FC_BEGIN(FN_cuStreamGetDevice, 1);
    fc_stream_t *s;
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = stream_info_unlocked(hStream, &s, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (!device)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *device = sctx->device;
    FC_END();
}

/* Pending events recorded on the stream stay pending: the work "completes
 * later", as the header says for a stream destroyed while busy. */
static CUresult stream_destroy(int fn, CUstream hStream)
{
    FC_BEGIN(fn, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_stream_t *s = fc_vec_remove(&fc.streams, (uint64_t)(uintptr_t)hStream);
    if (!s) /* includes the special streams, which cannot be destroyed */
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    fc.dev[s->ctx->device].n_streams--;
    free(s);
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    return stream_destroy(FN_cuStreamDestroy, hStream);
}

FC_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    return stream_destroy(FN_cuStreamDestroy_v2, hStream);
}

FC_API CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    FC_BEGIN(FN_cuStreamQuery, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    int busy = 0;
    for (size_t i = 0; i < fc.events.n; i++) {
        fc_event_t *e = fc.events.v[i].val;
        if (e->ctx == sctx && e->stream_key == key && !poll_unlocked(e))
            busy = 1;
    }
    if (fc.ev_mode == FC_EV_TIMELINE && fc_tl_ready_unlocked(sctx, key) > fc.host_ns)
        busy = 1;
    if (busy)
        FC_FAIL(CUDA_ERROR_NOT_READY);
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    FC_BEGIN(FN_cuStreamSynchronize, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    fc_tl_host_wait_unlocked(fc_tl_ready_unlocked(sctx, key));
    complete_unlocked(sctx, key);
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxSynchronize(void)
{
    FC_BEGIN(FN_cuCtxSynchronize, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_tl_host_wait_unlocked(c->tl_all);
    complete_unlocked(c, 0);
    FC_END();
}

/* ------------------------------------------------------------------ */
/* events                                                               */

FC_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FC_BEGIN(FN_cuEventCreate, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    const unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_event_t *e = calloc(1, sizeof *e);
    uint64_t hv = FC_HANDLE_EVENT | (fc_new_id_unlocked() << 4);
    if (!e || fc_vec_insert(&fc.events, hv, e) != 0) {
        free(e);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    e->handle = hv;
    e->ctx = c;
    e->flags = Flags;
    fc.dev[c->device].n_events++;
    *phEvent = (CUevent)(uintptr_t)hv;
    FC_END();
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static CUresult event_record(int fn, CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FC_BEGIN(fn, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_event_t *e = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    if (e->ctx != sctx) /* documented: "must be from the same context" */
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if (flags & ~(unsigned int)CU_EVENT_RECORD_EXTERNAL)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    e->recorded = 1;
    e->stream_key = key;
    e->recorded_ms = now_ms();
    e->timed = fc.ev_mode == FC_EV_TIMELINE;
    if (e->timed) { /* at least now: an idle stream's event completes at once */
        uint64_t t = fc_tl_ready_unlocked(sctx, key);
        e->t_ns = t > fc.host_ns ? t : fc.host_ns;
    }
    switch (fc.ev_mode) {
    case FC_EV_TIMELINE:
        e->complete = 0;
        e->remaining = 0;
        break;
    case FC_EV_IMMEDIATE:
        e->complete = 1;
        e->remaining = 0;
        break;
    case FC_EV_NEVER:
        e->complete = 0;
        e->remaining = -1;
        break;
    default:
        e->complete = fc.ev_after == 0;
        e->remaining = fc.ev_after;
        break;
    }
    FC_END();
}

FC_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return event_record(FN_cuEventRecord, hEvent, hStream, 0);
}

/* CU_EVENT_RECORD_EXTERNAL only matters under stream capture, which the
 * fake does not have. */
FC_API CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return event_record(FN_cuEventRecordWithFlags, hEvent, hStream, flags);
}

/* In the timeline mode, the stream's later work starts after the event's
 * time. Otherwise nothing runs, so waiting adds no dependency: the stream's
 * own events still complete by the event mode. */
FC_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FC_BEGIN(FN_cuStreamWaitEvent, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    fc_event_t *e = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if (Flags & ~(unsigned int)CU_EVENT_WAIT_EXTERNAL)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (e->recorded && e->timed && !e->complete)
        fc_tl_wait_unlocked(sctx, key, e->t_ns);
    FC_END();
}

/* Host time between the two records. As documented: INVALID_HANDLE if
 * either event was created with DISABLE_TIMING or never recorded,
 * NOT_READY if either has not completed (not a poll: the answer does not
 * count towards after:N). */
FC_API CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FC_BEGIN(FN_cuEventElapsedTime_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_event_t *a = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hStart);
    fc_event_t *b = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hEnd);
    if (!pMilliseconds)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!a || !b || !a->recorded || !b->recorded || (a->flags & CU_EVENT_DISABLE_TIMING) ||
        (b->flags & CU_EVENT_DISABLE_TIMING))
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if (pending(a) || pending(b))
        FC_FAIL(CUDA_ERROR_NOT_READY);
    if (a->timed && b->timed) /* simulated time */
        *pMilliseconds = (float)(((double)b->t_ns - (double)a->t_ns) / 1e6);
    else
        *pMilliseconds = (float)(b->recorded_ms - a->recorded_ms);
    FC_END();
}

/* No current context needed: the header lists no CUDA_ERROR_INVALID_CONTEXT
 * for cuEventQuery (an event of a destroyed context is an invalid handle). */
FC_API CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    FC_BEGIN(FN_cuEventQuery, 1);
    fc_event_t *e = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if (!poll_unlocked(e))
        FC_FAIL(CUDA_ERROR_NOT_READY);
    FC_END();
}

/* The host waits and the fake GPU finishes: always completes the event. */
FC_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    FC_BEGIN(FN_cuEventSynchronize, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_event_t *e = fc_vec_find(&fc.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    if (e->recorded && e->timed)
        fc_tl_host_wait_unlocked(e->t_ns);
    e->complete = 1;
    FC_END();
}

static CUresult event_destroy(int fn, CUevent hEvent)
{
    FC_BEGIN(fn, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    fc_event_t *e = fc_vec_remove(&fc.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    fc.dev[e->ctx->device].n_events--;
    free(e);
    FC_END();
}

FC_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return event_destroy(FN_cuEventDestroy, hEvent); }

FC_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    return event_destroy(FN_cuEventDestroy_v2, hEvent);
}

/* ------------------------------------------------------------------ */
/* report                                                               */

int fc_sync_report_leaks_unlocked(sim_sb_t *sb, int *first, int left)
{
    for (size_t i = 0; i < fc.streams.n; i++) {
        const fc_stream_t *s = fc.streams.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"stream\", \"device\": %d, \"handle\": %llu}",
                         s->ctx->device, (unsigned long long)s->handle);
    }
    for (size_t i = 0; i < fc.events.n; i++) {
        const fc_event_t *e = fc.events.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"event\", \"device\": %d, \"handle\": %llu, \"pending\": %s}",
                         e->ctx->device, (unsigned long long)e->handle, pending(e) ? "true" : "false");
    }
    return left;
}
