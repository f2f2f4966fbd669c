/*
 * fakecuda_sync.c - streams of the fake CUDA driver (events are
 * fakecuda_event.c's), cuCtxSynchronize, and the bookkeeping of both.
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
        n += e->ctx->device == dev && fc_event_pending(e);
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
        fc_cap_event_clear(e);
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
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS ||
        (res = fc_cap_sync_stream_unlocked(sctx, key)) != CUDA_SUCCESS)
        goto done;
    int busy = 0;
    for (size_t i = 0; i < fc.events.n; i++) {
        fc_event_t *e = fc.events.v[i].val;
        if (e->ctx == sctx && e->stream_key == key && !fc_event_poll_unlocked(e))
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
    if ((res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS ||
        (res = fc_cap_sync_stream_unlocked(sctx, key)) != CUDA_SUCCESS)
        goto done;
    fc_tl_host_wait_unlocked(fc_tl_ready_unlocked(sctx, key));
    complete_unlocked(sctx, key);
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxSynchronize(void)
{
    FC_BEGIN(FN_cuCtxSynchronize, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_cap_sync_ctx_unlocked(c)) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    fc_tl_host_wait_unlocked(c->tl_all);
    complete_unlocked(c, 0);
    FC_END();
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
                         e->ctx->device, (unsigned long long)e->handle, fc_event_pending(e) ? "true" : "false");
    }
    return left;
}
