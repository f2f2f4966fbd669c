/*
 * fakecuda_ctx.c - primary contexts (retain, release, reset, state) and the
 * per-thread context stack (cuCtxGet/Set/Push/PopCurrent, cuCtxGetDevice).
 *
 * Invariants: dev[i].ctx.refcount >= 0; a primary context is active iff its
 * refcount > 0, and when the last reference goes, everything created in it
 * is destroyed (as the driver documents for cuDevicePrimaryCtxRelease) and
 * counted in fc.reclaimed. The context stack is the calling thread's own.
 */
#include "fakecuda_internal.h"

#include <string.h>

#define FC_CTX_STACK 64
static __thread struct CUctx_st *tls_ctx_stack[FC_CTX_STACK];
static __thread int tls_ctx_depth;

/* ------------------------------------------------------------------ */
/* primary contexts                                                     */

static struct CUctx_st *ctx_from_handle(CUcontext c)
{
    for (int i = 0; i < fc.ndev; i++)
        if (c == &fc.dev[i].ctx)
            return c;
    return NULL;
}

CUresult fc_current_ctx_unlocked(struct CUctx_st **out)
{
    if (tls_ctx_depth == 0 || tls_ctx_stack[tls_ctx_depth - 1] == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = tls_ctx_stack[tls_ctx_depth - 1];
    if (c->refcount == 0)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

/* What the driver does when a primary context is reset: everything created
 * in it is destroyed. VMM objects are process-wide and survive. */
static void reset_ctx_unlocked(struct CUctx_st *c)
{
    fc_mem_reset_device_unlocked(c->device);
    fc_sync_reset_ctx_unlocked(c);
    fc_module_reset_ctx_unlocked(c);
    memset(c->limits, 0, sizeof c->limits);
}

/*
 * Note [Context memory]
 * Rationale: on a real GPU an active context holds device memory of its own
 *   (code, stacks, heaps: a few hundred MiB), which cudaMemGetInfo reports
 *   as used and allocations cannot have; programs and tests that reason
 *   about "half the device" depend on it.
 * Approach: GPUMEM_SIM_CONTEXT_MEMORY (also GPUMEM_FAKECUDA_CONTEXT_MEMORY)
 *   bytes are charged to a device when its primary context becomes active
 *   (first retain) and given back when the last reference is released; a
 *   device without that much free memory refuses the context with
 *   CUDA_ERROR_OUT_OF_MEMORY, as the driver does.
 * Limitations: the default is 0 (the charge varies with the GPU and the
 *   driver, and a simulation should not invent one); a reset keeps it, as
 *   the context stays retained.
 */
FC_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FC_BEGIN(FN_cuDevicePrimaryCtxRetain, 1);
    if (!pctx)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    fc_device_t *d = &fc.dev[dev];
    if (d->ctx.refcount == 0 && fc.context_memory) {
        size_t used = fc_used(d);
        if (used > d->capacity || fc.context_memory > d->capacity - used)
            FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
        d->bytes_context = fc.context_memory;
        fc_note_usage_unlocked(dev);
    }
    fc.dev[dev].ctx.refcount++;
    *pctx = &fc.dev[dev].ctx;
    FC_END();
}

static CUresult primary_release(int fn, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    struct CUctx_st *c = &fc.dev[dev].ctx;
    if (c->refcount == 0) /* documented: releasing what was not retained */
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    if (--c->refcount == 0) {
        reset_ctx_unlocked(c);
        fc.dev[dev].bytes_context = 0;
    }
    FC_END();
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(FN_cuDevicePrimaryCtxRelease, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(FN_cuDevicePrimaryCtxRelease_v2, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FC_BEGIN(FN_cuDevicePrimaryCtxGetState, 1);
    if (!flags || !active)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    *active = fc.dev[dev].ctx.refcount > 0;
    FC_END();
}

/* Destroys everything created in the context; the retain count is kept
 * ("Resetting the primary context does not release it"). */
static CUresult primary_reset(int fn, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    reset_ctx_unlocked(&fc.dev[dev].ctx);
    FC_END();
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(FN_cuDevicePrimaryCtxReset, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(FN_cuDevicePrimaryCtxReset_v2, dev);
}

/* ------------------------------------------------------------------ */
/* the per-thread context stack                                         */

FC_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    FC_BEGIN(FN_cuCtxGetCurrent, 1);
    if (!pctx)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *pctx = tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
    FC_END();
}

/* A context handle that is not one of ours, or a primary context released
 * to zero, cannot be made current. */
static CUresult check_bindable(CUcontext ctx)
{
    struct CUctx_st *c = ctx_from_handle(ctx);
    if (!c || c->refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    FC_BEGIN(FN_cuCtxSetCurrent, 1);
    if (ctx == NULL) {
        if (tls_ctx_depth > 0)
            tls_ctx_depth--;
        goto done;
    }
    if ((res = check_bindable(ctx)) != CUDA_SUCCESS)
        goto done;
    if (tls_ctx_depth == 0)
        tls_ctx_depth = 1;
    tls_ctx_stack[tls_ctx_depth - 1] = ctx;
    FC_END();
}

static CUresult ctx_push(int fn, CUcontext ctx)
{
    FC_BEGIN(fn, 1);
    if (ctx == NULL)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = check_bindable(ctx)) != CUDA_SUCCESS)
        goto done;
    if (tls_ctx_depth == FC_CTX_STACK)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    tls_ctx_stack[tls_ctx_depth++] = ctx;
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return ctx_push(FN_cuCtxPushCurrent, ctx); }

FC_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    return ctx_push(FN_cuCtxPushCurrent_v2, ctx);
}

static CUresult ctx_pop(int fn, CUcontext *pctx)
{
    FC_BEGIN(fn, 1);
    if (tls_ctx_depth == 0)
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    CUcontext top = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = top;
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return ctx_pop(FN_cuCtxPopCurrent, pctx); }

FC_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    return ctx_pop(FN_cuCtxPopCurrent_v2, pctx);
}

FC_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    FC_BEGIN(FN_cuCtxGetDevice, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!device)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *device = c->device;
    FC_END();
}
