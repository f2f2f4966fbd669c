/*
 * cudnn_backend_graph.c - finalizing an operation graph: the union of its
 * operations' tensors becomes the graph's sim_problem_t, with the engines
 * the simulator offers for it.
 *
 * A graph of one convolution operation (what PyTorch's Conv_v8.cpp builds)
 * offers the convolution's three engines (Note [cuDNN workspace sizes]).
 * Any other graph (attention, fused pointwise, ...) offers one engine whose
 * workspace is Note [cuDNN graph workspace].
 *
 * Must not: keep pointers to the operations (see cudnn_internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cudnn_internal.h"

static int is_operation(int type)
{
    switch (type) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    case CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR: case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
    case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR: case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: case CUDNN_BACKEND_RESAMPLE_DESCRIPTOR:
    case CUDNN_BACKEND_RNG_DESCRIPTOR: case CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR:
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR:
        return 0; /* descriptors that are not operations */
    default:
        return 1;
    }
}

/* Note [cuDNN graph workspace]
 * Rationale: fused graphs (PyTorch's cuDNN attention) run as one engine;
 * cuDNN's flash-attention backward accumulates dQ in float32 in its
 * workspace, forward needs none.
 * Approach: a graph offers one engine; its workspace is 4 bytes per element
 * of the largest non-virtual tensor when the graph has more than 8 bound
 * tensors (attention backward binds q, k, v, o, dO, stats, dq, dk, dv and the
 * scale), and none otherwise.
 * Limitations: the sizes of real fused engines are not published; this
 * matches the dQ-accumulator pattern only.
 */
static int64_t largest_tensor(sim_bdesc_t *op)
{
    int64_t best = 0;
    for (int i = 0; i < op->nattrs; i++) {
        if (op->attrs[i].type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
            continue;
        for (int64_t k = 0; k < op->attrs[i].count; k++) {
            sim_bdesc_t *t = sim_battr_desc(op, op->attrs[i].name, k);
            if (!t || t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR || t->virt)
                continue;
            const sim_attr_t *dims = sim_battr_find(t, CUDNN_ATTR_TENSOR_DIMENSIONS);
            int64_t n = 1;
            for (int64_t j = 0; dims && j < dims->count; j++) {
                int64_t v;
                memcpy(&v, dims->data + 8 * j, 8);
                n *= v;
            }
            if (n > best)
                best = n;
        }
    }
    return best;
}

cudnnStatus_t sim_graph_finalize(sim_bdesc_t *d)
{
    const sim_attr_t *ops = sim_battr_find(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (!ops || ops->count < 1)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "operation graph: no operations (OPS)");
    /* HANDLE is deprecated since 9.0; when given it must be live. */
    const sim_attr_t *h = sim_battr_find(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
    cudnnHandle_t handle;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (h && (memcpy(&handle, h->data, 8),
              st = sim_dnn_check_handle(handle, "operation graph")) != CUDNN_STATUS_SUCCESS)
        return st;
    int nops = (int)ops->count;
    sim_bdesc_t **op = calloc((size_t)nops, sizeof *op);
    if (!op)
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "out of host memory");
    int64_t total = 0;
    for (int i = 0; i < nops; i++) {
        op[i] = sim_battr_desc(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, i);
        if (!op[i] || !is_operation(op[i]->type) || !op[i]->finalized || !op[i]->prob) {
            cudnnStatus_t code = op[i] && !op[i]->finalized ? CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED
                                                            : CUDNN_STATUS_BAD_PARAM;
            free(op);
            return sim_dnn_fail(code, "operation graph: element %d of OPS is not a finalized "
                                "operation", i);
        }
        total += op[i]->prob->nuids;
    }
    sim_problem_t *p = calloc(1, sizeof *p + (size_t)total * sizeof(int64_t));
    if (!p) {
        free(op);
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "out of host memory");
    }
    atomic_init(&p->refs, 1);
    for (int i = 0; i < nops; i++)
        for (int64_t k = 0; k < op[i]->prob->nuids; k++) {
            int64_t uid = op[i]->prob->uids[k], j = 0;
            while (j < p->nuids && p->uids[j] != uid)
                j++;
            if (j == p->nuids)
                p->uids[p->nuids++] = uid;
        }
    if (nops == 1 && op[0]->prob->kind == SIM_PROB_CONV) {
        const sim_problem_t *c = op[0]->prob;
        p->kind = SIM_PROB_CONV;
        p->nengines = c->nengines;
        memcpy(p->ws, c->ws, sizeof p->ws);
        memcpy(p->notes, c->notes, sizeof p->notes);
        memcpy(p->heur, c->heur, sizeof p->heur);
        p->nheur = c->nheur;
        memcpy(p->fallback, c->fallback, sizeof p->fallback);
        p->nfallback = c->nfallback;
    } else {
        p->kind = SIM_PROB_GENERIC;
        p->nengines = 1;
        int64_t big = 0;
        for (int i = 0; p->nuids > 8 && i < nops; i++) {
            int64_t n = largest_tensor(op[i]);
            big = n > big ? n : big;
        }
        p->ws[0] = (4 * big + 255) / 256 * 256; /* Note [cuDNN graph workspace] */
        p->nheur = p->nfallback = 1;
    }
    free(op);
    sim_problem_unref(d->prob);
    d->prob = p;
    return CUDNN_STATUS_SUCCESS;
}
