/*
 * fakecuda_graph.c - CUDA graphs of the fake driver: graphs and their nodes
 * (made by stream capture, fakecuda_capture.c), executable graphs
 * (instantiate, update, upload, launch, destroy), host functions, and the
 * graph part of the leak report.
 *
 * A launch replays the nodes in their order (a topological order: a node's
 * dependencies are always older) on the launch stream: a kernel costs what
 * a kernel costs on the device timeline, copies and memsets really copy
 * then (with the arguments captured), host nodes call their function,
 * event nodes record or wait. Everything runs serially on that stream,
 * which is one valid schedule of the graph.
 *
 * Invariants: a live graph or exec is in fc.graphs / fc.execs (keyed by its
 * handle, the struct's address), so a stale handle is detected; a node
 * belongs to exactly one graph and dies with it; an exec owns copies of
 * the nodes and is independent of its graph (which may be destroyed).
 *
 * Must not: call a host function while holding the lock, or call an
 * exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct CUgraph_st *fc_graph_new_unlocked(void)
{
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (g && fc_vec_insert(&fc.graphs, (uint64_t)(uintptr_t)g, g) != 0) {
        free(g);
        g = NULL;
    }
    return g;
}

void fc_graph_free_unlocked(struct CUgraph_st *g)
{
    fc_vec_remove(&fc.graphs, (uint64_t)(uintptr_t)g);
    for (size_t i = 0; i < g->n; i++) {
        free(g->nodes[i]->deps);
        free(g->nodes[i]);
    }
    free(g->nodes);
    free(g);
}

struct CUgraphNode_st *fc_graph_add_unlocked(struct CUgraph_st *g, const struct CUgraphNode_st *proto,
                                             struct CUgraphNode_st *const *deps, size_t ndeps)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct CUgraphNode_st **v = realloc(g->nodes, cap * sizeof *v);
        if (!v)
            return NULL;
        g->nodes = v;
        g->cap = cap;
    }
    struct CUgraphNode_st *node = malloc(sizeof *node);
    struct CUgraphNode_st **d = ndeps ? malloc(ndeps * sizeof *d) : NULL;
    if (!node || (ndeps && !d)) {
        free(node);
        free(d);
        return NULL;
    }
    *node = *proto;
    if (ndeps)
        memcpy(d, deps, ndeps * sizeof *d);
    node->deps = d;
    node->ndeps = ndeps;
    node->graph = g;
    node->index = g->n;
    g->nodes[g->n++] = node;
    return node;
}

static struct CUgraph_st *graph_of(CUgraph h) { return fc_vec_find(&fc.graphs, (uint64_t)(uintptr_t)h); }

static struct CUgraphExec_st *exec_of(CUgraphExec h)
{
    return fc_vec_find(&fc.execs, (uint64_t)(uintptr_t)h);
}

static void exec_free_unlocked(struct CUgraphExec_st *x)
{
    fc_vec_remove(&fc.execs, (uint64_t)(uintptr_t)x);
    free(x->nodes);
    free(x);
}

/* ------------------------------------------------------------------ */
/* graphs                                                               */

FC_API CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    FC_BEGIN(FN_cuGraphCreate, 1);
    if (!phGraph || flags != 0) /* documented: flags must be 0 */
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    struct CUgraph_st *g = fc_graph_new_unlocked();
    if (!g)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    *phGraph = g;
    FC_END();
}

FC_API CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    FC_BEGIN(FN_cuGraphDestroy, 1);
    struct CUgraph_st *g = graph_of(hGraph);
    if (!g)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (g->capture_id) /* still being captured into */
        FC_FAIL(CUDA_ERROR_ILLEGAL_STATE);
    fc_graph_free_unlocked(g);
    FC_END();
}

/* As documented: with nodes NULL, the count; otherwise up to *numNodes
 * nodes, the rest NULL, and *numNodes the number written. */
FC_API CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FC_BEGIN(FN_cuGraphGetNodes, 1);
    struct CUgraph_st *g = graph_of(hGraph);
    if (!g || !numNodes)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!nodes) {
        *numNodes = g->n;
        goto done;
    }
    size_t i = 0;
    for (; i < *numNodes && i < g->n; i++)
        nodes[i] = g->nodes[i];
    for (size_t j = i; j < *numNodes; j++)
        nodes[j] = NULL;
    *numNodes = i;
    FC_END();
}

/* The node must belong to a live graph. */
static struct CUgraphNode_st *node_of(CUgraphNode h)
{
    for (size_t i = 0; h && i < fc.graphs.n; i++) {
        struct CUgraph_st *g = fc.graphs.v[i].val;
        for (size_t j = 0; j < g->n; j++)
            if (g->nodes[j] == h)
                return h;
    }
    return NULL;
}

FC_API CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode *dependencies,
                                                      CUgraphEdgeData *edgeData, size_t *numDependencies)
{
    FC_BEGIN(FN_cuGraphNodeGetDependencies_v2, 1);
    struct CUgraphNode_st *node = node_of(hNode);
    if (!node || !numDependencies)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!dependencies) {
        *numDependencies = node->ndeps;
        goto done;
    }
    size_t i = 0;
    for (; i < *numDependencies && i < node->ndeps; i++) {
        dependencies[i] = node->deps[i];
        if (edgeData)
            memset(&edgeData[i], 0, sizeof edgeData[i]);
    }
    for (size_t j = i; j < *numDependencies; j++)
        dependencies[j] = NULL;
    *numDependencies = i;
    FC_END();
}

static const char *const node_names[] = {"empty", "kernel", "memcpy", "memset", "host",
                                         "event_record", "event_wait"};

/* A DOT file: one vertex per node with its type and captured arguments,
 * one edge per dependency. */
FC_API CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph hGraph, const char *path, unsigned int flags)
{
    FC_BEGIN(FN_cuGraphDebugDotPrint, 1);
    (void)flags; /* every flag only selects detail */
    struct CUgraph_st *g = graph_of(hGraph);
    if (!g || !path)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    FILE *f = fopen(path, "w");
    if (!f)
        FC_FAIL(CUDA_ERROR_OPERATING_SYSTEM);
    fprintf(f, "digraph simulated_cuda_graph {\n");
    for (size_t i = 0; i < g->n; i++) {
        const struct CUgraphNode_st *n = g->nodes[i];
        fprintf(f, "  n%zu [label=\"%zu: %s", i, i, node_names[n->type]);
        if (n->type == FC_NODE_MEMCPY)
            fprintf(f, " %zu bytes 0x%llx <- 0x%llx", n->u.copy.n, (unsigned long long)n->u.copy.dst,
                    (unsigned long long)n->u.copy.src);
        else if (n->type == FC_NODE_MEMSET)
            fprintf(f, " %zu x %zu bytes at 0x%llx", n->u.set.n, n->u.set.elem,
                    (unsigned long long)n->u.set.dst);
        fprintf(f, "\"];\n");
        for (size_t j = 0; j < n->ndeps; j++)
            fprintf(f, "  n%zu -> n%zu;\n", n->deps[j]->index, i);
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0)
        FC_FAIL(CUDA_ERROR_OPERATING_SYSTEM);
    FC_END();
}

/* ------------------------------------------------------------------ */
/* executable graphs                                                    */

#define KNOWN_FLAGS                                                         \
    (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |   \
     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)

/* Copies of g's nodes (deps dropped): what an exec runs. */
static struct CUgraphNode_st *copy_nodes(const struct CUgraph_st *g)
{
    struct CUgraphNode_st *v = malloc((g->n ? g->n : 1) * sizeof *v);
    for (size_t i = 0; v && i < g->n; i++) {
        v[i] = *g->nodes[i];
        v[i].graph = NULL;
        v[i].deps = NULL;
        v[i].ndeps = 0;
    }
    return v;
}

static CUresult instantiate_unlocked(CUgraphExec *out, CUgraph hGraph, unsigned long long flags)
{
    struct CUgraph_st *g = graph_of(hGraph);
    if (!out || !g || (flags & ~(unsigned long long)KNOWN_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) &&
        (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
        return CUDA_ERROR_INVALID_VALUE; /* documented: not together */
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
        return CUDA_ERROR_NOT_SUPPORTED; /* no device-side launches */
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (!x || !(x->nodes = copy_nodes(g)) || fc_vec_insert(&fc.execs, (uint64_t)(uintptr_t)x, x)) {
        if (x)
            free(x->nodes);
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    x->n = g->n;
    x->flags = flags;
    *out = x;
    return CUDA_SUCCESS;
}

/* UPLOAD belongs to cuGraphInstantiateWithParams only (documented). */
FC_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                    unsigned long long flags)
{
    FC_BEGIN(FN_cuGraphInstantiateWithFlags, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    res = instantiate_unlocked(phGraphExec, hGraph, flags);
    FC_END();
}

FC_API CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                     CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FC_BEGIN(FN_cuGraphInstantiateWithParams, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!params)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) &&
        (res = fc_resolve_stream_unlocked(params->hUploadStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    res = instantiate_unlocked(phGraphExec, hGraph, params->flags);
    params->hErrNode_out = NULL;
    params->result_out = res == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    FC_END();
}

FC_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FC_BEGIN(FN_cuGraphExecDestroy, 1);
    struct CUgraphExec_st *x = exec_of(hGraphExec);
    if (!x)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    exec_free_unlocked(x);
    FC_END();
}

/* Same topology and node types: take the new parameters; otherwise the
 * documented failure with the reason in resultInfo. */
FC_API CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                             CUgraphExecUpdateResultInfo *resultInfo)
{
    FC_BEGIN(FN_cuGraphExecUpdate_v2, 1);
    struct CUgraphExec_st *x = exec_of(hGraphExec);
    struct CUgraph_st *g = graph_of(hGraph);
    if (!x || !g || !resultInfo)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    resultInfo->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    resultInfo->errorNode = resultInfo->errorFromNode = NULL;
    if (g->n != x->n)
        resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (size_t i = 0; i < g->n && resultInfo->result == CU_GRAPH_EXEC_UPDATE_SUCCESS; i++)
        if (g->nodes[i]->type != x->nodes[i].type) {
            resultInfo->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
            resultInfo->errorNode = g->nodes[i];
        }
    if (resultInfo->result != CU_GRAPH_EXEC_UPDATE_SUCCESS)
        FC_FAIL(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    struct CUgraphNode_st *v = copy_nodes(g);
    if (!v)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    free(x->nodes);
    x->nodes = v;
    FC_END();
}

/* The stream a graph operation runs on: live, and not capturing (no
 * child-graph nodes in the fake; see Note [Stream capture]). */
static CUresult launch_stream_unlocked(CUstream h, struct CUctx_st **sctx, uint64_t *key)
{
    struct CUctx_st *c;
    int captured;
    CUresult res = fc_current_ctx_unlocked(&c);
    if (res == CUDA_SUCCESS)
        res = fc_resolve_stream_unlocked(h, c, key, sctx);
    if (res == CUDA_SUCCESS)
        res = fc_cap_work_unlocked(*sctx, *key, NULL, &captured);
    if (res == CUDA_SUCCESS && fc_cap_is_capturing_unlocked(*key))
        res = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return res;
}

/* Nothing to upload: the nodes live in host memory already. */
FC_API CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_BEGIN(FN_cuGraphUpload, 1);
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = launch_stream_unlocked(hStream, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (!exec_of(hGraphExec))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    FC_END();
}

/* Device memory that may no longer be used that way (host memory cannot
 * be checked). */
static int bad_side(uint64_t p, size_t n, int write)
{
    uint64_t base;
    size_t size;
    int dev;
    return fc_lookup_device_ptr_unlocked(p, &base, &size, &dev) && !fc_accessible_unlocked(p, n, write);
}

/* One node of a launch; host nodes are the caller's. */
static CUresult run_node_unlocked(const struct CUgraphNode_st *n, CUstream h, struct CUctx_st *sctx,
                                  uint64_t key)
{
    fc_event_t *e;
    switch (n->type) {
    case FC_NODE_KERNEL:
        fc_spin_kernel_unlocked(); /* Note [Reads that wait on kernels] */
        fc_tl_enqueue_unlocked(sctx, key, fc_tl_kernel_ns(n->u.cycles));
        break;
    case FC_NODE_MEMCPY:
        /* the ranges were checked at capture; memory freed since faults */
        if (n->u.copy.n && (bad_side(n->u.copy.dst, n->u.copy.n, 1) || bad_side(n->u.copy.src, n->u.copy.n, 0)))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        fc_move_unlocked(n->u.copy.dst, n->u.copy.src, n->u.copy.n);
        fc_tl_copy_unlocked(h, n->u.copy.dst, n->u.copy.src, n->u.copy.n, 0);
        break;
    case FC_NODE_MEMSET:
        if (n->u.set.n && !fc_accessible_unlocked(n->u.set.dst, n->u.set.n * n->u.set.elem, 1))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        fc_fill_unlocked(n->u.set.dst, n->u.set.value, n->u.set.elem, n->u.set.n);
        fc_tl_copy_unlocked(h, n->u.set.dst, 0, n->u.set.n * n->u.set.elem, 0);
        break;
    case FC_NODE_EVENT_RECORD:
        if ((e = fc_vec_find(&fc.events, n->u.event)))
            fc_event_record_now_unlocked(e, sctx, key);
        break;
    case FC_NODE_EVENT_WAIT:
        e = fc_vec_find(&fc.events, n->u.event);
        if (e && e->recorded && e->timed && !e->complete)
            fc_tl_wait_unlocked(sctx, key, e->t_ns);
        break;
    default:
        break;
    }
    return CUDA_SUCCESS;
}

/* Replays a snapshot of the exec's nodes, so that a host function may
 * destroy or update the exec without harm. */
FC_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    FC_BEGIN(FN_cuGraphLaunch, 1);
    struct CUctx_st *sctx;
    uint64_t key;
    if ((res = launch_stream_unlocked(hStream, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    struct CUgraphExec_st *x = exec_of(hGraphExec);
    if (!x)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    size_t n = x->n;
    struct CUgraphNode_st *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    memcpy(v, x->nodes, n * sizeof *v);
    x->launches++;
    for (size_t i = 0; i < n && res == CUDA_SUCCESS; i++) {
        if (v[i].type != FC_NODE_HOST) {
            res = run_node_unlocked(&v[i], hStream, sctx, key);
            continue;
        }
        fc_unlock();
        v[i].u.host.fn(v[i].u.host.data);
        fc_lock();
    }
    free(v);
    FC_END();
}

/* Outside a capture the function runs at once, on the calling thread:
 * nothing queued before it can still be running in the simulation. */
FC_API CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    FC_BEGIN(FN_cuLaunchHostFunc, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    int captured;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    if (!fn)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    struct CUgraphNode_st proto = {.type = FC_NODE_HOST, .u.host = {fn, userData}};
    if ((res = fc_cap_work_unlocked(sctx, key, &proto, &captured)) != CUDA_SUCCESS || captured)
        goto done;
    fc_unlock();
    fn(userData);
    return CUDA_SUCCESS;
    FC_END();
}

/* ------------------------------------------------------------------ */
/* report                                                               */

int fc_graph_report_leaks_unlocked(sim_sb_t *sb, int *first, int left)
{
    for (size_t i = 0; i < fc.graphs.n; i++) {
        const struct CUgraph_st *g = fc.graphs.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"graph\", \"nodes\": %zu, \"capturing\": %s}", g->n,
                          g->capture_id ? "true" : "false");
    }
    for (size_t i = 0; i < fc.execs.n; i++) {
        const struct CUgraphExec_st *x = fc.execs.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"graph_exec\", \"nodes\": %zu, \"launches\": %llu}", x->n,
                          (unsigned long long)x->launches);
    }
    return left;
}
