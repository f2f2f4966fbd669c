/*
 * fakecuda_nohost.c - where the data of every copy and memset goes: the
 * one place that writes device memory or reads it back, and the mode in
 * which device memory holds no data at all (GPUMEM_FAKECUDA_NO_HOST_MEMORY=1,
 * Note [No host memory]).
 *
 * Every driver path that moves data calls fc_move_unlocked (cuMemcpy*,
 * HtoD, DtoH, DtoD, peer and async copies, captured copies replayed by a
 * graph launch) or fc_fill_unlocked (cuMemsetD8/D32 and their async
 * variants, cuStreamWriteValue32, captured memsets). The ranges are
 * checked by the callers; these only move bytes.
 *
 * Invariants: with the mode on, the host reads or writes device memory
 * only in pieces of at most FC_NOHOST_KEEP bytes, so device memory costs
 * host memory only for what small copies touch; the accounting (capacity,
 * bytes used, peaks, out-of-memory) does not depend on the mode.
 *
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <string.h>

/*
 * Note [No host memory]
 * Rationale: device memory is host memory that a copy touches, so a
 *   program that fills its parameters (an H2D copy of a checkpoint, a
 *   memset) costs as much host memory as device memory: a 7B-parameter
 *   fp32 model is 28 GB per process, and eight simulated ranks of anything
 *   large cannot run on a small machine. The simulator's product is memory
 *   figures, not values (kernels compute nothing), so the data can go.
 * Approach: GPUMEM_FAKECUDA_NO_HOST_MEMORY=1, read once with the rest of
 *   the configuration (the first cuInit), sets fc.no_host_memory. Then a
 *   copy or memset of more than FC_NOHOST_KEEP (64 KiB) bytes whose
 *   destination is device memory stores nothing, and one whose source is
 *   device memory and destination host memory fills the destination with
 *   zeros without reading the device range (no page of the device mapping
 *   is touched, not even the zero page's page tables). Host-to-host copies
 *   (pinned memory) copy as always. Pieces of at most 64 KiB still move
 *   data: they are the values programs read back to decide things that
 *   must agree across ranks (DDP all-gathers every rank's parameter shapes
 *   and compares them with its own; with zeros it stops with "DDP expects
 *   same model across all ranks"), flags and scalars; they dirty at most
 *   the pages they touch, so the host cost stays that of the small tensors
 *   written from the host, not of the model. Checks, errors, capture, the
 *   timeline and the accounting are the same code as without the mode:
 *   only the bytes are dropped. The other fakes ask the driver
 *   (sim_no_host_memory_drops in ../common/simcommon.c): the fake NCCL's
 *   data copies and cuBLAS's Set/Get Vector/Matrix follow the same rule.
 * Limitations: a tensor of more than 64 KiB written from the host reads
 *   back as zeros (`.cpu()`, `print`, a checkpoint saved from the device);
 *   a large read-back returns zeros even where small writes stored data.
 *   Kernel outputs are zeros with or without the mode (kernels do not
 *   run): `.item()` of a computed loss, GradScaler's found_inf (no step is
 *   skipped). Device memory stays mapped read-write, so a stray path that
 *   touches it directly still works, at the cost of host memory.
 */

/* Is p in device memory (an allocation, a mapping or a reservation)? */
static int on_device_unlocked(uint64_t p)
{
    uint64_t base;
    size_t size;
    int dev;
    return fc_lookup_device_ptr_unlocked(p, &base, &size, &dev);
}

static void move_data(uint64_t dst, uint64_t src, size_t n)
{
    if (!fc.no_host_memory || n <= FC_NOHOST_KEEP) {
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return;
    }
    if (on_device_unlocked(dst))
        return;
    if (on_device_unlocked(src))
        memset((void *)(uintptr_t)dst, 0, n);
    else
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
}

void fc_move_unlocked(uint64_t dst, uint64_t src, size_t n)
{
    if (n == 0)
        return;
    move_data(dst, src, n);
    fc_spin_moved_unlocked(dst, src, n); /* Note [Reads that wait on kernels] */
}

void fc_fill_unlocked(uint64_t dst, unsigned int value, size_t elem, size_t n)
{
    fc_spin_write_unlocked(dst, n * elem);
    /* a memset's destination is always device memory */
    if (fc.no_host_memory && n * elem > FC_NOHOST_KEEP)
        return;
    if (elem == 1) {
        memset((void *)(uintptr_t)dst, (int)(value & 0xff), n);
    } else {
        uint32_t *p = (uint32_t *)(uintptr_t)dst;
        for (size_t i = 0; i < n; i++)
            p[i] = value;
    }
}
