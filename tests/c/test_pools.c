/*
 * test_pools.c - size rounding, pool choice, segment sizes, best fit,
 * splitting (including the large-pool split rule) and coalescing.
 *
 * The expected numbers are PyTorch's CUDACachingAllocator policy:
 * round_size, get_allocation_size, should_split and the (stream, size,
 * address) ordering of get_free_block. Each step that must not reuse an
 * earlier block runs on a fresh stream, because free lists are per stream.
 */
#include <string.h>

#include "helpers.h"

/* Block size, segment size and pool of one malloc on an otherwise unused
 * stream. */
static void expect_round(fx_t *fx, uintptr_t stream, size_t req, size_t block, size_t segment,
                         int small, const char *file, int line) {
    gm_stats_t before = fx_stats(fx);
    tdev_counters_t cb = fx_counters(fx);
    uintptr_t p = fx_malloc_at(fx, req, stream, file, line);
    if (!p)
        return;
    gm_stats_t after = fx_stats(fx);
    tdev_counters_t ca = fx_counters(fx);
    size_t size = 0, requested = 0;
    uintptr_t st = 0;
    int rc = gm_alloc_block_size(fx->a, p, &size, &requested, &st);
    if (rc != 0)
        gmtest_fail(file, line, "block_size(%#lx) = %d", (unsigned long)p, rc);
    if (size != block)
        gmtest_fail(file, line, "malloc(%zu): block size %zu, expected %zu", req, size, block);
    if (requested != req)
        gmtest_fail(file, line, "malloc(%zu): requested %zu", req, requested);
    if (st != stream)
        gmtest_fail(file, line, "malloc(%zu): stream %#lx", req, (unsigned long)st);
    int64_t dres = after.reserved_bytes[GM_STAT_ALL].current - before.reserved_bytes[GM_STAT_ALL].current;
    if (dres != (int64_t)segment)
        gmtest_fail(file, line, "malloc(%zu): reserved grew by %lld, expected segment %zu", req,
                    (long long)dres, segment);
    if (ca.bytes_allocated - cb.bytes_allocated != segment)
        gmtest_fail(file, line, "malloc(%zu): device allocated %zu, expected %zu", req,
                    ca.bytes_allocated - cb.bytes_allocated, segment);
    int t = small ? GM_STAT_SMALL : GM_STAT_LARGE, o = small ? GM_STAT_LARGE : GM_STAT_SMALL;
    if (after.segment[t].current - before.segment[t].current != 1 ||
        after.segment[o].current != before.segment[o].current)
        gmtest_fail(file, line, "malloc(%zu): expected one new %s segment", req,
                    small ? "small" : "large");
    if (after.allocated_bytes[t].current - before.allocated_bytes[t].current != (int64_t)block)
        gmtest_fail(file, line, "malloc(%zu): allocated_bytes.%s grew by %lld", req,
                    small ? "small" : "large",
                    (long long)(after.allocated_bytes[t].current - before.allocated_bytes[t].current));
    int i = trace_find(fx, GM_ACT_SEGMENT_ALLOC, TRACE_ANY);
    if (i < 0 || fx->trace->ev[i].size != segment)
        gmtest_fail(file, line, "malloc(%zu): no segment_alloc event of %zu bytes", req, segment);
    trace_clear(fx);
}
#define EXPECT_ROUND(fx, stream, req, block, segment, small) \
    expect_round((fx), (stream), (req), (block), (segment), (small), __FILE__, __LINE__)

TEST(rounding_to_512) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    trace_clear(&fx);
    EXPECT_ROUND(&fx, FX_STREAM(4), 1, 512, 2 * MiB, 1);
    EXPECT_ROUND(&fx, FX_STREAM(5), 512, 512, 2 * MiB, 1);
    EXPECT_ROUND(&fx, FX_STREAM(6), 513, 1024, 2 * MiB, 1);
    EXPECT_ROUND(&fx, FX_STREAM(7), 1000, 1024, 2 * MiB, 1);
    EXPECT_ROUND(&fx, FX_STREAM(8), 4097, 4608, 2 * MiB, 1);
    fx_close(&fx);
}

TEST(pool_and_segment_sizes) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    trace_clear(&fx);
    /* Small pool: requests up to 1 MiB live in 2 MiB segments. */
    EXPECT_ROUND(&fx, FX_STREAM(4), 1 * MiB, 1 * MiB, 2 * MiB, 1);
    /* Large pool: below 10 MiB a 20 MiB segment, split (remainder > 1 MiB). */
    EXPECT_ROUND(&fx, FX_STREAM(5), 1 * MiB + 1, 1 * MiB + 512, 20 * MiB, 0);
    EXPECT_ROUND(&fx, FX_STREAM(6), 4 * MiB, 4 * MiB, 20 * MiB, 0);
    EXPECT_ROUND(&fx, FX_STREAM(7), 10 * MiB - 512, 10 * MiB - 512, 20 * MiB, 0);
    /* the segment size follows the rounded size: 10 MiB - 1 rounds to 10 MiB */
    EXPECT_ROUND(&fx, FX_STREAM(13), 10 * MiB - 1, 10 * MiB, 10 * MiB, 0);
    /* 10 MiB and above: the request rounded up to 2 MiB. */
    EXPECT_ROUND(&fx, FX_STREAM(8), 10 * MiB, 10 * MiB, 10 * MiB, 0);
    EXPECT_ROUND(&fx, FX_STREAM(9), 10 * MiB + 1, 10 * MiB + 512, 12 * MiB, 0);
    /* remainder exactly 1 MiB: not split, the block is the whole segment */
    EXPECT_ROUND(&fx, FX_STREAM(10), 11 * MiB, 12 * MiB, 12 * MiB, 0);
    EXPECT_ROUND(&fx, FX_STREAM(11), 100 * MiB, 100 * MiB, 100 * MiB, 0);
    EXPECT_ROUND(&fx, FX_STREAM(12), 101 * MiB, 102 * MiB, 102 * MiB, 0);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.segment[GM_STAT_SMALL].current, 1);
    CHECK_EQ(s.segment[GM_STAT_LARGE].current, 9);
    CHECK_EQ(s.reserved_bytes[GM_STAT_SMALL].current, 2 * MiB);
    CHECK_EQ(s.reserved_bytes[GM_STAT_LARGE].current,
             20 * MiB * 3 + 10 * MiB * 2 + 12 * MiB * 2 + 100 * MiB + 102 * MiB);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 10);
    fx_close(&fx);
}

TEST(small_requests_share_a_segment) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p[8];
    for (int i = 0; i < 8; i++)
        p[i] = MALLOC(&fx, 100 * KiB, S1); /* 8 x 100 KiB fit in 2 MiB */
    for (int i = 1; i < 8; i++)
        CHECK_EQ(p[i], p[i - 1] + 100 * KiB); /* carved from the front, in order */
    CHECK_EQ(fx_stats(&fx).segment[GM_STAT_SMALL].current, 1);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    /* 1 MiB and 1 MiB - 512 fill a segment; the last 512 bytes still serve a
     * request (small pool: remainder >= 512 is split). */
    uintptr_t a = MALLOC(&fx, 1 * MiB, S2);
    uintptr_t b = MALLOC(&fx, 1 * MiB - 512, S2);
    uintptr_t c = MALLOC(&fx, 1, S2);
    CHECK_EQ(b, a + 1 * MiB);
    CHECK_EQ(c, a + 2 * MiB - 512);
    CHECK_EQ(fx_stats(&fx).segment[GM_STAT_SMALL].current, 2);
    for (int i = 0; i < 8; i++)
        FREE(&fx, p[i]);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(best_fit_small_pool) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    /* [g0 512][h1 8K][g1 512][h2 4K][g2 512][h3 16K][g3 512][h4 4K][g4 512][tail] */
    uintptr_t g[5], h[5];
    size_t hs[5] = {0, 8 * KiB, 4 * KiB, 16 * KiB, 4 * KiB};
    g[0] = MALLOC(&fx, 512, S1);
    for (int i = 1; i < 5; i++) {
        h[i] = MALLOC(&fx, hs[i], S1);
        g[i] = MALLOC(&fx, 512, S1);
        CHECK_EQ(h[i], g[i - 1] + 512);
        CHECK_EQ(g[i], h[i] + hs[i]);
    }
    for (int i = 1; i < 5; i++)
        FREE(&fx, h[i]);
    gm_stats_t s = fx_stats(&fx);
    /* four holes plus the tail */
    CHECK_EQ(s.inactive_split[GM_STAT_SMALL].current, 5);
    /* 3 KiB: the smallest fitting hole is 4 KiB; of the two, the lower address */
    uintptr_t x = MALLOC(&fx, 3 * KiB, S1);
    CHECK_EQ(x, h[2]);
    CHECK_EQ(fx_block_size(&fx, x), 3 * KiB);
    /* the 1 KiB left of h2 is now the best fit for 1 KiB */
    uintptr_t y = MALLOC(&fx, 1 * KiB, S1);
    CHECK_EQ(y, h[2] + 3 * KiB);
    /* 4 KiB exactly: the other 4 KiB hole */
    uintptr_t z = MALLOC(&fx, 4 * KiB, S1);
    CHECK_EQ(z, h[4]);
    /* 6 KiB: the 8 KiB hole, not the 16 KiB one or the tail */
    uintptr_t u = MALLOC(&fx, 6 * KiB, S1);
    CHECK_EQ(u, h[1]);
    /* 10 KiB: the 16 KiB hole */
    uintptr_t v = MALLOC(&fx, 10 * KiB, S1);
    CHECK_EQ(v, h[3]);
    /* 20 KiB: only the tail fits */
    uintptr_t w = MALLOC(&fx, 20 * KiB, S1);
    CHECK_EQ(w, g[4] + 512);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    CHECK_ALLOC(&fx);
    uintptr_t all[] = {g[0], g[1], g[2], g[3], g[4], x, y, z, u, v, w};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        FREE(&fx, all[i]);
    s = fx_stats(&fx);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_ALL].current, 0);
    fx_close(&fx);
}

TEST(best_fit_and_split_rule_large_pool) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    /* one 20 MiB segment: [a 3M][g1 2M][b 5M][g2 2M][tail 8M] */
    uintptr_t a = MALLOC(&fx, 3 * MiB, S1);
    uintptr_t g1 = MALLOC(&fx, 2 * MiB, S1);
    uintptr_t b = MALLOC(&fx, 5 * MiB, S1);
    uintptr_t g2 = MALLOC(&fx, 2 * MiB, S1);
    CHECK_EQ(g1, a + 3 * MiB);
    CHECK_EQ(b, a + 5 * MiB);
    CHECK_EQ(g2, a + 10 * MiB);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    FREE(&fx, a);
    FREE(&fx, b);
    /* 4 MiB: best fit is b (5 MiB); the 1 MiB remainder is not > 1 MiB, so
     * the large pool does not split and the whole 5 MiB block is used. */
    uintptr_t x = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(x, b);
    CHECK_EQ(fx_block_size(&fx, x), 5 * MiB);
    /* 2.5 MiB: a (3 MiB), remainder 0.5 MiB, not split either */
    uintptr_t y = MALLOC(&fx, 2 * MiB + 512 * KiB, S1);
    CHECK_EQ(y, a);
    CHECK_EQ(fx_block_size(&fx, y), 3 * MiB);
    /* 6 MiB from the 8 MiB tail: remainder 2 MiB > 1 MiB, split */
    uintptr_t z = MALLOC(&fx, 6 * MiB, S1);
    CHECK_EQ(z, a + 12 * MiB);
    CHECK_EQ(fx_block_size(&fx, z), 6 * MiB);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.allocated_bytes[GM_STAT_LARGE].current, 18 * MiB);
    CHECK_EQ(s.requested_bytes[GM_STAT_LARGE].current,
             4 * MiB + 2 * MiB + 512 * KiB + 6 * MiB + 4 * MiB);
    CHECK_EQ(s.inactive_split[GM_STAT_LARGE].current, 1);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_LARGE].current, 2 * MiB);
    /* the last 2 MiB: rounded 1 MiB + 512 fits, remainder ~1 MiB: not split */
    uintptr_t t = MALLOC(&fx, 1 * MiB + 1, S1);
    CHECK_EQ(t, a + 18 * MiB);
    CHECK_EQ(fx_block_size(&fx, t), 2 * MiB);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    CHECK_ALLOC(&fx);
    FREE(&fx, g1);
    FREE(&fx, g2);
    FREE(&fx, x);
    FREE(&fx, y);
    FREE(&fx, z);
    FREE(&fx, t);
    fx_close(&fx);
}

TEST(split_20mib_segment_into_4mib_blocks) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p[5];
    for (int i = 0; i < 5; i++)
        p[i] = MALLOC(&fx, 4 * MiB, S1);
    for (int i = 1; i < 5; i++)
        CHECK_EQ(p[i], p[0] + (size_t)i * 4 * MiB);
    tdev_counters_t c = fx_counters(&fx);
    CHECK_EQ(c.calls[TDEV_FN_SEG_ALLOC], 1);
    CHECK_EQ(c.bytes_allocated, 20 * MiB);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.segment[GM_STAT_LARGE].current, 1);
    CHECK_EQ(s.allocation[GM_STAT_LARGE].current, 5);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].current, 0); /* fully used */
    /* a sixth needs a new segment */
    uintptr_t q = MALLOC(&fx, 4 * MiB, S1);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 2);
    FREE(&fx, q);
    for (int i = 0; i < 5; i++)
        FREE(&fx, p[i]);
    fx_close(&fx);
}

TEST(coalescing_neighbours) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &plain) == 0);
    uintptr_t p[5];
    for (int i = 0; i < 5; i++)
        p[i] = MALLOC(&fx, 4 * MiB, S1);
    FREE(&fx, p[1]);
    FREE(&fx, p[3]);
    gm_stats_t s = fx_stats(&fx);
    CHECK_EQ(s.inactive_split[GM_STAT_LARGE].current, 2);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_LARGE].current, 8 * MiB);
    /* freeing the middle one merges p1, p2 and p3 */
    FREE(&fx, p[2]);
    s = fx_stats(&fx);
    CHECK_EQ(s.inactive_split[GM_STAT_LARGE].current, 1);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_LARGE].current, 12 * MiB);
    walk_t w;
    walk_collect(&fx, &w);
    const walk_seg_t *seg = NULL;
    const gm_block_info_t *b = walk_block(&w, p[1], &seg);
    CHECK(b != NULL);
    if (b) {
        CHECK_EQ(b->size, 12 * MiB);
        CHECK_EQ(b->state, GM_BLOCK_INACTIVE);
        CHECK_EQ(seg->info.nblocks, 3);
    }
    walk_free(&w);
    /* 12 MiB fits the merged hole exactly: no device allocation */
    uintptr_t m = MALLOC(&fx, 12 * MiB, S1);
    CHECK_EQ(m, p[1]);
    FREE(&fx, m);
    FREE(&fx, p[0]);
    FREE(&fx, p[4]);
    s = fx_stats(&fx);
    CHECK_EQ(s.inactive_split[GM_STAT_ALL].current, 0);
    CHECK_EQ(s.inactive_split_bytes[GM_STAT_ALL].current, 0);
    walk_collect(&fx, &w);
    CHECK_EQ(w.nsegs, 1);
    if (w.nsegs == 1) {
        CHECK_EQ(w.segs[0].info.nblocks, 1);
        CHECK_EQ(w.segs[0].info.total_size, 20 * MiB);
    }
    walk_free(&w);
    /* the whole segment serves a 20 MiB request without the device */
    uintptr_t all = MALLOC(&fx, 20 * MiB, S1);
    CHECK_EQ(all, p[0]);
    CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
    CHECK_EQ(fx_stats(&fx).num_device_alloc, 1);
    FREE(&fx, all);
    CHECK_ALLOC(&fx);
    fx_close(&fx);
}

TEST(coalescing_in_any_order) {
    /* plain segments: about cudaMalloc segment sizes, splits and calls */
    gm_settings_t plain = settings_with(0);
    static const int orders[][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}};
    for (size_t o = 0; o < sizeof orders / sizeof orders[0]; o++) {
        fx_t fx;
        REQUIRE(fx_open(&fx, NULL, &plain) == 0);
        uintptr_t p[4];
        for (int i = 0; i < 4; i++)
            p[i] = MALLOC(&fx, 256 * KiB, S1);
        for (int i = 0; i < 4; i++) {
            FREE(&fx, p[orders[o][i]]);
            CHECK_ALLOC(&fx);
        }
        gm_stats_t s = fx_stats(&fx);
        CHECK_EQ(s.inactive_split[GM_STAT_ALL].current, 0);
        CHECK_EQ(s.inactive_split_bytes[GM_STAT_ALL].current, 0);
        CHECK_EQ(s.active_bytes[GM_STAT_ALL].current, 0);
        uintptr_t q = MALLOC(&fx, 1 * MiB, S1);
        uintptr_t r = MALLOC(&fx, 1 * MiB, S1);
        CHECK_EQ(q, p[0]);
        CHECK_EQ(r, p[0] + 1 * MiB);
        CHECK_EQ(fx_counters(&fx).calls[TDEV_FN_SEG_ALLOC], 1);
        FREE(&fx, q);
        FREE(&fx, r);
        fx_close(&fx);
    }
}

TEST(roundup_power2_divisions) {
    gm_settings_t st = fx_settings(); /* either mode: rounding comes first */
    st.roundup_power2_divisions[0] = 4; /* sizes below 2 MiB */
    st.roundup_power2_divisions[1] = 4; /* [2 MiB, 4 MiB) */
    char msg[256] = "";
    CHECK_EQ(gm_settings_validate(&st, msg, sizeof msg), 0);
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, &st) == 0);
    uintptr_t a = MALLOC(&fx, 1200, S1); /* 1200 <= 512 * 4: plain 512 rounding */
    CHECK_EQ(fx_block_size(&fx, a), 1536);
    uintptr_t b = MALLOC(&fx, 1258291, S2); /* 1.2 MiB -> 1.25 MiB */
    CHECK_EQ(fx_block_size(&fx, b), 1310720);
    uintptr_t c = MALLOC(&fx, 2202009, S2); /* 2.1 MiB -> 2.5 MiB */
    CHECK_EQ(fx_block_size(&fx, c), 2621440);
    uintptr_t d = MALLOC(&fx, 3 * MiB, S2); /* on a division already */
    CHECK_EQ(fx_block_size(&fx, d), 3 * MiB);
    uintptr_t e = MALLOC(&fx, 4 * MiB + 1, S3); /* interval without divisions */
    CHECK_EQ(fx_block_size(&fx, e), 4 * MiB + 512);
    FREE(&fx, a);
    FREE(&fx, b);
    FREE(&fx, c);
    FREE(&fx, d);
    FREE(&fx, e);
    fx_close(&fx);
}

TEST(block_size_lookup) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    uintptr_t p = MALLOC(&fx, 1000, S2);
    size_t size = 0, req = 0;
    uintptr_t st = 99;
    CHECK_EQ(gm_alloc_block_size(fx.a, p, &size, &req, &st), 0);
    CHECK_EQ(size, 1024);
    CHECK_EQ(req, 1000);
    CHECK_EQ(st, S2);
    CHECK_EQ(gm_alloc_block_size(fx.a, p + 512, &size, &req, &st), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_block_size(fx.a, (uintptr_t)0x1234, &size, &req, &st), GM_ENOTFOUND);
    FREE(&fx, p);
    CHECK(gm_alloc_block_size(fx.a, p, &size, &req, &st) != 0); /* no longer live */
    fx_close(&fx);
}
