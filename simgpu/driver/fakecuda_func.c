/*
 * fakecuda_func.c - attributes of a loaded function and what follows from
 * them: cuFuncGetAttribute, cuFuncSetAttribute, cuFuncSetCacheConfig,
 * cuOccupancyMaxActiveBlocksPerMultiprocessor (Note [Function limits]).
 *
 * Invariants: a function's settable attributes stay within what
 * cuFuncSetAttribute documents (a rejected value changes nothing).
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

/*
 * Note [Function limits]
 * Rationale: Triton asks for a kernel's registers, spills and maximum block
 *   size after loading it and sizes its launches by them; the occupancy and
 *   the launch checks need the same numbers.
 * Approach: the image's values (fakecuda_image.c). The maximum threads per
 *   block is the least of 1024, the kernel's .maxntid (or .reqntid), and
 *   what the register file allows: registers are allocated per warp in
 *   units of 256 (a thread's count times 32, rounded up), and a block may
 *   use at most 64 Ki registers (CUDA's occupancy calculator's rules for
 *   compute capability 7.0-9.0; 255 registers give 256 threads). Blocks per
 *   SM are limited by the model's threads, blocks, registers and shared
 *   memory per SM; each block's shared memory is its static plus dynamic
 *   shared memory plus the 1 KiB the system reserves per block
 *   (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK), in 128-byte
 *   units.
 * Limitations: the carveout and cache preferences are recorded but change
 *   nothing; cluster scheduling across GPCs is not modelled.
 */

#define FC_MAX_BLOCK_THREADS 1024
#define FC_REGS_PER_BLOCK 65536
#define FC_REG_UNIT 256
#define FC_RESERVED_SMEM 1024
#define FC_SMEM_UNIT 128

static int round_up(int v, int unit) { return (v + unit - 1) / unit * unit; }

static int regs_per_warp(const fc_func_t *f)
{
    int r = f->k->regs > 0 ? f->k->regs : 1;
    return round_up(r * 32, FC_REG_UNIT);
}

int fc_func_max_threads(const fc_func_t *f)
{
    int t = FC_MAX_BLOCK_THREADS;
    int by_regs = FC_REGS_PER_BLOCK / regs_per_warp(f) * 32;
    if (by_regs < t)
        t = by_regs;
    if (f->k->max_threads > 0 && f->k->max_threads < t)
        t = f->k->max_threads;
    if (f->k->req_threads > 0 && f->k->req_threads < t)
        t = f->k->req_threads;
    return t;
}

int fc_func_blocks_per_sm(const fc_func_t *f, int threads, size_t dyn_smem)
{
    const fc_gpu_t *g = &fc.gpu;
    if (threads <= 0)
        return 0;
    int warps = (threads + 31) / 32;
    int n = g->blocks_per_sm;
    int by_threads = g->threads_per_sm / (warps * 32);
    int by_regs = g->regs_per_sm / (regs_per_warp(f) * warps);
    size_t smem = (size_t)f->k->shared_bytes + dyn_smem + FC_RESERVED_SMEM;
    smem = (smem + FC_SMEM_UNIT - 1) / FC_SMEM_UNIT * FC_SMEM_UNIT;
    int by_smem = (int)((size_t)g->smem_per_sm / smem);
    if (by_threads < n)
        n = by_threads;
    if (by_regs < n)
        n = by_regs;
    if (by_smem < n)
        n = by_smem;
    return n;
}

FC_API CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    FC_BEGIN(FN_cuFuncGetAttribute, 1);
    fc_func_t *f;
    if (!pi)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = fc_func_lookup_unlocked(hfunc, &f)) != CUDA_SUCCESS)
        goto done;
    const fc_image_t *im = &f->mod->img;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = fc_func_max_threads(f); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = f->k->shared_bytes; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = f->k->const_bytes; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = f->k->local_bytes; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = f->k->regs; break;
    /* PTX: the ISA's virtual architecture is its target; the binary is what
     * the JIT would build, for the device itself */
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = im->kind == FC_IMG_PTX ? im->sm : im->ptx_version; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *pi = im->kind == FC_IMG_PTX ? fc.gpu.cc_major * 10 + fc.gpu.cc_minor : im->sm;
        break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dyn_shared; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = f->carveout; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *pi = f->k->cluster[0] != 0; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *pi = f->cluster[0]; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *pi = f->cluster[1]; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *pi = f->cluster[2]; break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *pi = f->non_portable; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *pi = f->sched_pref; break;
    default: FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    FC_END();
}

/* The settable attributes and their documented ranges (cuda.h,
 * cuFuncSetAttribute); any other attribute is CUDA_ERROR_INVALID_VALUE. */
FC_API CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    FC_BEGIN(FN_cuFuncSetAttribute, 1);
    fc_func_t *f;
    if ((res = fc_func_lookup_unlocked(hfunc, &f)) != CUDA_SUCCESS)
        goto done;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        /* up to the opt-in limit less the static shared memory */
        if (value < 0 || value > fc.gpu.smem_per_block_optin - f->k->shared_bytes)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        f->max_dyn_shared = value;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (value < -1 || value > 100)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        f->carveout = value;
        break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        /* only where the binary has no compile-time cluster size */
        if (fc.gpu.cc_major < 9 || value < 0 || f->k->cluster[0] != 0)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        f->cluster[attrib - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH] = value;
        break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        if (fc.gpu.cc_major < 9 || (value != 0 && value != 1))
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        f->non_portable = value;
        break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        if (value < 0 || value > 2) /* CUclusterSchedulingPolicy */
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        f->sched_pref = value;
        break;
    default:
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    FC_END();
}

FC_API CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    FC_BEGIN(FN_cuFuncSetCacheConfig, 1);
    fc_func_t *f;
    if ((res = fc_func_lookup_unlocked(hfunc, &f)) != CUDA_SUCCESS)
        goto done;
    if ((unsigned)config > CU_FUNC_CACHE_PREFER_EQUAL)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    f->cache_config = (int)config;
    FC_END();
}

FC_API CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                                    int blockSize,
                                                                    size_t dynamicSMemSize)
{
    FC_BEGIN(FN_cuOccupancyMaxActiveBlocksPerMultiprocessor, 1);
    fc_func_t *f;
    if (!numBlocks)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = fc_func_lookup_unlocked(func, &f)) != CUDA_SUCCESS)
        goto done;
    if (blockSize <= 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    /* a block the function cannot run, or more shared memory than it may
     * use, fits 0 times */
    if (blockSize > fc_func_max_threads(f) || dynamicSMemSize > (size_t)f->max_dyn_shared)
        *numBlocks = 0;
    else
        *numBlocks = fc_func_blocks_per_sm(f, blockSize, dynamicSMemSize);
    FC_END();
}
