/*
 * pickle_vm.h - the state of one snapshot pickle read (pickle_reader.c):
 * the value stack, the marks, the memo, the compacted traces, the staged
 * entries (pickle_stage.c), and the errors it raises (pickle_vm.c). Error kinds: see pickle_reader.c.
 */
#ifndef GM_PYTHON_PICKLE_VM_H
#define GM_PYTHON_PICKLE_VM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../base/ptrmap.h"

#define MEMO_SLACK 1024
#define MAX_STACK (1 << 22)
#define MAX_MARKS (1 << 16)
#define GM_PK_STAGE_KEYS 8 /* pairs a staged trace entry holds (pickle_stage.c) */

struct gm_pk_stage_slot;

typedef struct gm_pk {
    const unsigned char *start, *p, *end;
    PyObject **stack;
    Py_ssize_t sp, scap;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, mcap;
    PyObject **memo; /* owned, NULL, or a tagged record (odd) */
    Py_ssize_t mcap_memo, mtop, mcount, stores;
    int proto, compact;
    PyObject *builders;    /* list of TraceColumns */
    gm_ptrmap_t builder_of; /* PyList* -> builder index + 1 */
    gm_ptrmap_t memo_dict;  /* a dict in the memo -> its (last) memo index + 1 */
    struct gm_pk_stage_slot *stg; /* Note [Staged trace entries] */
    Py_ssize_t stg_cap, stg_top, stg_free, nstaged;
    gm_ptrmap_t staged_of;        /* a staged dict -> its stage slot + 1 */
    const unsigned char *op_at;
} gm_pk_t;

/* ValueError((kind, detail, offset of the opcode)); steals detail; NULL. */
PyObject *gm_pk_fail(gm_pk_t *r, const char *kind, PyObject *detail);
PyObject *gm_pk_corrupt(gm_pk_t *r, const char *text);
/* The pending exception as kind "error" ("Type: text"); a MemoryError is kept. */
PyObject *gm_pk_error(gm_pk_t *r);
/* 0 if n more bytes are there, else -1 with "truncated". */
int gm_pk_need(gm_pk_t *r, Py_ssize_t n);
/* Push v (stolen; NULL is an error passed on): 0 or -1. */
int gm_pk_push(gm_pk_t *r, PyObject *v);
/* Pop the top value above the last mark: a new reference, or NULL. */
PyObject *gm_pk_pop(gm_pk_t *r);
/* Pop the last mark: the stack height it marked, or -1. */
Py_ssize_t gm_pk_pop_mark(gm_pk_t *r);
/* Store the top value at index (refused past the stores made + MEMO_SLACK). */
int gm_pk_memo_put(gm_pk_t *r, uint64_t index);
/* The memo slot that alone with the stack refers to item (k = 0 or 1 of
 * them, in slots), or -1 if anything else refers to it. */
int gm_pk_own_slots(gm_pk_t *r, PyObject *item, Py_ssize_t slots[1]);
/* Push memo[index]; a compacted entry becomes its dict (once). */
int gm_pk_memo_get(gm_pk_t *r, uint64_t index);

static inline Py_ssize_t gm_pk_fence(gm_pk_t *r) { return r->nmarks ? r->marks[r->nmarks - 1] : 0; }

/* n bytes little-endian. */
static inline uint64_t gm_pk_le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* n (1 to 8) bytes little-endian, two's complement: LONG1's value. */
static inline int64_t gm_pk_le_signed(const unsigned char *p, int n) {
    uint64_t x = gm_pk_le(p, n);
    if (n < 8 && (x >> (8 * n - 1)) & 1)
        x |= ~0ull << (8 * n); /* sign-extended */
    return (int64_t)x;
}

#endif /* GM_PYTHON_PICKLE_VM_H */
