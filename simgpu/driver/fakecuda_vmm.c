/*
 * fakecuda_vmm.c - virtual memory management of the fake CUDA driver:
 * cuMemGetAllocationGranularity, cuMemAddressReserve/Free, cuMemCreate,
 * cuMemGetAllocationPropertiesFromHandle, cuMemRelease, cuMemMap/Unmap and
 * cuMemSetAccess.
 *
 * Invariants (checked by the tests through the report):
 *   bytes_created = sum of cuMemCreate sizes whose memory is not freed yet
 *                   (unreleased, or released but still mapped);
 *   mappings never overlap and each lies inside one reservation;
 *   a handle's memory is freed exactly when it is released and unmapped.
 *
 * Must not: touch the contents of device memory (Note [No host memory]).
 */
#include "fakecuda_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
/*
 * Note [VMM over a memfd]
 * Rationale: cuMemCreate makes physical memory that exists without an
 * address; cuMemMap gives it one, possibly several times, and the contents
 * must survive cuMemUnmap while the handle lives.
 * Approach: one memfd (a file in RAM) backs every handle. Each cuMemCreate
 * takes a fresh extent of the file (a bump pointer; the file is sparse, so
 * unused offsets cost nothing) and cuMemMap maps that extent with
 * MAP_SHARED|MAP_FIXED over the PROT_NONE reservation. Until cuMemSetAccess
 * the mapping stays PROT_NONE, so touching it faults as on a GPU. When the
 * memory is freed its extent is hole-punched, returning the pages.
 * cuMemUnmap puts a PROT_NONE anonymous mapping back, so the range is again
 * a plain reservation.
 * Limitations: offsets are never reused (2^63 bytes of them); if memfd is
 * unavailable a deleted temporary file in /dev/shm or $TMPDIR is used.
 */

static size_t page_size(void)
{
    static size_t p;
    if (!p)
        p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

/* ------------------------------------------------------------------ */
/* VMM helpers                                                          */

/* Every VMM call needs an initialised driver, a current context (stricter
 * than the header, which lists no CUDA_ERROR_INVALID_CONTEXT for them) and
 * VMM support (GPUMEM_FAKECUDA_GRANULARITY != 0). */
#define VMM_PROLOGUE(fn)                                                    \
    FC_BEGIN(fn, 1);                                                        \
    struct CUctx_st *c;                                                     \
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)                \
        goto done;                                                          \
    (void)c;                                                                \
    if (fc.granularity == 0)                                                \
        FC_FAIL(CUDA_ERROR_NOT_SUPPORTED)

static CUresult check_prop_unlocked(const CUmemAllocationProp *p, int for_create)
{
    if (p->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->location.type == CU_MEM_LOCATION_TYPE_HOST ||
        p->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return CUDA_ERROR_NOT_SUPPORTED; /* host VMM attributes report 0 */
    if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_valid_device(p->location.id))
        return for_create ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
    unsigned int ht = (unsigned int)p->requestedHandleTypes;
    if (ht & ~(unsigned int)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                             CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
        return CUDA_ERROR_INVALID_VALUE;
    if (ht & ~(unsigned int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* fabric and Windows handles */
    if (p->win32HandleMetaData != NULL) /* "required to be zero" on Linux */
        return CUDA_ERROR_INVALID_VALUE;
    if (p->allocFlags.compressionType > CU_MEM_ALLOCATION_COMP_GENERIC)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 4; i++)
        if (p->allocFlags.reserved[i])
            return CUDA_ERROR_INVALID_VALUE;
    if (p->allocFlags.gpuDirectRDMACapable || p->allocFlags.usage)
        return CUDA_ERROR_NOT_SUPPORTED; /* attributes 110 and tile pools: 0 */
    return CUDA_SUCCESS;
}

static int ensure_memfd_unlocked(void)
{
    if (fc.memfd >= 0)
        return 0;
    int fd = -1;
#ifdef SYS_memfd_create
    fd = (int)syscall(SYS_memfd_create, "fakecuda-vmm", 1u /* MFD_CLOEXEC */);
#endif
    if (fd < 0) {
        const char *dirs[] = {"/dev/shm", getenv("TMPDIR"), "/tmp"};
        for (size_t i = 0; i < 3 && fd < 0; i++) {
            if (!dirs[i])
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/fakecuda-vmm-XXXXXX", dirs[i]);
            fd = mkostemp(path, O_CLOEXEC);
            if (fd >= 0)
                unlink(path);
        }
    }
    if (fd < 0)
        return -1;
    fc.memfd = fd;
    fc.memfd_size = 0;
    return 0;
}

static void phys_free_unlocked(fc_vhandle_t *h)
{
#ifdef FALLOC_FL_PUNCH_HOLE
    fallocate(fc.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->file_off,
              (off_t)h->size);
#endif
    fc.dev[h->device].bytes_created -= h->size;
    fc.dev[h->device].n_phys--;
    free(h);
}

static fc_reservation_t *reservation_containing_unlocked(uint64_t ptr, size_t size)
{
    size_t i = fc_vec_lower(&fc.reservations, ptr + 1);
    if (i == 0)
        return NULL;
    fc_reservation_t *r = fc.reservations.v[i - 1].val;
    if (ptr >= r->start && ptr + size >= ptr && ptr + size <= r->start + r->size)
        return r;
    return NULL;
}

/* Is [ptr, ptr+size) exactly a run of whole, back-to-back mappings? */
static int exact_mappings_unlocked(uint64_t ptr, size_t size, size_t *first, size_t *count)
{
    if (size == 0 || ptr + size < ptr)
        return 0;
    size_t i = fc_vec_lower(&fc.mappings, ptr);
    size_t start = i;
    uint64_t cur = ptr;
    while (cur < ptr + size) {
        if (i >= fc.mappings.n)
            return 0;
        const fc_mapping_t *m = fc.mappings.v[i].val;
        if (m->start != cur)
            return 0;
        cur += m->size;
        i++;
    }
    if (cur != ptr + size)
        return 0;
    *first = start;
    *count = i - start;
    return 1;
}

/* ------------------------------------------------------------------ */
/* VMM entry points                                                     */

FC_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity,
                                                      const CUmemAllocationProp *prop,
                                                      CUmemAllocationGranularity_flags option)
{
    /* A pure query: no context needed (the header lists no INVALID_CONTEXT). */
    FC_BEGIN(FN_cuMemGetAllocationGranularity, 1);
    if (fc.granularity == 0)
        FC_FAIL(CUDA_ERROR_NOT_SUPPORTED);
    if (!granularity || !prop)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = check_prop_unlocked(prop, 0)) != CUDA_SUCCESS)
        goto done;
    *granularity = fc.granularity;
    FC_END();
}

FC_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags)
{
    VMM_PROLOGUE(FN_cuMemAddressReserve);
    if (!ptr || size == 0 || flags != 0 || size % fc.granularity != 0 ||
        (alignment & (alignment - 1)) != 0 || addr % page_size() != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    /* addr is only a hint and is ignored. Over-reserve, then trim to the
     * requested alignment (never less than the granularity). */
    size_t align = alignment > fc.granularity ? alignment : fc.granularity;
    size_t total = size + align;
    if (total < size)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    char *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)p)
        munmap(p, start - (uintptr_t)p);
    if ((uintptr_t)p + total > start + size)
        munmap((void *)(start + size), (uintptr_t)p + total - (start + size));
    fc_reservation_t *r = malloc(sizeof *r);
    if (!r || fc_vec_insert(&fc.reservations, start, r) != 0) {
        free(r);
        munmap((void *)start, size);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    r->start = start;
    r->size = size;
    r->device = c->device;
    r->nmaps = 0;
    fc.dev[r->device].n_reservations++;
    fc.dev[r->device].bytes_reserved += size;
    *ptr = (CUdeviceptr)start;
    FC_END();
}

/* The header is silent on freeing a range that still has mappings. The fake
 * refuses with CUDA_ERROR_INVALID_VALUE, so callers must unmap first (which
 * is what the CUDA samples and PyTorch do). */
FC_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    VMM_PROLOGUE(FN_cuMemAddressFree);
    fc_reservation_t *r = fc_vec_find(&fc.reservations, (uint64_t)ptr);
    if (!r || r->size != size || r->nmaps != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_vec_remove(&fc.reservations, (uint64_t)ptr);
    munmap((void *)(uintptr_t)r->start, r->size);
    fc.dev[r->device].n_reservations--;
    fc.dev[r->device].bytes_reserved -= r->size;
    free(r);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    VMM_PROLOGUE(FN_cuMemCreate);
    if (!handle || !prop || flags != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = check_prop_unlocked(prop, 1)) != CUDA_SUCCESS)
        goto done;
    if (size == 0 || size % fc.granularity != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    int dev = prop->location.id;
    if (fc_mem_over_limit_unlocked(dev, size))
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    if (ensure_memfd_unlocked() != 0)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    uint64_t off = fc.memfd_size;
    if (off + size < off || ftruncate(fc.memfd, (off_t)(off + size)) != 0)
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    fc.memfd_size = off + size;
    fc_vhandle_t *h = malloc(sizeof *h);
    uint64_t hv = FC_HANDLE_MEM | fc_new_id_unlocked();
    if (!h || fc_vec_insert(&fc.handles, hv, h) != 0) {
        free(h);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    h->handle = hv;
    h->device = dev;
    h->size = size;
    h->file_off = off;
    h->handle_types = (unsigned int)prop->requestedHandleTypes;
    h->released = 0;
    h->nmaps = 0;
    fc.dev[dev].bytes_created += size;
    fc.dev[dev].n_handles++;
    fc.dev[dev].n_phys++;
    fc_note_usage_unlocked(dev);
    *handle = hv;
    FC_END();
}

/* The properties cuMemCreate was given (as far as the fake keeps them). */
FC_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                               CUmemGenericAllocationHandle handle)
{
    VMM_PROLOGUE(FN_cuMemGetAllocationPropertiesFromHandle);
    fc_vhandle_t *h = fc_vec_find(&fc.handles, handle);
    if (!prop || !h)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = (CUmemAllocationHandleType)h->handle_types;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = h->device;
    FC_END();
}

/* Documented: the handle may be released while mapped; the memory is freed
 * when the last mapping goes. Unknown or released handles: INVALID_VALUE. */
FC_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    VMM_PROLOGUE(FN_cuMemRelease);
    fc_vhandle_t *h = fc_vec_remove(&fc.handles, handle);
    if (!h)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    h->released = 1;
    fc.dev[h->device].n_handles--;
    if (h->nmaps == 0)
        phys_free_unlocked(h);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    VMM_PROLOGUE(FN_cuMemMap);
    /* The header: offset "currently must be zero", flags must be zero. */
    if (flags != 0 || offset != 0 || size == 0 || ptr % fc.granularity != 0 ||
        size % fc.granularity != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_vhandle_t *h = fc_vec_find(&fc.handles, handle);
    if (!h || size > h->size)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_reservation_t *r = reservation_containing_unlocked(ptr, size);
    if (!r)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    /* Only a range that is not mapped yet can be mapped. */
    size_t i = fc_vec_lower(&fc.mappings, ptr);
    if (i > 0) {
        const fc_mapping_t *prev = fc.mappings.v[i - 1].val;
        if (prev->start + prev->size > ptr)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    if (i < fc.mappings.n && fc.mappings.v[i].key < ptr + size)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_mapping_t *m = calloc(1, sizeof *m);
    if (!m || fc_vec_insert(&fc.mappings, ptr, m) != 0) {
        free(m);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fc.memfd,
                   (off_t)h->file_off);
    if (p == MAP_FAILED) {
        fc_vec_remove(&fc.mappings, ptr);
        free(m);
        FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
    }
    m->start = ptr;
    m->size = size;
    m->h = h;
    m->res = r;
    h->nmaps++;
    r->nmaps++;
    fc.dev[h->device].bytes_mapped += size;
    fc.dev[h->device].n_mappings++;
    FC_END();
}

/* The range must be exactly one or more whole, adjacent mappings. */
FC_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    VMM_PROLOGUE(FN_cuMemUnmap);
    size_t first, count;
    if (!exact_mappings_unlocked(ptr, size, &first, &count))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = count; k-- > 0;) {
        fc_mapping_t *m = fc.mappings.v[first + k].val;
        /* Back to a plain PROT_NONE reservation. */
        mmap((void *)(uintptr_t)m->start, m->size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        fc_vec_remove_at(&fc.mappings, first + k);
        fc.dev[m->h->device].bytes_mapped -= m->size;
        fc.dev[m->h->device].n_mappings--;
        m->res->nmaps--;
        if (--m->h->nmaps == 0 && m->h->released)
            phys_free_unlocked(m->h);
        free(m);
    }
    FC_END();
}

FC_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                       size_t count)
{
    VMM_PROLOGUE(FN_cuMemSetAccess);
    size_t first, n;
    if (!desc || count == 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < count; k++) {
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
        if (!fc_valid_device(desc[k].location.id))
            FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
        if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    if (!exact_mappings_unlocked(ptr, size, &first, &n))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = first; i < first + n; i++) {
        fc_mapping_t *m = fc.mappings.v[i].val;
        for (size_t k = 0; k < count; k++)
            m->access[desc[k].location.id] = (unsigned char)desc[k].flags;
        int prot = fc_mapping_prot(m);
        int host = prot == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : prot == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                              : PROT_NONE;
        if (mprotect((void *)(uintptr_t)m->start, m->size, host) != 0)
            FC_FAIL(CUDA_ERROR_UNKNOWN);
    }
    FC_END();
}
