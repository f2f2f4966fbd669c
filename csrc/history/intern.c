/*
 * intern.c - the interning tables behind traceback ids (see intern.h).
 *
 * Three open-addressing hash tables (frames, tracebacks, strings) map keys
 * to uint32 ids; each id indexes an array of records. Records live in a
 * bump arena that is never freed, so a record pointer is stable even when
 * the id arrays are reallocated. Tables are kept at most half full.
 *
 * Invariants: ids are dense (1..count); a record never changes after it is
 * published; a key is in its table exactly once.
 *
 * Note [Traceback cache]
 * Rationale: a capture interns the whole stack on every allocation and
 *   free, and most of them repeat a stack this thread interned moments ago
 *   (the same loop, the same layer). The locked path costs a mutex round
 *   trip and a probe that reads each frame through the frames array.
 * Approach: each traceback record keeps its raw frames inline (compared
 *   with one memcmp), and each thread keeps a small direct-mapped cache,
 *   keyed by the traceback hash, of records it interned or found. A hit
 *   compares the record's immutable inline copy and returns its id without
 *   taking intern_lock. The cache only ever holds records this thread
 *   obtained under intern_lock (so it has seen their contents), and records
 *   are never freed or changed, so reading them unlocked is safe.
 * Limitations: the cache is per thread (a new thread starts cold), and a
 *   record costs 16 more bytes per Python frame for the inline copy.
 * Must not: call Python, take another lock while holding intern_lock, or
 * free anything (ids are valid for the life of the process).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "intern.h"

#define ARENA_CHUNK ((size_t)64 << 10)

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t size;
} arena_chunk_t;

typedef struct tb_rec {
    uint64_t hash;
    uint32_t npy, nc;
    uint32_t *fids;
    uintptr_t *c;
    gm_rawframe_t *raw; /* the npy frames as captured (Note [Traceback cache]) */
} tb_rec_t;

/* tb_equal compares raw frames with memcmp: no padding may hide in them. */
_Static_assert(sizeof(gm_rawframe_t) == sizeof(uintptr_t) + 2 * sizeof(int32_t),
               "gm_rawframe_t must have no padding");

#define TLS_CACHE 16 /* entries per thread, a power of two */

typedef struct tls_entry {
    uint64_t hash;
    const tb_rec_t *rec; /* NULL: empty */
    uint32_t id;
} tls_entry_t;

/* protected by: being thread-local (Note [Traceback cache]) */
static _Thread_local tls_entry_t tls_cache[TLS_CACHE];

typedef struct str_rec {
    uint64_t hash;
    size_t len;
    char data[];
} str_rec_t;

typedef struct table {
    uint32_t *slots; /* id or 0 */
    size_t mask;     /* capacity - 1; capacity is a power of two, or 0 */
} table_t;

/* Everything below is protected by: intern_lock. */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*retain_fn)(uintptr_t);

static arena_chunk_t *arena_head;
static char *arena_cur;
static size_t arena_left;
static size_t arena_bytes;

static gm_rawframe_t *frames; /* frames[id - 1] */
static size_t n_frames, cap_frames;
static table_t frame_tab;

static tb_rec_t **tbs; /* tbs[id - 1] */
static size_t n_tbs, cap_tbs;
static table_t tb_tab;

static str_rec_t **strs; /* strs[id - 1] */
static size_t n_strs, cap_strs;
static table_t str_tab;

/* -------------------------------------------------------------- helpers */

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 31);
}

static uint64_t frame_hash(const gm_rawframe_t *f) {
    return mix(mix(0x51ed270b9c4f3a11ULL, (uint64_t)f->code),
               ((uint64_t)(uint32_t)f->loc << 1) | (uint64_t)(f->kind & 1));
}

static void *arena_alloc(size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size > arena_left) {
        size_t chunk = size + sizeof(arena_chunk_t) + 16 > ARENA_CHUNK
                           ? size + sizeof(arena_chunk_t) + 16
                           : ARENA_CHUNK;
        arena_chunk_t *c = malloc(chunk);
        if (!c)
            return NULL;
        c->next = arena_head;
        c->size = chunk;
        arena_head = c;
        arena_bytes += chunk;
        uintptr_t start = ((uintptr_t)(c + 1) + 15) & ~(uintptr_t)15;
        arena_cur = (char *)start;
        arena_left = chunk - (size_t)(start - (uintptr_t)c);
    }
    void *p = arena_cur;
    arena_cur += size;
    arena_left -= size;
    return p;
}

/* Make room for one more id in *arr (element size esz). */
static int grow_ids(void **arr, size_t n, size_t *cap, size_t esz) {
    if (n < *cap)
        return 0;
    if (n >= (size_t)UINT32_MAX - 1)
        return -1;
    size_t ncap = *cap ? *cap * 2 : 256;
    void *p = realloc(*arr, ncap * esz);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* Keep the table at most half full; `hash_of(id)` recomputes a key hash. */
static int table_reserve(table_t *t, size_t count, uint64_t (*hash_of)(uint32_t)) {
    size_t cap = t->slots ? t->mask + 1 : 0;
    if ((count + 1) * 2 <= cap)
        return 0;
    size_t ncap = cap ? cap * 2 : 1024;
    uint32_t *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -1;
    for (size_t i = 0; i < cap; i++) {
        uint32_t id = t->slots[i];
        if (!id)
            continue;
        size_t j = (size_t)hash_of(id) & (ncap - 1);
        while (ns[j])
            j = (j + 1) & (ncap - 1);
        ns[j] = id;
    }
    free(t->slots);
    t->slots = ns;
    t->mask = ncap - 1;
    return 0;
}

static uint64_t frame_hash_of(uint32_t id) { return frame_hash(&frames[id - 1]); }
static uint64_t tb_hash_of(uint32_t id) { return tbs[id - 1]->hash; }
static uint64_t str_hash_of(uint32_t id) { return strs[id - 1]->hash; }

void gm_intern_set_retain(void (*retain)(uintptr_t code)) {
    pthread_mutex_lock(&intern_lock);
    retain_fn = retain;
    pthread_mutex_unlock(&intern_lock);
}

/* --------------------------------------------------------------- frames */

/* Caller holds intern_lock. 0 on failure. */
static uint32_t frame_id_unlocked(const gm_rawframe_t *f) {
    uint64_t h = frame_hash(f);
    if (table_reserve(&frame_tab, n_frames, frame_hash_of))
        return 0;
    size_t j = (size_t)h & frame_tab.mask;
    for (uint32_t id; (id = frame_tab.slots[j]); j = (j + 1) & frame_tab.mask) {
        const gm_rawframe_t *g = &frames[id - 1];
        if (g->code == f->code && g->loc == f->loc && g->kind == f->kind)
            return id;
    }
    if (grow_ids((void **)&frames, n_frames, &cap_frames, sizeof *frames))
        return 0;
    frames[n_frames++] = *f;
    uint32_t id = (uint32_t)n_frames;
    frame_tab.slots[j] = id;
    if (retain_fn && f->kind != GM_LOC_SCRIPT)
        retain_fn(f->code);
    return id;
}

int gm_intern_frame(uint32_t fid, gm_rawframe_t *out) {
    pthread_mutex_lock(&intern_lock);
    int ok = fid >= 1 && fid <= n_frames;
    if (ok)
        *out = frames[fid - 1];
    pthread_mutex_unlock(&intern_lock);
    return ok ? 0 : -1;
}

/* ----------------------------------------------------------- tracebacks */

/* The whole key: the Python frames' running hash (gm_intern_hash_frame,
 * usually folded in by capture as it walks), then the counts and C
 * addresses, then one avalanche. */
static uint64_t tb_hash(uint64_t pyhash, uint32_t npy, const uintptr_t *c, uint32_t nc) {
    uint64_t h = mix(pyhash, ((uint64_t)npy << 32) | nc);
    for (uint32_t i = 0; i < nc; i++)
        h = h * 0x9e3779b97f4a7c15ULL + (uint64_t)c[i];
    return mix(h, 0x2545f4914f6cdd1dULL);
}

/* Reads only the record's immutable fields: safe without intern_lock for
 * a published record (Note [Traceback cache]). */
static int tb_equal(const tb_rec_t *r, uint64_t h, const gm_rawframe_t *py, uint32_t npy,
                    const uintptr_t *c, uint32_t nc) {
    if (r->hash != h || r->npy != npy || r->nc != nc)
        return 0;
    return (npy == 0 || memcmp(r->raw, py, npy * sizeof *py) == 0) &&
           (nc == 0 || memcmp(r->c, c, nc * sizeof *c) == 0);
}

uint32_t gm_intern_traceback(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c,
                             uint32_t nc) {
    uint64_t pyhash = GM_INTERN_HASH_SEED;
    for (uint32_t i = 0; i < npy; i++)
        pyhash = gm_intern_hash_frame(pyhash, &py[i]);
    return gm_intern_traceback_hashed(py, npy, pyhash, c, nc);
}

uint32_t gm_intern_traceback_hashed(const gm_rawframe_t *py, uint32_t npy, uint64_t pyhash,
                                    const uintptr_t *c, uint32_t nc) {
    if (npy == 0 && nc == 0)
        return 0;
    uint64_t h = tb_hash(pyhash, npy, c, nc);
    tls_entry_t *hit = &tls_cache[h & (TLS_CACHE - 1)];
    if (hit->rec && tb_equal(hit->rec, h, py, npy, c, nc))
        return hit->id; /* lock-free: Note [Traceback cache] */
    uint32_t result = 0;
    const tb_rec_t *found = NULL;
    pthread_mutex_lock(&intern_lock);
    if (table_reserve(&tb_tab, n_tbs, tb_hash_of))
        goto out;
    size_t j = (size_t)h & tb_tab.mask;
    for (uint32_t id; (id = tb_tab.slots[j]); j = (j + 1) & tb_tab.mask)
        if (tb_equal(tbs[id - 1], h, py, npy, c, nc)) {
            result = id;
            found = tbs[id - 1];
            goto out;
        }
    /* A new stack: intern its frames, then publish the record. */
    if (grow_ids((void **)&tbs, n_tbs, &cap_tbs, sizeof *tbs))
        goto out;
    /* Layout: record, C addresses, raw frames, frame ids (each aligned). */
    tb_rec_t *r = arena_alloc(sizeof *r + nc * sizeof(uintptr_t) + npy * sizeof(gm_rawframe_t) +
                              npy * sizeof(uint32_t) + 16);
    if (!r)
        goto out;
    r->hash = h;
    r->npy = npy;
    r->nc = nc;
    r->c = (uintptr_t *)(r + 1);
    r->raw = (gm_rawframe_t *)(r->c + nc);
    r->fids = (uint32_t *)(r->raw + npy);
    if (nc)
        memcpy(r->c, c, nc * sizeof *c);
    if (npy)
        memcpy(r->raw, py, npy * sizeof *py);
    for (uint32_t i = 0; i < npy; i++)
        if (!(r->fids[i] = frame_id_unlocked(&py[i])))
            goto out; /* the arena bytes are lost; nothing refers to them */
    /* Frame interning never touches tb_tab, so slot j is still free. */
    tbs[n_tbs++] = r;
    result = (uint32_t)n_tbs;
    tb_tab.slots[j] = result;
    found = r;
out:
    pthread_mutex_unlock(&intern_lock);
    if (found) {
        hit->hash = h;
        hit->rec = found;
        hit->id = result;
    }
    return result;
}

int gm_intern_tb_view(uint32_t id, gm_tb_view_t *out) {
    pthread_mutex_lock(&intern_lock);
    int ok = id >= 1 && id <= n_tbs;
    if (ok) {
        const tb_rec_t *r = tbs[id - 1];
        out->npy = r->npy;
        out->nc = r->nc;
        out->fids = r->fids;
        out->raw = r->raw;
        out->c = r->c;
    }
    pthread_mutex_unlock(&intern_lock);
    return ok ? 0 : -1;
}

/* -------------------------------------------------------------- strings */

static uint64_t bytes_hash(const char *s, size_t len) {
    uint64_t h = mix(0x7a3c1f0e5b2d4968ULL, len);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, s + i, 8);
        h = mix(h, v);
    }
    uint64_t tail = 0;
    memcpy(&tail, s + i, len - i);
    return mix(h, tail);
}

uint32_t gm_intern_string(const char *s, size_t len) {
    if (len == 0)
        return 0;
    uint64_t h = bytes_hash(s, len);
    uint32_t result = 0;
    pthread_mutex_lock(&intern_lock);
    if (table_reserve(&str_tab, n_strs, str_hash_of))
        goto out;
    size_t j = (size_t)h & str_tab.mask;
    for (uint32_t id; (id = str_tab.slots[j]); j = (j + 1) & str_tab.mask) {
        const str_rec_t *r = strs[id - 1];
        if (r->hash == h && r->len == len && memcmp(r->data, s, len) == 0) {
            result = id;
            goto out;
        }
    }
    if (grow_ids((void **)&strs, n_strs, &cap_strs, sizeof *strs))
        goto out;
    str_rec_t *r = arena_alloc(sizeof *r + len + 1);
    if (!r)
        goto out;
    r->hash = h;
    r->len = len;
    memcpy(r->data, s, len);
    r->data[len] = 0;
    strs[n_strs++] = r;
    result = (uint32_t)n_strs;
    str_tab.slots[j] = result;
out:
    pthread_mutex_unlock(&intern_lock);
    return result;
}

int gm_intern_string_view(uint32_t id, const char **s, size_t *len) {
    if (id == 0) {
        *s = "";
        *len = 0;
        return 0;
    }
    pthread_mutex_lock(&intern_lock);
    int ok = id <= n_strs;
    if (ok) {
        *s = strs[id - 1]->data;
        *len = strs[id - 1]->len;
    }
    pthread_mutex_unlock(&intern_lock);
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- sizes */

void gm_intern_counts(uint32_t *ntb, uint32_t *nframes, uint32_t *nstrings) {
    pthread_mutex_lock(&intern_lock);
    if (ntb)
        *ntb = (uint32_t)n_tbs;
    if (nframes)
        *nframes = (uint32_t)n_frames;
    if (nstrings)
        *nstrings = (uint32_t)n_strs;
    pthread_mutex_unlock(&intern_lock);
}

size_t gm_intern_bytes(void) {
    pthread_mutex_lock(&intern_lock);
    size_t b = arena_bytes + cap_frames * sizeof *frames + cap_tbs * sizeof *tbs +
               cap_strs * sizeof *strs;
    table_t *ts[3] = {&frame_tab, &tb_tab, &str_tab};
    for (int i = 0; i < 3; i++)
        if (ts[i]->slots)
            b += (ts[i]->mask + 1) * sizeof(uint32_t);
    pthread_mutex_unlock(&intern_lock);
    return b;
}
