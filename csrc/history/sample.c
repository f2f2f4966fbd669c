/*
 * sample.c - the always-on sampled mode: which allocations have their stack
 * captured.
 *
 * Invariants: with sampling off every allocation is captured; with it on,
 * an allocation of at least the threshold always is, and a smaller one of s
 * bytes is with probability exactly 1 - exp(-s / mean), independently of
 * every other allocation of the same thread except through the bytes
 * between them. Must not: lock, block, allocate or call Python (it runs on
 * every allocation, before the allocator lock, on any thread, also inside
 * CUDA stream capture).
 *
 * Note [Sampled recording]
 * Rationale: a stack capture is most of what recording costs per
 *   allocation; a mode cheap enough to leave on in every run captures few
 *   of them, but an OOM must still name what holds the memory, and reports
 *   per site must not be biased towards large or small allocations.
 * Approach: tcmalloc's heap-profiler sampling. Allocations at or above the
 *   threshold (default 1 MiB: torch's large-pool boundary; they are few
 *   and hold most of a training step's bytes) are always captured. Below
 *   it, each thread counts down the bytes to its next sample point, drawn
 *   from an exponential distribution with the mean interval: the sample
 *   points form a Poisson process over the bytes the thread allocates, so
 *   every byte is equally likely to be sampled and an allocation is
 *   captured when a point falls inside it, with probability
 *   p(s) = 1 - exp(-s / mean); dividing by p(s) makes per-site counts and
 *   bytes unbiased. After a capture the next interval is drawn afresh
 *   (the process is memoryless). The generator is splitmix64, seeded per
 *   thread from (seed, the order in which threads first allocate after the
 *   configuration), so one thread's decisions repeat exactly under a seed.
 * Limitations: the counter is per thread (thread-local), so threads that
 *   allocate little each start a fresh interval; p(s) still holds. Frees
 *   are not sampled (the free path captures no stack in this mode).
 */
#include <math.h>
#include <stdatomic.h>

#include "sample.h"

/* Written by gm_hist_sampling_set (under the history registry lock, or by
 * a single caller), read lock-free. */
static _Atomic uint64_t cfg_mean;      /* 0: off */
static _Atomic uint64_t cfg_threshold;
static _Atomic uint64_t cfg_seed;
static atomic_uint cfg_generation;     /* bumped by every set */
static atomic_uint gen_threads;        /* threads seeded in this generation */

typedef struct sampler {
    unsigned generation; /* cfg_generation when this thread last seeded */
    uint64_t rng;        /* splitmix64 state */
    uint64_t left;       /* bytes to the next sample point */
} sampler_t;
static _Thread_local sampler_t tls_sampler; /* protected by: thread-local */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* The bytes to the next sample point: exponential with mean `mean`, at
 * least 1 (a sample point lies inside an allocation of s bytes when this is
 * at most s). */
static uint64_t draw(sampler_t *t, uint64_t mean) {
    double u = ((double)(splitmix64(&t->rng) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double x = ceil(-log(u) * (double)mean);
    return x < 1.0 ? 1 : x >= 0x1.0p63 ? (UINT64_C(1) << 63) : (uint64_t)x;
}

void gm_hist_sampling_set(const gm_hist_sampling_t *s) {
    atomic_store(&cfg_threshold, s->threshold);
    atomic_store(&cfg_seed, s->seed);
    atomic_store(&gen_threads, 0);
    atomic_fetch_add(&cfg_generation, 1);
    atomic_store(&cfg_mean, s->mean_bytes); /* last: a reader that sees it sees the rest */
}

void gm_hist_sampling_get(gm_hist_sampling_t *out) {
    out->mean_bytes = atomic_load(&cfg_mean);
    out->threshold = atomic_load(&cfg_threshold);
    out->seed = atomic_load(&cfg_seed);
}

int gm_hist_sampling_on(void) { return atomic_load_explicit(&cfg_mean, memory_order_relaxed) != 0; }

/* This thread's first sampled allocation since the last configuration. */
static void reseed(sampler_t *t, unsigned generation, uint64_t mean) {
    uint64_t order = atomic_fetch_add(&gen_threads, 1);
    t->generation = generation;
    t->rng = atomic_load(&cfg_seed) ^ (order * UINT64_C(0xD1B54A32D192ED03));
    t->left = draw(t, mean);
}

int gm_hist_sample(size_t size) {
    uint64_t mean = atomic_load_explicit(&cfg_mean, memory_order_acquire);
    if (!mean || size >= atomic_load_explicit(&cfg_threshold, memory_order_relaxed))
        return 1;
    sampler_t *t = &tls_sampler;
    unsigned generation = atomic_load_explicit(&cfg_generation, memory_order_relaxed);
    if (t->generation != generation)
        reseed(t, generation, mean);
    if (t->left > size) {
        t->left -= size;
        return 0;
    }
    t->left = draw(t, mean);
    return 1;
}
