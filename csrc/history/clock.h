/*
 * clock.h - event timestamps: a tick counter cheap enough for every event,
 * converted to microseconds since the Unix epoch when events are copied.
 *
 * Note [Event clock]
 * Rationale: clock_gettime(CLOCK_REALTIME) costs about 30 ns here, the
 *   TSC about 18, and a pair of allocations records three events. Torch
 *   also stamps events from the TSC and converts at snapshot time.
 * Approach: gm_clock_ticks() reads the TSC on x86 (the realtime clock in
 *   nanoseconds elsewhere). gm_clock_anchor() pairs a tick reading with
 *   the realtime clock once, before any event is stamped; a copy pairs
 *   them again (gm_clock_conv_now) and maps each tick linearly between
 *   the two pairs, so every converted time lies between the anchor and
 *   the copy, in tick order, and the rate comes from the whole span since
 *   the anchor.
 * Limitations: assumes a TSC that runs at a constant rate and agrees
 *   between cores (constant_tsc / nonstop_tsc, what Linux requires to use
 *   it as its clocksource); a wall-clock step between the anchor and a
 *   copy is spread over the span instead of appearing as a jump. Each
 *   copy measures the rate again over a longer span, so two snapshots may
 *   give the same event times a microsecond apart (the later one's rate is
 *   the better estimate).
 */
#ifndef GM_HISTORY_CLOCK_H
#define GM_HISTORY_CLOCK_H

#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

static inline uint64_t gm_clock_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t gm_clock_ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    return gm_clock_realtime_ns();
#endif
}

typedef struct gm_clock_conv {
    uint64_t t0, ns0; /* the anchor */
    uint64_t t1, ns1; /* the copy's pair */
    uint64_t mult;    /* ns per tick, 24.40 fixed point; 0: no usable span */
} gm_clock_conv_t;

/* Take the anchor; once, before any event is stamped (not thread-safe:
 * call under a once guard). */
void gm_clock_anchor(void);
/* The conversion for events stamped up to now. */
void gm_clock_conv_now(gm_clock_conv_t *c);
/* ticks -> microseconds since the Unix epoch. */
uint64_t gm_clock_to_us(const gm_clock_conv_t *c, uint64_t ticks);

#endif /* GM_HISTORY_CLOCK_H */
