/*
 * cudnn_internal.h - what the files of the fake libcudnn.so.9 share: the
 * registry of live objects, the per-thread last error, the legacy
 * descriptor structs and the backend descriptor object model.
 *
 * Invariants: every object handed to a caller (handle, legacy descriptor,
 * backend descriptor) is in the registry from its create to its destroy, and
 * a pointer is dereferenced only after sim_dnn_live() said it is live with
 * the expected kind. Finalized backend descriptors never point at other
 * descriptors: what they need from the descriptors they were given is
 * copied (a problem summary, shared by reference count), so destroying
 * descriptors in any order is safe, as with NVIDIA's library.
 *
 * Must not: compute anything (kernels are no-ops on the simulator) or
 * allocate device memory: workspaces come from the caller.
 */
#ifndef GPUMEM_SIM_CUDNN_INTERNAL_H
#define GPUMEM_SIM_CUDNN_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "cudnn_api.h"
#include "simcommon.h"

/* ---- registry (cudnn_handle.c); protected by its own mutex ---- */
enum {
    SIM_DNN_HANDLE = 1, SIM_DNN_TENSOR, SIM_DNN_FILTER, SIM_DNN_CONV, SIM_DNN_ACTIVATION,
    SIM_DNN_DROPOUT, SIM_DNN_BACKEND,
};
int sim_dnn_register(const void *p, int kind);   /* 0, or -1 when out of memory */
void sim_dnn_unregister(const void *p);
int sim_dnn_live(const void *p, int kind);       /* 1 if p is a live object of kind */
size_t sim_dnn_live_count(int kind);

/* Records a one-line reason as the thread's last error (cudnnGetLastErrorString)
 * and returns status. */
cudnnStatus_t sim_dnn_fail(cudnnStatus_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* CUDNN_STATUS_SUCCESS for a live handle, else BAD_PARAM (recorded). */
cudnnStatus_t sim_dnn_check_handle(cudnnHandle_t handle, const char *fn);
size_t sim_dnn_dtype_size(int dtype); /* bytes per element; 0 for an unknown type */

/* ---- legacy descriptors (cudnn_legacy_desc.c) ---- */
struct cudnnTensorStruct {
    int set; /* a Set call succeeded */
    cudnnDataType_t dtype;
    int nd;
    int dims[SIM_CUDNN_DIM_MAX], strides[SIM_CUDNN_DIM_MAX];
};
struct cudnnFilterStruct {
    int set;
    cudnnDataType_t dtype;
    cudnnTensorFormat_t format;
    int nd;
    int dims[SIM_CUDNN_DIM_MAX];
};
struct cudnnConvolutionStruct {
    int set;
    int nspatial, groups;
    int pad[SIM_CUDNN_DIM_MAX], stride[SIM_CUDNN_DIM_MAX], dilation[SIM_CUDNN_DIM_MAX];
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};
struct cudnnActivationStruct {
    cudnnActivationMode_t mode;
    cudnnNanPropagation_t nan;
    double coef;
};
struct cudnnDropoutStruct {
    float dropout;
    void *states;
    size_t state_size;
    unsigned long long seed;
};
cudnnStatus_t sim_dnn_tensor(const struct cudnnTensorStruct *t, const char *fn);
cudnnStatus_t sim_dnn_filter(const struct cudnnFilterStruct *f, const char *fn);
int64_t sim_dnn_tensor_bytes(const struct cudnnTensorStruct *t);

/* ---- convolution arithmetic (cudnn_conv_shape.c) ---- */
enum { SIM_CONV_FWD = 0, SIM_CONV_BWD_DATA = 1, SIM_CONV_BWD_FILTER = 2 };
typedef struct sim_conv_geom {
    int nspatial;
    int64_t x[SIM_CUDNN_DIM_MAX], w[SIM_CUDNN_DIM_MAX], y[SIM_CUDNN_DIM_MAX]; /* N C spatial.. */
    int64_t pre[SIM_CUDNN_DIM_MAX], post[SIM_CUDNN_DIM_MAX];
    int64_t stride[SIM_CUDNN_DIM_MAX], dilation[SIM_CUDNN_DIM_MAX];
    int64_t groups; /* 0: derive from x and w */
    size_t elem;    /* bytes per element of x */
} sim_conv_geom_t;
/* Checks x, w, y against each other as cuDNN does (y's spatial sizes follow
 * from x, w, paddings, strides and dilations); fills g->groups.
 * CUDNN_STATUS_SUCCESS or BAD_PARAM_SHAPE_MISMATCH (recorded). */
cudnnStatus_t sim_conv_check(sim_conv_geom_t *g);
/* Output dims of a forward convolution; 0, or -1 when they are not positive. */
int sim_conv_out_dims(const sim_conv_geom_t *g, int64_t *y);
/* Workspace of conv engine/algorithm `engine` (0..SIM_CONV_ENGINES-1) for
 * direction dir: Note [cuDNN workspace sizes] in cudnn_conv_shape.c. */
#define SIM_CONV_ENGINES 3
int64_t sim_conv_workspace(const sim_conv_geom_t *g, int dir, int engine);

/* ---- backend descriptors (cudnn_backend_desc.c) ---- */
#define SIM_MAX_ENGINES 4

/* What a finalized operation graph boils down to; immutable, shared by
 * reference count between the graph and every heuristics result, engine,
 * engine config and plan derived from it. */
typedef struct sim_problem {
    atomic_int refs;
    int kind;            /* SIM_PROB_* */
    int nengines;        /* OPERATIONGRAPH_ENGINE_GLOBAL_COUNT */
    int64_t ws[SIM_MAX_ENGINES];
    unsigned notes[SIM_MAX_ENGINES]; /* bit n: numerical note n */
    int heur[SIM_MAX_ENGINES], nheur; /* heuristics (INSTANT/A/B) order */
    int fallback[SIM_MAX_ENGINES], nfallback;
    int64_t nuids;       /* non-virtual tensors the variant pack must bind */
    int64_t uids[];
} sim_problem_t;
enum { SIM_PROB_CONV = 1, SIM_PROB_GENERIC = 2 };

typedef struct sim_attr {
    int name, type;
    int64_t count;
    unsigned char *data; /* count * element size */
} sim_attr_t;

typedef struct sim_bdesc {
    int type;             /* cudnnBackendDescriptorType_t */
    int finalized;
    sim_attr_t *attrs;
    int nattrs, cap;
    sim_problem_t *prob;  /* graph and everything derived from it; an op's own part */
    int64_t engine;       /* engine, engine config, plan */
    int64_t ws;           /* plan */
    int64_t virt;         /* tensor: IS_VIRTUAL; op: conv direction */
} sim_bdesc_t;

size_t sim_battr_elem_size(int type);
const sim_attr_t *sim_battr_find(const sim_bdesc_t *d, int name);
/* Stores (replacing) an attribute; CUDNN_STATUS_SUCCESS or an error. */
cudnnStatus_t sim_battr_store(sim_bdesc_t *d, int name, int type, int64_t count, const void *data);
/* One INT64 (or a narrower integer type) attribute value; `dflt` if unset. */
int64_t sim_battr_int(const sim_bdesc_t *d, int name, int64_t dflt);
/* The live backend descriptor stored as attribute `name` (element i), or NULL. */
sim_bdesc_t *sim_battr_desc(const sim_bdesc_t *d, int name, int64_t i);
sim_bdesc_t *sim_bdesc_live(cudnnBackendDescriptor_t p);
void sim_problem_unref(sim_problem_t *p);
sim_problem_t *sim_problem_ref(sim_problem_t *p);

/* ---- finalize rules (cudnn_backend_finalize.c, cudnn_backend_graph.c) ---- */
cudnnStatus_t sim_bdesc_finalize(sim_bdesc_t *d);
cudnnStatus_t sim_graph_finalize(sim_bdesc_t *d);
cudnnStatus_t sim_conv_op_finalize(sim_bdesc_t *d);
cudnnStatus_t sim_generic_op_finalize(sim_bdesc_t *d);
/* ---- derived attributes (cudnn_backend_engine.c) ---- */
/* 1 if (d, name) is computed rather than stored; then *st holds the result. */
int sim_engine_get(sim_bdesc_t *d, int name, int type, int64_t requested, int64_t *count,
                   void *array, cudnnStatus_t *st);
cudnnStatus_t sim_engine_finalize(sim_bdesc_t *d);

/* ---- counters for the report (cudnn_handle.c); updated atomically ---- */
extern atomic_ullong sim_dnn_executions, sim_dnn_plans;

#endif /* GPUMEM_SIM_CUDNN_INTERNAL_H */
