/*
 * fakecuda_launch.c - kernel launches of loaded functions: cuLaunchKernel,
 * cuLaunchKernelEx (with its launch attributes), cuLaunchCooperativeKernel,
 * and cuOccupancyMaxActiveClusters (Note [Launches]).
 *
 * Invariants: a launch either fails its checks and enqueues nothing, or
 * goes to fakecuda_launch(hStream, -1), the driver's single kernel entry
 * (fakecuda_timeline.c), which checks the stream and puts the kernel on
 * the device timeline. No launch accounting happens anywhere else.
 * Must not: call fakecuda_launch while holding the lock (it takes it).
 */
#include "fakecuda_internal.h"

/*
 * Note [Launches]
 * Rationale: nothing runs on the simulated GPU, but a launch the real
 *   driver would refuse must fail here too, or code that works on the
 *   simulator fails on a GPU; and every launch takes device time, so that
 *   events around it (Inductor's benchmarks) measure something.
 * Approach: the checks the driver API documents, in this order: a current
 *   context (INVALID_CONTEXT); a loaded function (INVALID_HANDLE);
 *   kernelParams and extra not both given, grid and block dimensions
 *   within the device's maxima and not 0, at most 1024 threads, dynamic
 *   shared memory within the function's MAX_DYNAMIC_SHARED_SIZE_BYTES
 *   (INVALID_VALUE); a block within the function's own limit (registers,
 *   .maxntid: LAUNCH_OUT_OF_RESOURCES; a .reqntid block of another size:
 *   INVALID_VALUE); a cluster (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION or the
 *   function's required size) only on compute capability 9.0+, each grid
 *   dimension a multiple of it, at most 8 blocks (16 with
 *   NON_PORTABLE_CLUSTER_SIZE_ALLOWED) (INVALID_CLUSTER_SIZE); a
 *   cooperative grid no larger than the blocks that fit on the device at
 *   once (COOPERATIVE_LAUNCH_TOO_LARGE). Then fakecuda_launch(stream, -1):
 *   one kernel of FC_TL_KERNEL_NS on the stream's timeline.
 * Limitations: the kernel does nothing (no memory is read or written);
 *   every kernel costs the same time whatever its grid; launch attributes
 *   other than cooperative and the cluster size are accepted and ignored.
 */

#define FC_MAX_CLUSTER_PORTABLE 8
#define FC_MAX_CLUSTER_NON_PORTABLE 16
#define FC_LAUNCH_ATTR_LAST 16 /* CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING */

typedef struct {
    unsigned grid[3], block[3];
    unsigned smem;
    int cooperative;
    unsigned cluster[3];        /* all 0: none given */
    int has_params, has_extra;
} launch_t;

static CUresult check_unlocked(const launch_t *l, CUfunction hf, fc_func_t **out)
{
    static const unsigned max_grid[3] = {2147483647u, 65535u, 65535u};
    static const unsigned max_block[3] = {1024u, 1024u, 64u};
    struct CUctx_st *c;
    fc_func_t *f;
    CUresult res;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        return res;
    if ((res = fc_func_lookup_unlocked(hf, &f)) != CUDA_SUCCESS)
        return res;
    *out = f;
    if (l->has_params && l->has_extra)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = 1, blocks = 1;
    for (int d = 0; d < 3; d++) {
        if (l->grid[d] == 0 || l->grid[d] > max_grid[d] || l->block[d] == 0 ||
            l->block[d] > max_block[d])
            return CUDA_ERROR_INVALID_VALUE;
        threads *= l->block[d];
        blocks *= l->grid[d];
    }
    if (threads > 1024 || l->smem > (unsigned)f->max_dyn_shared)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->k->req_threads > 0 && threads != (uint64_t)f->k->req_threads)
        return CUDA_ERROR_INVALID_VALUE;
    if (threads > (uint64_t)fc_func_max_threads(f))
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    unsigned cl[3];
    int given = l->cluster[0] || l->cluster[1] || l->cluster[2];
    for (int d = 0; d < 3; d++)
        cl[d] = given ? l->cluster[d] : (unsigned)f->cluster[d];
    if (cl[0] || cl[1] || cl[2]) {
        if (fc.gpu.cc_major < 9)
            return CUDA_ERROR_INVALID_CLUSTER_SIZE;
        uint64_t size = 1;
        for (int d = 0; d < 3; d++) {
            if (cl[d] == 0 || l->grid[d] % cl[d] != 0 ||
                (f->k->cluster[0] && cl[d] != f->k->cluster[d]))
                return CUDA_ERROR_INVALID_CLUSTER_SIZE;
            size *= cl[d];
        }
        if (size > (f->non_portable ? FC_MAX_CLUSTER_NON_PORTABLE : FC_MAX_CLUSTER_PORTABLE))
            return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    }
    if (l->cooperative &&
        blocks > (uint64_t)fc_func_blocks_per_sm(f, (int)threads, l->smem) * fc.gpu.sm_count)
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    return CUDA_SUCCESS;
}

/* The checks under the lock (counted as fn), then the one kernel entry. */
static CUresult launch(int fn, const launch_t *l, CUfunction hf, CUstream hStream)
{
    fc_func_t *f;
    FC_BEGIN(fn, 1);
    res = check_unlocked(l, hf, &f);
    fc_unlock();
    return res == CUDA_SUCCESS ? fakecuda_launch(hStream, -1) : res;
done:
    fc_unlock();
    return res;
}

static void dims(launch_t *l, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                 unsigned bz, unsigned smem)
{
    *l = (launch_t){{gx, gy, gz}, {bx, by, bz}, smem, 0, {0, 0, 0}, 0, 0};
}

FC_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX,
                                       unsigned int blockDimY, unsigned int blockDimZ,
                                       unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra)
{
    launch_t l;
    dims(&l, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes);
    l.has_params = kernelParams != NULL;
    l.has_extra = extra != NULL;
    return launch(FN_cuLaunchKernel, &l, f, hStream);
}

FC_API CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                  unsigned int gridDimY, unsigned int gridDimZ,
                                                  unsigned int blockDimX, unsigned int blockDimY,
                                                  unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void **kernelParams)
{
    launch_t l;
    dims(&l, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes);
    l.cooperative = 1;
    l.has_params = kernelParams != NULL;
    return launch(FN_cuLaunchCooperativeKernel, &l, f, hStream);
}

/* A CUlaunchConfig's dimensions and attributes; INVALID_VALUE if malformed. */
static CUresult from_config(const CUlaunchConfig *config, launch_t *l)
{
    if (!config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    dims(l, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
         config->blockDimY, config->blockDimZ, config->sharedMemBytes);
    for (unsigned i = 0; i < config->numAttrs; i++) {
        const CUlaunchAttribute *a = &config->attrs[i];
        if ((unsigned)a->id > FC_LAUNCH_ATTR_LAST)
            return CUDA_ERROR_INVALID_VALUE;
        if (a->id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
            l->cooperative = a->value.cooperative != 0;
        } else if (a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            l->cluster[0] = a->value.clusterDim.x;
            l->cluster[1] = a->value.clusterDim.y;
            l->cluster[2] = a->value.clusterDim.z;
            if (!l->cluster[0] || !l->cluster[1] || !l->cluster[2])
                return CUDA_ERROR_INVALID_CLUSTER_SIZE;
        }
    }
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                         void **kernelParams, void **extra)
{
    launch_t l;
    CUresult bad = from_config(config, &l);
    if (bad != CUDA_SUCCESS) { /* still counted, and after the cuInit rule */
        FC_BEGIN(FN_cuLaunchKernelEx, 1);
        res = bad;
        FC_END();
    }
    l.has_params = kernelParams != NULL;
    l.has_extra = extra != NULL;
    return launch(FN_cuLaunchKernelEx, &l, f, config->hStream);
}

/* Clusters of the config's size that fit on the device at once: blocks per
 * SM times SMs, in whole clusters (GPC boundaries not modelled). */
FC_API CUresult CUDAAPI cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func,
                                                     const CUlaunchConfig *config)
{
    launch_t l;
    CUresult bad = numClusters ? from_config(config, &l) : CUDA_ERROR_INVALID_VALUE;
    FC_BEGIN(FN_cuOccupancyMaxActiveClusters, 1);
    fc_func_t *f;
    if (bad != CUDA_SUCCESS)
        FC_FAIL(bad);
    if ((res = fc_func_lookup_unlocked(func, &f)) != CUDA_SUCCESS)
        goto done;
    unsigned size = 1;
    int given = l.cluster[0] || l.cluster[1] || l.cluster[2];
    for (int d = 0; d < 3; d++) {
        unsigned c = given ? l.cluster[d] : (unsigned)(f->cluster[d] ? f->cluster[d] : 1);
        size *= c;
    }
    if (fc.gpu.cc_major < 9 ||
        size > (unsigned)(f->non_portable ? FC_MAX_CLUSTER_NON_PORTABLE : FC_MAX_CLUSTER_PORTABLE))
        FC_FAIL(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    int threads = (int)(l.block[0] * l.block[1] * l.block[2]);
    if (threads <= 0 || threads > fc_func_max_threads(f) || l.smem > (unsigned)f->max_dyn_shared) {
        *numClusters = 0;
    } else {
        long blocks = (long)fc_func_blocks_per_sm(f, threads, l.smem) * fc.gpu.sm_count;
        *numClusters = (int)(blocks / (long)size);
    }
    FC_END();
}
