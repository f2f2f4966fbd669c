/*
 * clock.c - the anchor and the conversion of event ticks to epoch
 * microseconds (clock.h, Note [Event clock]).
 */
#include "clock.h"

static uint64_t anchor_ticks, anchor_ns; /* written once before any event; immutable after */

/* A tick reading and the realtime clock taken together: the ticks are the
 * midpoint of two readings around the clock's, from the tightest of a few
 * tries (a thread preempted between its readings would otherwise put the
 * pair off by a time slice and skew the rate of every conversion). */
static void pair_now(uint64_t *ticks, uint64_t *ns) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = gm_clock_ticks();
        uint64_t t = gm_clock_realtime_ns();
        uint64_t b = gm_clock_ticks();
        if (b - a < best) {
            best = b - a;
            *ticks = a + (b - a) / 2;
            *ns = t;
        }
    }
}

void gm_clock_anchor(void) { pair_now(&anchor_ticks, &anchor_ns); }

void gm_clock_conv_now(gm_clock_conv_t *c) {
    c->t0 = anchor_ticks;
    c->ns0 = anchor_ns;
    pair_now(&c->t1, &c->ns1);
    /* nanoseconds per tick in 24.40 fixed point: no division per event */
    c->mult = c->t1 > c->t0 && c->ns1 > c->ns0
                  ? (uint64_t)(((unsigned __int128)(c->ns1 - c->ns0) << 40) / (c->t1 - c->t0))
                  : 0;
}

uint64_t gm_clock_to_us(const gm_clock_conv_t *c, uint64_t ticks) {
    if (ticks <= c->t0)
        return c->ns0 / 1000u;
    if (!c->mult) /* no span to take a rate from */
        return (ticks >= c->t1 ? c->ns1 : c->ns0) / 1000u;
    uint64_t dt = ticks - c->t0;
    if (dt > c->t1 - c->t0)
        dt = c->t1 - c->t0; /* stamped after the copy's pair: at most its time */
    uint64_t dns = (uint64_t)(((unsigned __int128)dt * c->mult) >> 40);
    if (dns > c->ns1 - c->ns0)
        dns = c->ns1 - c->ns0;
    return (c->ns0 + dns) / 1000u;
}
