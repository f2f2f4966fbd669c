/*
 * cunwind.c - the calling thread's C return addresses, walked with each
 * address's unwind rule cached (Note [Cached unwind] in cunwind.h).
 *
 * Invariants: a table slot, once published (its pc stored with release
 *   order), never changes; every stack load lies in [the walk's own frame,
 *   the thread's stack top). The rules come from cfi.c.
 * Must not: allocate after a thread's first walk, take locks (the first
 *   walk of a thread asks pthread for its stack; a rule's first look-up
 *   takes the loader's lock in dl_iterate_phdr), or touch Python.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_getattr_np */
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cunwind.h"

#if GM_CUNWIND_SUPPORTED

enum { SLOTS = 1 << 14, MAX_PROBES = 32 };
#define BUSY ((uintptr_t)1) /* a slot being filled */

typedef struct slot {
    _Atomic uintptr_t pc; /* the return address; 0 empty, BUSY being filled */
    uint8_t status;       /* GM_CFI_* */
    gm_cfi_rule_t rule;
} slot_t;

/* protected by: the slot's pc (claimed by CAS, published with release) */
static slot_t table[SLOTS];

static size_t slot_of(uintptr_t pc) {
    return (size_t)((pc * UINT64_C(0x9E3779B97F4A7C15)) >> 40) & (SLOTS - 1);
}

static void insert(uintptr_t pc, int status, const gm_cfi_rule_t *r) {
    size_t i = slot_of(pc);
    for (int probe = 0; probe < MAX_PROBES; probe++, i = (i + 1) & (SLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&table[i].pc, memory_order_acquire);
        if (k == pc)
            return;
        if (k == 0 && atomic_compare_exchange_strong_explicit(&table[i].pc, &k, BUSY,
                                                              memory_order_acquire,
                                                              memory_order_relaxed)) {
            table[i].status = (uint8_t)status;
            table[i].rule = *r;
            atomic_store_explicit(&table[i].pc, pc, memory_order_release);
            return;
        }
        if (k == pc)
            return; /* another thread published it meanwhile */
    }
    /* the neighbourhood is full: computed again next time */
}

/* The rule of return address pc (GM_CFI_*). */
static int rule_of(uintptr_t pc, gm_cfi_rule_t *r) {
    size_t i = slot_of(pc);
    for (int probe = 0; probe < MAX_PROBES; probe++, i = (i + 1) & (SLOTS - 1)) {
        uintptr_t k = atomic_load_explicit(&table[i].pc, memory_order_acquire);
        if (k == pc) {
            *r = table[i].rule;
            return table[i].status;
        }
        if (k == 0)
            break;
    }
    int status = gm_cfi_rule(pc - 1, r); /* pc - 1: inside the call */
    insert(pc, status, r);
    return status;
}

/* This thread's stack top, 0 if unknown (protected by: thread-local). */
static _Thread_local uintptr_t stack_top;
static _Thread_local int stack_known; /* 1 known, -1 failed */

static uintptr_t thread_stack_top(void) {
    if (stack_known)
        return stack_top;
    pthread_attr_t attr;
    void *addr = NULL;
    size_t size = 0;
    stack_known = -1;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr && size) {
            stack_top = (uintptr_t)addr + size;
            stack_known = 1;
        }
        pthread_attr_destroy(&attr);
    }
    return stack_top;
}

/* The word at a, if it lies in [lo, hi); else *ok = 0. */
static inline uintptr_t load(uintptr_t a, uintptr_t lo, uintptr_t hi, int *ok) {
    if (a < lo || a > hi - sizeof(uintptr_t) || (a & (sizeof(uintptr_t) - 1))) {
        *ok = 0;
        return 0;
    }
    return *(const uintptr_t *)a;
}

/* __builtin_frame_address(0) makes GCC and Clang keep a frame pointer in
 * this function; GCC is also told so explicitly. */
#if defined(__clang__)
#define KEEP_FRAME_POINTER __attribute__((noinline))
#else
#define KEEP_FRAME_POINTER __attribute__((noinline, optimize("no-omit-frame-pointer")))
#endif

KEEP_FRAME_POINTER int gm_cunwind(uintptr_t *out, int max, int skip) {
    uintptr_t hi = thread_stack_top();
    if (!hi)
        return -1;
    /* This function keeps a frame pointer: fp[0] is the caller's rbp and
     * fp[1] the return address into it; the caller's rsp is fp + 2. */
    const uintptr_t *fp = __builtin_frame_address(0);
    uintptr_t lo = (uintptr_t)fp;
    if (lo >= hi)
        return -1;
    uintptr_t rbp = fp[0], pc = fp[1], sp = (uintptr_t)(fp + 2);
    int n = 0, ok = 1;
    for (int k = 0; n < max && pc > BUSY; k++) {
        if (k >= skip)
            out[n++] = pc;
        gm_cfi_rule_t r;
        int status = rule_of(pc, &r);
        if (status == GM_CFI_END || status == GM_CFI_NONE)
            break;
        if (status != GM_CFI_OK)
            return -1;
        uintptr_t base = r.cfa_reg == 7 ? sp : rbp;
        uintptr_t cfa = base + (uintptr_t)(intptr_t)r.cfa_off;
        if (r.cfa_kind == GM_CFA_DEREF)
            cfa = load(cfa, lo, hi, &ok);
        if (!ok || cfa <= sp || cfa > hi)
            return -1;
        if (r.rbp_saved)
            rbp = load(cfa + (uintptr_t)(intptr_t)r.rbp_off, lo, hi, &ok);
        pc = load(cfa + (uintptr_t)(intptr_t)r.ra_off, lo, hi, &ok);
        if (!ok)
            return -1;
        sp = cfa;
    }
    return n;
}

#else
int gm_cunwind(uintptr_t *out, int max, int skip) {
    (void)out, (void)max, (void)skip;
    return -1;
}
#endif /* GM_CUNWIND_SUPPORTED */
