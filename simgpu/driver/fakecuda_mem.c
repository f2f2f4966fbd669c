/*
 * fakecuda_mem.c - device memory of the fake CUDA driver: cuMemAlloc/Free,
 * cuMemGetInfo, the synchronous copies and memset, pointer lookups and
 * access checks, and the leak report of every memory object. The virtual
 * memory management calls are in fakecuda_vmm.c.
 *
 * "Device" memory is host memory. cuMemAlloc is an anonymous
 * MAP_NORESERVE mapping placed in the device's address range (fakecuda_va.c),
 * so capacity can exceed RAM and untouched pages cost nothing.
 *
 * Invariants (checked by the tests through the report):
 *   bytes_allocated = sum of live cuMemAlloc sizes of the device;
 *   bytes_allocated + bytes_created + bytes_context <= capacity (fc_used).
 *
 * Must not: touch the contents of device memory except through
 * fc_move_unlocked / fc_fill_unlocked (Note [No host memory]).
 */
#include "fakecuda_internal.h"

#include <stdlib.h>

/* OUT_OF_MEMORY if `size` more bytes would exceed the device capacity or the
 * GPUMEM_FAKECUDA_FAIL_ABOVE limit. */
int fc_mem_over_limit_unlocked(int dev, size_t size)
{
    const fc_device_t *d = &fc.dev[dev];
    size_t used = fc_used(d);
    if (fc.fail_above && size > fc.fail_above)
        return 1;
    return used > d->capacity || size > d->capacity - used;
}

/* ------------------------------------------------------------------ */
/* cuMemAlloc and friends                                               */

FC_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FC_BEGIN(FN_cuMemAlloc_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_cap_unsafe_unlocked()) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    if (!dptr || bytesize == 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (fc_mem_over_limit_unlocked(c->device, bytesize))
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    uint64_t p;
    size_t map;
    if (fc_va_alloc_unlocked(c->device, bytesize, &p, &map)) /* Note [Device addresses] */
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    fc_alloc_t *a = malloc(sizeof *a);
    if (!a || fc_vec_insert(&fc.allocs, p, a) != 0) {
        free(a);
        fc_va_free_unlocked(p, map);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    a->ptr = p;
    a->size = bytesize;
    a->map_size = map;
    a->device = c->device;
    fc.dev[c->device].bytes_allocated += bytesize;
    fc.dev[c->device].n_allocs++;
    fc_note_usage_unlocked(c->device);
    *dptr = (CUdeviceptr)a->ptr;
    FC_END();
}

static void free_alloc_unlocked(fc_alloc_t *a)
{
    fc_va_free_unlocked(a->ptr, a->map_size);
    fc.dev[a->device].bytes_allocated -= a->size;
    fc.dev[a->device].n_allocs--;
    free(a);
}

/* Any valid context will do: with unified addressing the pointer names its
 * device. Unknown, interior and already freed pointers (and 0) are errors. */
FC_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    FC_BEGIN(FN_cuMemFree_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_cap_unsafe_unlocked()) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    fc_alloc_t *a = fc_vec_remove(&fc.allocs, (uint64_t)dptr);
    if (!a)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    free_alloc_unlocked(a);
    FC_END();
}

void fc_mem_reset_device_unlocked(int dev)
{
    for (size_t i = fc.allocs.n; i-- > 0;) {
        fc_alloc_t *a = fc.allocs.v[i].val;
        if (a->device != dev)
            continue;
        fc.reclaimed.allocations++;
        fc.reclaimed.bytes += a->size;
        fc_vec_remove_at(&fc.allocs, i);
        free_alloc_unlocked(a);
    }
}

FC_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FC_BEGIN(FN_cuMemGetInfo_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!free_bytes || !total)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    const fc_device_t *d = &fc.dev[c->device];
    size_t used = fc_used(d);
    *free_bytes = used < d->capacity ? d->capacity - used : 0;
    *total = d->capacity;
    FC_END();
}

int fc_mapping_prot(const fc_mapping_t *m)
{
    int best = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (int i = 0; i < fc.ndev; i++)
        if (m->access[i] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            best = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        else if (m->access[i] == CU_MEM_ACCESS_FLAGS_PROT_READ && best == CU_MEM_ACCESS_FLAGS_PROT_NONE)
            best = CU_MEM_ACCESS_FLAGS_PROT_READ;
    return best;
}

/* Is [p, p+n) device memory the device may read (write)? Either inside one
 * cuMemAlloc allocation, or covered by consecutive mappings with access. */
int fc_accessible_unlocked(uint64_t p, size_t n, int write)
{
    if (p + n < p)
        return 0;
    size_t i = fc_vec_lower(&fc.allocs, p + 1);
    if (i > 0) {
        const fc_alloc_t *a = fc.allocs.v[i - 1].val;
        if (p >= a->ptr && p + n <= a->ptr + a->size)
            return 1;
    }
    i = fc_vec_lower(&fc.mappings, p + 1);
    if (i == 0)
        return 0;
    i--;
    for (uint64_t cur = p; cur < p + n; i++) {
        if (i >= fc.mappings.n)
            return 0;
        const fc_mapping_t *m = fc.mappings.v[i].val;
        if (cur < m->start || cur >= m->start + m->size)
            return 0;
        int prot = fc_mapping_prot(m);
        if (prot == CU_MEM_ACCESS_FLAGS_PROT_NONE ||
            (write && prot != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            return 0;
        cur = m->start + m->size;
    }
    return 1;
}

int fc_lookup_device_ptr_unlocked(uint64_t p, uint64_t *base, size_t *size, int *dev)
{
    size_t i = fc_vec_lower(&fc.allocs, p + 1);
    if (i > 0) {
        const fc_alloc_t *a = fc.allocs.v[i - 1].val;
        if (p >= a->ptr && p < a->ptr + a->size) {
            *base = a->ptr;
            *size = a->size;
            *dev = a->device;
            return 1;
        }
    }
    i = fc_vec_lower(&fc.mappings, p + 1);
    if (i > 0) {
        const fc_mapping_t *m = fc.mappings.v[i - 1].val;
        if (p >= m->start && p < m->start + m->size) {
            *base = m->start;
            *size = m->size;
            *dev = m->h->device;
            return 1;
        }
    }
    i = fc_vec_lower(&fc.reservations, p + 1);
    if (i > 0) {
        const fc_reservation_t *r = fc.reservations.v[i - 1].val;
        if (p >= r->start && p < r->start + r->size) {
            *base = p;
            *size = 0;
            *dev = r->device;
            return 1;
        }
    }
    return 0;
}

FC_API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpyHtoD_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_cap_sync_call_unlocked(c)) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    if (ByteCount == 0)
        goto done;
    if (!srcHost || !fc_accessible_unlocked(dstDevice, ByteCount, 1))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_move_unlocked(dstDevice, (uint64_t)(uintptr_t)srcHost, ByteCount);
    fc_tl_copy_unlocked(NULL, dstDevice, (uint64_t)(uintptr_t)srcHost, ByteCount, 1);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpyDtoH_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_cap_sync_call_unlocked(c)) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    if (ByteCount == 0)
        goto done;
    if (!dstHost || !fc_accessible_unlocked(srcDevice, ByteCount, 0))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_move_unlocked((uint64_t)(uintptr_t)dstHost, srcDevice, ByteCount);
    fc_tl_copy_unlocked(NULL, (uint64_t)(uintptr_t)dstHost, srcDevice, ByteCount, 1);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    FC_BEGIN(FN_cuMemsetD8_v2, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if ((res = fc_cap_sync_call_unlocked(c)) != CUDA_SUCCESS) /* Note [Stream capture] */
        goto done;
    if (N == 0)
        goto done;
    if (!fc_accessible_unlocked(dstDevice, N, 1))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_fill_unlocked(dstDevice, uc, 1, N);
    fc_tl_copy_unlocked(NULL, dstDevice, 0, N, 0);
    FC_END();
}

/* ------------------------------------------------------------------ */
/* report                                                               */

int fc_mem_report_leaks_unlocked(sim_sb_t *sb, int *first, int left)
{
    for (size_t i = 0; i < fc.allocs.n; i++) {
        const fc_alloc_t *a = fc.allocs.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"allocation\", \"device\": %d, \"ptr\": %llu, \"size\": %zu}",
                         a->device, (unsigned long long)a->ptr, a->size);
    }
    for (size_t i = 0; i < fc.handles.n; i++) {
        const fc_vhandle_t *h = fc.handles.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"handle\", \"device\": %d, \"handle\": %llu, \"size\": %zu, "
                             "\"mappings\": %zu}",
                         h->device, (unsigned long long)h->handle, h->size, h->nmaps);
    }
    for (size_t i = 0; i < fc.mappings.n; i++) {
        const fc_mapping_t *m = fc.mappings.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"mapping\", \"device\": %d, \"ptr\": %llu, \"size\": %zu, "
                             "\"handle\": %llu, \"handle_released\": %s}",
                         m->h->device, (unsigned long long)m->start, m->size,
                         (unsigned long long)m->h->handle, m->h->released ? "true" : "false");
    }
    for (size_t i = 0; i < fc.reservations.n; i++) {
        const fc_reservation_t *r = fc.reservations.v[i].val;
        if (fc_leak_slot(sb, first, &left))
            sim_sb_printf(sb, "{\"kind\": \"reservation\", \"device\": %d, \"ptr\": %llu, \"size\": %zu, "
                             "\"mappings\": %zu}",
                         r->device, (unsigned long long)r->start, r->size, r->nmaps);
    }
    return left;
}
