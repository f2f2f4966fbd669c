/*
 * pickle_stage.c - trace entries read straight into records, without the
 * dict that SETITEMS would fill for each.
 *
 * Note [Staged trace entries]
 * Rationale: reading a 5,000,000-event snapshot, filling each entry's dict
 *   and walking it again to take it as a record (Note [Compact trace
 *   entries]) was about a quarter of the reader's time (issue 34); after
 *   that, making and freeing an int object for each address, size and time
 *   was 9% of its perf samples on a 1,000,000-event file, the opcode loop
 *   that pushes each pair 13%.
 * Approach: a SETITEMS ('u') whose dict is empty, that only the stack and at
 *   most one memo slot refer to, whose keys are all str with an 'action' str
 *   among them, and whose dict sits in a list being appended to (the value
 *   just below the enclosing mark is a list), moves its pairs off the stack
 *   into a stage slot; the dict stays empty. APPEND(S) takes a staged dict
 *   as a record from the pairs (gm_tcols_take_pairs); in every other case
 *   the dict is given its pairs first, in their order, as SETITEMS would
 *   have done ("unstaged").
 *   Direct: at the MARK that opens such a dict's pairs, when every opcode up
 *   to its SETITEMS is a memo GET (of a str key, or of a value other than an
 *   empty dict), an int of up to 64 bits (K, M, J, LONG1 of up to 8 bytes)
 *   or None, the pairs are read from the data into a stage slot without
 *   going through the stack, the ints kept as int64 (a NULL value in kv):
 *   no int object is made for them, and gm_tcols_take_pairs reads them as
 *   they are. Unstaging makes them, equal to what the opcodes make. Anything
 *   else (a str made in place, MEMOIZE, FRAME, a record's tag in the memo,
 *   a missing memo slot, truncated data, a full stack or mark list) leaves
 *   the read to the opcode loop from the MARK, unchanged, so refusals and
 *   their offsets are those of the loop. The first entry of a trace, whose
 *   keys are new str, goes the loop's way; the others, in every snapshot
 *   whose writer memoizes its keys (pickle's does), go directly.
 * Invariants: a staged dict is empty and is referred to only from the stack
 *   and the memo; every path that takes a value off the stack into anything
 *   else (a container, the result, an error) or drops a stack reference
 *   (POP, POP_MARK, the end of APPEND(S)/SETITEM(S)) unstages it first, so
 *   nothing ever sees a staged dict empty; a memo GET only pushes it again.
 *   Stage slots are reused through a free list: at most one per staged dict,
 *   so their number is bounded by the stack's.
 * Limitations: keys must be exact str (so giving the pairs late can fail
 *   only for lack of memory, never where SETITEMS would not have), at most
 *   GM_PK_STAGE_KEYS pairs. A trace whose entries hold a list made in place
 *   (torch's frames, a new list an entry) is staged through the stack.
 * Must not: read a staged dict's pointer once the read is over (it may be gone).
 */
#include "pickle_stage.h"

#include <string.h>

#include "pycompat.h"

struct gm_pk_stage_slot {
    PyObject *kv[2 * GM_PK_STAGE_KEYS]; /* owned; key, value, key, value...; NULL: see imm */
    int64_t imm[GM_PK_STAGE_KEYS];      /* pair i's int when kv[2i + 1] is NULL */
    int n;                              /* pairs; -1 on the free list */
    Py_ssize_t next_free;
};

static int is_action(PyObject *key) {
    return PyUnicode_GET_LENGTH(key) == 6 && PyUnicode_CompareWithASCIIString(key, "action") == 0;
}

/* Whether the dict d = stack[at] may be staged (the mark of its pairs just
 * above it): an empty dict that only the stack and at most one memo slot
 * name, not staged already, inside a list's APPENDS mark. */
static int stageable(gm_pk_t *r, Py_ssize_t at) {
    Py_ssize_t m2 = gm_pk_fence(r), slots[1];
    PyObject *d = r->stack[at];
    uintptr_t had;
    return PyDict_CheckExact(d) && !PyDict_GET_SIZE(d) && m2 >= 1 && m2 <= at &&
           PyList_CheckExact(r->stack[m2 - 1]) && gm_pk_own_slots(r, d, slots) >= 0 &&
           !gm_ptrmap_get(&r->staged_of, (uintptr_t)d, &had);
}

/* A free stage slot, registered as d's, or -1 (nothing changed). */
static Py_ssize_t new_slot(gm_pk_t *r, PyObject *d) {
    Py_ssize_t s = r->stg_free;
    if (s >= 0) {
        r->stg_free = r->stg[s].next_free;
    } else {
        if (r->stg_top == r->stg_cap) {
            Py_ssize_t cap = r->stg_cap ? r->stg_cap * 2 : 64;
            struct gm_pk_stage_slot *p = PyMem_Realloc(r->stg, (size_t)cap * sizeof *p);
            if (!p)
                return -1; /* SETITEMS as usual */
            r->stg = p;
            r->stg_cap = cap;
        }
        s = r->stg_top++;
    }
    if (gm_ptrmap_put(&r->staged_of, (uintptr_t)d, (uintptr_t)s + 1) != 0) {
        r->stg[s].n = -1;
        r->stg[s].next_free = r->stg_free;
        r->stg_free = s;
        return -1;
    }
    r->nstaged++;
    return s;
}

int gm_pk_stage(gm_pk_t *r, Py_ssize_t mark) {
    Py_ssize_t n2 = r->sp - mark;
    if (!r->compact || mark < 1 || n2 < 2 || n2 % 2 || n2 > 2 * GM_PK_STAGE_KEYS)
        return 0;
    int action = 0;
    for (Py_ssize_t i = mark; i < r->sp; i += 2) {
        if (!PyUnicode_CheckExact(r->stack[i]))
            return 0;
        if (!action && is_action(r->stack[i]))
            action = PyUnicode_CheckExact(r->stack[i + 1]) ? 1 : -1;
    }
    Py_ssize_t s;
    if (action != 1 || !stageable(r, mark - 1) || (s = new_slot(r, r->stack[mark - 1])) < 0)
        return 0;
    memcpy(r->stg[s].kv, r->stack + mark, (size_t)n2 * sizeof(PyObject *)); /* refs move */
    r->stg[s].n = (int)(n2 / 2);
    r->sp = mark;
    return 1;
}

/* Memo[i] when it is an object a GET pushes as it is (not a record's tag). */
static PyObject *memo_obj(gm_pk_t *r, uint64_t i) {
    PyObject *v = (Py_ssize_t)i < r->mcap_memo ? r->memo[i] : NULL;
    return v && !((uintptr_t)v & 1) ? v : NULL;
}

int gm_pk_stage_direct(gm_pk_t *r) {
    PyObject *d = r->sp >= 1 ? r->stack[r->sp - 1] : NULL;
    if (!r->compact || !d || !PyDict_CheckExact(d) || PyDict_GET_SIZE(d) ||
        r->nmarks >= MAX_MARKS)
        return 0; /* the rest of stageable() once the pairs are read */
    PyObject *kv[2 * GM_PK_STAGE_KEYS];
    int64_t imm[GM_PK_STAGE_KEYS];
    const unsigned char *p = r->p, *end = r->end;
    int n = 0, action = 0;
    for (;; n++) {
        if (p >= end)
            return 0;
        if (*p == 'u' && !(n % 2))
            break;
        if (n == 2 * GM_PK_STAGE_KEYS)
            return 0;
        unsigned char op = *p++;
        int w = op == 'K' || op == 'h' ? 1 : op == 'M' ? 2 : op == 'J' || op == 'j' ? 4
                : op == 0x8a ? 1 : 0;
        if (end - p < w)
            return 0;
        uint64_t x = gm_pk_le(p, w);
        p += w;
        PyObject *v = NULL;
        if (op == 'h' || op == 'j') {
            if (!(v = memo_obj(r, x)) || (PyDict_CheckExact(v) && !PyDict_GET_SIZE(v)))
                return 0; /* a staged dict as a value: SETITEMS' way */
        } else if (n % 2 == 0) {
            return 0; /* keys: str from the memo only */
        } else if (op == 'N') {
            v = Py_None;
        } else if (op == 'K' || op == 'M') {
            imm[n / 2] = (int64_t)x;
        } else if (op == 'J') {
            imm[n / 2] = (int32_t)(uint32_t)x;
        } else if (op == 0x8a) { /* LONG1 of up to 8 bytes, as long_bytes reads it */
            if (x > 8 || (uint64_t)(end - p) < x)
                return 0;
            imm[n / 2] = x ? gm_pk_le_signed(p, (int)x) : 0;
            p += x;
        } else {
            return 0;
        }
        if (n % 2 == 0 && !PyUnicode_CheckExact(v))
            return 0;
        if (n % 2 == 1 && !action && is_action(kv[n - 1]))
            action = v && PyUnicode_CheckExact(v) ? 1 : -1;
        kv[n] = v;
    }
    Py_ssize_t s;
    if (n < 2 || action != 1 || r->sp + n > MAX_STACK || !stageable(r, r->sp - 1) ||
        (s = new_slot(r, d)) < 0)
        return 0;
    for (int i = 0; i < n; i++) {
        Py_XINCREF(kv[i]);
        r->stg[s].kv[i] = kv[i];
    }
    memcpy(r->stg[s].imm, imm, (size_t)(n / 2) * sizeof *imm);
    r->stg[s].n = n / 2;
    r->p = p + 1; /* past the SETITEMS */
    return 1;
}

static struct gm_pk_stage_slot *slot_of(gm_pk_t *r, PyObject *d) {
    uintptr_t s;
    if (!r->nstaged || !gm_ptrmap_get(&r->staged_of, (uintptr_t)d, &s))
        return NULL;
    return &r->stg[s - 1];
}

PyObject *const *gm_pk_staged(gm_pk_t *r, PyObject *d, int *n, const int64_t **imm) {
    struct gm_pk_stage_slot *s = slot_of(r, d);
    if (!s)
        return NULL;
    *n = s->n;
    *imm = s->imm;
    return s->kv;
}

static void release(gm_pk_t *r, PyObject *d, struct gm_pk_stage_slot *s) {
    uintptr_t gone;
    gm_ptrmap_del(&r->staged_of, (uintptr_t)d, &gone);
    for (int i = 0; i < 2 * s->n; i++)
        Py_XDECREF(s->kv[i]);
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
    for (int i = 0; i < 2 * s->n; i += 2) {
        PyObject *v = s->kv[i + 1] ? Py_NewRef(s->kv[i + 1]) : PyLong_FromLongLong(s->imm[i / 2]);
        int rc = v ? PyDict_SetItem(d, s->kv[i], v) : -1;
        Py_XDECREF(v);
        if (rc < 0) {
            PyDict_Clear(d);
            release(r, d, s);
            return -1;
        }
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
            Py_XDECREF(r->stg[s].kv[i]);
    PyMem_Free(r->stg);
    r->stg = NULL;
    r->stg_top = r->stg_cap = 0;
    r->stg_free = -1;
    r->nstaged = 0;
    gm_ptrmap_free(&r->staged_of);
}
