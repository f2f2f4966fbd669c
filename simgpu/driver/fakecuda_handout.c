/*
 * fakecuda_handout.c - a caching allocator tells the driver that it handed
 * a block of device memory out (Note [Blocks handed out]).
 *
 * Invariants: only writable device memory is touched, and only blocks of
 * at most FC_NOHOST_KEEP bytes; the accounting does not change.
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

/*
 * Note [Blocks handed out]
 * Rationale: kernels compute nothing, so a kernel's output read back (a
 *   loss's `.item()`, an all-reduced scalar) is whatever bytes its block
 *   held before: with a caching allocator, what an earlier tensor copied
 *   there. torchtitan stops at a loss that is not finite, and on 2
 *   simulated GPUs a run read back NaN (another, -inf) left in a reused
 *   block by an earlier copy: a run that works on a GPU, where a kernel
 *   writes the value, failed now and then. Fresh device memory reads
 *   zeros, which every such check accepts.
 * Approach: gpumem's allocator calls fakecuda_block_handed_out(ptr, n)
 *   each time it hands a block out, when the driver it loaded exports the
 *   name (only this fake does). A block of at most FC_NOHOST_KEEP (64 KiB)
 *   bytes is set to zeros, as a memset would set it; what the program
 *   then copies there reads back as copied. Larger blocks are left as they
 *   are: zeroing them would cost their host memory and time, and the
 *   values programs test are scalars.
 * Limitations: torch's own allocator does not call it, so under torch's
 *   allocator a small kernel output can still read back stale bytes
 *   (tests/sim/test_handout.py shows both); a tensor read without being
 *   written (`torch.empty(1).item()`) reads zeros where a GPU gives
 *   whatever was there.
 */

FC_API int fakecuda_block_handed_out(CUdeviceptr ptr, size_t n)
{
    int rc = -1;
    fc_lock();
    if (fc.initialized && fc_accessible_unlocked(ptr, n, 1)) {
        if (n <= FC_NOHOST_KEEP)
            fc_fill_unlocked(ptr, 0, 1, n);
        rc = 0;
    }
    fc_unlock();
    return rc;
}
