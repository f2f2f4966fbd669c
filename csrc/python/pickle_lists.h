/*
 * pickle_lists.h - APPEND(S) and SETITEM(S) of the snapshot pickle reader,
 * with trace entries taken as records, and the end of a read (pickle_lists.c).
 */
#ifndef GM_PYTHON_PICKLE_LISTS_H
#define GM_PYTHON_PICKLE_LISTS_H

#include "pickle_vm.h"

/* The values above mark appended to the list just below it: 0 or -1. */
int gm_pk_appends(gm_pk_t *r, Py_ssize_t mark);
/* The pairs above mark set in the dict just below it, or staged for it when
 * stage (SETITEMS, not SETITEM) and it is a trace entry (pickle_stage.h): 0 or -1. */
int gm_pk_setitems(gm_pk_t *r, Py_ssize_t mark, int stage);
/* After STOP, the memo emptied: each device trace whose entries became
 * records replaced by its TraceColumns (where nothing else names the
 * list), every other list given its dicts back. 0 or -1. */
int gm_pk_finish(gm_pk_t *r, PyObject *top);
/* Once, at module init: 0 or -1. */
int gm_pk_lists_init(void);

#endif /* GM_PYTHON_PICKLE_LISTS_H */
