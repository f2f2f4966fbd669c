/*
 * blaslt.c - the fake libcublasLt.so.N: handles, matmul / layout /
 * preference / transform descriptors (attributes are stored and read
 * back), algorithm heuristics, and cublasLtMatmul, which does nothing.
 *
 * PyTorch throws unless cublasLtMatmulAlgoGetHeuristic offers at least one
 * algorithm whose workspace fits the preference's
 * CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES; the fake always offers exactly
 * one, needing no workspace. Everything else cuBLASLt exports answers
 * CUBLAS_STATUS_NOT_SUPPORTED and is logged once (generated stubs).
 */
#include "blas_api.h"
#include "simcommon.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LT_MAGIC 0x744c5347u /* "GSLt" */
#define LT_MAX_ATTRS 64
#define LT_ATTR_BYTES 64

enum { KIND_HANDLE = 1, KIND_MATMUL, KIND_LAYOUT, KIND_PREF, KIND_TRANSFORM };

/* Every handle and descriptor the fake hands out is one of these. */
typedef struct lt_obj {
    unsigned int magic;
    int kind;
    int nattrs;
    struct {
        int id;
        size_t size;
        unsigned char val[LT_ATTR_BYTES];
    } attrs[LT_MAX_ATTRS];
} lt_obj_t;

static uint64_t n_created[KIND_TRANSFORM + 1], n_destroyed[KIND_TRANSFORM + 1];

static cublasStatus_t obj_create(void **out, int kind)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    lt_obj_t *o = calloc(1, sizeof *o);
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    o->magic = LT_MAGIC;
    o->kind = kind;
    __atomic_fetch_add(&n_created[kind], 1, __ATOMIC_RELAXED);
    *out = o;
    return CUBLAS_STATUS_SUCCESS;
}

static lt_obj_t *obj_get(const void *p, int kind)
{
    lt_obj_t *o = (lt_obj_t *)p;
    return o && o->magic == LT_MAGIC && o->kind == kind ? o : NULL;
}

/* Live handles (never dereferenced before they are found here: a bad handle
 * must give NOT_INITIALIZED, not a crash). Descriptors are checked by
 * their magic only, like the real library trusts its descriptors. */
static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static const void **handles;
static size_t nhandles, caphandles;

static int handle_index(const void *p)
{
    for (size_t i = 0; i < nhandles; i++)
        if (handles[i] == p)
            return (int)i;
    return -1;
}

/* A cuBLASLt handle: one of ours, or a live handle of the fake libcublas. */
static int is_handle(const void *p)
{
    pthread_mutex_lock(&handles_mu);
    int ours = handle_index(p) >= 0;
    pthread_mutex_unlock(&handles_mu);
    if (ours || !p)
        return ours;
    static int (*cublas_is_handle)(const void *);
    if (!cublas_is_handle)
        cublas_is_handle = (int (*)(const void *))dlsym(RTLD_DEFAULT, "gpumem_sim_cublas_is_handle");
    return cublas_is_handle && cublas_is_handle(p);
}

static cublasStatus_t obj_destroy(void *p, int kind)
{
    lt_obj_t *o = obj_get(p, kind);
    if (!o)
        return kind == KIND_HANDLE ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_INVALID_VALUE;
    o->magic = 0;
    free(o);
    __atomic_fetch_add(&n_destroyed[kind], 1, __ATOMIC_RELAXED);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t attr_set(void *p, int kind, int id, const void *buf, size_t size)
{
    lt_obj_t *o = obj_get(p, kind);
    if (!o || !buf || size == 0 || size > LT_ATTR_BYTES)
        return CUBLAS_STATUS_INVALID_VALUE;
    int i = 0;
    while (i < o->nattrs && o->attrs[i].id != id)
        i++;
    if (i == o->nattrs) {
        if (o->nattrs == LT_MAX_ATTRS)
            return CUBLAS_STATUS_INVALID_VALUE;
        o->nattrs++;
    }
    o->attrs[i].id = id;
    o->attrs[i].size = size;
    memset(o->attrs[i].val, 0, LT_ATTR_BYTES);
    memcpy(o->attrs[i].val, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

/* As documented: buf NULL and size 0 only ask for the size. An attribute
 * never set reads as zeros of the requested size. */
static cublasStatus_t attr_get(const void *p, int kind, int id, void *buf, size_t size,
                               size_t *written)
{
    const lt_obj_t *o = obj_get(p, kind);
    if (!o)
        return CUBLAS_STATUS_INVALID_VALUE;
    int i = 0;
    while (i < o->nattrs && o->attrs[i].id != id)
        i++;
    size_t have = i < o->nattrs ? o->attrs[i].size : size;
    if (written)
        *written = have;
    if (!buf && size == 0)
        return written ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    if (!buf || size < have || size > LT_ATTR_BYTES)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(buf, 0, size);
    if (i < o->nattrs)
        memcpy(buf, o->attrs[i].val, have);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- handles, versions, status strings ---- */

SIM_API cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    SIM_ENTRY("cublasLtCreate");
    cublasStatus_t s = obj_create((void **)lightHandle, KIND_HANDLE);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    pthread_mutex_lock(&handles_mu);
    if (nhandles == caphandles) {
        size_t cap = caphandles ? caphandles * 2 : 16;
        const void **v = realloc(handles, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&handles_mu);
            obj_destroy(*lightHandle, KIND_HANDLE);
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
        handles = v;
        caphandles = cap;
    }
    handles[nhandles++] = *lightHandle;
    pthread_mutex_unlock(&handles_mu);
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    SIM_ENTRY("cublasLtDestroy");
    pthread_mutex_lock(&handles_mu);
    int i = handle_index(lightHandle);
    if (i >= 0)
        handles[i] = handles[--nhandles];
    pthread_mutex_unlock(&handles_mu);
    if (i < 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    return obj_destroy(lightHandle, KIND_HANDLE);
}

SIM_API size_t CUBLASWINAPI cublasLtGetVersion(void)
{
    SIM_ENTRY("cublasLtGetVersion");
    return SIM_CUBLAS_VERSION;
}

SIM_API size_t CUBLASWINAPI cublasLtGetCudartVersion(void)
{
    SIM_ENTRY("cublasLtGetCudartVersion");
    return SIM_CUDART_VERSION;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int *value)
{
    SIM_ENTRY("cublasLtGetProperty");
    return (cublasStatus_t)sim_blas_property(type, value);
}

SIM_API const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status)
{
    SIM_ENTRY("cublasLtGetStatusName");
    return sim_blas_status_name(status);
}

SIM_API const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status)
{
    SIM_ENTRY("cublasLtGetStatusString");
    return sim_blas_status_string(status);
}

/* ---- descriptors ---- */

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                             cublasComputeType_t computeType,
                                                             cudaDataType_t scaleType)
{
    SIM_ENTRY("cublasLtMatmulDescCreate");
    cublasStatus_t s = obj_create((void **)matmulDesc, KIND_MATMUL);
    if (s == CUBLAS_STATUS_SUCCESS) {
        int32_t ct = (int32_t)computeType, st = (int32_t)scaleType;
        attr_set(*matmulDesc, KIND_MATMUL, 0 /* COMPUTE_TYPE */, &ct, sizeof ct);
        attr_set(*matmulDesc, KIND_MATMUL, 1 /* SCALE_TYPE */, &st, sizeof st);
    }
    return s;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    SIM_ENTRY("cublasLtMatmulDescDestroy");
    return obj_destroy(matmulDesc, KIND_MATMUL);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                                   cublasLtMatmulDescAttributes_t attr,
                                                                   const void *buf, size_t sizeInBytes)
{
    SIM_ENTRY("cublasLtMatmulDescSetAttribute");
    return attr_set(matmulDesc, KIND_MATMUL, (int)attr, buf, sizeInBytes);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                                   cublasLtMatmulDescAttributes_t attr,
                                                                   void *buf, size_t sizeInBytes,
                                                                   size_t *sizeWritten)
{
    SIM_ENTRY("cublasLtMatmulDescGetAttribute");
    return attr_get(matmulDesc, KIND_MATMUL, (int)attr, buf, sizeInBytes, sizeWritten);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                               cudaDataType type, uint64_t rows,
                                                               uint64_t cols, int64_t ld)
{
    SIM_ENTRY("cublasLtMatrixLayoutCreate");
    cublasStatus_t s = obj_create((void **)matLayout, KIND_LAYOUT);
    if (s == CUBLAS_STATUS_SUCCESS) {
        uint32_t t = (uint32_t)type;
        attr_set(*matLayout, KIND_LAYOUT, 0 /* TYPE */, &t, sizeof t);
        attr_set(*matLayout, KIND_LAYOUT, 2 /* ROWS */, &rows, sizeof rows);
        attr_set(*matLayout, KIND_LAYOUT, 3 /* COLS */, &cols, sizeof cols);
        attr_set(*matLayout, KIND_LAYOUT, 4 /* LD */, &ld, sizeof ld);
    }
    return s;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    SIM_ENTRY("cublasLtMatrixLayoutDestroy");
    return obj_destroy(matLayout, KIND_LAYOUT);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                                     cublasLtMatrixLayoutAttribute_t attr,
                                                                     const void *buf, size_t sizeInBytes)
{
    SIM_ENTRY("cublasLtMatrixLayoutSetAttribute");
    return attr_set(matLayout, KIND_LAYOUT, (int)attr, buf, sizeInBytes);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                                     cublasLtMatrixLayoutAttribute_t attr,
                                                                     void *buf, size_t sizeInBytes,
                                                                     size_t *sizeWritten)
{
    SIM_ENTRY("cublasLtMatrixLayoutGetAttribute");
    return attr_get(matLayout, KIND_LAYOUT, (int)attr, buf, sizeInBytes, sizeWritten);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    SIM_ENTRY("cublasLtMatmulPreferenceCreate");
    return obj_create((void **)pref, KIND_PREF);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    SIM_ENTRY("cublasLtMatmulPreferenceDestroy");
    return obj_destroy(pref, KIND_PREF);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t sizeInBytes)
{
    SIM_ENTRY("cublasLtMatmulPreferenceSetAttribute");
    return attr_set(pref, KIND_PREF, (int)attr, buf, sizeInBytes);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void *buf,
    size_t sizeInBytes, size_t *sizeWritten)
{
    SIM_ENTRY("cublasLtMatmulPreferenceGetAttribute");
    return attr_get(pref, KIND_PREF, (int)attr, buf, sizeInBytes, sizeWritten);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixTransformDescCreate(
    cublasLtMatrixTransformDesc_t *transformDesc, cudaDataType scaleType)
{
    SIM_ENTRY("cublasLtMatrixTransformDescCreate");
    cublasStatus_t s = obj_create((void **)transformDesc, KIND_TRANSFORM);
    if (s == CUBLAS_STATUS_SUCCESS) {
        int32_t st = (int32_t)scaleType;
        attr_set(*transformDesc, KIND_TRANSFORM, 0 /* SCALE_TYPE */, &st, sizeof st);
    }
    return s;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixTransformDescDestroy(
    cublasLtMatrixTransformDesc_t transformDesc)
{
    SIM_ENTRY("cublasLtMatrixTransformDescDestroy");
    return obj_destroy(transformDesc, KIND_TRANSFORM);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixTransformDescSetAttribute(
    cublasLtMatrixTransformDesc_t transformDesc, cublasLtMatrixTransformDescAttributes_t attr,
    const void *buf, size_t sizeInBytes)
{
    SIM_ENTRY("cublasLtMatrixTransformDescSetAttribute");
    return attr_set(transformDesc, KIND_TRANSFORM, (int)attr, buf, sizeInBytes);
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixTransformDescGetAttribute(
    cublasLtMatrixTransformDesc_t transformDesc, cublasLtMatrixTransformDescAttributes_t attr,
    void *buf, size_t sizeInBytes, size_t *sizeWritten)
{
    SIM_ENTRY("cublasLtMatrixTransformDescGetAttribute");
    return attr_get(transformDesc, KIND_TRANSFORM, (int)attr, buf, sizeInBytes, sizeWritten);
}

/* ---- algorithms ---- */

static void fill_result(cublasLtMatmulHeuristicResult_t *r, const cublasLtMatmulAlgo_t *algo)
{
    memset(r, 0, sizeof *r);
    if (algo)
        r->algo = *algo;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    SIM_ENTRY("cublasLtMatmulAlgoGetHeuristic");
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!obj_get(operationDesc, KIND_MATMUL) || !obj_get(Adesc, KIND_LAYOUT) ||
        !obj_get(Bdesc, KIND_LAYOUT) || !obj_get(Cdesc, KIND_LAYOUT) ||
        !obj_get(Ddesc, KIND_LAYOUT) || !obj_get(preference, KIND_PREF) ||
        requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulAlgo_t algo;
    memset(&algo, 0, sizeof algo);
    fill_result(&heuristicResultsArray[0], &algo);
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetIds(
    cublasLtHandle_t lightHandle, cublasComputeType_t computeType, cudaDataType_t scaleType,
    cudaDataType_t Atype, cudaDataType_t Btype, cudaDataType_t Ctype, cudaDataType_t Dtype,
    int requestedAlgoCount, int algoIdsArray[], int *returnAlgoCount)
{
    SIM_ENTRY("cublasLtMatmulAlgoGetIds");
    (void)computeType, (void)scaleType, (void)Atype, (void)Btype, (void)Ctype, (void)Dtype;
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount < 1 || !algoIdsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    algoIdsArray[0] = 0;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoInit(
    cublasLtHandle_t lightHandle, cublasComputeType_t computeType, cudaDataType_t scaleType,
    cudaDataType_t Atype, cudaDataType_t Btype, cudaDataType_t Ctype, cudaDataType_t Dtype,
    int algoId, cublasLtMatmulAlgo_t *algo)
{
    SIM_ENTRY("cublasLtMatmulAlgoInit");
    (void)computeType, (void)scaleType, (void)Atype, (void)Btype, (void)Ctype, (void)Dtype;
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!algo || algoId < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(algo, 0, sizeof *algo);
    algo->data[0] = (uint64_t)algoId;
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *result)
{
    SIM_ENTRY("cublasLtMatmulAlgoCheck");
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!obj_get(operationDesc, KIND_MATMUL) || !obj_get(Adesc, KIND_LAYOUT) ||
        !obj_get(Bdesc, KIND_LAYOUT) || !obj_get(Cdesc, KIND_LAYOUT) ||
        !obj_get(Ddesc, KIND_LAYOUT) || !algo || !result)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulAlgo_t copy = *algo; /* algo may point into result */
    fill_result(result, &copy);
    return CUBLAS_STATUS_SUCCESS;
}

/* The algorithm id lives in data[0]; other configuration attributes are
 * accepted and read back as 0. */
SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigSetAttribute(
    cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void *buf,
    size_t sizeInBytes)
{
    SIM_ENTRY("cublasLtMatmulAlgoConfigSetAttribute");
    if (!algo || !buf || sizeInBytes == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_ALGO_CONFIG_ID) {
        int32_t id = 0;
        memcpy(&id, buf, sizeInBytes < sizeof id ? sizeInBytes : sizeof id);
        algo->data[0] = (uint64_t)id;
    }
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr, void *buf,
    size_t sizeInBytes, size_t *sizeWritten)
{
    SIM_ENTRY("cublasLtMatmulAlgoConfigGetAttribute");
    if (!algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t need = attr == CUBLASLT_ALGO_CONFIG_ID ? sizeof(int32_t) : sizeInBytes;
    if (sizeWritten)
        *sizeWritten = need;
    if (!buf && sizeInBytes == 0)
        return sizeWritten ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    if (!buf || sizeInBytes < need)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(buf, 0, sizeInBytes);
    if (attr == CUBLASLT_ALGO_CONFIG_ID) {
        int32_t id = (int32_t)algo->data[0];
        memcpy(buf, &id, sizeof id);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the operations: no-ops ---- */

static uint64_t n_matmuls;

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha, const void *A,
    cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
    const void *C, cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
    cudaStream_t stream)
{
    SIM_ENTRY("cublasLtMatmul");
    (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)D, (void)algo, (void)workspace;
    (void)workspaceSizeInBytes, (void)stream;
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!obj_get(computeDesc, KIND_MATMUL) || !obj_get(Adesc, KIND_LAYOUT) ||
        !obj_get(Bdesc, KIND_LAYOUT) || !obj_get(Cdesc, KIND_LAYOUT) || !obj_get(Ddesc, KIND_LAYOUT))
        return CUBLAS_STATUS_INVALID_VALUE;
    __atomic_fetch_add(&n_matmuls, 1, __ATOMIC_RELAXED);
    return CUBLAS_STATUS_SUCCESS;
}

SIM_API cublasStatus_t CUBLASWINAPI cublasLtMatrixTransform(
    cublasLtHandle_t lightHandle, cublasLtMatrixTransformDesc_t transformDesc, const void *alpha,
    const void *A, cublasLtMatrixLayout_t Adesc, const void *beta, const void *B,
    cublasLtMatrixLayout_t Bdesc, void *C, cublasLtMatrixLayout_t Cdesc, cudaStream_t stream)
{
    SIM_ENTRY("cublasLtMatrixTransform");
    (void)alpha, (void)A, (void)Adesc, (void)beta, (void)B, (void)Bdesc, (void)C, (void)stream;
    if (!is_handle(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!obj_get(transformDesc, KIND_TRANSFORM) || !obj_get(Cdesc, KIND_LAYOUT))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- report ---- */

SIM_API int gpumem_sim_cublaslt_report_json(char *buf, size_t len)
{
    static const char *const kinds[] = {"", "handles", "matmul_descs", "layouts", "preferences",
                                        "transform_descs"};
    sim_sb_t sb = {0};
    sim_sb_printf(&sb, "{\"library\": \"%s\", ", sim_table.soname);
    sim_report_calls(&sb);
    sim_sb_printf(&sb, ", \"matmuls\": %llu, \"live\": {",
                  (unsigned long long)__atomic_load_n(&n_matmuls, __ATOMIC_RELAXED));
    for (int k = KIND_HANDLE; k <= KIND_TRANSFORM; k++)
        sim_sb_printf(&sb, "%s\"%s\": %lld", k == KIND_HANDLE ? "" : ", ", kinds[k],
                      (long long)(__atomic_load_n(&n_created[k], __ATOMIC_RELAXED) -
                                  __atomic_load_n(&n_destroyed[k], __ATOMIC_RELAXED)));
    sim_sb_printf(&sb, "}}");
    return sim_sb_finish(&sb, buf, len);
}
