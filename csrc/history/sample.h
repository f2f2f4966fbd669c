/*
 * sample.h - the always-on sampled mode's decision: which allocations get
 * their stack captured (Note [Sampled recording] in sample.c).
 *
 * Every allocation of at least the threshold is captured; smaller ones are
 * sampled by bytes allocated, a Poisson process with a mean interval of
 * `mean_bytes`, so an allocation of s bytes is captured with probability
 * 1 - exp(-s / mean_bytes) and a captured one stands for
 * s / (1 - exp(-s / mean_bytes)) bytes (gpumem/snapshots/sampling.py scales
 * reports so).
 * Pure C, lock-free: the decision reads two relaxed atomics and this
 * thread's own counter. Must not: take a lock or call Python.
 */
#ifndef GM_HISTORY_SAMPLE_H
#define GM_HISTORY_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sampling parameters; mean_bytes 0: every allocation is captured. */
typedef struct gm_hist_sampling {
    uint64_t mean_bytes;
    uint64_t threshold; /* allocations of at least this many bytes are always captured */
    uint64_t seed;      /* each thread's generator starts from (seed, thread order) */
} gm_hist_sampling_t;

/* Set the parameters for every thread; each thread's counter and generator
 * restart from the seed at its next allocation. */
void gm_hist_sampling_set(const gm_hist_sampling_t *s);
void gm_hist_sampling_get(gm_hist_sampling_t *out);
/* Nonzero while allocations are sampled (mean_bytes > 0). Lock-free. */
int gm_hist_sampling_on(void);

/* Should the stack of an allocation of `size` bytes be captured? 1 when
 * sampling is off. Call before the allocator lock, once per allocation. */
int gm_hist_sample(size_t size);

#ifdef __cplusplus
}
#endif
#endif /* GM_HISTORY_SAMPLE_H */
