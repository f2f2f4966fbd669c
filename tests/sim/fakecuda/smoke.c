/*
 * smoke.c - a plain CUDA driver API program run against the fake libcuda.so.1
 * by tests/sim/test_driver.py: linked with -l:libcuda.so.1 (to check the loader
 * prints nothing and the names cuda.h's macros produce are all exported), and
 * built with sanitizers together with the fake (to catch memory errors in it).
 *
 * It uses the un-suffixed API names, as CUDA programs do; with the real
 * cuda.h (-DUSE_CUDA_H) they become the _v2 symbols through its macros.
 * Exit status 0 means every check passed; failures print one line each.
 */
#ifdef USE_CUDA_H
#include <cuda.h>
#else
#include "cuda_min.h"
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuMemsetD8 cuMemsetD8_v2
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuDeviceGetUuid cuDeviceGetUuid_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuEventDestroy cuEventDestroy_v2
#endif

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fakecuda_report_json(char *buf, size_t len);
int fakecuda_set_fail(const char *spec);
void fakecuda_set_event_mode(const char *mode);
void fakecuda_complete_events(void);

static int failures;

#define EXPECT(call, want)                                                          \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != (want)) {                                                         \
            fprintf(stderr, "smoke.c:%d: %s returned %d, want %d\n", __LINE__, #call, \
                    (int)r_, (int)(want));                                          \
            failures++;                                                             \
        }                                                                           \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)

static CUcontext g_ctx;

static void *worker(void *arg)
{
    (void)arg;
    OK(cuCtxSetCurrent(g_ctx));
    for (int i = 0; i < 200; i++) {
        CUdeviceptr p;
        CUevent ev;
        CUstream s;
        OK(cuMemAlloc(&p, 4096 + (size_t)i));
        OK(cuMemsetD8(p, (unsigned char)i, 64));
        OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        OK(cuEventRecord(ev, s));
        OK(cuStreamSynchronize(s));
        OK(cuEventQuery(ev));
        OK(cuEventDestroy(ev));
        OK(cuStreamDestroy(s));
        OK(cuMemFree(p));
    }
    return NULL;
}

int main(void)
{
    CUdevice dev;
    int n = 0, version = 0;
    const char *str = NULL;

    EXPECT(cuMemAlloc(&(CUdeviceptr){0}, 16), CUDA_ERROR_NOT_INITIALIZED);
    OK(cuDriverGetVersion(&version));
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    OK(cuDeviceGet(&dev, 0));
    size_t total = 0;
    OK(cuDeviceTotalMem(&total, dev));
    CUuuid uuid;
    OK(cuDeviceGetUuid(&uuid, dev));
    OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &str));
    OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &str));

    OK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    OK(cuCtxPushCurrent(g_ctx));

    /* plain allocations */
    CUdeviceptr p;
    char in[64] = "fakecuda smoke", out[64] = {0};
    OK(cuMemAlloc(&p, sizeof in));
    OK(cuMemcpyHtoD(p, in, sizeof in));
    OK(cuMemcpyDtoH(out, p, sizeof out));
    if (strcmp(in, out) != 0) {
        fprintf(stderr, "smoke.c: copy round trip failed\n");
        failures++;
    }
    OK(cuMemFree(p));
    EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    size_t fr, tot;
    OK(cuMemGetInfo(&fr, &tot));

    /* VMM: map two handles back to back, release one while mapped */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (gran) {
        CUdeviceptr va;
        CUmemGenericAllocationHandle h1, h2;
        OK(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
        OK(cuMemCreate(&h1, gran, &prop, 0));
        OK(cuMemCreate(&h2, gran, &prop, 0));
        OK(cuMemMap(va, gran, 0, h1, 0));
        OK(cuMemMap(va + gran, gran, 0, h2, 0));
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = dev;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        OK(cuMemSetAccess(va, 2 * gran, &acc, 1));
        memset((void *)(uintptr_t)va, 0xab, 2 * gran); /* real host memory now */
        OK(cuMemsetD8(va + gran - 8, 0x11, 16));
        OK(cuMemRelease(h1));
        EXPECT(cuMemUnmap(va, gran / 2), CUDA_ERROR_INVALID_VALUE);
        OK(cuMemUnmap(va, 2 * gran));
        EXPECT(cuMemRelease(h1), CUDA_ERROR_INVALID_VALUE);
        OK(cuMemRelease(h2));
        OK(cuMemAddressFree(va, 4 * gran));
    }

    /* events in "after:2" mode */
    fakecuda_set_event_mode("after:2");
    CUevent ev;
    OK(cuEventCreate(&ev, CU_EVENT_DEFAULT));
    OK(cuEventRecord(ev, CU_STREAM_LEGACY));
    EXPECT(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    EXPECT(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    OK(cuEventQuery(ev));
    fakecuda_set_event_mode("immediate");
    OK(cuEventDestroy(ev));
    EXPECT(cuEventDestroy(ev), CUDA_ERROR_INVALID_HANDLE);

    /* failure injection */
    if (fakecuda_set_fail("cuMemAlloc_v2:2") != 0)
        failures++;
    CUdeviceptr a, b;
    OK(cuMemAlloc(&a, 100));
    EXPECT(cuMemAlloc(&b, 100), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemFree(a));
    fakecuda_set_fail("");

    /* threads */
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);

    CUcontext popped;
    OK(cuCtxPopCurrent(&popped));
    OK(cuDevicePrimaryCtxRelease(dev));

    int len = fakecuda_report_json(NULL, 0);
    char *rep = malloc((size_t)len + 1);
    if (!rep || fakecuda_report_json(rep, (size_t)len + 1) != len || !strstr(rep, "\"leaks\": {\"total\": 0,")) {
        fprintf(stderr, "smoke.c: report shows leaks or is inconsistent:\n%s\n", rep ? rep : "");
        failures++;
    }
    free(rep);
    if (failures == 0)
        printf("smoke ok\n");
    return failures != 0;
}
