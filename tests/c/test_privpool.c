/*
 * test_privpool.c - private memory pools (torch's PrivatePool, for CUDA
 * graphs and torch.cuda.MemPool): routing, reuse only within a pool, use
 * counts, release and empty_cache, the walk's pool ids and filter, and the
 * capture rules (no event recorded or queried while a pool is allocating,
 * no release of the default pools on the out-of-memory path).
 *
 * The expected behaviour is torch's CUDACachingAllocator: beginAllocateToPool
 * / endAllocateToPool / releasePool / getPoolUseCount / emptyCache(id) and
 * release_cached_blocks with graph_pools_freeable.
 */
#include "helpers.h"

static const gm_mempool_id_t P1 = {0, 1}, P2 = {0, 2}, G1 = {7, 0};

static uintptr_t pmalloc_at(fx_t *fx, size_t size, uintptr_t stream, gm_mempool_id_t id,
                            const char *file, int line) {
    uintptr_t p = 0;
    int rc = gm_alloc_malloc_pool(fx->a, size, stream, 0, id, &p, NULL);
    if (rc != GM_OK || !p)
        gmtest_fail(file, line, "malloc_pool(%zu) = %d", size, rc);
    return p;
}
#define PMALLOC(fx, size, stream, id) pmalloc_at((fx), (size), (stream), (id), __FILE__, __LINE__)

static int use_count(fx_t *fx, gm_mempool_id_t id) {
    int n = -1;
    return gm_alloc_pool_use_count(fx->a, id, &n) == GM_OK ? n : -1;
}

/* The pool id the walk reports for the segment holding p. */
static gm_mempool_id_t pool_of(fx_t *fx, uintptr_t p) {
    gm_mempool_id_t none = {99, 99};
    walk_t w;
    walk_collect(fx, &w);
    const walk_seg_t *s = walk_segment(&w, p);
    gm_mempool_id_t id = s ? s->info.pool_id : none;
    walk_free(&w);
    return id;
}

static int count_segs(void *arg, const gm_segment_info_t *seg) {
    (void)seg;
    ++*(int *)arg;
    return 0;
}

TEST(privpool_blocks_are_reused_only_within_their_pool) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P1), GM_OK);
    CHECK_EQ(use_count(&fx, P1), 1);
    uintptr_t small = PMALLOC(&fx, 1000, S1, P1), large = PMALLOC(&fx, 3 * MiB, S1, P1);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_OK);
    CHECK_EQ(pool_of(&fx, small).second, 1);
    CHECK_EQ(pool_of(&fx, large).second, 1);
    size_t reserved = fx_reserved(&fx);
    CHECK(fx_allocated(&fx) >= 1024 + 3 * MiB);
    FREE(&fx, small);
    FREE(&fx, large);
    /* the default pools never see the private pool's free blocks */
    uintptr_t d1 = MALLOC(&fx, 1000, S1), d2 = MALLOC(&fx, 3 * MiB, S1);
    CHECK_NE(d1, small);
    CHECK_NE(d2, large);
    CHECK(fx_reserved(&fx) > reserved);
    CHECK_EQ(pool_of(&fx, d1).second, 0);
    FREE(&fx, d1);
    FREE(&fx, d2);
    /* ... and the private pool reuses its own */
    CHECK_EQ(PMALLOC(&fx, 1000, S1, P1), small);
    uintptr_t again = PMALLOC(&fx, 3 * MiB, S1, P1);
    CHECK_EQ(again, large);
    /* a second pool gets memory of its own */
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, P2), GM_OK);
    uintptr_t q = PMALLOC(&fx, 1000, S1, P2);
    CHECK_NE(q, small);
    CHECK_EQ(pool_of(&fx, q).second, 2);
    int n1 = 0, n2 = 0, nall = 0;
    gm_alloc_walk_pool(fx.a, P1, count_segs, &n1);
    gm_alloc_walk_pool(fx.a, P2, count_segs, &n2);
    gm_alloc_walk(fx.a, count_segs, &nall);
    CHECK(n1 >= 2);
    CHECK(n2 >= 1);
    CHECK(nall >= n1 + n2 + 1);
    int nunknown = 0;
    gm_mempool_id_t unknown = {5, 5};
    gm_alloc_walk_pool(fx.a, unknown, count_segs, &nunknown);
    CHECK_EQ(nunknown, 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(privpool_release_frees_on_empty_cache_only_when_unused) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, G1), GM_OK);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, G1), GM_OK); /* shared by two graphs */
    CHECK_EQ(use_count(&fx, G1), 2);
    uintptr_t p = PMALLOC(&fx, 5 * MiB, S0, G1);
    uintptr_t d = MALLOC(&fx, 5 * MiB, S0);
    FREE(&fx, p);
    FREE(&fx, d);
    size_t pool_bytes = fx_reserved(&fx) / 2;
    /* a live pool keeps its memory through empty_cache of everything or of it */
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), pool_bytes);
    CHECK_EQ(gm_alloc_empty_cache_pool(fx.a, G1, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), pool_bytes);
    CHECK_EQ(gm_alloc_pool_release(fx.a, G1), GM_OK);
    CHECK_EQ(use_count(&fx, G1), 1);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), pool_bytes);
    /* freeable: release does not free by itself, empty_cache(id) does */
    CHECK_EQ(gm_alloc_pool_release(fx.a, G1), GM_OK);
    CHECK_EQ(use_count(&fx, G1), 0);
    CHECK_EQ(fx_reserved(&fx), pool_bytes);
    CHECK_EQ(gm_alloc_empty_cache_pool(fx.a, G1, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_EQ(use_count(&fx, G1), -1); /* deleted: it held nothing */
    CHECK_EQ(gm_alloc_pool_release(fx.a, G1), GM_ENOTFOUND);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(privpool_released_with_live_blocks_waits_for_them) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, P1), GM_OK);
    uintptr_t p = PMALLOC(&fx, 3 * MiB, S0, P1);
    uintptr_t d = MALLOC(&fx, 1000, S0);
    FREE(&fx, d);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(use_count(&fx, P1), 0); /* kept: it still holds p */
    CHECK(fx_reserved(&fx) >= 3 * MiB);
    CHECK_EQ(pool_of(&fx, p).second, 1);
    FREE(&fx, p);
    CHECK_EQ(pool_of(&fx, p).second, 1); /* freed into its own pool */
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_EQ(use_count(&fx, P1), -1);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(privpool_misuse_is_refused) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    gm_mempool_id_t none = {0, 0};
    CHECK_EQ(gm_alloc_pool_begin(fx.a, none), GM_EINVAL);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, none), GM_EINVAL);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P1), GM_ESTATE);
    CHECK_EQ(use_count(&fx, P1), 1);
    CHECK_EQ(gm_alloc_pool_any_allocating(fx.a), 1);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_pool_any_allocating(fx.a), 0);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_ESTATE);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, P1), GM_ESTATE);
    /* a request routed to a pool that does not exist goes to the default */
    uintptr_t p = PMALLOC(&fx, 1000, S0, P2);
    CHECK_EQ(pool_of(&fx, p).second, 0);
    FREE(&fx, p);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(privpool_events_wait_until_no_pool_is_allocating) {
    fx_t fx;
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    uintptr_t d = MALLOC(&fx, 1000, S1);
    CHECK_EQ(gm_alloc_record_stream(fx.a, d, S2), GM_OK);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, G1), GM_OK);
    long rec0 = fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD];
    long q0 = fx_counters(&fx).calls[TDEV_FN_EVENT_QUERY];
    FREE(&fx, d);
    uintptr_t p = PMALLOC(&fx, 1000, S1, G1);
    CHECK_NE(p, d);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), GM_OK);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD], rec0); /* deferred */
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_EVENT_QUERY], q0);
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_pool_end(fx.a, G1), GM_OK);
    uintptr_t x = MALLOC(&fx, 1000, S1); /* polls: the deferred event is recorded now */
    CHECK_NE(x, d);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_EVENT_RECORD], rec0 + 1);
    fx_complete_events(&fx);
    uintptr_t y = MALLOC(&fx, 1000, S1);
    CHECK(y == d || fx.settings.expandable_segments);
    FREE(&fx, p);
    FREE(&fx, x);
    FREE(&fx, y);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(privpool_oom_while_allocating_keeps_the_default_cache) {
    fx_t fx;
    tdev_config_t cfg = dev_cfg(64 * MiB, TDEV_EVENTS_IMMEDIATE);
    gm_settings_t s = settings_with(0);
    REQUIRE(fx_open(&fx, &cfg, &s) == 0);
    uintptr_t d = MALLOC(&fx, 40 * MiB, S0);
    FREE(&fx, d);
    size_t cached = fx_reserved(&fx);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, G1), GM_OK);
    uintptr_t p = 0;
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 40 * MiB, S0, 0, G1, &p, NULL), GM_EOOM);
    CHECK_EQ(fx_reserved(&fx), cached); /* torch: no release_cached_blocks during capture */
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), cached); /* nor does empty_cache free the default pools */
    CHECK_EQ(gm_alloc_pool_end(fx.a, G1), GM_OK);
    CHECK_EQ(gm_alloc_malloc_pool(fx.a, 40 * MiB, S0, 0, G1, &p, NULL), GM_OK);
    CHECK_EQ(pool_of(&fx, p).first, 7);
    FREE(&fx, p);
    CHECK_EQ(gm_alloc_pool_release(fx.a, G1), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

/* A backend that wraps the fixture's, with a capture mode of its own and
 * a record of the mode each device allocation ran in. */
static const gm_backend_t *inner;
static int cur_mode, n_exchanges, n_allocs, n_allocs_relaxed;

static int exchange_mode(void *ctx, int *mode) {
    (void)ctx;
    int prev = cur_mode;
    cur_mode = *mode;
    *mode = prev;
    n_exchanges++;
    return GM_OK;
}

static int wrapped_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out) {
    n_allocs++;
    n_allocs_relaxed += cur_mode == GM_CAPTURE_MODE_RELAXED;
    return inner->seg_alloc(ctx, device, size, out);
}

static int wrapped_map(void *ctx, int device, uintptr_t va, size_t size) {
    n_allocs++;
    n_allocs_relaxed += cur_mode == GM_CAPTURE_MODE_RELAXED;
    return inner->map(ctx, device, va, size);
}

TEST(privpool_device_allocations_run_in_relaxed_capture_mode) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    inner = fx.be;
    gm_backend_t be = *fx.be;
    be.seg_alloc = wrapped_seg_alloc;
    be.map = wrapped_map;
    be.exchange_capture_mode = exchange_mode;
    cur_mode = GM_CAPTURE_MODE_GLOBAL;
    n_exchanges = n_allocs = n_allocs_relaxed = 0;
    gm_alloc_t *a = NULL;
    REQUIRE(gm_alloc_create(&be, 0, &fx.settings, &a) == GM_OK);
    uintptr_t p = 0, q = 0;
    CHECK_EQ(gm_alloc_malloc(a, 3 * MiB, S0, 0, &p, NULL), GM_OK);
    CHECK_EQ(n_exchanges, 0); /* no pool allocating: the fast path never asks */
    CHECK(n_allocs >= 1);
    CHECK_EQ(n_allocs_relaxed, 0);
    CHECK_EQ(gm_alloc_pool_begin(a, G1), GM_OK);
    int before = n_allocs;
    CHECK_EQ(gm_alloc_malloc_pool(a, 3 * MiB, S0, 0, G1, &q, NULL), GM_OK);
    CHECK(n_allocs > before);
    CHECK_EQ(n_allocs_relaxed, n_allocs - before);
    CHECK_EQ(cur_mode, GM_CAPTURE_MODE_GLOBAL); /* restored */
    CHECK_EQ(n_exchanges % 2, 0);
    CHECK_EQ(gm_alloc_pool_end(a, G1), GM_OK);
    CHECK_EQ(gm_alloc_free(a, p, 0), GM_OK);
    CHECK_EQ(gm_alloc_free(a, q, 0), GM_OK);
    char msg[256];
    CHECK_EQ(gm_alloc_check(a, msg, sizeof msg), 0);
    gm_alloc_destroy(a);
    fx_close(&fx);
}

/* ---- threads: routed and default allocations while pools come and go ---- */
#include <pthread.h>
#include <stdatomic.h>

/* The id of the pool the main thread cycles through: a new one each time,
 * as torch never reuses an id. */
static _Atomic uint64_t cycling_id = 100;

typedef struct pool_worker {
    fx_t *fx;
    uintptr_t stream;
    gm_mempool_id_t pool;
    int failures;
} pool_worker_t;

static void *pool_worker_main(void *arg) {
    pool_worker_t *w = arg;
    uintptr_t live[16] = {0};
    for (int i = 0; i < 4000; i++) {
        int k = i % 16;
        if (live[k] && gm_alloc_free(w->fx->a, live[k], 0) != GM_OK)
            w->failures++;
        live[k] = 0;
        size_t size = (size_t)(1 + (i * 7919) % 3) * (k < 12 ? 4096 : 3 * MiB);
        gm_mempool_id_t pool = w->pool;
        if (!pool.first && !pool.second)
            pool.second = atomic_load(&cycling_id);
        int rc = (i & 1) ? gm_alloc_malloc_pool(w->fx->a, size, w->stream, 0, pool, &live[k], NULL)
                         : gm_alloc_malloc(w->fx->a, size, w->stream, 0, &live[k], NULL);
        if (rc != GM_OK)
            w->failures++;
    }
    for (int k = 0; k < 16; k++)
        if (live[k] && gm_alloc_free(w->fx->a, live[k], 0) != GM_OK)
            w->failures++;
    return NULL;
}

TEST(threads_privpool_routing_while_pools_come_and_go) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_pool_create_or_incref(fx.a, P1), GM_OK);
    pool_worker_t w[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        gm_mempool_id_t none = {0, 0};
        w[i] = (pool_worker_t){&fx, FX_STREAM(i + 1), i == 2 ? none : P1, 0};
        REQUIRE(pthread_create(&t[i], NULL, pool_worker_main, &w[i]) == 0);
    }
    /* meanwhile pools are begun, ended, released and freed one after
     * another: requests routed to one that is gone go to the default pools */
    for (int i = 0; i < 200; i++) {
        gm_mempool_id_t id = {0, atomic_load(&cycling_id)};
        CHECK_EQ(gm_alloc_pool_begin(fx.a, id), GM_OK);
        CHECK_EQ(gm_alloc_pool_end(fx.a, id), GM_OK);
        CHECK_EQ(gm_alloc_pool_release(fx.a, id), GM_OK);
        CHECK_EQ(gm_alloc_empty_cache_pool(fx.a, id, 0), GM_OK);
        atomic_fetch_add(&cycling_id, 1);
        if (i % 50 == 0)
            CHECK_ALLOC(&fx);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].failures, 0);
    }
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}
