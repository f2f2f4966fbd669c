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
/* The staged pairs of d, or NULL when d is not staged (*n set). */
PyObject *const *gm_pk_staged(gm_pk_t *r, PyObject *d, int *n);
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
