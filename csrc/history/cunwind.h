/*
 * cunwind.h - the calling thread's C return addresses from the unwind
 * tables, with each address's rule cached (cunwind.c), and the rule of one
 * address read from .eh_frame (cfi.c). x86-64 Linux only; elsewhere
 * gm_cunwind returns -1 and cframes.c uses glibc's backtrace().
 *
 * Note [Cached unwind]
 * Rationale: stacks='all' captured C frames with glibc's backtrace(), which
 *   runs libgcc's unwinder: per frame it finds the FDE and interprets its
 *   call-frame instructions again, about 330 ns a frame here. A torch
 *   allocation's C stack is tens of frames deep, and on a GPT training
 *   step (1,115 allocations, each captured at allocation and at free) the
 *   recorder cost about 40 us per allocation against torch's 7 to 8 us
 *   (simulated GPU); on an H200 it took the step from 38.8 to 70.7 ms
 *   (torch's unwinder caches each address's rule; docs/benchmarks.md,
 *   issue 32). The cached walk costs about 11 ns a frame.
 * Approach: the rule of a return address (CFA = rsp or rbp + offset, or
 *   *(rbp + offset) after stack realignment; the return address and the
 *   caller's rbp at fixed offsets from the CFA) is computed once from
 *   .eh_frame (cfi.c) and kept in a process-wide open-addressed table,
 *   inserted lock-free (a slot is claimed by compare-and-swap and published
 *   with a release store) and never changed. A walk is then one table probe
 *   and two loads per frame. Every load is checked against the thread's
 *   stack bounds; an address whose rule the subset cannot express, a load
 *   out of bounds, or code outside any loaded object (run-time generated)
 *   makes the whole capture fall back to backtrace(). The walk stops where
 *   libgcc's does: after a frame whose return address is undefined
 *   (_start, clone3) or whose address has no FDE.
 * Limitations: x86-64 only. A library unloaded and another loaded at the
 *   same address keep the first one's cached rules; the bounds checks keep
 *   a wrong rule from reading outside the stack, but the frames above it
 *   may be wrong. Signal frames fall back to backtrace().
 */
#ifndef GM_HISTORY_CUNWIND_H
#define GM_HISTORY_CUNWIND_H

#include <stdint.h>

#if defined(__x86_64__) && defined(__linux__)
#define GM_CUNWIND_SUPPORTED 1
#else
#define GM_CUNWIND_SUPPORTED 0
#endif

enum { GM_CFA_REG = 1, GM_CFA_DEREF = 2 };

/* How to step from a frame at one return address to its caller. */
typedef struct gm_cfi_rule {
    uint8_t cfa_kind;  /* GM_CFA_REG: CFA = reg + cfa_off; GM_CFA_DEREF: *(reg + cfa_off) */
    uint8_t cfa_reg;   /* 6 = rbp, 7 = rsp */
    uint8_t rbp_saved; /* the caller's rbp is at CFA + rbp_off (else: unchanged) */
    int32_t cfa_off, ra_off, rbp_off;
} gm_cfi_rule_t;

enum {
    GM_CFI_OK = 1,   /* *out holds the rule */
    GM_CFI_END = 2,  /* the return address is undefined: the outermost frame */
    GM_CFI_NONE = 3, /* in a loaded object, but no FDE covers it */
    GM_CFI_SLOW = 4, /* not expressible here: use backtrace() */
};

/* The rule at code address pc (a return address minus one): GM_CFI_*. */
int gm_cfi_rule(uintptr_t pc, gm_cfi_rule_t *out);

/* Up to max return addresses of the caller's stack, innermost first (the
 * first is the return address into gm_cunwind's caller), after skipping
 * `skip`; the count, or -1 when the walk must be made by backtrace(). */
int gm_cunwind(uintptr_t *out, int max, int skip);

#endif /* GM_HISTORY_CUNWIND_H */
