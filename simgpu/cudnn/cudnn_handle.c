/*
 * cudnn_handle.c - the fake libcudnn.so.9's handles, streams, versions,
 * status texts, the per-thread last error, the registry of live objects and
 * the JSON report.
 *
 * The registry is an open-addressing hash set of (pointer, kind), protected
 * by `mu`; every create adds, every destroy removes, and every API entry
 * checks its arguments against it, so a destroyed or foreign pointer is
 * answered with CUDNN_STATUS_BAD_PARAM instead of being dereferenced.
 *
 * Must not: hold `mu` while calling anything else.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudnn_internal.h"

struct cudnnContext {
    cudaStream_t stream; /* owned by the thread using the handle, as in cuDNN */
};

typedef struct {
    const void *p;
    int kind; /* 0 empty, -1 deleted */
} slot_t;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot_t *table;        /* protected by: mu */
static size_t cap, used;     /* protected by: mu; used counts live and deleted slots */
static size_t live[SIM_DNN_BACKEND + 1]; /* protected by: mu */
static unsigned long long handles_created; /* protected by: mu */
atomic_ullong sim_dnn_executions, sim_dnn_plans;

static size_t hash(const void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull); }

static slot_t *lookup_unlocked(const void *p)
{
    if (!cap)
        return NULL;
    for (size_t i = hash(p) & (cap - 1), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
        if (table[i].kind == 0)
            return NULL;
        if (table[i].kind > 0 && table[i].p == p)
            return &table[i];
    }
    return NULL;
}

static int grow_unlocked(void)
{
    size_t ncap = cap ? cap * 2 : 256;
    slot_t *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return -1;
    for (size_t i = 0; i < cap; i++) {
        if (table[i].kind <= 0)
            continue;
        size_t j = hash(table[i].p) & (ncap - 1);
        while (nt[j].kind)
            j = (j + 1) & (ncap - 1);
        nt[j] = table[i];
    }
    size_t n = 0;
    for (size_t i = 0; i < cap; i++)
        n += table[i].kind > 0;
    free(table);
    table = nt;
    cap = ncap;
    used = n;
    return 0;
}

int sim_dnn_register(const void *p, int kind)
{
    int rc = 0;
    pthread_mutex_lock(&mu);
    if ((used + 1) * 2 > cap && grow_unlocked() != 0) {
        rc = -1;
    } else {
        size_t i = hash(p) & (cap - 1);
        while (table[i].kind > 0)
            i = (i + 1) & (cap - 1);
        used += table[i].kind == 0;
        table[i].p = p;
        table[i].kind = kind;
        live[kind]++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

void sim_dnn_unregister(const void *p)
{
    pthread_mutex_lock(&mu);
    slot_t *s = lookup_unlocked(p);
    if (s) {
        live[s->kind]--;
        s->kind = -1;
    }
    pthread_mutex_unlock(&mu);
}

int sim_dnn_live(const void *p, int kind)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&mu);
    slot_t *s = lookup_unlocked(p);
    int ok = s && s->kind == kind;
    pthread_mutex_unlock(&mu);
    return ok;
}

size_t sim_dnn_live_count(int kind)
{
    pthread_mutex_lock(&mu);
    size_t n = live[kind];
    pthread_mutex_unlock(&mu);
    return n;
}

/* ---- last error ---- */
static __thread char last_error[512];

cudnnStatus_t sim_dnn_fail(cudnnStatus_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    sim_log("libcudnn.so.9: status %d: %s", (int)status, last_error);
    return status;
}

SIM_API void cudnnGetLastErrorString(char *message, size_t max_size)
{
    SIM_ENTRY("cudnnGetLastErrorString");
    if (message && max_size) {
        snprintf(message, max_size, "%s", last_error);
    }
    last_error[0] = '\0';
}

cudnnStatus_t sim_dnn_check_handle(cudnnHandle_t handle, const char *fn)
{
    if (!handle)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: handle is NULL", fn);
    if (!sim_dnn_live(handle, SIM_DNN_HANDLE))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %p is not a live cudnnHandle_t", fn,
                            (void *)handle);
    return CUDNN_STATUS_SUCCESS;
}

size_t sim_dnn_dtype_size(int dtype)
{
    switch (dtype) {
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: case CUDNN_DATA_COMPLEX_FP32: return 8;
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: case CUDNN_DATA_UINT32: return 4;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: case CUDNN_DATA_FP8_E4M3:
    case CUDNN_DATA_FP8_E5M2: case CUDNN_DATA_FP8_E8M0: case CUDNN_DATA_FAST_FLOAT_FOR_FP8: return 1;
    case CUDNN_DATA_COMPLEX_FP64: return 16;
    case CUDNN_DATA_FP4_E2M1: case CUDNN_DATA_INT4: case CUDNN_DATA_UINT4: return 1; /* packed */
    default: return 0;
    }
}

/* ---- handles ---- */
SIM_API cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    SIM_ENTRY("cudnnCreate");
    if (!handle)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate: handle is NULL");
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h || sim_dnn_register(h, SIM_DNN_HANDLE) != 0) {
        free(h);
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                            "cudnnCreate: out of host memory");
    }
    pthread_mutex_lock(&mu);
    handles_created++;
    pthread_mutex_unlock(&mu);
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    SIM_ENTRY("cudnnDestroy");
    cudnnStatus_t st = sim_dnn_check_handle(handle, "cudnnDestroy");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    sim_dnn_unregister(handle);
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
{
    SIM_ENTRY("cudnnSetStream");
    cudnnStatus_t st = sim_dnn_check_handle(handle, "cudnnSetStream");
    if (st == CUDNN_STATUS_SUCCESS)
        handle->stream = streamId;
    return st;
}

SIM_API cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId)
{
    SIM_ENTRY("cudnnGetStream");
    cudnnStatus_t st = sim_dnn_check_handle(handle, "cudnnGetStream");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!streamId)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetStream: streamId is NULL");
    *streamId = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- versions ---- */
SIM_API size_t cudnnGetVersion(void)
{
    SIM_ENTRY("cudnnGetVersion");
    return SIM_CUDNN_VERSION;
}

SIM_API size_t cudnnGetMaxDeviceVersion(void)
{
    SIM_ENTRY("cudnnGetMaxDeviceVersion");
    return SIM_CUDNN_MAX_DEVICE_VERSION;
}

SIM_API size_t cudnnGetCudartVersion(void)
{
    SIM_ENTRY("cudnnGetCudartVersion");
    return SIM_CUDART_VERSION;
}

SIM_API cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value)
{
    SIM_ENTRY("cudnnGetProperty");
    if (!value)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetProperty: value is NULL");
    switch (type) {
    case MAJOR_VERSION: *value = SIM_CUDNN_MAJOR; return CUDNN_STATUS_SUCCESS;
    case MINOR_VERSION: *value = SIM_CUDNN_MINOR; return CUDNN_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = SIM_CUDNN_PATCHLEVEL; return CUDNN_STATUS_SUCCESS;
    default:
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetProperty: unknown property %d",
                            (int)type);
    }
}

/* ---- status texts ---- */
static const struct {
    int status;
    const char *name;
} names[] = {
    {0, "CUDNN_STATUS_SUCCESS"}, {1001, "CUDNN_STATUS_NOT_INITIALIZED"},
    {1002, "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"},
    {1003, "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH"}, {1004, "CUDNN_STATUS_DEPRECATED"},
    {1005, "CUDNN_STATUS_LICENSE_ERROR"}, {1006, "CUDNN_STATUS_RUNTIME_IN_PROGRESS"},
    {1007, "CUDNN_STATUS_RUNTIME_FP_OVERFLOW"}, {1008, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"},
    {2000, "CUDNN_STATUS_BAD_PARAM"}, {2001, "CUDNN_STATUS_INVALID_VALUE"},
    {2002, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"},
    {2003, "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"},
    {2004, "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"}, {2005, "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND"},
    {2006, "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT"},
    {2007, "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH"},
    {2008, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"},
    {2009, "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES"},
    {2010, "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"},
    {2011, "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH"},
    {2012, "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE"}, {3000, "CUDNN_STATUS_NOT_SUPPORTED"},
    {3001, "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN"}, {3002, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"},
    {3003, "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE"}, {3004, "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"},
    {3005, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER"},
    {3006, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART"},
    {3007, "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"},
    {3008, "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING"},
    {3009, "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE"},
    {3010, "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT"},
    {3011, "CUDNN_STATUS_NOT_SUPPORTED_PADDING"}, {3012, "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM"},
    {3013, "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API"},
    {3014, "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"},
    {4000, "CUDNN_STATUS_INTERNAL_ERROR"}, {4001, "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED"},
    {4002, "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE"},
    {4003, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"},
    {4004, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"},
    {4005, "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM"},
    {4006, "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"},
    {5000, "CUDNN_STATUS_EXECUTION_FAILED"}, {5001, "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER"},
    {5002, "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS"}, {5003, "CUDNN_STATUS_EXECUTION_FAILED_CUDART"},
    {5004, "CUDNN_STATUS_EXECUTION_FAILED_CURAND"},
};

SIM_API const char *cudnnGetErrorString(cudnnStatus_t status)
{
    SIM_ENTRY("cudnnGetErrorString");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].status == (int)status)
            return names[i].name;
    return "CUDNN_STATUS_UNKNOWN";
}

/* Stubs answer CUDNN_STATUS_NOT_SUPPORTED; say so in the last error too. */
void sim_lib_on_unsupported(int code)
{
    sim_dnn_fail((cudnnStatus_t)code, "not implemented by the simulator's libcudnn.so.9");
}

SIM_API int gpumem_sim_cudnn_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    sim_sb_printf(&sb, "{\"library\": \"%s\", ", sim_table.soname);
    sim_report_calls(&sb);
    pthread_mutex_lock(&mu);
    sim_sb_printf(&sb, ", \"handles\": {\"created\": %llu, \"live\": %zu}", handles_created,
                  live[SIM_DNN_HANDLE]);
    sim_sb_printf(&sb, ", \"descriptors_live\": {\"backend\": %zu, \"tensor\": %zu, \"filter\": %zu, "
                  "\"convolution\": %zu}", live[SIM_DNN_BACKEND], live[SIM_DNN_TENSOR],
                  live[SIM_DNN_FILTER], live[SIM_DNN_CONV]);
    pthread_mutex_unlock(&mu);
    sim_sb_printf(&sb, ", \"plans_finalized\": %llu, \"executions\": %llu}",
                  (unsigned long long)atomic_load(&sim_dnn_plans),
                  (unsigned long long)atomic_load(&sim_dnn_executions));
    return sim_sb_finish(&sb, buf, len);
}
