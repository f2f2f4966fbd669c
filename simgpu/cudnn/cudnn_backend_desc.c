/*
 * cudnn_backend_desc.c - the backend API's descriptor object model:
 * cudnnBackendCreateDescriptor / Destroy / SetAttribute / GetAttribute /
 * Finalize, and typed attribute storage.
 *
 * A descriptor stores every attribute it is given as (name, type, count,
 * bytes). Set checks the descriptor is live and not finalized, the name
 * belongs to the descriptor's type and the type is the documented one
 * (table `rules`, for the descriptors convolutions and attention go
 * through); Get checks the descriptor is finalized and the type matches,
 * then answers stored values, or derived ones (cudnn_backend_engine.c).
 * Finalize applies the per-type rules of cudnn_backend_finalize.c.
 *
 * Descriptor-valued attributes hold private copies (clones) of the
 * descriptors given, made when the attribute is set, as cuDNN copies them:
 * PyTorch's frontend destroys some descriptors right after setting them.
 * A descriptor owns its clones and destroys them with itself.
 *
 * Must not: keep pointers to descriptors it does not own. A descriptor is
 * not locked: as with NVIDIA's library, one descriptor must not be changed
 * from two threads at once.
 */
#include <stdlib.h>
#include <string.h>

#include "cudnn_internal.h"

size_t sim_battr_elem_size(int type)
{
    switch (type) {
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_INT64: case CUDNN_TYPE_DOUBLE: case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return 8;
    case CUDNN_TYPE_BOOLEAN: case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_FRACTION: return 16;
    default: return 4; /* FLOAT, INT32 and every enum type */
    }
}

/* Documented attribute types (cudnn_graph.h) of the descriptors the fake
 * checks strictly. A name outside the table is still checked against its
 * descriptor's range (see owner_ok). */
#define T(x) (1u << CUDNN_TYPE_##x)
static const struct {
    int name;
    unsigned types;
    int64_t min, max; /* element count */
} rules[] = {
    {CUDNN_ATTR_CONVOLUTION_COMP_TYPE, T(DATA_TYPE), 1, 1},
    {CUDNN_ATTR_CONVOLUTION_CONV_MODE, T(CONVOLUTION_MODE), 1, 1},
    {CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, T(INT64), 1, 1},
    {CUDNN_ATTR_CONVOLUTION_DILATIONS, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_ENGINEHEUR_MODE, T(HEUR_MODE), 1, 1},
    {CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, T(BACKEND_DESCRIPTOR), 1, 1},
    {CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET, T(INT32), 1, 1},
    {CUDNN_ATTR_ENGINECFG_ENGINE, T(BACKEND_DESCRIPTOR), 1, 1},
    {CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, T(BACKEND_DESCRIPTOR), 0, 1 << 20},
    {CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, T(INT64), 1, 1},
    {CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED, T(INT32), 1, 1},
    {CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, T(INT64), 1, 1},
    {CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, T(CHAR), 0, 1 << 20},
    {CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, T(INT64), 1, 1},
    {CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T(NUMERICAL_NOTE), 0, CUDNN_NUMERICAL_NOTE_TYPE_COUNT},
    {CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, T(BEHAVIOR_NOTE), 0, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT},
    {CUDNN_ATTR_ENGINEHEUR_RESULTS, T(BACKEND_DESCRIPTOR), 0, 1 << 20},
    {CUDNN_ATTR_EXECUTION_PLAN_HANDLE, T(HANDLE), 1, 1},
    {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, T(BACKEND_DESCRIPTOR), 1, 1},
    {CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS, T(INT64), 0, 1 << 20},
    {CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, T(KNOB_TYPE), 1, 1},
    {CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, T(INT64), 1, 1},
    {CUDNN_ATTR_OPERATIONGRAPH_HANDLE, T(HANDLE), 1, 1},
    {CUDNN_ATTR_OPERATIONGRAPH_OPS, T(BACKEND_DESCRIPTOR), 1, 1 << 20},
    {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, T(INT64), 1, 1},
    {CUDNN_ATTR_TENSOR_DATA_TYPE, T(DATA_TYPE), 1, 1},
    {CUDNN_ATTR_TENSOR_DIMENSIONS, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_TENSOR_STRIDES, T(INT64), 1, SIM_CUDNN_DIM_MAX},
    {CUDNN_ATTR_TENSOR_VECTOR_COUNT, T(INT64), 1, 1},
    {CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION, T(INT64), 1, 1},
    {CUDNN_ATTR_TENSOR_UNIQUE_ID, T(INT64), 1, 1},
    {CUDNN_ATTR_TENSOR_IS_VIRTUAL, T(BOOLEAN), 1, 1},
    {CUDNN_ATTR_TENSOR_IS_BY_VALUE, T(BOOLEAN), 1, 1},
    {CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, T(INT64), 0, 1 << 20},
    {CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T(VOID_PTR), 0, 1 << 20},
    {CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES, T(VOID_PTR), 0, 1 << 20},
    {CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T(VOID_PTR), 1, 1},
    {CUDNN_ATTR_ENGINE_OPERATION_GRAPH, T(BACKEND_DESCRIPTOR), 1, 1},
    {CUDNN_ATTR_ENGINE_GLOBAL_INDEX, T(INT64), 1, 1},
    {CUDNN_ATTR_ENGINE_SM_COUNT_TARGET, T(INT32), 1, 1},
};

/* Convolution operations: X/W/Y style names take one descriptor, ALPHA and
 * BETA a float or a double. */
static int conv_op_rule(int name, unsigned *types, int64_t *max)
{
    if (name < CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA ||
        name > CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY)
        return 0;
    int k = (name - CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA) % 6;
    *types = k < 2 ? (T(FLOAT) | T(DOUBLE)) : T(BACKEND_DESCRIPTOR);
    *max = k < 2 ? 2 : 1; /* alpha/beta: one value, or a complex pair */
    return 1;
}

/* The descriptor types whose attributes live in one range of names. */
static int owner_ok(int dtype, int name)
{
    int r = name / 100;
    switch (dtype) {
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return r == 1;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return r == 2;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return r == 3;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return r == 4;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return r == 6;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return r == 8;
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return r == 9;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return r == 10;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return r == 13;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return name >= 700 && name <= 705;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
        return name >= 706 && name <= 711;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        return name >= 712 && name <= 717;
    default: return 1; /* not checked (see simgpu/README.md) */
    }
}

/* Attributes cuDNN computes: they can be read, never set. */
static int read_only(int name)
{
    switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED: case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
    case CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION:
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: case CUDNN_ATTR_ENGINE_KNOB_INFO:
    case CUDNN_ATTR_ENGINE_LAYOUT_INFO:
        return 1;
    default:
        return 0;
    }
}

static cudnnStatus_t check_type(const sim_bdesc_t *d, int name, int type, int64_t count,
                                const char *fn)
{
    if (!owner_ok(d->type, name))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "%s: attribute %d does not belong to descriptor type %d", fn, name,
                            d->type);
    unsigned types = 0;
    int64_t min = 0, max = INT64_MAX;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rules[i].name == name) {
            types = rules[i].types;
            min = rules[i].min;
            max = rules[i].max;
        }
    if (!types && conv_op_rule(name, &types, &max))
        min = 1;
    if (types && (type < 0 || type > 31 || !(types & (1u << type))))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
                            "%s: attribute %d does not take attribute type %d", fn, name, type);
    if (count != -1 && (count < min || count > max))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
                            "%s: attribute %d takes %lld..%lld elements, not %lld", fn, name,
                            (long long)min, (long long)max, (long long)count);
    return CUDNN_STATUS_SUCCESS;
}

const sim_attr_t *sim_battr_find(const sim_bdesc_t *d, int name)
{
    for (int i = 0; i < d->nattrs; i++)
        if (d->attrs[i].name == name)
            return &d->attrs[i];
    return NULL;
}

static void destroy(sim_bdesc_t *d);
static sim_bdesc_t *clone(const sim_bdesc_t *src);

/* Frees an attribute's value and the clones it owns. */
static void drop(sim_attr_t *a)
{
    if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR && a->data)
        for (int64_t i = 0; i < a->count; i++) {
            sim_bdesc_t *c;
            memcpy(&c, a->data + 8 * i, 8);
            if (c)
                destroy(c);
        }
    free(a->data);
    a->data = NULL;
}

cudnnStatus_t sim_battr_store(sim_bdesc_t *d, int name, int type, int64_t count, const void *data)
{
    size_t bytes = (size_t)count * sim_battr_elem_size(type);
    unsigned char *copy = calloc(1, bytes ? bytes : 1);
    if (!copy)
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "out of host memory");
    sim_attr_t tmp = {name, type, count, copy};
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        for (int64_t i = 0; i < count; i++) {
            void *p;
            memcpy(&p, (const unsigned char *)data + 8 * i, 8);
            sim_bdesc_t *c = p ? clone(p) : NULL;
            if (p && !c) {
                drop(&tmp);
                return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                                    "out of host memory");
            }
            memcpy(copy + 8 * i, &c, 8);
        }
    } else if (bytes) {
        memcpy(copy, data, bytes);
    }
    sim_attr_t *a = (sim_attr_t *)sim_battr_find(d, name);
    if (!a) {
        if (d->nattrs == d->cap) {
            int ncap = d->cap ? d->cap * 2 : 8;
            sim_attr_t *na = realloc(d->attrs, (size_t)ncap * sizeof *na);
            if (!na) {
                drop(&tmp);
                return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                                    "out of host memory");
            }
            d->attrs = na;
            d->cap = ncap;
        }
        a = &d->attrs[d->nattrs++];
        a->data = NULL;
    }
    drop(a);
    *a = tmp;
    return CUDNN_STATUS_SUCCESS;
}

int64_t sim_battr_int(const sim_bdesc_t *d, int name, int64_t dflt)
{
    const sim_attr_t *a = sim_battr_find(d, name);
    if (!a || a->count < 1)
        return dflt;
    switch (sim_battr_elem_size(a->type)) {
    case 8: { int64_t v; memcpy(&v, a->data, 8); return v; }
    case 1: return a->data[0];
    default: { int32_t v; memcpy(&v, a->data, 4); return v; }
    }
}

sim_bdesc_t *sim_bdesc_live(cudnnBackendDescriptor_t p)
{
    return sim_dnn_live(p, SIM_DNN_BACKEND) ? (sim_bdesc_t *)p : NULL;
}

sim_bdesc_t *sim_battr_desc(const sim_bdesc_t *d, int name, int64_t i)
{
    const sim_attr_t *a = sim_battr_find(d, name);
    if (!a || a->type != CUDNN_TYPE_BACKEND_DESCRIPTOR || i >= a->count)
        return NULL;
    void *p;
    memcpy(&p, a->data + 8 * i, 8);
    return sim_bdesc_live(p);
}

sim_problem_t *sim_problem_ref(sim_problem_t *p)
{
    if (p)
        atomic_fetch_add(&p->refs, 1);
    return p;
}

void sim_problem_unref(sim_problem_t *p)
{
    if (p && atomic_fetch_sub(&p->refs, 1) == 1)
        free(p);
}

static sim_bdesc_t *new_desc(int type)
{
    sim_bdesc_t *d = calloc(1, sizeof *d);
    if (!d || sim_dnn_register(d, SIM_DNN_BACKEND) != 0) {
        free(d);
        return NULL;
    }
    d->type = type;
    d->engine = -1;
    return d;
}

static void destroy(sim_bdesc_t *d)
{
    sim_dnn_unregister(d);
    for (int i = 0; i < d->nattrs; i++)
        drop(&d->attrs[i]);
    free(d->attrs);
    sim_problem_unref(d->prob);
    free(d);
}

static sim_bdesc_t *clone(const sim_bdesc_t *src)
{
    sim_bdesc_t *d = new_desc(src->type);
    if (!d)
        return NULL;
    for (int i = 0; i < src->nattrs; i++)
        if (sim_battr_store(d, src->attrs[i].name, src->attrs[i].type, src->attrs[i].count,
                            src->attrs[i].data) != CUDNN_STATUS_SUCCESS) {
            destroy(d);
            return NULL;
        }
    d->finalized = src->finalized;
    d->prob = sim_problem_ref(src->prob);
    d->engine = src->engine;
    d->ws = src->ws;
    d->virt = src->virt;
    return d;
}

SIM_API cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                   cudnnBackendDescriptor_t *descriptor)
{
    SIM_ENTRY("cudnnBackendCreateDescriptor");
    if (!descriptor)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "cudnnBackendCreateDescriptor: descriptor is NULL");
    if ((int)descriptorType < 0 || descriptorType > CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR)
        return sim_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED,
                            "cudnnBackendCreateDescriptor: unknown descriptor type %d",
                            (int)descriptorType);
    sim_bdesc_t *d = new_desc(descriptorType);
    if (!d)
        return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                            "cudnnBackendCreateDescriptor: out of host memory");
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    SIM_ENTRY("cudnnBackendDestroyDescriptor");
    sim_bdesc_t *d = sim_bdesc_live(descriptor);
    if (!d)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "cudnnBackendDestroyDescriptor: %p is not a live descriptor", descriptor);
    destroy(d);
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor)
{
    SIM_ENTRY("cudnnBackendInitialize");
    return sim_bdesc_live(descriptor) ? CUDNN_STATUS_SUCCESS
                                      : sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                                     "cudnnBackendInitialize: not a live descriptor");
}

SIM_API cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                               cudnnBackendAttributeName_t attributeName,
                                               cudnnBackendAttributeType_t attributeType,
                                               int64_t elementCount, const void *arrayOfElements)
{
    SIM_ENTRY("cudnnBackendSetAttribute");
    static const char fn[] = "cudnnBackendSetAttribute";
    if (!descriptor)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: descriptor is NULL", fn);
    sim_bdesc_t *d = sim_bdesc_live(descriptor);
    if (!d)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %p is not a live descriptor", fn,
                            descriptor);
    if (d->finalized)
        return sim_dnn_fail(CUDNN_STATUS_NOT_INITIALIZED,
                            "%s: descriptor type %d is finalized; attribute %d cannot change", fn,
                            d->type, (int)attributeName);
    if (elementCount < 0 || (elementCount > 0 && !arrayOfElements))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: %lld elements at NULL (attribute %d)", fn, (long long)elementCount,
                            (int)attributeName);
    if (read_only(attributeName))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: attribute %d is computed by cuDNN, not set",
                            fn, (int)attributeName);
    cudnnStatus_t st = check_type(d, attributeName, attributeType, elementCount, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        for (int64_t i = 0; i < elementCount; i++) {
            void *p;
            memcpy(&p, (const unsigned char *)arrayOfElements + 8 * i, 8);
            if (!sim_bdesc_live(p))
                return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                    "%s: element %lld of attribute %d is not a live descriptor", fn,
                                    (long long)i, (int)attributeName);
        }
    }
    return sim_battr_store(d, attributeName, attributeType, elementCount, arrayOfElements);
}

SIM_API cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                               cudnnBackendAttributeName_t attributeName,
                                               cudnnBackendAttributeType_t attributeType,
                                               int64_t requestedElementCount,
                                               int64_t *elementCount, void *arrayOfElements)
{
    SIM_ENTRY("cudnnBackendGetAttribute");
    static const char fn[] = "cudnnBackendGetAttribute";
    sim_bdesc_t *d = sim_bdesc_live(descriptor);
    if (!d)
        return sim_dnn_fail(descriptor ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: %p is not a live descriptor", fn, descriptor);
    if (!elementCount && !arrayOfElements)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: elementCount and arrayOfElements are both NULL", fn);
    if (requestedElementCount < 0)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %lld elements requested", fn,
                            (long long)requestedElementCount);
    if (!arrayOfElements)
        requestedElementCount = 0; /* a count query, as cuDNN allows */
    if (!d->finalized)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                            "%s: descriptor type %d is not finalized", fn, d->type);
    cudnnStatus_t st = check_type(d, attributeName, attributeType, -1, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    int64_t dummy;
    if (!elementCount)
        elementCount = &dummy;
    if (sim_engine_get(d, attributeName, attributeType, requestedElementCount, elementCount,
                       arrayOfElements, &st))
        return st;
    const sim_attr_t *a = sim_battr_find(d, attributeName);
    if (!a) {
        *elementCount = 0;
        return CUDNN_STATUS_SUCCESS; /* unset optional attribute: no elements */
    }
    if (a->type != (int)attributeType && sim_battr_elem_size(a->type) != sim_battr_elem_size(attributeType))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
                            "%s: attribute %d was set as type %d, asked as %d", fn,
                            (int)attributeName, a->type, (int)attributeType);
    int64_t n = a->count < requestedElementCount ? a->count : requestedElementCount;
    if (attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        /* Stored descriptors are copied into the caller's. */
        for (int64_t i = 0; i < n; i++) {
            void *dst;
            memcpy(&dst, (unsigned char *)arrayOfElements + 8 * i, 8);
            sim_bdesc_t *out = sim_bdesc_live(dst), *src = sim_battr_desc(d, attributeName, i);
            if (!out || !src || out->type != src->type || out->finalized)
                return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                                    "%s: element %lld must be a new descriptor of type %d", fn,
                                    (long long)i, src ? src->type : -1);
            for (int k = 0; k < src->nattrs && st == CUDNN_STATUS_SUCCESS; k++)
                st = sim_battr_store(out, src->attrs[k].name, src->attrs[k].type,
                                     src->attrs[k].count, src->attrs[k].data);
            if (st != CUDNN_STATUS_SUCCESS)
                return st;
            sim_problem_unref(out->prob);
            out->prob = sim_problem_ref(src->prob);
            out->engine = src->engine;
            out->ws = src->ws;
            out->virt = src->virt;
            out->finalized = 1;
        }
    } else if (n > 0) {
        memcpy(arrayOfElements, a->data, (size_t)n * sim_battr_elem_size(a->type));
    }
    *elementCount = a->count < requestedElementCount || requestedElementCount == 0 ? a->count : n;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    SIM_ENTRY("cudnnBackendFinalize");
    sim_bdesc_t *d = sim_bdesc_live(descriptor);
    if (!d)
        return sim_dnn_fail(descriptor ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "cudnnBackendFinalize: %p is not a live descriptor", descriptor);
    if (d->finalized)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: already finalized");
    cudnnStatus_t st = sim_bdesc_finalize(d);
    if (st == CUDNN_STATUS_SUCCESS)
        d->finalized = 1;
    return st;
}
