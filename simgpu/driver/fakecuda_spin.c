/*
 * fakecuda_spin.c - loops that wait on a kernel's result end
 * (Note [Reads that wait on kernels]).
 *
 * fc_spin_kernel_unlocked counts kernel launches; fc_spin_write_unlocked
 * forgets the reads a copy or memset overwrites; fc_spin_read_unlocked
 * sees every small read of device memory into host memory, after its data
 * moved, and may replace that data with zeros.
 *
 * Invariants: only reads of at most SPIN_MAX bytes are followed, in
 * SPIN_SLOTS slots (least recently used replaced); a read is changed only
 * after SPIN_READS reads of the same bytes at the same place with kernels
 * launched between them and no copy or memset writing there.
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <string.h>

/*
 * Note [Reads that wait on kernels]
 * Rationale: kernels compute nothing, so a loop that launches kernels until
 *   a result read back says stop spins forever on the simulator: torch's
 *   nn.init.trunc_normal_ redraws until `mask.any()` is false, and the byte
 *   `.any()` reads is whatever an earlier copy left in a reused block
 *   (torchtitan's model init hung at 100% CPU, with no message). Reading
 *   zeros for every small read would fix that loop but break programs that
 *   read back what they copied (DDP compares every rank's parameter shapes,
 *   Note [No host memory]).
 * Approach: a read of at most 64 bytes from device memory that returns the
 *   same bytes from the same address SPIN_READS (64) times in a row, with
 *   kernels launched between the reads and no copy or memset writing
 *   there, is a program waiting for a kernel to change a value: on a GPU
 *   it would have changed. From then on that read gives zeros, the value
 *   of a kernel's output in fresh device memory and the one that ends the
 *   usual loops (`.any()`, `.item()` of a count, a nonzero() size). The
 *   first time, one line on stderr says so. A copy or memset that writes
 *   the range, or a read of other bytes, starts counting again.
 * Limitations: a loop that waits for a non-zero value (`while not
 *   x.all()`) still spins; a program that reads the same value it copied
 *   once, 64 times, with kernels between and no write, gets zeros from the
 *   65th read on; reads wider than 64 bytes are never changed.
 */

#define SPIN_MAX 64
#define SPIN_SLOTS 8
#define SPIN_READS 64

typedef struct {
    uint64_t src;     /* device address read; 0: slot free */
    size_t n;
    uint64_t launches; /* kernel launches seen at the last read */
    uint64_t used;     /* for least-recently-used replacement */
    unsigned same;     /* reads in a row that found the same bytes */
    unsigned char bytes[SPIN_MAX];
} spin_slot_t;

/* protected by: the driver lock */
static spin_slot_t slots[SPIN_SLOTS];
static uint64_t launches, clock_;
static int told;

void fc_spin_kernel_unlocked(void) { launches++; }

void fc_spin_write_unlocked(uint64_t dst, size_t n)
{
    for (int i = 0; i < SPIN_SLOTS; i++)
        if (slots[i].src && dst < slots[i].src + slots[i].n && slots[i].src < dst + n)
            slots[i].src = 0;
}

static void spin_read(uint64_t dst, uint64_t src, size_t n)
{
    spin_slot_t *s = NULL, *victim = &slots[0];
    for (int i = 0; i < SPIN_SLOTS; i++) {
        if (slots[i].src == src && slots[i].n == n)
            s = &slots[i];
        if (slots[i].used < victim->used)
            victim = &slots[i];
    }
    const unsigned char *got = (const unsigned char *)(uintptr_t)dst;
    if (s && s->launches != launches && memcmp(s->bytes, got, n) == 0) {
        s->same++;
    } else {
        if (!s) {
            s = victim;
            s->src = src;
            s->n = n;
        }
        s->same = 0;
        memcpy(s->bytes, got, n);
    }
    s->launches = launches;
    s->used = ++clock_;
    if (s->same < SPIN_READS)
        return;
    memset((void *)(uintptr_t)dst, 0, n);
    if (!told) {
        told = 1;
        fprintf(stderr, "fakecuda: the program read the same %zu byte(s) of device memory back "
                "%d times while launching kernels and writing nothing there: a loop waiting on a "
                "kernel's result, which the simulator does not compute; these reads now give "
                "zeros (Note [Reads that wait on kernels], docs/simulation.md)\n",
                n, SPIN_READS);
    }
}

/* Is p in device memory? */
static int on_device(uint64_t p)
{
    uint64_t base;
    size_t size;
    int dev;
    return fc_lookup_device_ptr_unlocked(p, &base, &size, &dev);
}

void fc_spin_moved_unlocked(uint64_t dst, uint64_t src, size_t n)
{
    fc_spin_write_unlocked(dst, n);
    if (n <= SPIN_MAX && on_device(src) && !on_device(dst))
        spin_read(dst, src, n);
}
