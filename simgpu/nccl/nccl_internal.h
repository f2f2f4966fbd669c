/*
 * nccl_internal.h - what the fake NCCL's files share: the communicator,
 * its registry, the last-error text, CUDA error mapping and the API macro.
 *
 * Ranks are separate processes that never talk to each other: a
 * communicator is what one rank knows (size, rank, device), and every
 * operation is checked as NCCL checks it and then put on its stream as one
 * kernel (no data moves). See simgpu/README.md, "NCCL".
 */
#ifndef GPUMEM_SIM_NCCL_INTERNAL_H
#define GPUMEM_SIM_NCCL_INTERNAL_H

#include "cuda_min.h"
#include "nccl_api.h"
#include "simcommon.h"

#define NCCL_API SIM_API
/* NCCL exports every ncclX also as pncclX (the profiling interface). */
#define NCCL_ALIAS(name) \
    extern __typeof(name) p##name __attribute__((alias(#name), visibility("default")))

#define NCCL_COMM_MAGIC 0x6e63636c53494dULL /* "ncclSIM" */
#define NCCL_MAX_USER_OPS 64

struct ncclComm {
    uint64_t magic;
    int nranks, rank, cudaDev;
    int blocking;
    int finalized;
    CUcontext ctx;             /* the device's primary context, retained */
    CUdeviceptr buffers;       /* NCCL's own device memory (nccl_mem.c) */
    size_t buffer_bytes;
    unsigned char user_ops[NCCL_MAX_USER_OPS]; /* 1 = PreMulSum op live */
    struct ncclComm *next;
};

/* Registry of live communicators (nccl_comm.c); never dereference a comm
 * that nc_comm_check did not accept. */
ncclResult_t nc_comm_check(ncclComm_t comm, const char *fn);

/* The thread's last error text (ncclGetLastError); returns code. */
ncclResult_t nc_fail(ncclResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A failed driver call: ncclUnhandledCudaError with the driver's text. */
ncclResult_t nc_cuda_fail(CUresult r, const char *what);

/* NCCL's device memory per communicator (nccl_mem.c). */
size_t nc_comm_buffer_bytes(int nranks);
ncclResult_t nc_charge(struct ncclComm *c);
void nc_release(struct ncclComm *c);


/* Exported by the fake libcuda.so.1: one kernel on the stream's timeline. */
extern unsigned long long nc_ops_launched;

CUresult fakecuda_launch(CUstream hStream, long long cycles);

#endif /* GPUMEM_SIM_NCCL_INTERNAL_H */
