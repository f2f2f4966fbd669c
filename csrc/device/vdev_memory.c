/*
 * vdev_memory.c - the virtual device's memory (see vdev.h): the address
 * space, plain segments, and VMM reservations with granules mapped in them.
 *
 * Address space: each device owns a 16 TiB window of fake device
 * addresses (virtual mode) starting at 0x7f0000000000-style values below
 * 2^53, handed out by a first-fit range allocator with 2 MiB alignment, so
 * addresses are reused after frees like a real driver's. In host mode the
 * memory is mmap(MAP_NORESERVE) and the address is the host address.
 * Capacity counts plain segments plus mapped granules; anything beyond it
 * fails with GM_EOOM, as cudaMalloc/cuMemCreate do.
 * The backend entries run under the device set's mutex (GM_VDEV_ENTER), but
 * vmm_granularity, which reads only the granularity (immutable after create);
 * gm_vdev_space_init and gm_vdev_space_free run inside create and destroy.
 * Must not: call into the allocator, or touch memory in virtual mode.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "vdev_internal.h"

#define SIM_ALIGN ((size_t)2 << 20)
#define SIM_BASE ((uintptr_t)0x7f << 40)  /* 0x7f0000000000 */

struct range {
    uintptr_t start;
    size_t size;
};

/* A used range: a plain segment or a VA reservation. */
struct used {
    uintptr_t start;
    size_t size;
    int is_va;
    uint8_t *mapped; /* VA reservations: one byte per granule */
};

/* ----------------------------------------------------- address space */

static size_t used_bytes(const vdev_device_t *d) {
    return d->counters.bytes_allocated + d->counters.bytes_mapped;
}

/* First-fit carve of an aligned range from the free list. */
static int range_take(vdev_device_t *d, size_t size, uintptr_t *out) {
    size = (size + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    for (size_t i = 0; i < d->n_free; i++) {
        if (d->free_ranges[i].size >= size) {
            *out = d->free_ranges[i].start;
            d->free_ranges[i].start += size;
            d->free_ranges[i].size -= size;
            if (d->free_ranges[i].size == 0) {
                memmove(&d->free_ranges[i], &d->free_ranges[i + 1],
                        (d->n_free - i - 1) * sizeof(range_t));
                d->n_free--;
            }
            return 0;
        }
    }
    return -1;
}

static int range_give(vdev_device_t *d, uintptr_t start, size_t size) {
    size = (size + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    size_t i = 0;
    while (i < d->n_free && d->free_ranges[i].start < start)
        i++;
    int merge_prev = i > 0 && d->free_ranges[i - 1].start + d->free_ranges[i - 1].size == start;
    int merge_next = i < d->n_free && start + size == d->free_ranges[i].start;
    if (merge_prev && merge_next) {
        d->free_ranges[i - 1].size += size + d->free_ranges[i].size;
        memmove(&d->free_ranges[i], &d->free_ranges[i + 1], (d->n_free - i - 1) * sizeof(range_t));
        d->n_free--;
    } else if (merge_prev) {
        d->free_ranges[i - 1].size += size;
    } else if (merge_next) {
        d->free_ranges[i].start = start;
        d->free_ranges[i].size += size;
    } else {
        if (gm_vdev_grow((void **)&d->free_ranges, &d->cap_free, d->n_free, sizeof(range_t)))
            return -1;
        memmove(&d->free_ranges[i + 1], &d->free_ranges[i], (d->n_free - i) * sizeof(range_t));
        d->free_ranges[i].start = start;
        d->free_ranges[i].size = size;
        d->n_free++;
    }
    return 0;
}

static used_t *find_used(vdev_device_t *d, uintptr_t start, int is_va) {
    for (size_t i = 0; i < d->n_used; i++)
        if (d->used[i].start == start && d->used[i].is_va == is_va)
            return &d->used[i];
    return NULL;
}

/* The VA reservation containing [va, va+size). */
static used_t *find_va(vdev_device_t *d, uintptr_t va, size_t size) {
    for (size_t i = 0; i < d->n_used; i++) {
        used_t *u = &d->used[i];
        if (u->is_va && va >= u->start && va + size <= u->start + u->size)
            return u;
    }
    return NULL;
}

static void drop_used(vdev_device_t *d, used_t *u) {
    free(u->mapped);
    *u = d->used[--d->n_used];
}

/* Obtain address space: a window address (virtual) or host memory. */
static int get_space(gm_vdev_t *s, vdev_device_t *d, size_t size, uintptr_t *out) {
    if (s->cfg.mode == GM_VDEV_HOST) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return gm_vdev_set_error(s, GM_EOOM, "mmap failed");
        *out = (uintptr_t)p;
        return GM_OK;
    }
    if (range_take(d, size, out))
        return gm_vdev_set_error(s, GM_EOOM, "simulated address space exhausted");
    return GM_OK;
}

static void put_space(gm_vdev_t *s, vdev_device_t *d, uintptr_t start, size_t size) {
    if (s->cfg.mode == GM_VDEV_HOST)
        munmap((void *)start, size);
    else
        range_give(d, start, size);
}

static void note_peak(vdev_device_t *d) {
    if (used_bytes(d) > d->counters.peak_used)
        d->counters.peak_used = used_bytes(d);
}

/* Give device `index` its window of addresses. */
int gm_vdev_space_init(vdev_device_t *d, int index) {
    if (range_give(d, SIM_BASE + (uintptr_t)index * GM_VDEV_WINDOW, GM_VDEV_WINDOW))
        return GM_ENOMEM;
    return GM_OK;
}

/* Free what the device still holds (host memory, granule maps) and its lists. */
void gm_vdev_space_free(gm_vdev_t *s, vdev_device_t *d) {
    for (size_t k = 0; k < d->n_used; k++) {
        if (s->cfg.mode == GM_VDEV_HOST)
            munmap((void *)d->used[k].start, d->used[k].size);
        free(d->used[k].mapped);
    }
    free(d->used);
    free(d->free_ranges);
}

/* ------------------------------------------- capacity, plain segments */

int gm_vdev_mem_get_info(void *ctx, int device, size_t *free_b, size_t *total) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    if (gm_vdev_bad_device(s, device))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid device ordinal"));
    size_t used = used_bytes(&s->devs[device]);
    *total = s->cfg.capacity;
    *free_b = used < s->cfg.capacity ? s->cfg.capacity - used : 0;
    GM_VDEV_LEAVE(s, GM_OK);
}

int gm_vdev_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_SEG_ALLOC, size);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    if (gm_vdev_bad_device(s, device) || size == 0)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid argument"));
    vdev_device_t *d = &s->devs[device];
    if (size > s->cfg.capacity - (used_bytes(d) < s->cfg.capacity ? used_bytes(d) : s->cfg.capacity))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EOOM, "out of memory"));
    if (gm_vdev_grow((void **)&d->used, &d->cap_used, d->n_used, sizeof(used_t)))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ENOMEM, "host out of memory"));
    uintptr_t p;
    if ((rc = get_space(s, d, size, &p)))
        GM_VDEV_LEAVE(s, rc);
    d->used[d->n_used++] = (used_t){p, size, 0, NULL};
    d->counters.bytes_allocated += size;
    d->counters.live_segments++;
    note_peak(d);
    *out = p;
    GM_VDEV_LEAVE(s, GM_OK);
}

int gm_vdev_seg_free(void *ctx, int device, uintptr_t ptr, size_t size) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_SEG_FREE, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    if (gm_vdev_bad_device(s, device))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid device ordinal"));
    vdev_device_t *d = &s->devs[device];
    used_t *u = find_used(d, ptr, 0);
    if (!u)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL,
                                           "free of an address that is not a live segment"));
    size = u->size;
    put_space(s, d, ptr, size);
    drop_used(d, u);
    d->counters.bytes_allocated -= size;
    d->counters.live_segments--;
    GM_VDEV_LEAVE(s, GM_OK);
}

/* ---------------------------------------------- reservations, mapping */

int gm_vdev_vmm_granularity(void *ctx, int device, size_t *out) {
    gm_vdev_t *s = ctx;
    if (!s->cfg.granularity)
        return GM_ENOTSUP;
    *out = s->cfg.granularity;
    return GM_OK;
}

int gm_vdev_va_reserve(void *ctx, int device, size_t size, size_t alignment, uintptr_t *out) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_VA_RESERVE, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    if (gm_vdev_bad_device(s, device) || !s->cfg.granularity || size % s->cfg.granularity)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid reservation"));
    vdev_device_t *d = &s->devs[device];
    if (gm_vdev_grow((void **)&d->used, &d->cap_used, d->n_used, sizeof(used_t)))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ENOMEM, "host out of memory"));
    uint8_t *m = calloc(size / s->cfg.granularity, 1);
    if (!m)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ENOMEM, "host out of memory"));
    uintptr_t va;
    if ((rc = get_space(s, d, size, &va))) {
        free(m);
        GM_VDEV_LEAVE(s, rc);
    }
    d->used[d->n_used++] = (used_t){va, size, 1, m};
    d->counters.bytes_reserved_va += size;
    d->counters.live_reservations++;
    *out = va;
    GM_VDEV_LEAVE(s, GM_OK);
}

int gm_vdev_va_free(void *ctx, int device, uintptr_t va, size_t size) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    if (gm_vdev_bad_device(s, device))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid device ordinal"));
    vdev_device_t *d = &s->devs[device];
    used_t *u = find_used(d, va, 1);
    if (!u || u->size != size)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL,
                                           "free of an address range that is not reserved"));
    for (size_t k = 0; k < size / s->cfg.granularity; k++)
        if (u->mapped[k])
            GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ESTATE,
                                               "address range still has mapped memory"));
    put_space(s, d, va, size);
    drop_used(d, u);
    d->counters.bytes_reserved_va -= size;
    d->counters.live_reservations--;
    GM_VDEV_LEAVE(s, GM_OK);
}

int gm_vdev_map(void *ctx, int device, uintptr_t va, size_t size) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_MAP, size);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    if (gm_vdev_bad_device(s, device))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid device ordinal"));
    vdev_device_t *d = &s->devs[device];
    size_t g = s->cfg.granularity;
    used_t *u = find_va(d, va, size);
    if (!u || size == 0 || (va - u->start) % g || size % g)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL,
                                           "map outside a reservation or not granule aligned"));
    size_t first = (va - u->start) / g, n = size / g;
    for (size_t k = first; k < first + n; k++)
        if (u->mapped[k])
            GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ESTATE, "address already mapped"));
    if (used_bytes(d) + size > s->cfg.capacity)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EOOM, "out of memory"));
    memset(u->mapped + first, 1, n);
    d->counters.bytes_mapped += size;
    note_peak(d);
    GM_VDEV_LEAVE(s, GM_OK);
}

int gm_vdev_unmap(void *ctx, int device, uintptr_t va, size_t size) {
    gm_vdev_t *s = ctx;
    GM_VDEV_ENTER(s);
    int rc = gm_vdev_inject(s, GM_VDEV_FN_UNMAP, 0);
    if (rc)
        GM_VDEV_LEAVE(s, rc);
    if (gm_vdev_bad_device(s, device))
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL, "invalid device ordinal"));
    vdev_device_t *d = &s->devs[device];
    size_t g = s->cfg.granularity;
    used_t *u = find_va(d, va, size);
    if (!u || size == 0 || (va - u->start) % g || size % g)
        GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_EINVAL,
                                           "unmap outside a reservation or not granule aligned"));
    size_t first = (va - u->start) / g, n = size / g;
    for (size_t k = first; k < first + n; k++)
        if (!u->mapped[k])
            GM_VDEV_LEAVE(s, gm_vdev_set_error(s, GM_ESTATE,
                                               "unmap of memory that is not mapped"));
    memset(u->mapped + first, 0, n);
    if (s->cfg.mode == GM_VDEV_HOST)
        madvise((void *)va, size, MADV_DONTNEED); /* contents are gone, as on a GPU */
    d->counters.bytes_mapped -= size;
    GM_VDEV_LEAVE(s, GM_OK);
}

