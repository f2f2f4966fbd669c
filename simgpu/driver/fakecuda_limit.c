/*
 * fakecuda_limit.c - the current context's limits: cuCtxSetLimit and
 * cuCtxGetLimit (stack size, printf FIFO, malloc heap, device-runtime
 * depths, L2 settings, CIG queries).
 *
 * Invariants: a context's limits are ctx->limits[], where 0 means "never
 * set: the default" (every settable limit's valid values are > 0, or 0
 * means the same as the default); a primary-context reset restores the
 * defaults (fakecuda_ctx.c).
 * Must not: call an exported cu* function (the lock is not recursive).
 *
 * Defaults are the documented ones (CUDA Programming Guide: printf FIFO
 * 1 MiB, malloc heap 8 MiB; cuda.h: stack size per thread, 1 KiB as
 * Note [Context memory] assumes; device-runtime sync depth 2, pending
 * launches 2048). Limitation: a larger stack does not charge more context
 * memory here, although the real driver reserves it.
 */
#include "fakecuda_internal.h"

static size_t limit_default(int limit)
{
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: return 1024;
    case CU_LIMIT_PRINTF_FIFO_SIZE: return 1u << 20;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return 8u << 20;
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: return 2;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: return 2048;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: return 64;
    default: return 0; /* persisting L2, CIG: none */
    }
}

FC_API CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value)
{
    FC_BEGIN(FN_cuCtxSetLimit, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    switch (limit) {
    case CU_LIMIT_STACK_SIZE:
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
        break;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: /* "a value between 0 and 128" */
        if (value > 128)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        break;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
        if (value > (size_t)fc.gpu.l2_bytes)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        break;
    case CU_LIMIT_SHMEM_SIZE:
    case CU_LIMIT_CIG_ENABLED: /* "can only be queried" */
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: /* only on a CIG context */
        FC_FAIL(CUDA_ERROR_UNSUPPORTED_LIMIT);
    default:
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    c->limits[limit] = value ? value : limit_default((int)limit);
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    FC_BEGIN(FN_cuCtxGetLimit, 1);
    struct CUctx_st *c;
    if (!pvalue || (unsigned)limit >= FC_LIMIT_COUNT)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (limit == CU_LIMIT_SHMEM_SIZE || limit == CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED)
        FC_FAIL(CUDA_ERROR_UNSUPPORTED_LIMIT); /* only on a CIG context */
    *pvalue = c->limits[limit] ? c->limits[limit] : limit_default((int)limit);
    FC_END();
}
