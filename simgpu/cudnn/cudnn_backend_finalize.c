/*
 * cudnn_backend_finalize.c - what cudnnBackendFinalize checks for the
 * descriptors that describe a problem: tensors, convolutions, convolution
 * operations and the other operations, variant packs and knob choices.
 * Operation graphs are in cudnn_backend_graph.c; heuristics, engines,
 * engine configs and plans in cudnn_backend_engine.c.
 *
 * Rules follow cudnn_graph.h: required attributes must be set, referenced
 * descriptors must be finalized and of the documented type, and a
 * convolution's tensors must agree with each other (sim_conv_check).
 *
 * Must not: keep pointers to the descriptors an operation references; an
 * operation copies what its graph will need (its tensors' UIDs and, for a
 * convolution, its geometry) into its own sim_problem_t.
 */
#include <stdlib.h>
#include <string.h>

#include "cudnn_internal.h"

static cudnnStatus_t require(const sim_bdesc_t *d, const int *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!sim_battr_find(d, names[i]))
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "cudnnBackendFinalize: descriptor type %d needs attribute %d",
                                d->type, names[i]);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_tensor(sim_bdesc_t *d)
{
    static const int req[] = {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS,
                              CUDNN_ATTR_TENSOR_STRIDES, CUDNN_ATTR_TENSOR_UNIQUE_ID,
                              CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT};
    cudnnStatus_t st = require(d, req, 5);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const sim_attr_t *dims = sim_battr_find(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
    const sim_attr_t *strides = sim_battr_find(d, CUDNN_ATTR_TENSOR_STRIDES);
    if (dims->count != strides->count)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "tensor: %lld dimensions but %lld strides", (long long)dims->count,
                            (long long)strides->count);
    for (int64_t i = 0; i < dims->count; i++) {
        int64_t n, s;
        memcpy(&n, dims->data + 8 * i, 8);
        memcpy(&s, strides->data + 8 * i, 8);
        if (n <= 0 || s < 0)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "tensor: dimension %lld is %lld with stride %lld", (long long)i,
                                (long long)n, (long long)s);
    }
    if (!sim_dnn_dtype_size((int)sim_battr_int(d, CUDNN_ATTR_TENSOR_DATA_TYPE, -1)))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "tensor: unknown data type");
    int64_t align = sim_battr_int(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    if (align <= 0 || (align & (align - 1)))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "tensor: byte alignment %lld is not a power of two", (long long)align);
    d->virt = sim_battr_int(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, 0);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_convolution(sim_bdesc_t *d)
{
    static const int req[] = {CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                              CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
                              CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                              CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
                              CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_ATTR_CONVOLUTION_DILATIONS};
    cudnnStatus_t st = require(d, req, 7);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    int64_t n = sim_battr_int(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 0);
    if (n < 1 || n > SIM_CUDNN_DIM_MAX - 2)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "convolution: %lld spatial dimensions",
                            (long long)n);
    for (int i = 2; i < 6; i++)
        if (sim_battr_find(d, req[i + 1])->count != n)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "convolution: attribute %d has %lld elements for %lld spatial "
                                "dimensions", req[i + 1],
                                (long long)sim_battr_find(d, req[i + 1])->count, (long long)n);
    return CUDNN_STATUS_SUCCESS;
}

/* A finalized tensor descriptor of attribute `name`, or NULL (recorded). */
static sim_bdesc_t *tensor_of(const sim_bdesc_t *op, int name, cudnnStatus_t *st)
{
    sim_bdesc_t *t = sim_battr_desc(op, name, 0);
    if (!t || t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR || !t->finalized) {
        *st = sim_dnn_fail(t && !t->finalized ? CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED
                                              : CUDNN_STATUS_BAD_PARAM,
                           "operation type %d: attribute %d must be a finalized tensor", op->type,
                           name);
        return NULL;
    }
    return t;
}

static int64_t read_dims(const sim_bdesc_t *t, int name, int64_t *out)
{
    const sim_attr_t *a = sim_battr_find(t, name);
    memcpy(out, a->data, (size_t)a->count * 8);
    return a->count;
}

/* The operation's own problem: its non-virtual tensors' UIDs. */
static cudnnStatus_t set_uids(sim_bdesc_t *op, sim_bdesc_t *const *ts, int n)
{
    sim_problem_t *p = calloc(1, sizeof *p + (size_t)n * sizeof(int64_t));
    if (!p)
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "out of host memory");
    atomic_init(&p->refs, 1);
    for (int i = 0; i < n; i++)
        if (!ts[i]->virt)
            p->uids[p->nuids++] = sim_battr_int(ts[i], CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
    sim_problem_unref(op->prob);
    op->prob = p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sim_conv_op_finalize(sim_bdesc_t *d)
{
    int dir = d->type == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ? SIM_CONV_FWD
              : d->type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                  ? SIM_CONV_BWD_DATA : SIM_CONV_BWD_FILTER;
    /* X, W, Y names of each direction, then its convolution descriptor */
    static const int names[3][4] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC},
    };
    cudnnStatus_t st = require(d, names[dir], 4);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    sim_bdesc_t *t[3];
    for (int i = 0; i < 3; i++)
        if (!(t[i] = tensor_of(d, names[dir][i], &st)))
            return st;
    sim_bdesc_t *c = sim_battr_desc(d, names[dir][3], 0);
    if (!c || c->type != CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR || !c->finalized)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "convolution operation: CONV_DESC must be a finalized convolution");
    sim_conv_geom_t g = {0};
    g.nspatial = (int)sim_battr_int(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 0);
    int64_t nd[3];
    nd[0] = read_dims(t[0], CUDNN_ATTR_TENSOR_DIMENSIONS, g.x);
    nd[1] = read_dims(t[1], CUDNN_ATTR_TENSOR_DIMENSIONS, g.w);
    nd[2] = read_dims(t[2], CUDNN_ATTR_TENSOR_DIMENSIONS, g.y);
    for (int i = 0; i < 3; i++)
        if (nd[i] != g.nspatial + 2)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "convolution operation: tensor %d has %lld dimensions, the "
                                "convolution %d spatial ones", i, (long long)nd[i], g.nspatial);
    read_dims(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, g.pre);
    read_dims(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, g.post);
    read_dims(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, g.stride);
    read_dims(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, g.dilation);
    g.elem = sim_dnn_dtype_size((int)sim_battr_int(t[0], CUDNN_ATTR_TENSOR_DATA_TYPE, 0));
    if ((st = sim_conv_check(&g)) != CUDNN_STATUS_SUCCESS)
        return st;
    if ((st = set_uids(d, t, 3)) != CUDNN_STATUS_SUCCESS)
        return st;
    int dtype = (int)sim_battr_int(t[0], CUDNN_ATTR_TENSOR_DATA_TYPE, 0);
    sim_problem_t *p = d->prob;
    p->kind = SIM_PROB_CONV;
    p->nengines = SIM_CONV_ENGINES;
    for (int e = 0; e < SIM_CONV_ENGINES; e++)
        p->ws[e] = sim_conv_workspace(&g, dir, e);
    if (dir != SIM_CONV_FWD)
        p->notes[1] |= 1u << CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    if (dtype == CUDNN_DATA_HALF || dtype == CUDNN_DATA_BFLOAT16)
        p->notes[2] |= 1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    static const int heur[] = {1, 0, 2};
    memcpy(p->heur, heur, sizeof heur);
    p->nheur = 3;
    p->fallback[0] = 0;
    p->nfallback = 1;
    d->virt = dir;
    return CUDNN_STATUS_SUCCESS;
}

/* Any other operation: every tensor it names must be finalized; its
 * non-virtual tensors are bound at execution. */
cudnnStatus_t sim_generic_op_finalize(sim_bdesc_t *d)
{
    sim_bdesc_t *ts[64];
    int n = 0;
    for (int i = 0; i < d->nattrs; i++) {
        const sim_attr_t *a = &d->attrs[i];
        if (a->type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
            continue;
        for (int64_t k = 0; k < a->count; k++) {
            sim_bdesc_t *t = sim_battr_desc(d, a->name, k);
            if (!t)
                return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                    "operation type %d: attribute %d names a destroyed descriptor",
                                    d->type, a->name);
            if (!t->finalized)
                return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                                    "operation type %d: attribute %d is not finalized", d->type,
                                    a->name);
            if (t->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR && n < 64)
                ts[n++] = t;
        }
    }
    return set_uids(d, ts, n);
}

static cudnnStatus_t finalize_variant_pack(sim_bdesc_t *d)
{
    const sim_attr_t *ids = sim_battr_find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const sim_attr_t *ptrs = sim_battr_find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    int64_t ni = ids ? ids->count : 0, np = ptrs ? ptrs->count : 0;
    if (ni != np)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "variant pack: %lld unique ids, %lld pointers",
                            (long long)ni, (long long)np);
    for (int64_t i = 0; i < ni; i++)
        for (int64_t k = 0; k < i; k++)
            if (!memcmp(ids->data + 8 * i, ids->data + 8 * k, 8))
                return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
                                    "variant pack: unique id given twice");
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sim_bdesc_finalize(sim_bdesc_t *d)
{
    static const int knob[] = {CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE};
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return finalize_convolution(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        return sim_conv_op_finalize(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return sim_graph_finalize(d);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return finalize_variant_pack(d);
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return require(d, knob, 2);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        return sim_engine_finalize(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR:
    case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR:
    case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR:
        return CUDNN_STATUS_SUCCESS;
    default:
        /* operations (pointwise, matmul, reduction, rng, SDPA, ...) and the
         * descriptors they use: accepted as given */
        return sim_generic_op_finalize(d);
    }
}
