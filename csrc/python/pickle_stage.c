/*
 * pickle_stage.c - trace entries read straight into records, without the
 * dict that SETITEMS would fill for each.
 *
 * Note [Staged trace entries]
 * Rationale: reading a 5,000,000-event snapshot, filling each entry's dict
 *   and walking it again to take it as a record (Note [Compact trace
 *   entries]) was about a quarter of the reader's time (issue 34).
 * Approach: a SETITEMS ('u') whose dict is empty, that only the stack and at
 *   most one memo slot refer to, whose keys are all str with an 'action' str
 *   among them, and whose dict sits in a list being appended to (the value
 *   just below the enclosing mark is a list), moves its pairs off the stack
 *   into a stage slot; the dict stays empty. APPEND(S) takes a staged dict
 *   as a record from the pairs (gm_tcols_take_pairs); in every other case
 *   the dict is given its pairs first, in their order, as SETITEMS would
 *   have done ("unstaged").
 * Invariants: a staged dict is empty and is referred to only from the stack
 *   and the memo; every path that takes a value off the stack into anything
 *   else (a container, the result, an error) or drops a stack reference
 *   (POP, POP_MARK, the end of APPEND(S)/SETITEM(S)) unstages it first, so
 *   nothing ever sees a staged dict empty; a memo GET only pushes it again.
 *   Stage slots are reused through a free list: at most one per staged dict,
 *   so their number is bounded by the stack's.
 * Limitations: keys must be exact str (so giving the pairs late can fail
 *   only for lack of memory, never where SETITEMS would not have), at most
 *   GM_PK_STAGE_KEYS pairs.
 * Must not: read a staged dict's pointer once the read is over (it may be gone).
 */
#include "pickle_stage.h"

#include <string.h>

struct gm_pk_stage_slot {
    PyObject *kv[2 * GM_PK_STAGE_KEYS]; /* owned; key, value, key, value... */
    int n;                              /* pairs; -1 on the free list */
    Py_ssize_t next_free;
};

static int is_action(PyObject *key) {
    return PyUnicode_GET_LENGTH(key) == 6 && PyUnicode_CompareWithASCIIString(key, "action") == 0;
}

int gm_pk_stage(gm_pk_t *r, Py_ssize_t mark) {
    Py_ssize_t m2 = gm_pk_fence(r), n2 = r->sp - mark, slots[1];
    if (!r->compact || mark < 1 || n2 < 2 || n2 % 2 || n2 > 2 * GM_PK_STAGE_KEYS)
        return 0;
    PyObject *d = r->stack[mark - 1];
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) || m2 < 1 || m2 > mark - 1 ||
        !PyList_CheckExact(r->stack[m2 - 1]))
        return 0;
    int action = 0;
    for (Py_ssize_t i = mark; i < r->sp; i += 2) {
        if (!PyUnicode_CheckExact(r->stack[i]))
            return 0;
        if (!action && is_action(r->stack[i]))
            action = PyUnicode_CheckExact(r->stack[i + 1]) ? 1 : -1;
    }
    uintptr_t had;
    if (action != 1 || gm_pk_own_slots(r, d, slots) < 0 ||
        gm_ptrmap_get(&r->staged_of, (uintptr_t)d, &had))
        return 0;
    Py_ssize_t s = r->stg_free;
    if (s >= 0) {
        r->stg_free = r->stg[s].next_free;
    } else {
        if (r->stg_top == r->stg_cap) {
            Py_ssize_t cap = r->stg_cap ? r->stg_cap * 2 : 64;
            struct gm_pk_stage_slot *p = PyMem_Realloc(r->stg, (size_t)cap * sizeof *p);
            if (!p)
                return 0; /* SETITEMS as usual */
            r->stg = p;
            r->stg_cap = cap;
        }
        s = r->stg_top++;
    }
    if (gm_ptrmap_put(&r->staged_of, (uintptr_t)d, (uintptr_t)s + 1) != 0) {
        r->stg[s].n = -1;
        r->stg[s].next_free = r->stg_free;
        r->stg_free = s;
        return 0;
    }
    memcpy(r->stg[s].kv, r->stack + mark, (size_t)n2 * sizeof(PyObject *)); /* refs move */
    r->stg[s].n = (int)(n2 / 2);
    r->sp = mark;
    r->nstaged++;
    return 1;
}

static struct gm_pk_stage_slot *slot_of(gm_pk_t *r, PyObject *d) {
    uintptr_t s;
    if (!r->nstaged || !gm_ptrmap_get(&r->staged_of, (uintptr_t)d, &s))
        return NULL;
    return &r->stg[s - 1];
}

PyObject *const *gm_pk_staged(gm_pk_t *r, PyObject *d, int *n) {
    struct gm_pk_stage_slot *s = slot_of(r, d);
    if (!s)
        return NULL;
    *n = s->n;
    return s->kv;
}

static void release(gm_pk_t *r, PyObject *d, struct gm_pk_stage_slot *s) {
    uintptr_t gone;
    gm_ptrmap_del(&r->staged_of, (uintptr_t)d, &gone);
    for (int i = 0; i < 2 * s->n; i++)
        Py_DECREF(s->kv[i]);
    s->n = -1;
    s->next_free = r->stg_free;
    r->stg_free = s - r->stg;
    r->nstaged--;
}

void gm_pk_stage_drop(gm_pk_t *r, PyObject *d) {
    struct gm_pk_stage_slot *s = slot_of(r, d);
    if (s)
        release(r, d, s);
}

int gm_pk_unstage_slow(gm_pk_t *r, PyObject *d) {
    struct gm_pk_stage_slot *s = slot_of(r, d);
    if (!s)
        return 0;
    for (int i = 0; i < 2 * s->n; i += 2)
        if (PyDict_SetItem(d, s->kv[i], s->kv[i + 1]) < 0) {
            PyDict_Clear(d);
            release(r, d, s);
            return -1;
        }
    release(r, d, s);
    return 0;
}

int gm_pk_unstage_range(gm_pk_t *r, Py_ssize_t from, Py_ssize_t to) {
    for (Py_ssize_t i = from; r->nstaged && i < to; i++)
        if (gm_pk_unstage(r, r->stack[i]) < 0)
            return -1;
    return 0;
}

void gm_pk_stage_free(gm_pk_t *r) {
    for (Py_ssize_t s = 0; s < r->stg_top; s++)
        for (int i = 0; i < 2 * r->stg[s].n; i++)
            Py_DECREF(r->stg[s].kv[i]);
    PyMem_Free(r->stg);
    r->stg = NULL;
    r->stg_top = r->stg_cap = 0;
    r->stg_free = -1;
    r->nstaged = 0;
    gm_ptrmap_free(&r->staged_of);
}
