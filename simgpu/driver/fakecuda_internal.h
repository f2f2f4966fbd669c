/*
 * fakecuda_internal.h - state shared by the files of the fake CUDA driver.
 *
 * The fake is a libcuda.so.1 over host memory for gpumem's tests (see
 * README.md). One mutex (fc.mu) protects every field of `fc`; every exported
 * cu* function takes it for its whole duration through FC_BEGIN/FC_END, so
 * helpers named *_unlocked expect it held. The current-context stack is
 * thread-local and needs no lock.
 *
 * Handles (streams, events, VMM allocation handles) are opaque numbers built
 * from a per-process counter that never repeats, so a destroyed handle can
 * never become valid again and a double destroy is always detected. They are
 * never dereferenced. Contexts are the only handles that are real pointers
 * (one static primary context per device).
 *
 * Must not: export anything but the cu* and fakecuda_* entry points listed in
 * libcuda.map, or call back into an exported cu* function while holding the
 * lock (the mutex is not recursive).
 */
#ifndef FAKECUDA_INTERNAL_H
#define FAKECUDA_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "simjson.h"
#include "fakecuda_image.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef FAKECUDA_USE_CUDA_H
#include <cuda.h>
/* cuda.h turns the legacy names into macros for the versioned ones. The fake
 * also exports the legacy names whose prototype is identical, so undo those
 * macros and declare the legacy functions as the real library has them. */
#undef cuDeviceGetUuid
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuStreamWriteValue32
#else
#include "cuda_min.h"
#endif

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx);
CUresult CUDAAPI cuStreamDestroy(CUstream hStream);
CUresult CUDAAPI cuEventDestroy(CUevent hEvent);
/* torch 2.6 looks it up by this name with dlsym (its DriverAPI list,
 * c10/cuda/driver_api.h), and asserts it exists. */
CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                      unsigned int flags);
/* CUDA 12's capture query, still exported by a CUDA 13 driver; cuda.h
 * declares it only for the driver's own build. */
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out,
                                           size_t *numDependencies_out);

#define FC_API __attribute__((visibility("default")))

/* Every exported cu* function, in the order the report lists them. The
 * failure-injection spec names functions by these exported names. */
#define FC_FUNCS(X)                                                         \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)      \
    X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem_v2)       \
    X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDevicePrimaryCtxRetain)    \
    X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2)            \
    X(cuDevicePrimaryCtxGetState) X(cuDevicePrimaryCtxReset)                \
    X(cuDevicePrimaryCtxReset_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent)     \
    X(cuCtxPushCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent)           \
    X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) X(cuCtxSynchronize)             \
    X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetInfo_v2) X(cuMemcpyHtoD_v2)  \
    X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2) X(cuStreamCreate) X(cuStreamDestroy)\
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamQuery)           \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventDestroy_v2) X(cuEventRecord)\
    X(cuEventQuery) X(cuEventSynchronize) X(cuMemAddressReserve)            \
    X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap)          \
    X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity)        \
    X(cuGetErrorName) X(cuGetErrorString)                                   \
    /* copies, memsets, pointer queries (fakecuda_copy.c) */                 \
    X(cuMemcpy) X(cuMemcpyAsync) X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2) \
    X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyPeer)        \
    X(cuMemcpyPeerAsync) X(cuMemsetD8Async) X(cuMemsetD32_v2)               \
    X(cuMemsetD32Async) X(cuPointerGetAttribute) X(cuMemGetAddressRange_v2) \
    X(cuStreamWriteValue32_v2) X(cuStreamWriteValue32)                      \
    X(cuMemGetAllocationPropertiesFromHandle)    \
    /* streams and events, runtime-level (fakecuda_sync.c, _event.c) */    \
    X(cuCtxGetStreamPriorityRange) X(cuStreamCreateWithPriority)            \
    X(cuStreamGetPriority) X(cuStreamGetFlags) X(cuStreamGetId)             \
    X(cuStreamGetDevice) X(cuStreamWaitEvent) X(cuEventRecordWithFlags)     \
    X(cuEventElapsedTime_v2)                                                \
    /* exported so that torch's libcaffe2_nvrtc.so loads; NOT_SUPPORTED     \
     * (fakecuda_stubs.c) */                                                \
    X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx)               \
    X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)              \
    X(cuLaunchCooperativeKernel) X(cuLinkCreate_v2) X(cuLinkAddData_v2)     \
    X(cuLinkComplete) X(cuFuncGetAttribute) X(cuFuncSetAttribute)           \
    X(cuFuncSetCacheConfig) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)  \
    X(cuTensorMapEncodeTiled)                                               \
    /* modules, functions, limits, launches, tensor maps for Triton and     \
     * Inductor (fakecuda_module.c, _func.c, _limit.c, _launch.c,           \
     * _tensormap.c) */                                                     \
    X(cuFuncGetName) X(cuCtxSetLimit) X(cuCtxGetLimit) X(cuLaunchKernelEx)  \
    X(cuOccupancyMaxActiveClusters) X(cuTensorMapEncodeIm2col)              \
    /* required by torch's DriverAPI (expandable segments); NOT_SUPPORTED */ \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)       \
    X(cuMemRetainAllocationHandle)                                          \
    /* stream capture (fakecuda_capture.c) and graphs (fakecuda_graph.c) */ \
    X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
    X(cuStreamGetCaptureInfo_v2) X(cuStreamGetCaptureInfo_v3)              \
    X(cuThreadExchangeStreamCaptureMode) X(cuLaunchHostFunc)                \
    X(cuGraphCreate) X(cuGraphDestroy) X(cuGraphGetNodes)                   \
    X(cuGraphNodeGetDependencies_v2) X(cuGraphInstantiateWithFlags)         \
    X(cuGraphInstantiateWithParams) X(cuGraphUpload) X(cuGraphLaunch)       \
    X(cuGraphExecDestroy) X(cuGraphExecUpdate_v2) X(cuGraphDebugDotPrint)

enum {
#define FC_ENUM(name) FN_##name,
    FC_FUNCS(FC_ENUM)
#undef FC_ENUM
    FN_COUNT
};

extern const char *const fc_func_names[FN_COUNT];

#define FC_MAX_DEVICES 16
#define FC_MAX_FAIL_RULES 64
#define FC_DRIVER_VERSION 13000
/* One past the highest CUdevice_attribute of CUDA 13.0; larger values are
 * rejected with CUDA_ERROR_INVALID_VALUE, as a 13.0 driver does. */
#define FC_ATTR_LIMIT 148

/* ---- a sorted vector of (key, pointer), the only container used ---- */
typedef struct {
    uint64_t key;
    void *val;
} fc_kv_t;

typedef struct {
    fc_kv_t *v;
    size_t n, cap;
} fc_vec_t;

size_t fc_vec_lower(const fc_vec_t *vec, uint64_t key); /* first index with v[i].key >= key */
void *fc_vec_find(const fc_vec_t *vec, uint64_t key);
int fc_vec_insert(fc_vec_t *vec, uint64_t key, void *val); /* 0 ok, -1 no memory */
void fc_vec_remove_at(fc_vec_t *vec, size_t idx);
void *fc_vec_remove(fc_vec_t *vec, uint64_t key);

/* ---- contexts and devices ---- */
#define FC_LIMIT_COUNT 10       /* CU_LIMIT_STACK_SIZE .. CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED */
typedef struct fc_device fc_device_t;
struct CUctx_st {
    int device;                 /* immutable after init */
    int refcount;               /* primary-context retains outstanding */
    /* Note [Device timeline], simulated ns; protected by fc.mu */
    uint64_t tl_legacy;         /* ready time of the legacy (and per-thread) stream */
    uint64_t tl_blocking;       /* >= every blocking stream's ready time */
    uint64_t tl_all;            /* >= every stream's ready time */
    size_t limits[FC_LIMIT_COUNT]; /* cuCtxSetLimit values; protected by fc.mu;
                                      0 in a limit never set: its default */
};

struct fc_device {
    size_t capacity;            /* immutable after init */
    struct CUctx_st ctx;        /* the primary context; &ctx is its CUcontext */
    size_t bytes_allocated;     /* live cuMemAlloc bytes */
    size_t bytes_created;       /* physical cuMemCreate bytes not yet freed */
    size_t bytes_mapped;        /* cuMemMap'ed bytes of this device's handles */
    size_t bytes_reserved;      /* cuMemAddressReserve'd bytes charged here */
    size_t bytes_context;       /* held by the active primary context */
    size_t peak_used;           /* max of fc_used() */
    size_t n_allocs, n_handles, n_phys, n_reservations, n_mappings;
    size_t n_events, n_streams;
    uint64_t va_base;           /* cuMemAlloc's address range, 0 until needed */
    size_t va_size;             /* (fakecuda_va.c, Note [Device addresses]) */
};

/* Device memory in use: allocations, physical VMM memory, and the memory an
 * active context holds (Note [Context memory] in fakecuda_ctx.c). */
static inline size_t fc_used(const fc_device_t *d)
{
    return d->bytes_allocated + d->bytes_created + d->bytes_context;
}

/* ---- tracked objects ---- */
typedef struct {
    uint64_t ptr;
    size_t size, map_size;
    int device;
} fc_alloc_t;

typedef struct {
    uint64_t handle;            /* the CUmemGenericAllocationHandle */
    int device;
    size_t size;
    uint64_t file_off;          /* backing extent in fc.memfd */
    unsigned int handle_types;  /* requestedHandleTypes of cuMemCreate */
    int released;
    size_t nmaps;
} fc_vhandle_t;

typedef struct {
    uint64_t start;
    size_t size;
    int device;                 /* device of the context that reserved it */
    size_t nmaps;
} fc_reservation_t;

typedef struct {
    uint64_t start;
    size_t size;
    fc_vhandle_t *h;
    fc_reservation_t *res;
    unsigned char access[FC_MAX_DEVICES]; /* CUmemAccess_flags per device */
} fc_mapping_t;

typedef struct {
    uint64_t handle;
    struct CUctx_st *ctx;
    unsigned int flags;
    int priority;               /* clamped into [FC_PRIO_GREATEST, FC_PRIO_LEAST] */
    uint64_t tl_ready;          /* when its enqueued work is done (timeline mode) */
} fc_stream_t;

/* Stream priorities, as an H100 reports them (cuCtxGetStreamPriorityRange). */
#define FC_PRIO_LEAST 0
#define FC_PRIO_GREATEST (-5)

/* The GPU model the device reports (fakecuda_gpu.c). */
typedef struct {
    char name[96];
    int sm_count, cc_major, cc_minor, threads_per_sm, blocks_per_sm;
    int smem_per_sm, smem_per_block_optin, l2_bytes, regs_per_sm;
    int clock_khz, mem_clock_khz, bus_bits;
    int mem_bw_gbs, pcie_gbs;   /* memory and host-link bandwidth, GB/s (one way) */
    int context_mib;            /* what an active primary context holds; 0: none */
    int context_kib;            /* the same in KiB (a measured figure); wins over context_mib */
} fc_gpu_t;

/* timeline (the default) first, so that a zeroed state means it */
enum { FC_EV_TIMELINE, FC_EV_IMMEDIATE, FC_EV_NEVER, FC_EV_AFTER };

/* The cost model of Note [Device timeline] (fakecuda_timeline.c), ns. */
#define FC_TL_HOST_CALL_NS 1000 /* host time of every driver call */
#define FC_TL_KERNEL_NS 5000    /* device time of a kernel */
#define FC_TL_COPY_NS 2000      /* fixed device time of a copy or memset */

typedef struct {
    uint64_t handle;
    struct CUctx_st *ctx;
    unsigned int flags;
    int recorded;               /* cuEventRecord was called at least once */
    int complete;               /* the captured work has finished */
    long remaining;             /* FC_EV_AFTER: NOT_READY answers left; -1: never */
    uint64_t stream_key;        /* which stream the last record captured */
    double recorded_ms;         /* CLOCK_MONOTONIC at the last record, for elapsed time */
    int timed;                  /* recorded in timeline mode: complete when host_ns >= t_ns */
    uint64_t t_ns;              /* the stream's ready time at the record (timeline) */
    /* Note [Stream capture]: last recorded in capture cap_id (0: not), with
     * the capturing stream's dependency set at the record */
    uint64_t cap_id;
    struct CUgraphNode_st **cap_deps;
    size_t cap_ndeps;
} fc_event_t;

typedef struct {
    int fn;
    uint64_t nth;
    int and_after;              /* "N+": the Nth and every later call */
    CUresult code;
} fc_fail_rule_t;

typedef struct {
    pthread_mutex_t mu;
    int config_loaded;          /* env parsed by a cuInit */
    int initialized;            /* cuInit succeeded */
    int ndev;
    size_t memory;              /* capacity per device */
    size_t context_memory;      /* what an active primary context holds (default 0) */
    fc_gpu_t gpu;               /* the model every device reports */
    size_t granularity;         /* 0: no VMM */
    size_t fail_above;          /* 0: off */
    int no_host_memory;         /* Note [No host memory]; immutable after the first cuInit */
    char *report_path;          /* malloc'ed or NULL */
    long report_pid;            /* only this process writes the report */
    int ev_mode;
    long ev_after;
    uint64_t host_ns;           /* the simulated host clock (Note [Device timeline]) */
    fc_device_t dev[FC_MAX_DEVICES];

    uint64_t calls[FN_COUNT];     /* reported; reset by fakecuda_reset_counters */
    uint64_t fail_seen[FN_COUNT]; /* "Nth call" counters; reset by set_fail too */
    fc_fail_rule_t rules[FC_MAX_FAIL_RULES];
    int nrules;
    char fail_spec[1024];

    fc_vec_t allocs;            /* key: ptr */
    fc_vec_t reservations;      /* key: start */
    fc_vec_t mappings;          /* key: start */
    fc_vec_t handles;           /* key: handle; unreleased handles only */
    fc_vec_t streams;           /* key: handle */
    fc_vec_t events;            /* key: handle */
    fc_vec_t modules;           /* key: handle (fc_module_t *) */
    fc_vec_t functions;         /* key: handle (fc_func_t *) of loaded modules */
    fc_vec_t graphs;            /* key: the CUgraph pointer (fakecuda_graph.c) */
    fc_vec_t execs;             /* key: the CUgraphExec pointer */
    fc_vec_t captures;          /* key: capture id; captures not yet ended */
    fc_vec_t capstreams;        /* key: stream key; streams taking part in one */
    uint64_t next_capture_id;   /* last capture id handed out */
    uint64_t next_id;

    int memfd;                  /* backing store of cuMemCreate; -1 until needed */
    uint64_t memfd_size;

    struct {
        size_t allocations, bytes, streams, events;
    } reclaimed;                /* freed by a primary-context reset */
} fc_state_t;

extern fc_state_t fc;

#define FC_HANDLE_STREAM 0x5717000000000000ull
#define FC_HANDLE_EVENT 0xe7e0000000000000ull
#define FC_HANDLE_MEM 0x3e30000000000000ull
#define FC_HANDLE_MODULE 0x30d0000000000000ull
#define FC_HANDLE_FUNC 0xf0c0000000000000ull

/* ---- modules and their functions (fakecuda_module.c) ---- */
typedef struct fc_module fc_module_t;
typedef struct {
    uint64_t handle;            /* the CUfunction */
    fc_module_t *mod;
    const fc_kinfo_t *k;        /* in mod->img; immutable */
    /* cuFuncSetAttribute / cuFuncSetCacheConfig; protected by fc.mu */
    int max_dyn_shared;         /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    int carveout;               /* PREFERRED_SHARED_MEMORY_CARVEOUT, -1: none */
    int cluster[3];             /* REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH, 0: none */
    int non_portable;           /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
    int sched_pref;             /* CLUSTER_SCHEDULING_POLICY_PREFERENCE */
    int cache_config;           /* CUfunc_cache */
} fc_func_t;

struct fc_module {
    uint64_t handle;            /* the CUmodule */
    struct CUctx_st *ctx;       /* loaded in; unloaded when it is reset */
    fc_image_t img;             /* immutable after load */
    fc_func_t *funcs;           /* one per kernel of img, in its order */
};

/* ---- entry/exit of every exported function ----
 * FC_BEGIN counts the call, applies failure injection and, when need_init,
 * the cuInit rule; on error it jumps to FC_END with `res` set. */
#define FC_BEGIN(fn, need_init)                                             \
    CUresult res;                                                           \
    fc_lock();                                                              \
    res = fc_enter_unlocked((fn), (need_init));                             \
    if (res != CUDA_SUCCESS)                                                \
        goto done

#define FC_FAIL(code)                                                       \
    do {                                                                    \
        res = (code);                                                       \
        goto done;                                                          \
    } while (0)

#define FC_END()                                                            \
    done:                                                                   \
    fc_unlock();                                                            \
    return res

void fc_lock(void);
void fc_unlock(void);
CUresult fc_enter_unlocked(int fn, int need_init);
CUresult fc_injected_unlocked(int fn);
/* The calling thread's current context, checked: INVALID_CONTEXT if none,
 * CONTEXT_IS_DESTROYED if its primary context was released to zero. */
CUresult fc_current_ctx_unlocked(struct CUctx_st **out);
int fc_valid_device(int dev);
void fc_note_usage_unlocked(int dev);
uint64_t fc_new_id_unlocked(void);
/* fakecuda_config.c. "80GiB", "512MiB", "2GB", "4096" -> bytes; 0 ok, -1
 * malformed. fc_load_config_unlocked reads every GPUMEM_FAKECUDA_* variable
 * into fc (all or nothing: 0, or -1 after one line on stderr). */
int fc_parse_size(const char *s, size_t *out);
int fc_load_config_unlocked(void);
/* fakecuda_gpu.c: the default model (H100 SXM5 80GB), and a GPUMEM_SIM_GPU
 * spec applied over it (0, or -1 with err set). */
void fc_gpu_default(fc_gpu_t *g);
int fc_gpu_parse(const char *spec, fc_gpu_t *g, char *err, size_t errlen);
int fc_parse_fail_spec(const char *spec, fc_fail_rule_t *rules, int *nrules, char *err,
                       size_t errlen);
void fc_set_fail_unlocked(const fc_fail_rule_t *rules, int nrules, const char *spec);

/* fakecuda_mem.c. fc_mem_over_limit_unlocked: 1 if `size` more bytes would
 * exceed dev's capacity or the GPUMEM_FAKECUDA_FAIL_ABOVE limit (the
 * allocation is then OUT_OF_MEMORY); fc_mapping_prot: the mmap protection
 * a VMM mapping's access flags give. */
void fc_mem_reset_device_unlocked(int dev);
int fc_mem_over_limit_unlocked(int dev, size_t size);
int fc_mapping_prot(const fc_mapping_t *m);
/* Is [p, p+n) device memory the device may read (write)? */
int fc_accessible_unlocked(uint64_t p, size_t n, int write);
/* If p lies in device memory (an allocation, or a VMM reservation), the
 * device and the range holding it (the allocation, or the mapping; for an
 * unmapped part of a reservation, *size is 0) and 1; otherwise 0. */
int fc_lookup_device_ptr_unlocked(uint64_t p, uint64_t *base, size_t *size, int *dev);
int fc_mem_report_leaks_unlocked(sim_sb_t *sb, int *first, int left);

/* fakecuda_nohost.c (Note [No host memory]): the data of a copy of n
 * bytes and of a memset (elem 1 or 4 bytes, n of them), the ranges already
 * checked, also replayed by graph launches. In the no-host-memory mode only
 * pieces of at most FC_NOHOST_KEEP bytes move data. */
#define FC_NOHOST_KEEP (64u << 10)
void fc_move_unlocked(uint64_t dst, uint64_t src, size_t n);
void fc_fill_unlocked(uint64_t dst, unsigned int value, size_t elem, size_t n);

/* fakecuda_spin.c (Note [Reads that wait on kernels]): a kernel launched
 * (or replayed); a device range written by a copy or memset; the data of a
 * copy moved (a small read back may then be replaced with zeros). */
void fc_spin_kernel_unlocked(void);
void fc_spin_write_unlocked(uint64_t dst, size_t n);
void fc_spin_moved_unlocked(uint64_t dst, uint64_t src, size_t n);

/* fakecuda_event.c: one poll of an event (a query: 1 when complete, which
 * may complete it), and "recorded and not complete" without polling. */
int fc_event_poll_unlocked(fc_event_t *e);
int fc_event_pending(const fc_event_t *e);

/* fakecuda_va.c: place a cuMemAlloc of size bytes on dev (0; -1 when the
 * range is full or mmap fails), and give its range back. */
int fc_va_alloc_unlocked(int dev, size_t size, uint64_t *ptr, size_t *map_size);
void fc_va_free_unlocked(uint64_t ptr, size_t map_size);

/* fakecuda_sync.c */
void fc_sync_reset_ctx_unlocked(struct CUctx_st *ctx);
/* Which stream h means (a key events remember) and its context; the
 * special streams mean the current context `cur`. INVALID_HANDLE if h is
 * not a live stream. */
CUresult fc_resolve_stream_unlocked(CUstream h, struct CUctx_st *cur, uint64_t *key,
                                    struct CUctx_st **sctx);
void fc_sync_complete_all_unlocked(void);
int fc_parse_event_mode(const char *s, int *mode, long *after);
size_t fc_sync_pending_events_unlocked(int dev);
int fc_sync_report_leaks_unlocked(sim_sb_t *sb, int *first, int left);

/* The driver's single kernel entry (exported; takes the lock itself): the
 * checks of a launch on hStream, then its work on the timeline. */
FC_API CUresult fakecuda_launch(CUstream hStream, long long cycles);

/* fakecuda_handout.c (Note [Blocks handed out]; exported; takes the lock
 * itself): a caching allocator handed [ptr, ptr+n) out; a small block reads
 * zeros until written. 0, or -1 for a range that is not writable device
 * memory. */
FC_API int fakecuda_block_handed_out(CUdeviceptr ptr, size_t n);

/* fakecuda_timeline.c (Note [Device timeline]); enqueue and copy do
 * nothing outside the timeline mode. */
uint64_t fc_tl_ready_unlocked(struct CUctx_st *ctx, uint64_t key);
void fc_tl_enqueue_unlocked(struct CUctx_st *ctx, uint64_t key, uint64_t cost_ns);
void fc_tl_wait_unlocked(struct CUctx_st *ctx, uint64_t key, uint64_t t);
void fc_tl_host_wait_unlocked(uint64_t t);
uint64_t fc_tl_kernel_ns(long long cycles);
uint64_t fc_tl_copy_ns(size_t n, int dev_dst, int dev_src);
/* A copy (src 0: a memset) on stream h of the current context; the host
 * waits for it if host_waits and host memory is involved. */
void fc_tl_copy_unlocked(CUstream h, uint64_t dst, uint64_t src, size_t n, int host_waits);

/* fakecuda_module.c: a loaded function (INVALID_HANDLE for NULL, unknown
 * or unloaded), and the unloading of a context's modules at its reset. */
CUresult fc_func_lookup_unlocked(CUfunction h, fc_func_t **out);
void fc_module_reset_ctx_unlocked(struct CUctx_st *ctx);
/* fakecuda_func.c: the most threads a block of f may have (registers,
 * .maxntid, the device), and how many blocks of it fit on one SM. */
int fc_func_max_threads(const fc_func_t *f);
int fc_func_blocks_per_sm(const fc_func_t *f, int threads, size_t dyn_smem);
/* ---- graphs (fakecuda_graph.c) and stream capture (fakecuda_capture.c) ----
 * All protected by fc.mu. A node belongs to one graph and lives until the
 * graph is destroyed; an exec holds copies of its graph's nodes. */
enum { FC_NODE_EMPTY, FC_NODE_KERNEL, FC_NODE_MEMCPY, FC_NODE_MEMSET, FC_NODE_HOST,
       FC_NODE_EVENT_RECORD, FC_NODE_EVENT_WAIT };

struct CUgraphNode_st {
    int type;                   /* FC_NODE_* */
    struct CUgraph_st *graph;   /* NULL in an exec's copy */
    size_t index;               /* position in the graph (a topological order) */
    struct CUgraphNode_st **deps;
    size_t ndeps;
    union {
        long long cycles;                                       /* KERNEL */
        struct { uint64_t dst, src; size_t n; } copy;           /* MEMCPY */
        struct { uint64_t dst; unsigned int value; size_t elem, n; } set; /* MEMSET */
        struct { CUhostFn fn; void *data; } host;              /* HOST */
        uint64_t event;                                         /* EVENT_* */
    } u;
};

struct CUgraph_st {
    struct CUgraphNode_st **nodes;
    size_t n, cap;
    uint64_t capture_id;        /* the capture recording into it, 0 if none */
};

struct CUgraphExec_st {
    struct CUgraphNode_st *nodes; /* copies, deps not kept */
    size_t n;
    unsigned long long flags;
    uint64_t launches;
};

typedef struct {
    uint64_t id;                /* nonzero, never reused */
    int mode;                   /* CUstreamCaptureMode given at begin */
    pthread_t thread;           /* the thread that began it */
    struct CUctx_st *ctx;
    uint64_t origin;            /* key of the stream it began on */
    int invalidated;
    struct CUgraph_st *graph;
} fc_capture_t;

typedef struct {                /* a stream taking part in a capture */
    uint64_t key;
    fc_capture_t *cap;
    int blocking;               /* not CU_STREAM_NON_BLOCKING */
    struct CUgraphNode_st **deps; /* what its next node depends on */
    CUgraphEdgeData *edges;     /* ndeps zeroed (default) edges */
    size_t ndeps;
} fc_capstream_t;

/* fakecuda_capture.c: the capture state */
fc_capstream_t *fc_cap_member_unlocked(uint64_t key);          /* NULL: not capturing */
fc_capture_t *fc_cap_active_unlocked(uint64_t id);              /* NULL: ended (or 0) */
/* Replace m's dependency set with a copy of deps; -1 out of memory. */
int fc_cap_set_deps(fc_capstream_t *m, struct CUgraphNode_st *const *deps, size_t n);
fc_capstream_t *fc_cap_join_unlocked(fc_capture_t *cap, uint64_t key, int blocking,
                                     struct CUgraphNode_st *const *deps, size_t n);
/* Does a blocking stream of ctx take part in a capture? Invalidates those. */
int fc_cap_implicit_unlocked(struct CUctx_st *ctx);
int fc_cap_thread_mode(void);                                   /* CUstreamCaptureMode */

struct CUgraph_st *fc_graph_new_unlocked(void);
void fc_graph_free_unlocked(struct CUgraph_st *g);
/* Appends a copy of proto depending on deps; NULL when out of memory. */
struct CUgraphNode_st *fc_graph_add_unlocked(struct CUgraph_st *g, const struct CUgraphNode_st *proto,
                                             struct CUgraphNode_st *const *deps, size_t ndeps);
int fc_graph_report_leaks_unlocked(sim_sb_t *sb, int *first, int left);

/* fakecuda_capture_rules.c. Work for stream (sctx, key): CUDA_SUCCESS and *captured = 1 if it was
 * recorded as a copy of proto (the caller must not run it), *captured = 0
 * if it is to run now; an error if the capture rules forbid it. proto NULL:
 * only the checks (synchronous calls on the legacy stream). */
CUresult fc_cap_work_unlocked(struct CUctx_st *sctx, uint64_t key, const struct CUgraphNode_st *proto,
                              int *captured);
/* A "potentially unsafe" call (cuMemAlloc, synchronous copies, ...) by this
 * thread: STREAM_CAPTURE_UNSUPPORTED (invalidating the captures that forbid
 * it) or CUDA_SUCCESS. */
CUresult fc_cap_unsafe_unlocked(void);
/* A synchronous copy or memset in context c: potentially unsafe, and on
 * the legacy stream (STREAM_CAPTURE_IMPLICIT next to a blocking capture). */
CUresult fc_cap_sync_call_unlocked(struct CUctx_st *c);
CUresult fc_cap_sync_ctx_unlocked(struct CUctx_st *c);
CUresult fc_cap_sync_stream_unlocked(struct CUctx_st *sctx, uint64_t key);
CUresult fc_cap_event_record_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key,
                                      unsigned int flags, int *captured);
CUresult fc_cap_event_wait_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key,
                                    unsigned int flags, int *captured);
/* Query or synchronise e: CAPTURED_EVENT while its capture is under way. */
CUresult fc_cap_event_use_unlocked(fc_event_t *e);
void fc_cap_event_clear(fc_event_t *e);
int fc_cap_is_capturing_unlocked(uint64_t key);
/* fakecuda_event.c: record e on (sctx, key) now, as cuEventRecord does. */
void fc_event_record_now_unlocked(fc_event_t *e, struct CUctx_st *sctx, uint64_t key);

/* report string builder (fakecuda_report.c) */
/* JSON for the report goes through simjson.h's builder (sb is a sim_sb_t *). */
/* Starts one entry of the leak "details" list: returns 1 (and writes the
 * separator) if the entry may be written, 0 once *left is used up, which
 * then becomes -1 to mark the list truncated. */
int fc_leak_slot(sim_sb_t *sb, int *first, int *left);

#endif /* FAKECUDA_INTERNAL_H */
