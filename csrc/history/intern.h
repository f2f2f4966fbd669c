/*
 * intern.h - hash-consed frames, tracebacks and metadata strings.
 *
 * A traceback is interned as a whole: an identical stack costs one hash
 * lookup and always yields the same uint32 id. Ids start at 1; 0 means
 * "none". Records are append-only and never freed (process lifetime,
 * bounded by the number of unique stacks), so an id stays valid forever
 * and a record pointer handed out stays valid too.
 *
 * Pure C: a Python frame is (code object address, location) and the table
 * treats the address as an opaque integer. The retain callback (set once by
 * the CPython layer) is called for every code address that enters the
 * table, under the intern lock and with the GIL held by the caller, so the
 * table owns a strong reference and an address can never be reused.
 *
 * All state is protected by the intern lock, a leaf lock: no other lock is
 * taken while it is held, and it is never held while taking another one.
 */
#ifndef GM_HISTORY_INTERN_H
#define GM_HISTORY_INTERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kind of gm_rawframe_t.loc: a Python frame located by instruction offset
 * (3.11+) or by line (3.10), or a TorchScript frame, whose `code` is the id
 * of an interned "name\0filename" string and whose loc is its line. */
enum { GM_LOC_LASTI = 0, GM_LOC_LINE = 1, GM_LOC_SCRIPT = 2 };

typedef struct gm_rawframe {
    uintptr_t code; /* PyCodeObject* (opaque here), or a string id for GM_LOC_SCRIPT */
    int32_t loc;    /* instruction byte offset, or line number */
    int32_t kind;   /* GM_LOC_* */
} gm_rawframe_t;

typedef struct gm_tb_view {
    uint32_t npy, nc;
    const uint32_t *fids; /* npy frame ids, innermost first */
    /* the same npy frames as captured; every one is already in the frame
     * table, so interning them again never retains a code object (safe
     * without the GIL) */
    const gm_rawframe_t *raw;
    const uintptr_t *c;   /* nc C return addresses, innermost first */
} gm_tb_view_t;

/* Called for every code address that enters the table (see above); never
 * for a TorchScript frame, whose `code` is a string id. */
void gm_intern_set_retain(void (*retain)(uintptr_t code));

/* Intern a traceback: Python frames py[0..npy) and C addresses c[0..nc),
 * both innermost first. Returns its id, or 0 when both are empty or host
 * memory ran out. */
uint32_t gm_intern_traceback(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c,
                             uint32_t nc);

/* The same, with the Python frames' hash already computed by folding
 * gm_intern_hash_frame over py[0..npy) from GM_INTERN_HASH_SEED. Capture
 * does this while it walks the stack, where the multiply hides behind the
 * walk's pointer chasing. */
#define GM_INTERN_HASH_SEED 0x51ed270b9c4f3a11ULL
static inline uint64_t gm_intern_hash_frame(uint64_t h, const gm_rawframe_t *f) {
    return h * 0x9e3779b97f4a7c15ULL +
           ((uint64_t)f->code ^ ((uint64_t)(uint32_t)f->loc << 40) ^ ((uint64_t)(f->kind & 1) << 63));
}
uint32_t gm_intern_traceback_hashed(const gm_rawframe_t *py, uint32_t npy, uint64_t pyhash,
                                    const uintptr_t *c, uint32_t nc);
/* 0 and a view of the record, or -1 for an unknown id. */
int gm_intern_tb_view(uint32_t id, gm_tb_view_t *out);
/* 0 and the frame, or -1 for an unknown id. */
int gm_intern_frame(uint32_t fid, gm_rawframe_t *out);

/* Intern a string (UTF-8, any bytes); "" is id 0. Returns 0 on failure too. */
uint32_t gm_intern_string(const char *s, size_t len);
/* 0 and the string (NUL terminated, valid forever), or -1 for an unknown id. */
int gm_intern_string_view(uint32_t id, const char **s, size_t *len);

/* Number of ids handed out so far (the largest valid id). */
void gm_intern_counts(uint32_t *ntb, uint32_t *nframes, uint32_t *nstrings);
/* Host bytes held by the tables and their records. */
size_t gm_intern_bytes(void);

#ifdef __cplusplus
}
#endif
#endif /* GM_HISTORY_INTERN_H */
