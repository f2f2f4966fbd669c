/*
 * test_misc.c - bad pointers, threads, settings, size formatting, error
 * strings, several devices and tear-down.
 *
 * Bad frees return GM_ENOTFOUND (never allocated, or an interior pointer)
 * or GM_EDOUBLEFREE (the block at that address was already freed) and
 * change nothing. The thread test runs four workers on their own streams
 * against one allocator backed by host memory, tags every allocation's
 * first and last bytes and verifies them before each free, while a fifth
 * thread runs the invariant checker.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "helpers.h"

TEST(free_errors_are_clean) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    CHECK_EQ(gm_alloc_free(fx.a, (uintptr_t)0x1234000, 0), GM_ENOTFOUND);
    uintptr_t a = MALLOC(&fx, 4096, S1);
    uintptr_t b = MALLOC(&fx, 4096, S1);
    uintptr_t c = MALLOC(&fx, 4096, S1);
    uintptr_t d = MALLOC(&fx, 4096, S1);
    gm_stats_t before = fx_stats(&fx);
    CHECK_EQ(gm_alloc_free(fx.a, b + 512, 0), GM_ENOTFOUND); /* interior */
    CHECK_EQ(gm_alloc_free(fx.a, b + 1, 0), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_free(fx.a, a + 2 * MiB, 0), GM_ENOTFOUND); /* past the segment */
    gm_stats_t after = fx_stats(&fx);
    CHECK_EQ(after.allocation[GM_STAT_ALL].current, before.allocation[GM_STAT_ALL].current);
    CHECK_EQ(after.allocated_bytes[GM_STAT_ALL].current,
             before.allocated_bytes[GM_STAT_ALL].current);
    /* b is freed with allocated neighbours: its free block starts at b */
    FREE(&fx, b);
    CHECK_EQ(gm_alloc_free(fx.a, b, 0), GM_EDOUBLEFREE);
    /* the first block of a segment */
    FREE(&fx, a);
    CHECK_EQ(gm_alloc_free(fx.a, a, 0), GM_EDOUBLEFREE);
    /* b has now been merged into a's block: still an error, never a free */
    int rc = gm_alloc_free(fx.a, b, 0);
    CHECK(rc == GM_EDOUBLEFREE || rc == GM_ENOTFOUND);
    /* a block waiting for its events */
    CHECK_EQ(gm_alloc_record_stream(fx.a, c, S2), 0);
    FREE(&fx, c);
    CHECK_EQ(gm_alloc_free(fx.a, c, 0), GM_EDOUBLEFREE);
    rc = gm_alloc_record_stream(fx.a, c, S3); /* torch has no rule here */
    CHECK(rc == GM_EDOUBLEFREE || rc == GM_ENOTFOUND);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 1);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].current, 4096);
    CHECK_EQ(s.active[GM_STAT_ALL].current, 2);
    CHECK_ALLOC(&fx);
    /* everything still works */
    uintptr_t e = MALLOC(&fx, 8192, S1);
    CHECK_EQ(e, a);
    fx_complete_events(&fx);
    CHECK_EQ(gm_alloc_process_events(fx.a, 0), 0);
    FREE(&fx, d);
    FREE(&fx, e);
    CHECK_EQ(gm_alloc_free(fx.a, d, 0), GM_EDOUBLEFREE);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(check_is_zero_when_consistent) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    char msg[256];
    memset(msg, 'x', sizeof msg);
    CHECK_EQ(gm_alloc_check(fx.a, msg, sizeof msg), 0);
    CHECK_EQ(gm_alloc_check(fx.a, NULL, 0), 0);
    uintptr_t p[16];
    for (int i = 0; i < 16; i++)
        p[i] = MALLOC(&fx, (size_t)(i + 1) * 300 * KiB, i % 2 ? S1 : S2);
    CHECK_EQ(gm_alloc_check(fx.a, msg, sizeof msg), 0);
    for (int i = 0; i < 16; i += 2)
        FREE(&fx, p[i]);
    CHECK_EQ(gm_alloc_check(fx.a, msg, sizeof msg), 0);
    for (int i = 1; i < 16; i += 2)
        FREE(&fx, p[i]);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(gm_alloc_check(fx.a, msg, sizeof msg), 0);
    fx_close(&fx);
}

TEST(destroy_releases_live_allocations) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_NEVER);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, NULL) == 0);
    MALLOC(&fx, 1000, S1);
    MALLOC(&fx, 50 * MiB, S2);
    uintptr_t p = MALLOC(&fx, 4 * MiB, S3);
    CHECK_EQ(gm_alloc_record_stream(fx.a, p, S1), 0);
    FREE(&fx, p); /* pending: its event is never completed */
    fx_close(&fx); /* checks that the device got everything back */
}

TEST(destroy_releases_expandable_ranges) {
    gm_settings_t st = settings_with(1);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    MALLOC(&fx, 1000, S1);
    MALLOC(&fx, 50 * MiB, S1);
    MALLOC(&fx, 4 * MiB, S2);
    fx_close(&fx);
}

TEST(two_devices_are_independent) {
    tdev_config_t cfg = dev_cfg(256 * MiB, TDEV_EVENTS_IMMEDIATE);
    cfg.num_devices = 2;
    gm_settings_t st = fx_settings();
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    gm_alloc_t *a0 = fx.a, *a1 = NULL;
    REQUIRE(gm_alloc_create(fx.be, 1, &st, &a1) == 0);
    CHECK_EQ(gm_alloc_device(a0), 0);
    CHECK_EQ(gm_alloc_device(a1), 1);
    uintptr_t p = 0, q = 0;
    CHECK_EQ(gm_alloc_malloc(a0, 200 * MiB, S0, 0, &p, NULL), 0);
    CHECK_EQ(gm_alloc_malloc(a1, 200 * MiB, S0, 0, &q, NULL), 0);
    tdev_counters_t c0, c1;
    tdev_counters(fx.dev, 0, &c0);
    tdev_counters(fx.dev, 1, &c1);
    /* plain segments (cuMemAlloc) or mapped granules, as the mode says */
    CHECK_EQ(c0.bytes_allocated + c0.bytes_mapped, 200 * MiB);
    CHECK_EQ(c1.bytes_allocated + c1.bytes_mapped, 200 * MiB);
    /* a pointer of device 1 is unknown to device 0 */
    CHECK_EQ(gm_alloc_free(a0, q, 0), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_free(a1, q, 0), 0);
    CHECK_EQ(gm_alloc_free(a0, p, 0), 0);
    CHECK_EQ(gm_alloc_check(a0, NULL, 0), 0);
    CHECK_EQ(gm_alloc_check(a1, NULL, 0), 0);
    gm_alloc_destroy(a1);
    tdev_counters(fx.dev, 1, &c1);
    CHECK_EQ(c1.live_segments + c1.live_reservations + c1.bytes_mapped, 0);
    fx_close(&fx); /* destroys a0 and checks that both devices are clean */
}

/* The device check in fx_close is what gives every other test's clean-up
 * its meaning (on cuda: the fake driver's own accounting), so it must
 * report what is left, and a later fixture must still start clean. */
TEST(device_check_reports_what_is_left) {
    tdev_config_t cfg = dev_cfg(0, TDEV_EVENTS_IMMEDIATE);
    tdev_t *d = NULL;
    char err[1024];
    REQUIRE(tdev_open(&cfg, &d, err, sizeof err) == 0);
    const gm_backend_t *be = tdev_backend(d);
    uintptr_t p = 0, ev = 0;
    CHECK_EQ(be->seg_alloc(be->ctx, 0, 2 * MiB, &p), 0);
    CHECK_EQ(be->event_create(be->ctx, 0, &ev), 0);
    CHECK_EQ(tdev_close(d, err, sizeof err), -1);
    CHECK_MSG(strstr(err, fx_on_cuda() ? "allocations=1" : "segments=1") != NULL, "%s", err);
    CHECK_MSG(strstr(err, "events=1") != NULL, "%s", err);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    uintptr_t q = MALLOC(&fx, 1000, S1);
    FREE(&fx, q);
    fx_close(&fx);
}

TEST(settings_defaults_and_validation) {
    gm_settings_t s;
    memset(&s, 0xab, sizeof s);
    gm_settings_default(&s);
    CHECK_EQ(s.expandable_segments, 0);
    CHECK_EQ(s.max_split_size, SIZE_MAX);
    CHECK(s.garbage_collection_threshold == 0.0);
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
        CHECK_EQ(s.roundup_power2_divisions[i], 0);
    char msg[256] = "";
    CHECK_EQ(gm_settings_validate(&s, msg, sizeof msg), 0);
    gm_settings_t bad = s;
    bad.garbage_collection_threshold = 1.5;
    msg[0] = 0;
    CHECK_EQ(gm_settings_validate(&bad, msg, sizeof msg), GM_EINVAL);
    CHECK(msg[0] != 0);
    bad = s;
    bad.garbage_collection_threshold = -0.5;
    CHECK_EQ(gm_settings_validate(&bad, msg, sizeof msg), GM_EINVAL);
    bad = s;
    bad.roundup_power2_divisions[3] = 3; /* torch: must be a power of two */
    CHECK_EQ(gm_settings_validate(&bad, msg, sizeof msg), GM_EINVAL);
    gm_settings_t good = s;
    good.garbage_collection_threshold = 0.6;
    good.max_split_size = 64 * MiB;
    good.roundup_power2_divisions[0] = 8;
    good.expandable_segments = 1;
    CHECK_EQ(gm_settings_validate(&good, msg, sizeof msg), 0);
    /* the allocator refuses invalid settings and reports what it uses */
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    gm_alloc_t *a = NULL;
    bad = s;
    bad.garbage_collection_threshold = 2.0;
    CHECK_EQ(gm_alloc_create(fx.be, 0, &bad, &a), GM_EINVAL);
    REQUIRE(gm_alloc_create(fx.be, 0, &good, &a) == 0);
    gm_settings_t got;
    gm_alloc_get_settings(a, &got);
    CHECK_EQ(got.max_split_size, 64 * MiB);
    CHECK_EQ(got.expandable_segments, 1);
    CHECK_EQ(got.roundup_power2_divisions[0], 8);
    CHECK_EQ(gm_alloc_set_settings(a, &bad), GM_EINVAL);
    gm_alloc_get_settings(a, &got);
    CHECK_EQ(got.max_split_size, 64 * MiB);
    gm_alloc_destroy(a);
    fx_close(&fx);
}

TEST(format_size_matches_c10) {
    static const struct {
        size_t n;
        const char *s;
    } cases[] = {
        {0, "0 bytes"},
        {1, "1 bytes"},
        {1024, "1024 bytes"},
        {1025, "1.00 KiB"},
        {1536, "1.50 KiB"},
        {1048576, "1024.00 KiB"},
        {1048577, "1.00 MiB"},
        {20 * MiB, "20.00 MiB"},
        {1 * GiB, "1024.00 MiB"},
        {2 * GiB, "2.00 GiB"},
        {(size_t)80 << 30, "80.00 GiB"},
        {3 * GiB + 512 * MiB, "3.50 GiB"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(buf, 0, sizeof buf);
        gm_format_size(cases[i].n, buf, sizeof buf);
        CHECK_STR(buf, cases[i].s);
    }
    /* a short buffer is truncated and terminated, never overrun */
    char small[16];
    memset(small, '#', sizeof small);
    gm_format_size(20 * MiB, small, 5);
    CHECK_LE(strlen(small), 4);
    CHECK_EQ(small[5], '#');
    CHECK_EQ(small[15], '#');
}

TEST(error_strings) {
    int codes[] = {GM_OK,        GM_EOOM,     GM_EINVAL,  GM_ENOTFOUND, GM_EDOUBLEFREE,
                   GM_ENOTREADY, GM_ENOTSUP,  GM_EDEVICE, GM_ENOMEM,    GM_ESTATE};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *s = gm_strerror(codes[i]);
        CHECK(s != NULL && s[0] != 0);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(s, gm_strerror(codes[j])) != 0);
    }
    CHECK(gm_strerror(-12345) != NULL);
    CHECK(gm_strerror(12345) != NULL);
}

/* ---- threads ---- */

#define NTHREADS 4
#define THREAD_OPS 20000
#define THREAD_SLOTS 64

typedef struct worker {
    fx_t *fx;
    int id;
    uintptr_t stream;
    uint64_t rng;
    long mallocs, frees, errors, corrupt;
    char first_error[160];
} worker_t;

static uint64_t xs(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void worker_error(worker_t *w, const char *what, int rc) {
    if (w->errors++ == 0)
        snprintf(w->first_error, sizeof w->first_error, "thread %d: %s: %d (%s)", w->id, what, rc,
                 gm_strerror(rc));
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    struct {
        uintptr_t p;
        size_t n;
        uint64_t tag;
    } slot[THREAD_SLOTS];
    memset(slot, 0, sizeof slot);
    for (long i = 0; i < THREAD_OPS; i++) {
        uint64_t r = xs(&w->rng);
        int k = (int)(r % THREAD_SLOTS);
        if (slot[k].p) {
            uint64_t head, tail;
            memcpy(&head, (void *)slot[k].p, 8);
            memcpy(&tail, (void *)(slot[k].p + slot[k].n - 8), 8);
            if (head != slot[k].tag || tail != ~slot[k].tag)
                w->corrupt++;
            int rc = gm_alloc_free(w->fx->a, slot[k].p, 0);
            if (rc)
                worker_error(w, "free", rc);
            w->frees++;
            slot[k].p = 0;
        } else {
            size_t n;
            switch ((r >> 8) % 8) {
            case 0: n = 16 + (r >> 16) % 4096; break;
            case 1: case 2: case 3: n = 16 + (r >> 16) % MiB; break;
            case 4: case 5: case 6: n = MiB + (r >> 16) % (6 * MiB); break;
            default: n = 10 * MiB + (r >> 16) % (10 * MiB); break;
            }
            uintptr_t p = 0;
            int rc = gm_alloc_malloc(w->fx->a, n, w->stream, (uint32_t)w->id, &p, NULL);
            if (rc) {
                worker_error(w, "malloc", rc);
                continue;
            }
            w->mallocs++;
            uint64_t tag = ((uint64_t)w->id << 56) ^ (uint64_t)i ^ (r << 20);
            memcpy((void *)p, &tag, 8);
            uint64_t inv = ~tag;
            memcpy((void *)(p + n - 8), &inv, 8);
            slot[k].p = p;
            slot[k].n = n;
            slot[k].tag = tag;
        }
        if (w->id == 0 && i % 2000 == 1999) {
            int rc = gm_alloc_empty_cache(w->fx->a, 0);
            if (rc)
                worker_error(w, "empty_cache", rc);
        }
    }
    for (int k = 0; k < THREAD_SLOTS; k++)
        if (slot[k].p) {
            int rc = gm_alloc_free(w->fx->a, slot[k].p, 0);
            if (rc)
                worker_error(w, "free", rc);
            w->frees++;
        }
    return NULL;
}

typedef struct checker {
    fx_t *fx;
    volatile int stop;
    long runs, violations;
    char msg[256];
} checker_t;

static void *checker_main(void *arg) {
    checker_t *c = arg;
    while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        char msg[256] = "";
        int n = gm_alloc_check(c->fx->a, msg, sizeof msg);
        if (n && c->violations++ == 0)
            snprintf(c->msg, sizeof c->msg, "%s", msg);
        gm_stats_t s;
        gm_alloc_get_stats(c->fx->a, &s);
        if (s.reserved_bytes[GM_STAT_ALL].current < s.allocated_bytes[GM_STAT_ALL].current &&
            c->violations++ == 0)
            snprintf(c->msg, sizeof c->msg, "reserved < allocated");
        c->runs++;
        /* Pause between walks: a walk holds the allocator lock for a long
         * time, and a checker that takes it back at once starves the
         * workers (the run then takes minutes under the sanitizers). */
        struct timespec pause = {0, 200 * 1000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void threads_case(int expandable) {
    tdev_config_t cfg = dev_cfg(16 * GiB, TDEV_EVENTS_IMMEDIATE);
    cfg.host_memory = 1;
    gm_settings_t st = settings_with(expandable);
    fx_t fx;
    REQUIRE(fx_open(&fx, &cfg, &st) == 0);
    gm_alloc_set_trace_hook(fx.a, NULL, NULL); /* the recorder is not thread-safe */
    worker_t w[NTHREADS];
    pthread_t t[NTHREADS], ct;
    checker_t chk;
    memset(&chk, 0, sizeof chk);
    chk.fx = &fx;
    REQUIRE(pthread_create(&ct, NULL, checker_main, &chk) == 0);
    for (int i = 0; i < NTHREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].fx = &fx;
        w[i].id = i;
        w[i].stream = FX_STREAM(i + 1);
        w[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        CHECK_EQ(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    long mallocs = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(w[i].errors == 0, "%ld errors, first: %s", w[i].errors, w[i].first_error);
        CHECK_EQ(w[i].corrupt, 0);
        CHECK_EQ(w[i].mallocs, w[i].frees);
        mallocs += w[i].mallocs;
    }
    __atomic_store_n(&chk.stop, 1, __ATOMIC_RELEASE);
    pthread_join(ct, NULL);
    CHECK_MSG(chk.violations == 0, "checker: %ld violations, first: %s", chk.violations, chk.msg);
    CHECK_GT(chk.runs, 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.allocation[GM_STAT_ALL].allocated, mallocs);
    CHECK_EQ(s.allocation[GM_STAT_ALL].freed, mallocs);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.requested_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.active_bytes[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.allocated_bytes[GM_STAT_ALL].allocated, s.allocated_bytes[GM_STAT_ALL].freed);
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), 0);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

TEST(threads_random_malloc_free) { threads_case(0); }
TEST(threads_random_malloc_free_expandable) { threads_case(1); }

TEST(extreme_sizes_are_refused_cleanly) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    uintptr_t p = 123;
    /* size 0: torch hands out no memory (a null pointer) */
    int rc = gm_alloc_malloc(fx.a, 0, S1, 0, &p, NULL);
    CHECK(rc == 0 || rc == GM_EINVAL);
    if (rc == 0 && p != 0)
        FREE(&fx, p);
    CHECK_EQ(fx_stats(&fx).allocation[GM_STAT_ALL].current, 0);
    static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - MiB, (size_t)1 << 63,
                                  ((size_t)1 << 62) + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        p = 0;
        gm_oom_info_t oom;
        memset(&oom, 0, sizeof oom);
        rc = gm_alloc_malloc(fx.a, huge[i], S1, 0, &p, &oom);
        CHECK_MSG(rc == GM_EINVAL || rc == GM_EOOM, "malloc(%zu) = %d", huge[i], rc);
        CHECK_EQ(p, 0);
    }
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocation[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.reserved_bytes[GM_STAT_ALL].current, 0);
    /* free of the null pointer does nothing harmful */
    rc = gm_alloc_free(fx.a, 0, 0);
    CHECK(rc == 0 || rc == GM_ENOTFOUND);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}
