/*
 * test_checkpoint.c - a private pool put back to a checkpoint
 * (gm_alloc_pool_restore, torch's setCheckpointPoolState): the blocks
 * allocated in the pool are freed and reported, the checkpointed segments
 * are laid out again with their allocated blocks live, the statistics are
 * what they were at the checkpoint, and a checkpoint that no longer fits
 * (or an unknown pool) is refused.
 *
 * The checkpoint is taken as the torch shim takes it: the pool's segment
 * walk (gm_alloc_walk_pool).
 */
#include "helpers.h"

static const gm_mempool_id_t P1 = {0, 1};

static uintptr_t pmalloc(fx_t *fx, size_t size) {
    uintptr_t p = 0;
    CHECK_EQ(gm_alloc_malloc_pool(fx->a, size, S1, 0, P1, &p, NULL), GM_OK);
    return p;
}

typedef struct ckpt {
    gm_ckpt_block_t v[64];
    size_t n;
} ckpt_t;

static int add_segment(void *arg, const gm_segment_info_t *seg) {
    ckpt_t *k = arg;
    for (size_t i = 0; i < seg->nblocks && k->n < 64; i++) {
        gm_ckpt_block_t *b = &k->v[k->n++];
        b->ptr = seg->blocks[i].address;
        b->size = seg->blocks[i].size;
        b->allocated = seg->blocks[i].state == GM_BLOCK_ACTIVE_ALLOCATED;
        b->first = i == 0;
    }
    return 0;
}

static ckpt_t take(fx_t *fx) {
    ckpt_t k;
    memset(&k, 0, sizeof k);
    CHECK_EQ(gm_alloc_walk_pool(fx->a, P1, add_segment, &k), GM_OK);
    return k;
}

typedef struct freed {
    uintptr_t v[16];
    size_t n;
} freed_t;

static void on_freed(void *arg, uintptr_t ptr) {
    freed_t *f = arg;
    if (f->n < 16)
        f->v[f->n++] = ptr;
}

static int was_freed(const freed_t *f, uintptr_t p) {
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i] == p)
            return 1;
    return 0;
}

TEST(checkpoint_restore_lays_a_pool_out_again) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P1), GM_OK);
    uintptr_t a = pmalloc(&fx, 1000), b = pmalloc(&fx, 3 * MiB), c = pmalloc(&fx, 2000);
    FREE(&fx, c);
    ckpt_t k = take(&fx);
    CHECK(k.n >= 3);
    gm_stats_t at = fx_stats(&fx);
    /* after the checkpoint: two new allocations, and one of its own dies */
    uintptr_t d = pmalloc(&fx, 5000), e = pmalloc(&fx, 2 * MiB);
    FREE(&fx, a);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_OK);
    freed_t f;
    memset(&f, 0, sizeof f);
    CHECK_EQ(gm_alloc_pool_restore(fx.a, P1, k.v, k.n, on_freed, &f, 0), GM_OK);
    CHECK_EQ(f.n, 3);
    CHECK(was_freed(&f, b) && was_freed(&f, d) && was_freed(&f, e) && !was_freed(&f, a));
    CHECK_ALLOC(&fx);
    /* the layout and the live blocks are the checkpoint's again */
    ckpt_t k2 = take(&fx);
    CHECK_EQ(k2.n, k.n);
    for (size_t i = 0; i < k.n && i < k2.n; i++) {
        CHECK_EQ(k2.v[i].ptr, k.v[i].ptr);
        /* an expandable segment mapped further since keeps its longer
         * free tail (Note [Private pool checkpoints]) */
        int tail = (i + 1 == k.n || k.v[i + 1].first) && !k.v[i].allocated;
        if (tail && fx.settings.expandable_segments)
            CHECK(k2.v[i].size >= k.v[i].size);
        else
            CHECK_EQ(k2.v[i].size, k.v[i].size);
        CHECK_EQ(k2.v[i].allocated, k.v[i].allocated);
    }
    gm_stats_t now = fx_stats(&fx);
    CHECK_EQ(now.allocated_bytes[GM_STAT_ALL].current, at.allocated_bytes[GM_STAT_ALL].current);
    CHECK_EQ(now.allocation[GM_STAT_ALL].current, at.allocation[GM_STAT_ALL].current);
    CHECK(fx_block_size(&fx, a) > 0 && fx_block_size(&fx, b) > 0);
    CHECK_EQ(fx_block_size(&fx, d), 0);
    /* restoring twice in a row is the same state */
    memset(&f, 0, sizeof f);
    CHECK_EQ(gm_alloc_pool_restore(fx.a, P1, k.v, k.n, on_freed, &f, 0), GM_OK);
    CHECK_EQ(f.n, 2);
    CHECK_ALLOC(&fx);
    FREE(&fx, a);
    FREE(&fx, b);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    CHECK_EQ(fx_reserved(&fx), 0);
    fx_close(&fx);
}

TEST(checkpoint_restore_refuses_what_no_longer_fits) {
    fx_t fx;
    REQUIRE(fx_open(&fx, NULL, NULL) == 0);
    gm_mempool_id_t unknown = {5, 5};
    CHECK_EQ(gm_alloc_pool_restore(fx.a, unknown, NULL, 0, NULL, NULL, 0), GM_ENOTFOUND);
    CHECK_EQ(gm_alloc_pool_begin(fx.a, P1), GM_OK);
    uintptr_t a = pmalloc(&fx, 1000);
    CHECK_EQ(gm_alloc_pool_end(fx.a, P1), GM_OK);
    ckpt_t k = take(&fx);
    REQUIRE(k.n >= 1);
    k.v[0].ptr += 512; /* a segment the pool does not have */
    CHECK_EQ(gm_alloc_pool_restore(fx.a, P1, k.v, k.n, NULL, NULL, 0), GM_ESTATE);
    CHECK_EQ(fx_block_size(&fx, a), 0); /* its blocks were freed first, as torch does */
    CHECK_ALLOC(&fx);
    CHECK_EQ(gm_alloc_pool_release(fx.a, P1), GM_OK);
    CHECK_EQ(gm_alloc_empty_cache(fx.a, 0), GM_OK);
    fx_close(&fx);
}
