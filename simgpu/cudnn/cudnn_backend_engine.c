/*
 * cudnn_backend_engine.c - engine heuristics, engines, engine configs and
 * execution plans: their finalize rules and the attributes they compute
 * (heuristics results, engine count, notes, workspace sizes), plus
 * cudnnBackendExecute.
 *
 * Every one of them holds a reference to the operation graph's
 * sim_problem_t and an engine index; the engines, their order and their
 * workspaces are decided when the graph is finalized (Note [cuDNN workspace
 * sizes], Note [cuDNN graph workspace]). Engines have no knobs. Descriptors
 * handed back through Get (heuristics results, a config's engine, a plan's
 * config) are the caller's own, filled and marked finalized, as cuDNN does.
 *
 * Must not: run anything on execute: the simulator's kernels compute
 * nothing; execution checks its arguments and counts.
 */
#include <stdio.h>
#include <string.h>

#include "cudnn_internal.h"

/* Shared memory every simulated engine reports using: 48 KiB, the default
 * per-block limit of every GPU the simulator models, so no engine is
 * filtered out for asking too much. */
#define SIM_ENGINE_SHARED_MEMORY 49152

static cudnnStatus_t need_prob(sim_bdesc_t *d, sim_bdesc_t *src, int src_type, const char *what)
{
    if (!src || src->type != src_type || !src->finalized || !src->prob)
        return sim_dnn_fail(src && !src->finalized ? CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED
                                                   : CUDNN_STATUS_BAD_PARAM,
                            "descriptor type %d: %s must be a finalized descriptor of type %d",
                            d->type, what, src_type);
    sim_problem_unref(d->prob);
    d->prob = sim_problem_ref(src->prob);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sim_engine_finalize(sim_bdesc_t *d)
{
    cudnnStatus_t st;
    switch (d->type) {
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (!sim_battr_find(d, CUDNN_ATTR_ENGINEHEUR_MODE))
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "engine heuristics: MODE is not set");
        d->engine = sim_battr_int(d, CUDNN_ATTR_ENGINEHEUR_MODE, 0); /* the mode */
        return need_prob(d, sim_battr_desc(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, 0),
                         CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "OPERATION_GRAPH");
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        st = need_prob(d, sim_battr_desc(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, 0),
                       CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "OPERATION_GRAPH");
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
        if (!sim_battr_find(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX))
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "engine: GLOBAL_INDEX is not set");
        d->engine = sim_battr_int(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, -1);
        if (d->engine < 0 || d->engine >= d->prob->nengines)
            return sim_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                                "engine: global index %lld does not support this graph (%d engines)",
                                (long long)d->engine, d->prob->nengines);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: {
        sim_bdesc_t *e = sim_battr_desc(d, CUDNN_ATTR_ENGINECFG_ENGINE, 0);
        st = need_prob(d, e, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "ENGINE");
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
        const sim_attr_t *k = sim_battr_find(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES);
        if (k && k->count > 0)
            return sim_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                                "engine config: the simulator's engines have no knobs");
        d->engine = e->engine;
        return CUDNN_STATUS_SUCCESS;
    }
    default: { /* CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR */
        /* HANDLE is deprecated since 9.0 (the handle comes with execute);
         * when given it must be live. */
        const sim_attr_t *h = sim_battr_find(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
        cudnnHandle_t handle;
        if (h && (memcpy(&handle, h->data, 8),
                  st = sim_dnn_check_handle(handle, "execution plan")) != CUDNN_STATUS_SUCCESS)
            return st;
        sim_bdesc_t *c = sim_battr_desc(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 0);
        st = need_prob(d, c, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "ENGINE_CONFIG");
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
        d->engine = c->engine;
        d->ws = d->prob->ws[d->engine];
        atomic_fetch_add(&sim_dnn_plans, 1);
        return CUDNN_STATUS_SUCCESS;
    }
    }
}

/* Fills the caller's descriptor `p` (of type `type`) with (prob, engine). */
static cudnnStatus_t fill(void *p, int type, sim_problem_t *prob, int64_t engine)
{
    sim_bdesc_t *d = sim_bdesc_live(p);
    if (!d || d->type != type)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                            "cudnnBackendGetAttribute: the array must hold live descriptors of "
                            "type %d", type);
    sim_problem_unref(d->prob);
    d->prob = sim_problem_ref(prob);
    d->engine = engine;
    d->ws = prob->ws[engine >= 0 ? engine : 0];
    d->finalized = 1;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t fill_list(int type, sim_problem_t *prob, const int *engines, int n,
                               int64_t requested, int64_t *count, void *array)
{
    int64_t k = requested < n ? requested : n;
    for (int64_t i = 0; i < k; i++) {
        void *p;
        memcpy(&p, (unsigned char *)array + 8 * i, 8);
        cudnnStatus_t st = fill(p, type, prob, engines ? engines[i] : -1);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    }
    *count = requested > 0 ? k : n;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t put_ints(int type, const int64_t *v, int64_t n, int64_t requested,
                              int64_t *count, void *array)
{
    int64_t k = requested < n ? requested : n;
    size_t es = sim_battr_elem_size(type);
    for (int64_t i = 0; i < k; i++) {
        if (es == 8)
            memcpy((unsigned char *)array + 8 * i, &v[i], 8);
        else {
            int32_t x = (int32_t)v[i];
            memcpy((unsigned char *)array + 4 * i, &x, 4);
        }
    }
    *count = requested > 0 ? k : n;
    return CUDNN_STATUS_SUCCESS;
}

int sim_engine_get(sim_bdesc_t *d, int name, int type, int64_t requested, int64_t *count,
                   void *array, cudnnStatus_t *st)
{
    sim_problem_t *p = d->prob;
    int64_t v[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int n = 0;
    int engine = d->engine >= 0 ? (int)d->engine : 0;
    switch (name) {
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        v[0] = p ? p->nengines : 0;
        *st = put_ints(type, v, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINEHEUR_RESULTS:
        if (d->engine == CUDNN_HEUR_MODE_FALLBACK)
            *st = fill_list(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, p, p->fallback, p->nfallback,
                            requested, count, array);
        else
            *st = fill_list(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, p, p->heur, p->nheur, requested,
                            count, array);
        return 1;
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
        v[0] = engine;
        *st = put_ints(type, v, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
        for (int b = 0; b < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; b++)
            if (p->notes[engine] & (1u << b))
                v[n++] = b;
        *st = put_ints(type, v, n, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: case CUDNN_ATTR_ENGINE_KNOB_INFO:
    case CUDNN_ATTR_ENGINE_LAYOUT_INFO: case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
    case CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO:
    case CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
        *count = 0; /* no knobs, notes, layouts or intermediates */
        *st = CUDNN_STATUS_SUCCESS;
        return 1;
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
        *st = fill_list(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, p, NULL, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINECFG_ENGINE:
        *st = fill_list(CUDNN_BACKEND_ENGINE_DESCRIPTOR, p, &engine, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
        *st = fill_list(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, p, &engine, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED:
        v[0] = SIM_ENGINE_SHARED_MEMORY;
        *st = put_ints(type, v, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE: case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
        v[0] = p->ws[engine];
        *st = put_ints(type, v, 1, requested, count, array);
        return 1;
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: {
        char json[128];
        int len = snprintf(json, sizeof json, "{\"simulated\": true, \"engine\": %d, "
                           "\"workspace\": %lld}", engine, (long long)p->ws[engine]);
        int64_t k = requested < len + 1 ? requested : len + 1;
        if (k > 0)
            memcpy(array, json, (size_t)k);
        *count = len + 1;
        *st = CUDNN_STATUS_SUCCESS;
        return 1;
    }
    default:
        return 0;
    }
}

static cudnnStatus_t check_exec(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                cudnnBackendDescriptor_t pack, sim_bdesc_t **pl, sim_bdesc_t **vp,
                                const char *fn)
{
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    *pl = sim_bdesc_live(plan);
    *vp = sim_bdesc_live(pack);
    if (!*pl || (*pl)->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !*vp ||
        (*vp)->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: needs a plan and a variant pack", fn);
    if (!(*pl)->finalized || !(*vp)->finalized)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                            "%s: the plan and the variant pack must be finalized", fn);
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetExecutionPlanWorkspaceSize(cudnnHandle_t handle,
                                                         cudnnBackendDescriptor_t executionPlan,
                                                         cudnnBackendDescriptor_t variantPack,
                                                         size_t *workspaceSizeInBytes)
{
    SIM_ENTRY("cudnnGetExecutionPlanWorkspaceSize");
    sim_bdesc_t *pl, *vp;
    cudnnStatus_t st = check_exec(handle, executionPlan, variantPack, &pl, &vp,
                                  "cudnnGetExecutionPlanWorkspaceSize");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!workspaceSizeInBytes)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "cudnnGetExecutionPlanWorkspaceSize: workspaceSizeInBytes is NULL");
    *workspaceSizeInBytes = (size_t)pl->ws;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                          cudnnBackendDescriptor_t variantPack)
{
    SIM_ENTRY("cudnnBackendExecute");
    static const char fn[] = "cudnnBackendExecute";
    sim_bdesc_t *pl, *vp;
    cudnnStatus_t st = check_exec(handle, executionPlan, variantPack, &pl, &vp, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const sim_attr_t *ids = sim_battr_find(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const sim_attr_t *ptrs = sim_battr_find(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    for (int64_t i = 0; i < pl->prob->nuids; i++) {
        int64_t k = 0;
        while (ids && k < ids->count && memcmp(ids->data + 8 * k, &pl->prob->uids[i], 8))
            k++;
        void *ptr = NULL;
        if (ids && k < ids->count)
            memcpy(&ptr, ptrs->data + 8 * k, 8);
        if (!ptr)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "%s: the variant pack binds no pointer to tensor uid %lld", fn,
                                (long long)pl->prob->uids[i]);
    }
    void *ws = (void *)(intptr_t)sim_battr_int(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, 0);
    if (pl->ws > 0 && !ws)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: the plan needs %lld bytes of workspace and the variant pack "
                            "gives none", fn, (long long)pl->ws);
    atomic_fetch_add(&sim_dnn_executions, 1);
    return CUDNN_STATUS_SUCCESS;
}
