/*
 * blas.c - the fake libcublas.so.N: handles and their settings (stream,
 * workspace, math, pointer and atomics modes, SM count target), versions,
 * status strings, and the host<->device vector/matrix copies, which really
 * copy (except in the driver's no-host-memory mode). Every BLAS routine
 * (GEMM, GEMV, batched, Ex, ...) is a generated NOOP stub (see the .syms
 * file): it checks that its first argument is a live handle and returns
 * CUBLAS_STATUS_SUCCESS without touching memory.
 * What does not take a handle and is not here answers
 * CUBLAS_STATUS_NOT_SUPPORTED and is logged once.
 *
 * cublasCreate allocates no device memory (the real library allocates a
 * small amount of its own); the workspace PyTorch sets with
 * cublasSetWorkspace comes from PyTorch's allocator and is accounted there.
 */
#include "blas_api.h"
#include "simcommon.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>


struct cublasContext {
    unsigned int magic;
    cudaStream_t stream;
    void *workspace;
    size_t workspace_size;
    cublasMath_t math;
    cublasPointerMode_t pointer_mode;
    cublasAtomicsMode_t atomics;
    int sm_count_target;
#if SIM_CUDA_MAJOR >= 13
    cublasEmulationStrategy_t emulation;
#endif
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct cublasContext **live; /* every handle not yet destroyed */
static size_t nlive, caplive;
static uint64_t created;

static long find_live(const void *h)
{
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == h)
            return (long)i;
    return -1;
}

/* The handle check of the generated NOOP stubs; never dereferences h
 * unless it is a live handle. */
int sim_lib_check_handle(void *h)
{
    pthread_mutex_lock(&mu);
    long i = find_live(h);
    pthread_mutex_unlock(&mu);
    return i >= 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* For the fake libcublasLt, which accepts our handles as its own. */
SIM_API int gpumem_sim_cublas_is_handle(const void *handle)
{
    return sim_lib_check_handle((void *)handle) == CUBLAS_STATUS_SUCCESS;
}

#define CHECK_HANDLE(h)                                                     \
    do {                                                                    \
        if (sim_lib_check_handle(h) != CUBLAS_STATUS_SUCCESS)               \
            return CUBLAS_STATUS_NOT_INITIALIZED;                           \
    } while (0)

SIM_API cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
    SIM_ENTRY("cublasCreate_v2");
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasContext *c = calloc(1, sizeof *c);
    if (!c)
        return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = 0x63624c53u;
    c->sm_count_target = 0;
    pthread_mutex_lock(&mu);
    if (nlive == caplive) {
        size_t cap = caplive ? caplive * 2 : 16;
        struct cublasContext **v = realloc(live, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&mu);
            free(c);
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
        live = v;
        caplive = cap;
    }
    live[nlive++] = c;
    created++;
    pthread_mutex_unlock(&mu);
    *handle = c;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
    SIM_ENTRY("cublasDestroy_v2");
    pthread_mutex_lock(&mu);
    long i = find_live(handle);
    if (i >= 0)
        live[i] = live[--nlive];
    pthread_mutex_unlock(&mu);
    if (i < 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    SIM_ENTRY("cublasGetVersion_v2");
    CHECK_HANDLE(handle);
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = SIM_CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetProperty(libraryPropertyType type, int *value)
{
    SIM_ENTRY("cublasGetProperty");
    return (cublasStatus_t)sim_blas_property(type, value);
}

SIM_API size_t CUBLASWINAPI cublasGetCudartVersion(void)
{
    SIM_ENTRY("cublasGetCudartVersion");
    return SIM_CUDART_VERSION;
}

SIM_API const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status)
{
    SIM_ENTRY("cublasGetStatusName");
    return sim_blas_status_name(status);
}

SIM_API const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
    SIM_ENTRY("cublasGetStatusString");
    return sim_blas_status_string(status);
}

/* ---- settings: stored, and read back by the getters ---- */

SIM_API cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                                          size_t workspaceSizeInBytes)
{
    SIM_ENTRY("cublasSetWorkspace_v2");
    CHECK_HANDLE(handle);
    if (workspaceSizeInBytes && !workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_size = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    SIM_ENTRY("cublasSetStream_v2");
    CHECK_HANDLE(handle);
    handle->stream = streamId;
    /* documented: setting a stream resets the workspace to the default */
    handle->workspace = NULL;
    handle->workspace_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId)
{
    SIM_ENTRY("cublasGetStream_v2");
    CHECK_HANDLE(handle);
    if (!streamId)
        return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetPointerMode_v2(cublasHandle_t handle,
                                                            cublasPointerMode_t *mode)
{
    SIM_ENTRY("cublasGetPointerMode_v2");
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetPointerMode_v2(cublasHandle_t handle,
                                                            cublasPointerMode_t mode)
{
    SIM_ENTRY("cublasSetPointerMode_v2");
    CHECK_HANDLE(handle);
    if ((unsigned)mode > CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode)
{
    SIM_ENTRY("cublasGetAtomicsMode");
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->atomics;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode)
{
    SIM_ENTRY("cublasSetAtomicsMode");
    CHECK_HANDLE(handle);
    if ((unsigned)mode > CUBLAS_ATOMICS_ALLOWED)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->atomics = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    SIM_ENTRY("cublasGetMathMode");
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

/* Any combination of the documented mode and flag bits is stored. */
SIM_API cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    SIM_ENTRY("cublasSetMathMode");
    CHECK_HANDLE(handle);
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetSmCountTarget(cublasHandle_t handle, int *smCountTarget)
{
    SIM_ENTRY("cublasGetSmCountTarget");
    CHECK_HANDLE(handle);
    if (!smCountTarget)
        return CUBLAS_STATUS_INVALID_VALUE;
    *smCountTarget = handle->sm_count_target;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetSmCountTarget(cublasHandle_t handle, int smCountTarget)
{
    SIM_ENTRY("cublasSetSmCountTarget");
    CHECK_HANDLE(handle);
    if (smCountTarget < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->sm_count_target = smCountTarget;
    return CUBLAS_STATUS_SUCCESS;
}

#if SIM_CUDA_MAJOR >= 13
SIM_API cublasStatus_t CUBLASWINAPI cublasGetEmulationStrategy(cublasHandle_t handle,
                                                               cublasEmulationStrategy_t *emulationStrategy)
{
    SIM_ENTRY("cublasGetEmulationStrategy");
    CHECK_HANDLE(handle);
    if (!emulationStrategy)
        return CUBLAS_STATUS_INVALID_VALUE;
    *emulationStrategy = handle->emulation;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetEmulationStrategy(cublasHandle_t handle,
                                                               cublasEmulationStrategy_t emulationStrategy)
{
    SIM_ENTRY("cublasSetEmulationStrategy");
    CHECK_HANDLE(handle);
    handle->emulation = emulationStrategy;
    return CUBLAS_STATUS_SUCCESS;
}
#endif

/* ---- logging: accepted, nothing is ever logged ---- */

SIM_API cublasStatus_t CUBLASWINAPI cublasLoggerConfigure(int logIsOn, int logToStdOut,
                                                          int logToStdErr, const char *logFileName)
{
    SIM_ENTRY("cublasLoggerConfigure");
    (void)logIsOn, (void)logToStdOut, (void)logToStdErr, (void)logFileName;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasLogCallback log_callback;

SIM_API cublasStatus_t CUBLASWINAPI cublasSetLoggerCallback(cublasLogCallback userCallback)
{
    SIM_ENTRY("cublasSetLoggerCallback");
    log_callback = userCallback;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetLoggerCallback(cublasLogCallback *userCallback)
{
    SIM_ENTRY("cublasGetLoggerCallback");
    if (!userCallback)
        return CUBLAS_STATUS_INVALID_VALUE;
    *userCallback = log_callback;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- vector and matrix copies (device memory is host memory) ----
 * In the driver's no-host-memory mode pieces above its limit move no data
 * (Note [No host memory] in ../driver/fakecuda_nohost.c): Set* stores
 * nothing, Get* writes zeros to the host. */

/* One piece of a copy: drop 1 for Set*, 2 for Get*, when the copy as a
 * whole moves no data; else 0. */
static void move(void *dst, const void *src, size_t n, int drop)
{
    if (!drop)
        memmove(dst, src, n);
    else if (drop == 2)
        memset(dst, 0, n);
}

static int drop_of(size_t total, int to_device)
{
    return sim_no_host_memory_drops(total) ? (to_device ? 1 : 2) : 0;
}

static cublasStatus_t strided_copy(int n, int elemSize, const void *x, int incx, void *y, int incy,
                                   int to_device)
{
    if (n < 0 || elemSize <= 0 || incx == 0 || incy == 0 || !x || !y)
        return CUBLAS_STATUS_INVALID_VALUE;
    const char *src = x;
    char *dst = y;
    int drop = drop_of((size_t)n * (size_t)elemSize, to_device);
    for (long i = 0; i < n; i++)
        move(dst + i * (long)incy * elemSize, src + i * (long)incx * elemSize, (size_t)elemSize,
             drop);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t matrix_copy(int rows, int cols, int elemSize, const void *A, int lda, void *B,
                                  int ldb, int to_device)
{
    if (rows < 0 || cols < 0 || elemSize <= 0 || lda <= 0 || ldb <= 0 || lda < rows ||
        ldb < rows || !A || !B)
        return CUBLAS_STATUS_INVALID_VALUE;
    int drop = drop_of((size_t)rows * (size_t)cols * (size_t)elemSize, to_device);
    for (long c = 0; c < cols; c++)
        move((char *)B + c * (long)ldb * elemSize, (const char *)A + c * (long)lda * elemSize,
             (size_t)rows * (size_t)elemSize, drop);
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetVector(int n, int elemSize, const void *x, int incx,
                                                    void *devicePtr, int incy)
{
    SIM_ENTRY("cublasSetVector");
    return strided_copy(n, elemSize, x, incx, devicePtr, incy, 1);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetVector(int n, int elemSize, const void *x, int incx,
                                                    void *y, int incy)
{
    SIM_ENTRY("cublasGetVector");
    return strided_copy(n, elemSize, x, incx, y, incy, 0);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetVectorAsync(int n, int elemSize, const void *hostPtr,
                                                         int incx, void *devicePtr, int incy,
                                                         cudaStream_t stream)
{
    SIM_ENTRY("cublasSetVectorAsync");
    (void)stream;
    return strided_copy(n, elemSize, hostPtr, incx, devicePtr, incy, 1);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetVectorAsync(int n, int elemSize, const void *devicePtr,
                                                         int incx, void *hostPtr, int incy,
                                                         cudaStream_t stream)
{
    SIM_ENTRY("cublasGetVectorAsync");
    (void)stream;
    return strided_copy(n, elemSize, devicePtr, incx, hostPtr, incy, 0);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetMatrix(int rows, int cols, int elemSize, const void *A,
                                                    int lda, void *B, int ldb)
{
    SIM_ENTRY("cublasSetMatrix");
    return matrix_copy(rows, cols, elemSize, A, lda, B, ldb, 1);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetMatrix(int rows, int cols, int elemSize, const void *A,
                                                    int lda, void *B, int ldb)
{
    SIM_ENTRY("cublasGetMatrix");
    return matrix_copy(rows, cols, elemSize, A, lda, B, ldb, 0);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasSetMatrixAsync(int rows, int cols, int elemSize,
                                                         const void *A, int lda, void *B, int ldb,
                                                         cudaStream_t stream)
{
    SIM_ENTRY("cublasSetMatrixAsync");
    (void)stream;
    return matrix_copy(rows, cols, elemSize, A, lda, B, ldb, 1);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasGetMatrixAsync(int rows, int cols, int elemSize,
                                                         const void *A, int lda, void *B, int ldb,
                                                         cudaStream_t stream)
{
    SIM_ENTRY("cublasGetMatrixAsync");
    (void)stream;
    return matrix_copy(rows, cols, elemSize, A, lda, B, ldb, 0);
}

/* ---- report ---- */

SIM_API int gpumem_sim_cublas_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    sim_sb_printf(&sb, "{\"library\": \"%s\", ", sim_table.soname);
    sim_report_calls(&sb);
    pthread_mutex_lock(&mu);
    sim_sb_printf(&sb, ", \"handles\": {\"created\": %llu, \"live\": %zu}}", (unsigned long long)created,
                  nlive);
    pthread_mutex_unlock(&mu);
    return sim_sb_finish(&sb, buf, len);
}
