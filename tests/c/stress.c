/*
 * stress.c - deterministic random stress test of the allocator core
 * against a simple reference model.
 *
 * Each step is one operation: malloc (tiny, small, medium and large sizes),
 * free, record_stream on another stream, event completion (the virtual
 * events never complete on their own), a bad free, empty_cache or a change
 * of the memory limit, over four streams. The model keeps every live and
 * pending-free block (pointer, block size, requested size, stream) in an
 * array sorted by address, so an overlapping allocation is caught when it
 * is inserted. After every step the statistics must equal the model's sums;
 * every --check-every steps gm_alloc_check must find nothing and the walk
 * must list exactly the model's blocks. In --host mode allocations carry a
 * tag at their first, middle and last bytes, verified before each free.
 * An out-of-memory result must be justified by the limit or the device.
 * With --pools, three private pools (torch's PrivatePool) are created,
 * begun, ended and released at random; while one is allocating, half the
 * mallocs are routed to it, and the walk must show every block in the pool
 * it was allocated from. While a pool is allocating nothing is polled or
 * synchronized (a capture may be underway), so the model completes nothing;
 * live pools keep their cached segments through empty_cache.
 *
 * Usage: stress [--backend=virtual|cuda] [--ops N] [--seed S] [--expandable] [--host]
 *               [--check-every N] [--max-split MiB] [--gc F] [--capacity MiB]
 *               [--pools]
 * --backend=cuda (or GM_TEST_BACKEND=cuda) runs on the CUDA driver backend
 * over the fake libcuda at $GPUMEM_LIBCUDA (testdev.h); the fake's memory is
 * real host memory, so --host's pattern checks apply there too.
 * The last line is "N passed, M failed", counting steps.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/gm_alloc.h"
#include "gmtest.h"
#include "testdev.h"

#define MiB ((size_t)1 << 20)
#define NSTREAMS 4
#define MAX_FAILED_STEPS 50
#define RECENT 64

static uintptr_t streams[NSTREAMS]; /* the default stream and three of the device's */

/* ---- options ---- */
static long opt_ops = 1000000;
static uint64_t opt_seed = 0x5eed0001;
static int opt_expandable, opt_host;
static long opt_check_every = 10;
static size_t opt_max_split; /* 0 = unlimited */
static double opt_gc;
static size_t opt_capacity = 4096 * MiB;
static int opt_pools;

/* ---- the private pools' model ---- */
#define NPOOLS 3
typedef struct mpool {
    gm_mempool_id_t id;
    int use;        /* use count; 0: the slot is free (its last id freeable) */
    int allocating; /* between begin and end */
} mpool_t;
static mpool_t mpools[NPOOLS];
static uint64_t next_pool_id = 1;
static int n_allocating; /* model's count of allocating pools */
static long n_pool_ops, n_pool_mallocs;

/* 1 if id names a pool some slot still holds (live, not freeable). */
static int pool_is_live(gm_mempool_id_t id) {
    for (int i = 0; i < NPOOLS; i++)
        if (mpools[i].use && mpools[i].id.first == id.first && mpools[i].id.second == id.second)
            return 1;
    return 0;
}

/* ---- PRNG: xorshift64* ---- */
static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* ---- the model ---- */
enum { LIVE = 1, PENDING = 2 };

typedef struct rec {
    uintptr_t ptr;
    size_t size; /* block size reported by the allocator */
    size_t req;
    uintptr_t stream;
    uint64_t tag;
    int xstream; /* record_stream on another stream happened */
    int state;
    long syncs_at_free; /* tdev_sync_calls() when it became pending */
    int seen;           /* scratch for reconcile_pending */
    gm_mempool_id_t pool; /* {0, 0}: the default pools */
} rec_t;

static rec_t *blocks; /* live and pending, sorted by ptr */
static size_t nblocks, capblocks;
static size_t nlive, npending;
static int64_t live_bytes, live_req, pend_bytes, pend_req;
static uintptr_t recent[RECENT]; /* recently freed pointers */
static size_t nrecent;

static tdev_t *dev;
static gm_alloc_t *alloc;
static const gm_backend_t *be;
static size_t limit; /* model's view of the limit, 0 = none */

/* counters for the report */
static long n_malloc, n_free, n_oom, n_record, n_complete, n_bad, n_empty, n_limit, n_checks;
static long n_early;
static long max_live;

static void die_oom(void) {
    fprintf(stderr, "stress: host out of memory\n");
    exit(2);
}

static size_t find_pos(uintptr_t ptr) { /* first index with blocks[i].ptr >= ptr */
    size_t lo = 0, hi = nblocks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].ptr < ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static rec_t *find_rec(uintptr_t ptr) {
    size_t i = find_pos(ptr);
    return i < nblocks && blocks[i].ptr == ptr ? &blocks[i] : NULL;
}

static void model_insert(const rec_t *r) {
    size_t i = find_pos(r->ptr);
    if (i > 0 && blocks[i - 1].ptr + blocks[i - 1].size > r->ptr)
        gmtest_fail(__FILE__, __LINE__,
                    "overlap: new [%#" PRIxPTR ", +%zu) inside %s [%#" PRIxPTR ", +%zu)", r->ptr,
                    r->size, blocks[i - 1].state == LIVE ? "live" : "pending", blocks[i - 1].ptr,
                    blocks[i - 1].size);
    if (i < nblocks && r->ptr + r->size > blocks[i].ptr)
        gmtest_fail(__FILE__, __LINE__,
                    "overlap: new [%#" PRIxPTR ", +%zu) runs into %s [%#" PRIxPTR ", +%zu)", r->ptr,
                    r->size, blocks[i].state == LIVE ? "live" : "pending", blocks[i].ptr,
                    blocks[i].size);
    if (nblocks == capblocks) {
        capblocks = capblocks ? capblocks * 2 : 1024;
        blocks = realloc(blocks, capblocks * sizeof *blocks);
        if (!blocks)
            die_oom();
    }
    memmove(&blocks[i + 1], &blocks[i], (nblocks - i) * sizeof *blocks);
    blocks[i] = *r;
    nblocks++;
    nlive++;
    live_bytes += (int64_t)r->size;
    live_req += (int64_t)r->req;
    if ((long)nlive > max_live)
        max_live = (long)nlive;
}

static void model_remove_at(size_t i) {
    memmove(&blocks[i], &blocks[i + 1], (nblocks - i - 1) * sizeof *blocks);
    nblocks--;
}

/* All pending blocks completed (events synchronized or completed). */
static void model_complete_pending(void) {
    if (!npending)
        return;
    size_t j = 0;
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].state != PENDING)
            blocks[j++] = blocks[i];
    nblocks = j;
    npending = 0;
    pend_bytes = pend_req = 0;
}

/* A pending block can complete before the model expects it on the CUDA
 * backend: the fake driver completes an event when its stream is
 * synchronized, and the allocator synchronizes a block's stream before it
 * unmaps expandable-segment granules (event synchronizes happen only on the
 * empty_cache/retry paths, which the model already treats as completing
 * everything). The virtual device's
 * stream_synchronize completes nothing, so there this never happens. After
 * a synchronize (or when the allocator has fewer active blocks than the
 * model), the walk says which pending blocks are gone; each must have
 * become pending before the latest synchronize call, or it is a failure. */
static int walk_mark_pending(void *arg, const gm_segment_info_t *seg) {
    for (size_t i = 0; i < seg->nblocks; i++)
        if (seg->blocks[i].state == GM_BLOCK_ACTIVE_PENDING_FREE) {
            rec_t *r = find_rec(seg->blocks[i].address);
            if (r && r->state == PENDING)
                r->seen = 1;
        }
    return 0;
}

static void reconcile_pending(int new_live /* allocated, not yet in the model */) {
    static long checked_syncs;
    if (!npending || tdev_kind() != TDEV_CUDA)
        return;
    long syncs = tdev_sync_calls(dev);
    gm_stats_t s;
    gm_alloc_get_stats(alloc, &s);
    if (syncs == checked_syncs &&
        s.active[GM_STAT_ALL].current >= (int64_t)(nlive + (size_t)new_live + npending))
        return; /* nothing synchronized since the last look, nothing missing */
    checked_syncs = syncs;
    for (size_t i = 0; i < nblocks; i++)
        blocks[i].seen = 0;
    gm_alloc_walk(alloc, walk_mark_pending, NULL);
    size_t j = 0;
    for (size_t i = 0; i < nblocks; i++) {
        rec_t *r = &blocks[i];
        if (r->state == PENDING && !r->seen) {
            if (syncs <= r->syncs_at_free)
                gmtest_fail(__FILE__, __LINE__,
                            "pending block %#" PRIxPTR " was freed with no synchronize since",
                            r->ptr);
            npending--;
            pend_bytes -= (int64_t)r->size;
            pend_req -= (int64_t)r->req;
            n_early++;
            continue;
        }
        blocks[j++] = *r;
    }
    nblocks = j;
}

/* ---- helpers ---- */
static size_t round512(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }
static size_t round2m(size_t n) { return (n + 2 * MiB - 1) / (2 * MiB) * (2 * MiB); }
static size_t alloc_size_for(size_t r) {
    if (r <= GM_SMALL_SIZE)
        return GM_SMALL_BUFFER;
    if (r < GM_MIN_LARGE_ALLOC)
        return GM_LARGE_BUFFER;
    return round2m(r);
}

static void pattern_write(uintptr_t p, size_t n, uint64_t tag) {
    unsigned char *m = (unsigned char *)p;
    size_t k = n < 8 ? n : 8;
    memcpy(m, &tag, k);
    if (n >= 16) {
        uint64_t t = ~tag;
        memcpy(m + n - 8, &t, 8);
    }
    if (n >= 4096) {
        uint64_t t = tag * 31 + 7;
        memcpy(m + (n / 2 & ~(size_t)7), &t, 8);
    }
}

static int pattern_ok(uintptr_t p, size_t n, uint64_t tag) {
    const unsigned char *m = (const unsigned char *)p;
    size_t k = n < 8 ? n : 8;
    if (memcmp(m, &tag, k))
        return 0;
    if (n >= 16) {
        uint64_t t = ~tag;
        if (memcmp(m + n - 8, &t, 8))
            return 0;
    }
    if (n >= 4096) {
        uint64_t t = tag * 31 + 7;
        if (memcmp(m + (n / 2 & ~(size_t)7), &t, 8))
            return 0;
    }
    return 1;
}

static size_t pick_size(void) {
    uint64_t r = rnd_below(100);
    if (r < 30)
        return 1 + (size_t)rnd_below(4096);
    if (r < 65)
        return 4097 + (size_t)rnd_below(MiB - 4096);
    if (r < 90)
        return MiB + 1 + (size_t)rnd_below(9 * MiB);
    return 10 * MiB + (size_t)rnd_below(90 * MiB + 1);
}

static size_t effective_limit(void) {
    return limit && limit < opt_capacity ? limit : opt_capacity;
}

/* ---- checks ---- */
static void check_stats(void) {
    reconcile_pending(0);
    gm_stats_t s;
    gm_alloc_get_stats(alloc, &s);
    const int A = GM_STAT_ALL;
    if (s.allocation[A].current != (int64_t)nlive)
        gmtest_fail(__FILE__, __LINE__, "allocation.current %" PRId64 " != model %zu",
                    s.allocation[A].current, nlive);
    if (s.allocated_bytes[A].current != live_bytes)
        gmtest_fail(__FILE__, __LINE__, "allocated_bytes.current %" PRId64 " != model %" PRId64,
                    s.allocated_bytes[A].current, live_bytes);
    if (s.active[A].current != (int64_t)(nlive + npending))
        gmtest_fail(__FILE__, __LINE__, "active.current %" PRId64 " != model %zu",
                    s.active[A].current, nlive + npending);
    if (s.active_bytes[A].current != live_bytes + pend_bytes)
        gmtest_fail(__FILE__, __LINE__, "active_bytes.current %" PRId64 " != model %" PRId64,
                    s.active_bytes[A].current, live_bytes + pend_bytes);
    if (s.requested_bytes[A].current != live_req + pend_req)
        gmtest_fail(__FILE__, __LINE__, "requested_bytes.current %" PRId64 " != model %" PRId64,
                    s.requested_bytes[A].current, live_req + pend_req);
    if (s.reserved_bytes[A].current < s.active_bytes[A].current)
        gmtest_fail(__FILE__, __LINE__, "reserved %" PRId64 " < active %" PRId64,
                    s.reserved_bytes[A].current, s.active_bytes[A].current);
    if (s.allocated_bytes[A].current !=
        s.allocated_bytes[GM_STAT_SMALL].current + s.allocated_bytes[GM_STAT_LARGE].current)
        gmtest_fail(__FILE__, __LINE__, "allocated_bytes all != small + large");
    if (s.reserved_bytes[A].current !=
        s.reserved_bytes[GM_STAT_SMALL].current + s.reserved_bytes[GM_STAT_LARGE].current)
        gmtest_fail(__FILE__, __LINE__, "reserved_bytes all != small + large");
    for (int t = 0; t < GM_STAT_NTYPES; t++)
        if (s.allocated_bytes[t].peak < s.allocated_bytes[t].current ||
            s.allocated_bytes[t].allocated - s.allocated_bytes[t].freed !=
                s.allocated_bytes[t].current)
            gmtest_fail(__FILE__, __LINE__, "allocated_bytes[%d] peak/allocated/freed broken", t);
    tdev_counters_t c;
    tdev_counters(dev, 0, &c);
    if ((size_t)s.reserved_bytes[A].current != c.bytes_allocated + c.bytes_mapped)
        gmtest_fail(__FILE__, __LINE__, "reserved %" PRId64 " != device allocated %zu + mapped %zu",
                    s.reserved_bytes[A].current, c.bytes_allocated, c.bytes_mapped);
}

typedef struct walk_state {
    size_t seen_live, seen_pending, segs;
    int after_release; /* no wholly free segment / granule may remain */
    uintptr_t last_end;
} walk_state_t;

static int walk_cb(void *arg, const gm_segment_info_t *seg) {
    walk_state_t *w = arg;
    w->segs++;
    if (seg->address < w->last_end)
        gmtest_fail(__FILE__, __LINE__, "walk: segment %#" PRIxPTR " out of order", seg->address);
    w->last_end = seg->address + seg->total_size;
    uintptr_t at = seg->address;
    int is_private = seg->pool_id.first || seg->pool_id.second;
    /* empty_cache leaves live private pools alone, and the default pools
     * while a pool is allocating (the caller clears after_release then) */
    int released = w->after_release && !(is_private && pool_is_live(seg->pool_id));
    for (size_t i = 0; i < seg->nblocks; i++) {
        const gm_block_info_t *b = &seg->blocks[i];
        if (b->address != at)
            gmtest_fail(__FILE__, __LINE__, "walk: gap or overlap at %#" PRIxPTR, b->address);
        at += b->size;
        if (b->state == GM_BLOCK_INACTIVE) {
            if (released && opt_expandable) {
                size_t g = 2 * MiB;
                uintptr_t lo = (b->address + g - 1) / g * g, hi = (b->address + b->size) / g * g;
                if (lo < hi)
                    gmtest_fail(__FILE__, __LINE__,
                                "walk: free granule [%#" PRIxPTR ", %#" PRIxPTR ") still mapped",
                                lo, hi);
            }
            continue;
        }
        const rec_t *r = find_rec(b->address);
        int want = b->state == GM_BLOCK_ACTIVE_ALLOCATED ? LIVE : PENDING;
        if (!r || r->state != want || r->size != b->size || r->req != b->requested_size) {
            gmtest_fail(__FILE__, __LINE__,
                        "walk: block %#" PRIxPTR " (%zu, state %d) not in the model as such",
                        b->address, b->size, b->state);
            continue;
        }
        if (r->pool.first != seg->pool_id.first || r->pool.second != seg->pool_id.second)
            gmtest_fail(__FILE__, __LINE__,
                        "walk: block %#" PRIxPTR " of pool (%" PRIu64 ", %" PRIu64
                        ") in a segment of pool (%" PRIu64 ", %" PRIu64 ")",
                        b->address, r->pool.first, r->pool.second, seg->pool_id.first,
                        seg->pool_id.second);
        if (want == LIVE)
            w->seen_live++;
        else
            w->seen_pending++;
    }
    if (at != seg->address + seg->total_size)
        gmtest_fail(__FILE__, __LINE__, "walk: blocks do not tile segment %#" PRIxPTR,
                    seg->address);
    if (released && !opt_expandable && seg->active_size == 0)
        gmtest_fail(__FILE__, __LINE__, "walk: wholly free segment %#" PRIxPTR " not released",
                    seg->address);
    return 0;
}

static void full_check(int after_release) {
    n_checks++;
    char msg[256] = "";
    int v = gm_alloc_check(alloc, msg, sizeof msg);
    if (v)
        gmtest_fail(__FILE__, __LINE__, "gm_alloc_check: %d violation(s): %s", v, msg);
    walk_state_t w;
    memset(&w, 0, sizeof w);
    w.after_release = after_release && !n_allocating;
    gm_alloc_walk(alloc, walk_cb, &w);
    if (w.seen_live != nlive || w.seen_pending != npending)
        gmtest_fail(__FILE__, __LINE__, "walk saw %zu live + %zu pending, model has %zu + %zu",
                    w.seen_live, w.seen_pending, nlive, npending);
}

/* ---- operations ---- */
static void op_malloc(void) {
    size_t req = pick_size();
    uintptr_t stream = streams[rnd_below(NSTREAMS)];
    gm_stats_t before;
    gm_alloc_get_stats(alloc, &before);
    gm_oom_info_t oom;
    memset(&oom, 0, sizeof oom);
    uintptr_t p = 0;
    gm_mempool_id_t pool = {0, 0};
    if (n_allocating && rnd_below(2)) { /* the shim's filter matched this pool */
        int k = (int)rnd_below(NPOOLS);
        while (!mpools[k].allocating)
            k = (k + 1) % NPOOLS;
        pool = mpools[k].id;
        n_pool_mallocs++;
    }
    int rc = gm_alloc_malloc_pool(alloc, req, stream, (uint32_t)(n_malloc & 0xffff), pool, &p,
                                  &oom);
    gm_stats_t after;
    gm_alloc_get_stats(alloc, &after);
    /* The retry path synchronizes every event: pending blocks are free
     * (there is no retry while a pool is allocating). */
    if (after.num_alloc_retries != before.num_alloc_retries ||
        (after.num_ooms != before.num_ooms && !n_allocating))
        model_complete_pending();
    reconcile_pending(rc == 0);
    size_t r = round512(req);
    if (rc == GM_EOOM) {
        n_oom++;
        if (after.num_ooms != before.num_ooms + 1)
            gmtest_fail(__FILE__, __LINE__, "num_ooms did not grow by one");
        if (oom.requested != req || oom.rounded != r)
            gmtest_fail(__FILE__, __LINE__, "oom info: requested %zu rounded %zu for %zu",
                        oom.requested, oom.rounded, req);
        if (!opt_expandable && oom.alloc_size != alloc_size_for(r))
            gmtest_fail(__FILE__, __LINE__, "oom info: alloc_size %zu for rounded %zu",
                        oom.alloc_size, r);
        size_t dfree = 0, dtotal = 0;
        be->mem_get_info(be->ctx, 0, &dfree, &dtotal);
        if (oom.device_free != dfree || oom.device_total != dtotal)
            gmtest_fail(__FILE__, __LINE__, "oom info: device %zu/%zu, device says %zu/%zu",
                        oom.device_free, oom.device_total, dfree, dtotal);
        if (oom.allocated != (size_t)live_bytes ||
            oom.reserved != (size_t)after.reserved_bytes[GM_STAT_ALL].current ||
            oom.reserved_unallocated != oom.reserved - oom.allocated)
            gmtest_fail(__FILE__, __LINE__, "oom info: allocated %zu reserved %zu unalloc %zu",
                        oom.allocated, oom.reserved, oom.reserved_unallocated);
        if (oom.limit_hit) {
            if (!limit || oom.allowed != limit || oom.reserved + oom.alloc_size <= oom.allowed)
                gmtest_fail(__FILE__, __LINE__,
                            "unjustified limit oom: limit %zu allowed %zu reserved %zu need %zu",
                            limit, oom.allowed, oom.reserved, oom.alloc_size);
        } else {
            size_t need = opt_expandable ? round2m(r) : oom.alloc_size;
            /* While a pool is allocating there is no retry after the
             * oversize release, which may free some memory but not enough
             * (torch's release_available_cached_blocks) */
            int partial = n_allocating && after.num_device_free != before.num_device_free;
            if (dfree >= need && !partial)
                gmtest_fail(__FILE__, __LINE__,
                            "unjustified device oom: device free %zu, request needs %zu", dfree,
                            need);
        }
        full_check(1);
        return;
    }
    if (rc != 0) {
        gmtest_fail(__FILE__, __LINE__, "malloc(%zu) = %d (%s)", req, rc, gm_strerror(rc));
        return;
    }
    n_malloc++;
    size_t size = 0, breq = 0;
    uintptr_t bstream = 0;
    rc = gm_alloc_block_size(alloc, p, &size, &breq, &bstream);
    if (rc != 0 || breq != req || bstream != stream) {
        gmtest_fail(__FILE__, __LINE__, "block_size(%#" PRIxPTR ") = %d, req %zu, stream %#" PRIxPTR,
                    p, rc, breq, bstream);
        return;
    }
    int ok;
    if (r <= GM_SMALL_SIZE || opt_expandable)
        ok = size == r;
    else if (opt_max_split && r >= opt_max_split)
        ok = size >= r && size < r + GM_LARGE_BUFFER;
    else
        ok = size >= r && size <= r + GM_SMALL_SIZE;
    if (!ok)
        gmtest_fail(__FILE__, __LINE__, "malloc(%zu): block size %zu for rounded %zu", req, size, r);
    rec_t rec = {p, size, req, stream, rnd(), 0, LIVE, 0, 0, pool};
    if (opt_host)
        pattern_write(p, req, rec.tag);
    model_insert(&rec);
}

static void op_free(void) {
    size_t k = (size_t)rnd_below(nlive);
    /* the k-th live block in address order (pending ones are skipped) */
    size_t i = 0;
    for (size_t seen = 0;; i++) {
        if (blocks[i].state != LIVE)
            continue;
        if (seen++ == k)
            break;
    }
    rec_t r = blocks[i];
    if (opt_host && !pattern_ok(r.ptr, r.req, r.tag))
        gmtest_fail(__FILE__, __LINE__, "memory of %#" PRIxPTR " (%zu bytes) was overwritten", r.ptr,
                    r.req);
    int rc = gm_alloc_free(alloc, r.ptr, 0);
    if (rc) {
        gmtest_fail(__FILE__, __LINE__, "free(%#" PRIxPTR ") = %d (%s)", r.ptr, rc, gm_strerror(rc));
        return;
    }
    n_free++;
    nlive--;
    live_bytes -= (int64_t)r.size;
    live_req -= (int64_t)r.req;
    if (r.xstream) {
        blocks[i].state = PENDING;
        blocks[i].syncs_at_free = tdev_sync_calls(dev);
        npending++;
        pend_bytes += (int64_t)r.size;
        pend_req += (int64_t)r.req;
    } else {
        model_remove_at(i);
    }
    recent[nrecent++ % RECENT] = r.ptr;
}

static rec_t *random_live(void) {
    if (!nlive)
        return NULL;
    for (int tries = 0; tries < 64; tries++) {
        rec_t *r = &blocks[rnd_below(nblocks)];
        if (r->state == LIVE)
            return r;
    }
    return NULL;
}

static void op_record_stream(void) {
    rec_t *r = random_live();
    if (!r)
        return;
    uintptr_t s = streams[rnd_below(NSTREAMS)];
    int rc = gm_alloc_record_stream(alloc, r->ptr, s);
    if (rc)
        gmtest_fail(__FILE__, __LINE__, "record_stream = %d", rc);
    else if (s != r->stream)
        r->xstream = 1;
    n_record++;
}

static void op_complete_events(void) {
    if (n_allocating)
        return; /* nothing would be polled: leave the device's events be */
    /* a poll first records the events of blocks freed while a pool was
     * allocating; then every event completes */
    if (gm_alloc_process_events(alloc, 0))
        gmtest_fail(__FILE__, __LINE__, "process_events failed");
    tdev_complete_events(dev);
    int rc = gm_alloc_process_events(alloc, 0);
    if (rc)
        gmtest_fail(__FILE__, __LINE__, "process_events = %d", rc);
    model_complete_pending();
    n_complete++;
}

static void op_bad_free(void) {
    n_bad++;
    if (rnd_below(2)) {
        rec_t *r = random_live();
        if (!r || r->size <= 512)
            return;
        int rc = gm_alloc_free(alloc, r->ptr + 512 * (1 + rnd_below(r->size / 512 - 1)), 0);
        if (rc != GM_ENOTFOUND)
            gmtest_fail(__FILE__, __LINE__, "free of an interior pointer = %d", rc);
        return;
    }
    if (!nrecent)
        return;
    uintptr_t p = recent[rnd_below(nrecent < RECENT ? nrecent : RECENT)];
    const rec_t *r = find_rec(p);
    if (r && r->state == LIVE)
        return; /* reused since: a valid pointer now */
    int rc = gm_alloc_free(alloc, p, 0);
    if (r && r->state == PENDING ? rc != GM_EDOUBLEFREE
                                 : (rc != GM_EDOUBLEFREE && rc != GM_ENOTFOUND))
        gmtest_fail(__FILE__, __LINE__, "double free of %#" PRIxPTR " = %d", p, rc);
}

static void op_empty_cache(void) {
    n_empty++;
    int rc = gm_alloc_empty_cache(alloc, 0);
    if (rc)
        gmtest_fail(__FILE__, __LINE__, "empty_cache = %d", rc);
    if (!n_allocating) /* no waiting for events while a pool is allocating */
        model_complete_pending();
    full_check(1);
}

static void expect_rc(int rc, int want, const char *what) {
    if (rc != want)
        gmtest_fail(__FILE__, __LINE__, "%s = %d (%s), expected %d", what, rc, gm_strerror(rc),
                    want);
}

/* One private-pool operation on a random slot: create or begin, end,
 * release, or empty_cache of the pool (nothing to free while it is live). */
static void op_pool(void) {
    n_pool_ops++;
    mpool_t *m = &mpools[rnd_below(NPOOLS)];
    int use = 0;
    switch (rnd_below(4)) {
    case 0:
        if (!m->use) {
            m->id.first = 0;
            m->id.second = next_pool_id++;
        }
        if (!m->allocating && rnd_below(2)) {
            expect_rc(gm_alloc_pool_begin(alloc, m->id), GM_OK, "pool_begin");
            m->allocating = 1;
            n_allocating++;
        } else {
            expect_rc(gm_alloc_pool_create_or_incref(alloc, m->id), GM_OK, "create_or_incref");
        }
        m->use++;
        break;
    case 1:
        if (!m->use)
            return;
        expect_rc(gm_alloc_pool_end(alloc, m->id), m->allocating ? GM_OK : GM_ENOTFOUND,
                  "pool_end");
        if (m->allocating) {
            m->allocating = 0;
            n_allocating--;
        }
        break;
    case 2:
        if (!m->use || m->allocating)
            return;
        expect_rc(gm_alloc_pool_release(alloc, m->id), GM_OK, "pool_release");
        m->use--;
        break;
    default:
        if (!m->use)
            return;
        expect_rc(gm_alloc_empty_cache_pool(alloc, m->id, 0), GM_OK, "empty_cache_pool");
        break;
    }
    if (m->use) {
        expect_rc(gm_alloc_pool_use_count(alloc, m->id, &use), GM_OK, "pool_use_count");
        if (use != m->use)
            gmtest_fail(__FILE__, __LINE__, "pool use count %d, model %d", use, m->use);
    }
}

/* End and release every pool, so that the final empty_cache frees all. */
static void release_pools(void) {
    for (int i = 0; i < NPOOLS; i++) {
        mpool_t *m = &mpools[i];
        if (m->allocating)
            expect_rc(gm_alloc_pool_end(alloc, m->id), GM_OK, "pool_end");
        for (; m->use > 0; m->use--)
            expect_rc(gm_alloc_pool_release(alloc, m->id), GM_OK, "pool_release");
        m->allocating = 0;
    }
    n_allocating = 0;
}

static void op_limit(void) {
    n_limit++;
    int rc = 0;
    switch (rnd_below(5)) {
    case 0:
        rc = gm_alloc_set_memory_limit(alloc, 0);
        limit = 0;
        break;
    case 1:
        rc = gm_alloc_set_memory_fraction(alloc, 0.5);
        limit = opt_capacity / 2;
        break;
    case 2:
        rc = gm_alloc_set_memory_fraction(alloc, 0.3);
        limit = (size_t)(0.3 * (double)opt_capacity);
        break;
    default: {
        size_t l = (512 + (size_t)rnd_below(2048)) * MiB;
        rc = gm_alloc_set_memory_limit(alloc, l);
        limit = l;
        break;
    }
    }
    if (rc)
        gmtest_fail(__FILE__, __LINE__, "setting the limit = %d", rc);
    if (gm_alloc_memory_limit(alloc) != limit) {
        /* a fraction may round differently; take the allocator's figure if close */
        size_t got = gm_alloc_memory_limit(alloc);
        if (got + MiB < limit || got > limit + MiB)
            gmtest_fail(__FILE__, __LINE__, "memory_limit %zu, expected %zu", got, limit);
        limit = got;
    }
}

static void step(void) {
    uint64_t r = rnd_below(100000);
    if (r < 2) {
        op_empty_cache();
        return;
    }
    if (r < 4) {
        op_limit();
        return;
    }
    r = rnd_below(1000);
    if (opt_pools && r >= 990) {
        op_pool();
        return;
    }
    if (r < 20) {
        op_record_stream();
        return;
    }
    if (r < 30) {
        op_complete_events();
        return;
    }
    if (r < 33) {
        op_bad_free();
        return;
    }
    if (r < 36) {
        if (gm_alloc_process_events(alloc, 0))
            gmtest_fail(__FILE__, __LINE__, "process_events failed");
        return;
    }
    /* alloc or free, steering the live bytes towards a budget */
    size_t budget = effective_limit() / 2;
    int want_free = nlive && ((size_t)live_bytes > budget ? rnd_below(100) < 75
                                                          : rnd_below(100) < 45);
    if (want_free)
        op_free();
    else
        op_malloc();
}

static void cleanup_all(void) {
    release_pools();
    while (nlive)
        op_free();
    op_complete_events();
    if (gm_alloc_empty_cache(alloc, 0))
        gmtest_fail(__FILE__, __LINE__, "final empty_cache failed");
    full_check(1);
    check_stats();
    gm_stats_t s;
    gm_alloc_get_stats(alloc, &s);
    tdev_counters_t c;
    tdev_counters(dev, 0, &c);
    if (s.reserved_bytes[GM_STAT_ALL].current || c.bytes_allocated || c.bytes_mapped)
        gmtest_fail(__FILE__, __LINE__, "after freeing everything: reserved %" PRId64
                    ", device allocated %zu, mapped %zu",
                    s.reserved_bytes[GM_STAT_ALL].current, c.bytes_allocated, c.bytes_mapped);
    if (s.allocation[GM_STAT_ALL].allocated != s.allocation[GM_STAT_ALL].freed ||
        s.allocation[GM_STAT_ALL].allocated != n_malloc)
        gmtest_fail(__FILE__, __LINE__, "allocation allocated %" PRId64 " freed %" PRId64
                    ", model mallocs %ld", s.allocation[GM_STAT_ALL].allocated,
                    s.allocation[GM_STAT_ALL].freed, n_malloc);
}

static void usage(void) {
    fprintf(stderr, "usage: stress [--backend=virtual|cuda] [--ops N] [--seed S] [--expandable] "
                    "[--host] [--check-every N] [--max-split MiB] [--gc F] [--capacity MiB] [--pools]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (tdev_parse_args(&argc, argv) != 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--expandable"))
            opt_expandable = 1;
        else if (!strcmp(a, "--pools"))
            opt_pools = 1;
        else if (!strcmp(a, "--host"))
            opt_host = 1;
        else if (!strcmp(a, "--ops") && v)
            opt_ops = strtol(argv[++i], NULL, 0);
        else if (!strcmp(a, "--seed") && v)
            opt_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "--check-every") && v)
            opt_check_every = strtol(argv[++i], NULL, 0);
        else if (!strcmp(a, "--max-split") && v)
            opt_max_split = (size_t)strtoul(argv[++i], NULL, 0) * MiB;
        else if (!strcmp(a, "--gc") && v)
            opt_gc = strtod(argv[++i], NULL);
        else if (!strcmp(a, "--capacity") && v)
            opt_capacity = (size_t)strtoul(argv[++i], NULL, 0) * MiB;
        else
            usage();
    }
    if (opt_ops < 1 || opt_check_every < 1 || opt_capacity < 256 * MiB)
        usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("stress: backend=%s seed=%#" PRIx64 " ops=%ld mode=%s memory=%s check_every=%ld "
           "max_split=%zu MiB gc=%.2f capacity=%zu MiB pools=%d\n",
           tdev_kind_name(), opt_seed, opt_ops, opt_expandable ? "expandable" : "segments",
           opt_host ? "host" : "virtual", opt_check_every, opt_max_split / MiB, opt_gc,
           opt_capacity / MiB, opt_pools);
    rng_state = opt_seed ? opt_seed : 1;

    tdev_config_t cfg;
    tdev_config_default(&cfg);
    cfg.capacity = opt_capacity;
    cfg.host_memory = opt_host;
    cfg.event_mode = TDEV_EVENTS_NEVER;
    char err[1024];
    if (tdev_open(&cfg, &dev, err, sizeof err)) {
        fprintf(stderr, "stress: opening the %s device failed: %s\n", tdev_kind_name(), err);
        return 2;
    }
    be = tdev_backend(dev);
    for (int i = 0; i < NSTREAMS; i++)
        streams[i] = tdev_stream(dev, i);
    gm_settings_t st;
    gm_settings_default(&st);
    st.expandable_segments = opt_expandable;
    if (opt_max_split)
        st.max_split_size = opt_max_split;
    st.garbage_collection_threshold = opt_gc;
    int rc = gm_alloc_create(be, 0, &st, &alloc);
    if (rc) {
        fprintf(stderr, "stress: gm_alloc_create failed: %d (%s)\n", rc, gm_strerror(rc));
        return 2;
    }
    if (opt_expandable && !gm_alloc_expandable_active(alloc)) {
        fprintf(stderr, "stress: expandable segments are not active\n");
        return 2;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long passed = 0, failed = 0;
    gmtest_begin("stress");
    for (long i = 0; i < opt_ops; i++) {
        long f0 = gmtest_failures();
        step();
        check_stats();
        if (i % opt_check_every == opt_check_every - 1)
            full_check(0);
        if (gmtest_failures() == f0) {
            passed++;
        } else {
            failed++;
            printf("stress: step %ld failed (seed %#" PRIx64 ")\n", i, opt_seed);
            if (failed >= MAX_FAILED_STEPS) {
                printf("stress: stopping after %d failed steps\n", MAX_FAILED_STEPS);
                break;
            }
        }
    }
    long f0 = gmtest_failures();
    cleanup_all();
    gm_alloc_destroy(alloc);
    if (tdev_close(dev, err, sizeof err))
        gmtest_fail(__FILE__, __LINE__, "%s device not clean after destroy: %s", tdev_kind_name(),
                    err);
    tdev_shutdown();
    free(blocks);
    if (gmtest_failures() == f0)
        passed++;
    else
        failed++;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("stress: %ld mallocs, %ld frees, %ld ooms, %ld record_stream, %ld event completions, "
           "%ld bad frees, %ld empty_cache, %ld limit changes, %ld full checks, max %ld live, "
           "%ld pending blocks completed by a stream synchronize, %ld pool operations, "
           "%ld mallocs routed to a pool\n",
           n_malloc, n_free, n_oom, n_record, n_complete, n_bad, n_empty, n_limit, n_checks,
           max_live, n_early, n_pool_ops, n_pool_mallocs);
    printf("stress: %.2f s (%.0f ns/step)\n", secs, secs * 1e9 / (double)(passed + failed));
    printf("%ld passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
