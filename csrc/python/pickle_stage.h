/*
 * pickle_stage.h - trace entries read straight into records: a SETITEMS that
 * fills a fresh dict inside a list being appended to keeps its key/value
 * pairs aside instead, and the dict stays empty until the entry is taken as
 * a record or has to be a dict after all (pickle_stage.c, Note [Staged trace
 * entries]).
 */
#ifndef GM_PYTHON_PICKLE_STAGE_H
#define GM_PYTHON_PICKLE_STAGE_H

#include "pickle_vm.h"

/* Try to stage the pairs above mark (popped by SETITEMS) for the dict just
 * below it: 1 staged (the pairs left the stack), 0 not (nothing changed). */
int gm_pk_stage(gm_pk_t *r, Py_ssize_t mark);
/* At a MARK, before it is pushed: when the stack's top is a dict that
 * gm_pk_stage would stage and the opcodes up to the next SETITEMS are only
 * memo GETs of str keys and of values, ints of up to 64 bits and None, stage
 * them straight from the data (ints kept as int64, no object made) and
 * return 1 with the read past that SETITEMS; else 0, nothing changed. */
int gm_pk_stage_direct(gm_pk_t *r);
/* The staged pairs of d, or NULL when d is not staged (*n set; a NULL value
 * is the int (*imm)[pair]). */
PyObject *const *gm_pk_staged(gm_pk_t *r, PyObject *d, int *n, const int64_t **imm);
/* Forget d's pairs (d became a record; it stays empty): no error. */
void gm_pk_stage_drop(gm_pk_t *r, PyObject *d);
/* Give d its staged pairs (SETITEMS' effect, done late); 0 if d is not
 * staged. 0 or -1 (MemoryError). */
int gm_pk_unstage_slow(gm_pk_t *r, PyObject *d);
static inline int gm_pk_unstage(gm_pk_t *r, PyObject *d) {
    return r->nstaged && PyDict_CheckExact(d) && !PyDict_GET_SIZE(d) ? gm_pk_unstage_slow(r, d)
                                                                       : 0;
}
/* gm_pk_unstage on stack[from..to). */
int gm_pk_unstage_range(gm_pk_t *r, Py_ssize_t from, Py_ssize_t to);
/* Release every stage (end of a read); touches no staged dict. */
void gm_pk_stage_free(gm_pk_t *r);

#endif /* GM_PYTHON_PICKLE_STAGE_H */
