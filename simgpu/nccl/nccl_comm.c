/*
 * nccl_comm.c - the fake NCCL's communicators: version, unique ids,
 * ncclCommInitRank[Config] / InitAll / Split / Finalize / Destroy / Abort,
 * the queries (Count, CuDevice, UserRank, GetAsyncError, MemStats), error
 * strings and the last-error text, and the report.
 *
 * Ranks never talk to each other. ncclCommInitRank returns at once with a
 * communicator that knows its size, rank and device; it does not wait for
 * the other ranks (a real NCCL blocks in its bootstrap until all nranks
 * have joined). ncclCommSplit cannot learn how many ranks chose the same
 * colour: the new communicator keeps the parent's size and rank, which is
 * right when every rank passes the same colour (torch's new_group over all
 * ranks) and wrong for true subgroups. Every communicator is in a registry,
 * so a destroyed or foreign handle is rejected, never dereferenced.
 */
#include "nccl_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live;
static unsigned long long n_created, n_destroyed, n_ids;
static __thread char last_error[512];

ncclResult_t nc_fail(ncclResult_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    sim_log("nccl: %s", last_error);
    return code;
}

ncclResult_t nc_cuda_fail(CUresult r, const char *what)
{
    const char *s = NULL;
    if (cuGetErrorString(r, &s) != CUDA_SUCCESS || !s)
        s = "unknown error";
    return nc_fail(ncclUnhandledCudaError, "%s: Cuda failure %d '%s'", what, (int)r, s);
}

/* Stubs (names not simulated) answer ncclInvalidUsage and say so. */
void sim_lib_on_unsupported(int code)
{
    (void)code;
    nc_fail(ncclInvalidUsage, "this NCCL function is not supported by gpumem's simulated NCCL");
}

ncclResult_t nc_comm_check(ncclComm_t comm, const char *fn)
{
    if (!comm)
        return nc_fail(ncclInvalidArgument, "%s : comm argument is NULL", fn);
    pthread_mutex_lock(&mu);
    struct ncclComm *c = live;
    while (c && c != comm)
        c = c->next;
    pthread_mutex_unlock(&mu);
    if (!c || c->magic != NCCL_COMM_MAGIC)
        return nc_fail(ncclInvalidArgument, "%s : comm %p is not a live communicator", fn,
                         (void *)comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGetVersion(int *version)
{
    SIM_ENTRY("ncclGetVersion");
    if (!version)
        return nc_fail(ncclInvalidArgument, "ncclGetVersion : version argument is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
NCCL_ALIAS(ncclGetVersion);

NCCL_API const char *ncclGetErrorString(ncclResult_t code)
{
    SIM_ENTRY("ncclGetErrorString");
    switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "NCCL operation timed out";
    default: return "unknown result code";
    }
}
NCCL_ALIAS(ncclGetErrorString);

NCCL_API const char *ncclGetLastError(ncclComm_t comm)
{
    SIM_ENTRY("ncclGetLastError");
    (void)comm; /* as in NCCL: the text is not per communicator */
    return last_error;
}
NCCL_ALIAS(ncclGetLastError);

/* 128 bytes: "gpumem-sim-nccl\0", then the process id, a counter and the
 * time, so two ids never compare equal; torch passes them through its store. */
NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    SIM_ENTRY("ncclGetUniqueId");
    if (!id)
        return nc_fail(ncclInvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "gpumem-sim-nccl", 16);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t words[4] = {(uint64_t)getpid(), __atomic_add_fetch(&n_ids, 1, __ATOMIC_RELAXED),
                         (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec};
    memcpy(id->internal + 16, words, sizeof words);
    return ncclSuccess;
}
NCCL_ALIAS(ncclGetUniqueId);

/* The device NCCL uses: the calling thread's current one (cudaGetDevice). */
static ncclResult_t current_device(int *dev)
{
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS)
        return nc_cuda_fail(r, "cuInit");
    CUcontext ctx = NULL;
    CUdevice d = 0;
    if (cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx && cuCtxGetDevice(&d) == CUDA_SUCCESS)
        *dev = (int)d;
    else
        *dev = 0; /* the runtime's default device */
    return ncclSuccess;
}

static ncclResult_t check_config(const ncclConfig_t *config, int *blocking, const char *fn)
{
    const char *env = getenv("NCCL_COMM_BLOCKING");
    *blocking = env && *env ? atoi(env) != 0 : 1;
    if (!config)
        return ncclSuccess;
    if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize))
        return nc_fail(ncclInvalidArgument,
                         "%s : the configuration was not initialised with NCCL_CONFIG_INITIALIZER", fn);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (config->blocking != 0 && config->blocking != 1)
            return nc_fail(ncclInvalidArgument, "%s : blocking %d must be 0 or 1", fn,
                             config->blocking);
        *blocking = config->blocking;
    }
    return ncclSuccess;
}

static ncclResult_t comm_create(ncclComm_t *out, int nranks, int rank, int dev, int blocking)
{
    int ndev = 0;
    CUresult r = cuDeviceGetCount(&ndev);
    if (r != CUDA_SUCCESS)
        return nc_cuda_fail(r, "cuDeviceGetCount");
    if (dev < 0 || dev >= ndev)
        return nc_fail(ncclInvalidArgument, "invalid device %d (%d devices)", dev, ndev);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return nc_fail(ncclSystemError, "out of host memory");
    c->magic = NCCL_COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->cudaDev = dev;
    c->blocking = blocking;
    ncclResult_t res = nc_charge(c);
    if (res != ncclSuccess) {
        free(c);
        return res;
    }
    pthread_mutex_lock(&mu);
    c->next = live;
    live = c;
    n_created++;
    pthread_mutex_unlock(&mu);
    *out = c;
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, int rank, ncclConfig_t *config,
                              const char *fn)
{
    if (!comm)
        return nc_fail(ncclInvalidArgument, "%s : comm argument is NULL", fn);
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return nc_fail(ncclInvalidArgument, "%s : invalid rank requested : %d/%d", fn, rank,
                         nranks);
    int blocking = 1, dev = 0;
    ncclResult_t r = check_config(config, &blocking, fn);
    if (r == ncclSuccess)
        r = current_device(&dev);
    return r == ncclSuccess ? comm_create(comm, nranks, rank, dev, blocking) : r;
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    SIM_ENTRY("ncclCommInitRank");
    (void)commId;
    return init_rank(comm, nranks, rank, NULL, "ncclCommInitRank");
}
NCCL_ALIAS(ncclCommInitRank);

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                             int rank, ncclConfig_t *config)
{
    SIM_ENTRY("ncclCommInitRankConfig");
    (void)commId;
    return init_rank(comm, nranks, rank, config, "ncclCommInitRankConfig");
}
NCCL_ALIAS(ncclCommInitRankConfig);

/* Several roots' ids (NCCL spreads the bootstrap of large jobs): the ids
 * carry nothing the fake needs, so only their count and pointer are checked. */
NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId *commIds, ncclConfig_t *config)
{
    SIM_ENTRY("ncclCommInitRankScalable");
    if (nId < 1 || !commIds)
        return nc_fail(ncclInvalidArgument, "ncclCommInitRankScalable : invalid nId %d or ids %p",
                       nId, (void *)commIds);
    return init_rank(newcomm, nranks, myrank, config, "ncclCommInitRankScalable");
}
NCCL_ALIAS(ncclCommInitRankScalable);

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    SIM_ENTRY("ncclCommInitAll");
    if (!comms)
        return nc_fail(ncclInvalidArgument, "ncclCommInitAll : comms argument is NULL");
    if (ndev < 1)
        return nc_fail(ncclInvalidArgument, "ncclCommInitAll : invalid ndev %d", ndev);
    if (devlist)
        for (int i = 0; i < ndev; i++)
            for (int j = 0; j < i; j++)
                if (devlist[i] == devlist[j])
                    return nc_fail(ncclInvalidUsage, "ncclCommInitAll : duplicate device %d",
                                     devlist[i]);
    int blocking;
    ncclResult_t r = check_config(NULL, &blocking, "ncclCommInitAll");
    for (int i = 0; i < ndev && r == ncclSuccess; i++) {
        r = comm_create(&comms[i], ndev, i, devlist ? devlist[i] : i, blocking);
        if (r != ncclSuccess) {
            for (int j = 0; j < i; j++)
                ncclCommDestroy(comms[j]);
            for (int j = 0; j < ndev; j++)
                comms[j] = NULL;
        }
    }
    return r;
}
NCCL_ALIAS(ncclCommInitAll);

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                    ncclConfig_t *config)
{
    SIM_ENTRY("ncclCommSplit");
    (void)key;
    ncclResult_t r = nc_comm_check(comm, "ncclCommSplit");
    if (r != ncclSuccess)
        return r;
    if (!newcomm)
        return nc_fail(ncclInvalidArgument, "ncclCommSplit : newcomm argument is NULL");
    if (color < NCCL_SPLIT_NOCOLOR)
        return nc_fail(ncclInvalidArgument, "ncclCommSplit : invalid color %d", color);
    *newcomm = NULL;
    int blocking;
    if ((r = check_config(config, &blocking, "ncclCommSplit")) != ncclSuccess)
        return r;
    if (!config)
        blocking = comm->blocking; /* inherited from the parent */
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    return comm_create(newcomm, comm->nranks, comm->rank, comm->cudaDev, blocking);
}
NCCL_ALIAS(ncclCommSplit);

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    SIM_ENTRY("ncclCommFinalize");
    ncclResult_t r = nc_comm_check(comm, "ncclCommFinalize");
    if (r != ncclSuccess)
        return r;
    if (comm->finalized)
        return nc_fail(ncclInvalidUsage, "ncclCommFinalize : comm %p is already finalized",
                         (void *)comm);
    comm->finalized = 1; /* operations complete in stream order: nothing to flush */
    return ncclSuccess;
}
NCCL_ALIAS(ncclCommFinalize);

static ncclResult_t comm_end(ncclComm_t comm, const char *fn)
{
    if (!comm)
        return ncclSuccess; /* NCCL: destroying or aborting NULL is a no-op */
    pthread_mutex_lock(&mu);
    struct ncclComm **pp = &live;
    while (*pp && *pp != comm)
        pp = &(*pp)->next;
    int found = *pp != NULL;
    if (found) {
        *pp = comm->next;
        n_destroyed++;
    }
    pthread_mutex_unlock(&mu);
    if (!found)
        return nc_fail(ncclInvalidArgument, "%s : comm %p is not a live communicator", fn,
                         (void *)comm);
    nc_release(comm);
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    SIM_ENTRY("ncclCommDestroy");
    return comm_end(comm, "ncclCommDestroy");
}
NCCL_ALIAS(ncclCommDestroy);

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    SIM_ENTRY("ncclCommAbort");
    return comm_end(comm, "ncclCommAbort");
}
NCCL_ALIAS(ncclCommAbort);

/* ------------------------------------------------------------------ */
/* queries                                                              */

#define QUERY(fn, arg, value)                                                        \
    do {                                                                             \
        ncclResult_t r_ = nc_comm_check(comm, fn);                                 \
        if (r_ != ncclSuccess)                                                       \
            return r_;                                                               \
        if (!(arg))                                                                  \
            return nc_fail(ncclInvalidArgument, "%s : " #arg " argument is NULL", fn); \
        *(arg) = (value);                                                            \
        return ncclSuccess;                                                          \
    } while (0)

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    SIM_ENTRY("ncclCommCount");
    QUERY("ncclCommCount", count, comm->nranks);
}
NCCL_ALIAS(ncclCommCount);

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    SIM_ENTRY("ncclCommCuDevice");
    QUERY("ncclCommCuDevice", device, comm->cudaDev);
}
NCCL_ALIAS(ncclCommCuDevice);

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    SIM_ENTRY("ncclCommUserRank");
    QUERY("ncclCommUserRank", rank, comm->rank);
}
NCCL_ALIAS(ncclCommUserRank);

/* Initialisation completes inside the call, blocking or not, and nothing
 * fails later: every communicator reports ncclSuccess. */
NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    SIM_ENTRY("ncclCommGetAsyncError");
    QUERY("ncclCommGetAsyncError", asyncError, ncclSuccess);
}
NCCL_ALIAS(ncclCommGetAsyncError);

NCCL_API ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value)
{
    SIM_ENTRY("ncclCommMemStats");
    ncclResult_t r = nc_comm_check(comm, "ncclCommMemStats");
    if (r != ncclSuccess)
        return r;
    if (!value)
        return nc_fail(ncclInvalidArgument, "ncclCommMemStats : value argument is NULL");
    switch (stat) {
    case ncclStatGpuMemSuspend: *value = 0; break;   /* nothing can be suspended */
    case ncclStatGpuMemSuspended: *value = 0; break;
    case ncclStatGpuMemPersist:
    case ncclStatGpuMemTotal: *value = comm->buffer_bytes; break;
    default: return nc_fail(ncclInvalidArgument, "ncclCommMemStats : invalid stat %d", (int)stat);
    }
    return ncclSuccess;
}
NCCL_ALIAS(ncclCommMemStats);

/* ------------------------------------------------------------------ */
/* report                                                               */

SIM_API int gpumem_sim_nccl_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    pthread_mutex_lock(&mu);
    size_t n_live = 0, bytes = 0;
    for (struct ncclComm *c = live; c; c = c->next) {
        n_live++;
        bytes += c->buffer_bytes;
    }
    sim_sb_printf(&sb, "{\"library\": \"libnccl.so.2\", \"version\": %d, \"comms_created\": %llu, "
                  "\"comms_destroyed\": %llu, \"comms_live\": %zu, \"buffer_bytes_live\": %zu, "
                  "\"ops_launched\": %llu, ",
                  NCCL_VERSION_CODE, n_created, n_destroyed, n_live, bytes,
                  __atomic_load_n(&nc_ops_launched, __ATOMIC_RELAXED));
    pthread_mutex_unlock(&mu);
    sim_report_calls(&sb);
    sim_sb_printf(&sb, "}");
    return sim_sb_finish(&sb, buf, len);
}
