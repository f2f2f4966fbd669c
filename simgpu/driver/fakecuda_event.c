/*
 * fakecuda_event.c - events of the fake CUDA driver: create, record, query,
 * synchronise, elapsed time, destroy, and cuStreamWaitEvent.
 *
 * When a recorded event completes is set by the event mode in force when it
 * was recorded (Note [Event completion]); in the timeline mode, by the
 * simulated clocks of fakecuda_timeline.c.
 *
 * Invariants: events belong to the context that was current when they were
 * created and die with it; handles are never reused.
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

/* One poll of an event; returns 1 when it is complete. */
int fc_event_poll_unlocked(fc_event_t *e)
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

int fc_event_pending(const fc_event_t *e)
{
    return e->recorded && !e->complete && !(e->timed && fc.host_ns >= e->t_ns);
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

/* The work of a record on (sctx, key), also replayed by graph launches. */
void fc_event_record_now_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key)
{
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
    int captured; /* Note [Stream capture] in fakecuda_capture.c */
    if ((res = fc_cap_event_record_unlocked(e, sctx, key, flags, &captured)) != CUDA_SUCCESS || captured)
        goto done;
    fc_event_record_now_unlocked(e, sctx, key);
    FC_END();
}

FC_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return event_record(FN_cuEventRecord, hEvent, hStream, 0);
}

/* CU_EVENT_RECORD_EXTERNAL only matters under stream capture: it makes the
 * record a node of the graph. */
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
    int captured; /* Note [Stream capture] in fakecuda_capture.c */
    if ((res = fc_cap_event_wait_unlocked(e, sctx, key, Flags, &captured)) != CUDA_SUCCESS || captured)
        goto done;
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
    if (fc_event_pending(a) || fc_event_pending(b))
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
    if ((res = fc_cap_event_use_unlocked(e)) != CUDA_SUCCESS)
        goto done;
    if (!fc_event_poll_unlocked(e))
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
    if ((res = fc_cap_event_use_unlocked(e)) != CUDA_SUCCESS)
        goto done;
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
    fc_cap_event_clear(e);
    free(e);
    FC_END();
}

FC_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return event_destroy(FN_cuEventDestroy, hEvent); }

FC_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    return event_destroy(FN_cuEventDestroy_v2, hEvent);
}
