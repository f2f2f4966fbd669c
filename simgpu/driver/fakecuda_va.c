/*
 * fakecuda_va.c - where cuMemAlloc puts device memory: one address range
 * per device, handed out first-fit from its low end in 2 MiB units, so
 * successive allocations get increasing, adjacent addresses, and a freed
 * range is reused by the next allocation that fits (Note [Device
 * addresses]).
 *
 * Invariants: a device's allocations lie inside its range, never overlap,
 * start on a 2 MiB boundary and are a whole number of 2 MiB units long
 * (map_size); the rest of the range is PROT_NONE and costs nothing.
 *
 * Must not: place VMM reservations (cuMemAddressReserve has its own
 * mappings), or call an exported cu* function.
 */
#include "fakecuda_internal.h"

#include <sys/mman.h>

/*
 * Note [Device addresses]
 * Rationale: allocators and tools reason about addresses (neighbouring
 *   segments, fragmentation views, "is this pointer in that segment"), and
 *   a fake that hands out addresses in an order no driver does hides
 *   mistakes. Each cuMemAlloc used to be its own mmap, which Linux places
 *   top-down: strictly decreasing addresses.
 * Approach: what 30 snapshots of PyTorch on real GPUs show
 *   (/work/shared/snapshots, simgpu/driver/README.md): every one of
 *   8,570 segment addresses is a multiple of 2 MiB; every gap between
 *   neighbouring segments is a multiple of 2 MiB, and half of them (4,285
 *   of 8,541) are zero; in the 17 snapshots whose traces show the order,
 *   84% of the steps from one newly used segment to the next go up (16 of
 *   the 17 mostly up), and the rest fill holes left lower down. So each device reserves one
 *   PROT_NONE, MAP_NORESERVE range at its first allocation and places
 *   every allocation at the lowest 2 MiB-aligned gap that fits
 *   (first fit), mapping it read-write with MAP_FIXED; a free maps the
 *   range PROT_NONE again, which drops its pages.
 * Limitations: the real driver packs small allocations (below 2 MiB)
 *   into shared 2 MiB pages; here each takes its own 2 MiB of address
 *   space (capacity is still charged by the requested size). The range is
 *   the capacity plus FC_VA_SLACK, so at most FC_VA_SLACK / 2 MiB small
 *   allocations fit beyond the capacity's worth of large ones.
 */

#define FC_VA_ALIGN (2ull << 20)
#define FC_VA_SLACK (64ull << 30)

static uint64_t round_up(uint64_t n) { return (n + FC_VA_ALIGN - 1) & ~(FC_VA_ALIGN - 1); }

/* Reserve (or re-reserve after a capacity change) the device's range. */
static int ensure_range_unlocked(fc_device_t *d)
{
    size_t want = round_up(d->capacity) + FC_VA_SLACK;
    if (d->va_base && d->n_allocs == 0 && d->va_size != want) {
        munmap((void *)(uintptr_t)d->va_base, d->va_size);
        d->va_base = 0;
    }
    if (d->va_base)
        return 0;
    char *p = mmap(NULL, want + FC_VA_ALIGN, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    uint64_t start = round_up((uint64_t)(uintptr_t)p);
    if (start > (uint64_t)(uintptr_t)p)
        munmap(p, start - (uint64_t)(uintptr_t)p);
    uint64_t tail = (uint64_t)(uintptr_t)p + want + FC_VA_ALIGN - (start + want);
    if (tail)
        munmap((void *)(uintptr_t)(start + want), tail);
    d->va_base = start;
    d->va_size = want;
    return 0;
}

int fc_va_alloc_unlocked(int dev, size_t size, uint64_t *ptr, size_t *map_size)
{
    fc_device_t *d = &fc.dev[dev];
    uint64_t map = round_up(size);
    if (map < size || ensure_range_unlocked(d))
        return -1;
    uint64_t cur = d->va_base, end = d->va_base + d->va_size;
    for (size_t i = fc_vec_lower(&fc.allocs, cur); i < fc.allocs.n; i++) {
        const fc_alloc_t *a = fc.allocs.v[i].val;
        if (a->ptr >= end || a->ptr - cur >= map)
            break;
        cur = a->ptr + a->map_size;
    }
    if (end - cur < map)
        return -1;
    void *p = mmap((void *)(uintptr_t)cur, map, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    *ptr = cur;
    *map_size = map;
    return 0;
}

void fc_va_free_unlocked(uint64_t ptr, size_t map_size)
{
    mmap((void *)(uintptr_t)ptr, map_size, PROT_NONE,
         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}
