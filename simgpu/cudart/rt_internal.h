/*
 * rt_internal.h - state shared by the files of the fake CUDA runtime
 * (libcudart.so.N over the fake driver libcuda.so.1).
 *
 * The runtime keeps almost nothing itself: devices, contexts, memory,
 * streams, events, stream captures and graphs live in the fake driver, so
 * driver-level and runtime-level handles are the same objects and the
 * accounting is in one place (the driver's report; the per-thread capture
 * mode is the driver's too). What the runtime keeps is per thread: the
 * current device, the last error and the launch configuration stack
 * (autograd runs on its own threads, so none of this may be process-wide).
 *
 * Rules every entry point follows:
 *   - the first thing it does is SIM_ENTRY("name") (call counting);
 *   - a call that needs a context calls rt_ctx() first, which makes the
 *     current device's primary context current in this thread, as the real
 *     runtime does (retaining it the first time);
 *   - every error it returns goes through rt_err(), which records it as the
 *     thread's last error (cudaGetLastError returns and clears it; nothing
 *     is sticky, because nothing runs that could corrupt a context).
 */
#ifndef GPUMEM_SIM_RT_INTERNAL_H
#define GPUMEM_SIM_RT_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "rt_api.h"
#include "simcommon.h"

#define RT_API SIM_API

/* Records e as the calling thread's last error unless it is cudaSuccess;
 * returns e. */
cudaError_t rt_err(cudaError_t e);
/* The runtime error for a driver result (the codes coincide), recorded. */
cudaError_t rt_cu(CUresult r);

/* cuInit once per process; cudaSuccess, or the error every call returns
 * (cudaErrorNoDevice, cudaErrorInitializationError). Not recorded. */
cudaError_t rt_init(void);
int rt_device_count(void);
int rt_current_device(void);
/* Valid device ordinal? */
int rt_valid_device(int dev);
/* Make the current device's primary context current in this thread. The
 * result is not recorded; callers pass it to rt_err. */
cudaError_t rt_ctx(void);
/* Same for a given device, without changing the current device. */
cudaError_t rt_ctx_for(int dev);
/* The primary context of dev (retaining it the first time), or NULL. */
CUcontext rt_primary_ctx(int dev);

/* Per-thread default stream handling for the _ptsz/_ptds entry points:
 * stream 0 there means the per-thread stream. */
static inline cudaStream_t rt_ptsz(cudaStream_t s) { return s ? s : cudaStreamPerThread; }

/* rt_ctx, then the driver call; both errors recorded. */
#define RT_WITH_CTX(call)                                                   \
    do {                                                                    \
        cudaError_t e_ = rt_ctx();                                          \
        if (e_ != cudaSuccess)                                              \
            return rt_err(e_);                                              \
        return rt_cu(call);                                                 \
    } while (0)

/* An entry point and its _ptsz twin (stream 0 there means the per-thread
 * stream), both calling name##_impl with a variable named `stream`. */
#define RT_PTSZ_PAIR(name, call_args, decl_args)                            \
    RT_API cudaError_t CUDARTAPI name decl_args                             \
    {                                                                       \
        SIM_ENTRY(#name);                                                   \
        return name##_impl call_args;                                       \
    }                                                                       \
    RT_API cudaError_t CUDARTAPI name##_ptsz decl_args                      \
    {                                                                       \
        SIM_ENTRY(#name "_ptsz");                                           \
        stream = rt_ptsz(stream);                                           \
        return name##_impl call_args;                                       \
    }

/* The fake driver's kernel launch (simgpu/driver/fakecuda_timeline.c):
 * checks hStream and puts the kernel's work on its timeline; cycles >= 0
 * for torch's _sleep kernel, -1 for any other. */
CUresult fakecuda_launch(CUstream hStream, long long cycles);

/* rt_symbol.c: the host copy of a __device__ variable registered with
 * __cudaRegisterVar (allocated on first use), or NULL; how many are
 * registered. */
void *rt_symbol_address(const void *symbol, size_t *size);
uint64_t rt_symbol_count(void);
/* rt_launch.c: counters for the report. */
void rt_launch_report(sim_sb_t *sb);
/* rt_host.c: pinned host memory's counters for the report; whether p lies
 * in pinned or registered host memory (1, with the device it was pinned
 * on in *device) or not (0). */
void rt_host_report(sim_sb_t *sb);
int rt_host_device(const void *p, int *device);

#endif /* GPUMEM_SIM_RT_INTERNAL_H */
