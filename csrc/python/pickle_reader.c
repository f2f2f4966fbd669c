/*
 * pickle_reader.c - _C.read_snapshot_pickle(data, compact=True): the object
 * of a snapshot pickle, built from plain data only, with each device trace
 * as a _C.TraceColumns (Note [Compact trace entries]) when compact.
 *
 * Reads the binary opcodes of protocols 2 to 5 that plain data uses: None,
 * bools, ints, floats, str, bytes, lists, tuples, dicts, the memo. Every
 * opcode that names or calls code (GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE,
 * BUILD, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID) is refused where it
 * stands, before anything is called. Errors are a ValueError whose args are
 * (kind, detail, offset) for gpumem/snapshots/unpickle.py to word:
 *   "global" (detail: module.name), "persid" (detail: the id object),
 *   "truncated", "memo" (detail: (index, stores)), "corrupt" (detail: text),
 *   "error" (detail: "ExceptionType: text" of a call that failed on the data),
 *   "unsupported" (legal but rare opcodes: text opcodes, sets, protocol 2's
 *   globals; the caller reads such a file with the reference loader).
 * Bounds: a memo store more than MEMO_SLACK beyond the stores made is
 * refused (pickle_scan.py's rule); at most MAX_STACK values on the stack
 * and MAX_MARKS marks; every length is checked against the data left. A
 * compacted entry that the memo still names is made a dict again once, on
 * its first GET, and that dict is kept (no expansion by repeated GETs).
 * Trace entries are read straight into records (Note [Staged trace entries]
 * in pickle_stage.c): every value taken off the stack is unstaged first.
 * Must not: import or call anything the data names; hold the GIL's absence
 * (it builds Python objects throughout).
 */
#include "pickle_reader.h"

#include <string.h>

#include "pickle_lists.h"
#include "pickle_stage.h"
#include "pickle_vm.h"
#include "trace_columns.h"

static PyObject *take_tuple(gm_pk_t *r, Py_ssize_t from) {
    if (gm_pk_unstage_range(r, from, r->sp) < 0)
        return NULL;
    PyObject *t = PyTuple_New(r->sp - from);
    if (!t)
        return NULL;
    for (Py_ssize_t i = from; i < r->sp; i++)
        PyTuple_SET_ITEM(t, i - from, r->stack[i]);
    r->sp = from;
    return t;
}

/* The top value, given its pairs if it is a staged entry: a new reference. */
static PyObject *pop(gm_pk_t *r) {
    PyObject *v = gm_pk_pop(r);
    if (v && gm_pk_unstage(r, v) < 0)
        Py_CLEAR(v);
    return v;
}

/* ---------------------------------------------------------------- refusals */

static PyObject *line(gm_pk_t *r) {
    const unsigned char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
    if (!nl) {
        gm_pk_fail(r, "truncated", NULL);
        return NULL;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p, nl - r->p, "replace");
    r->p = nl + 1;
    return s;
}

static int refuse_global(gm_pk_t *r, PyObject *module, PyObject *name) {
    PyObject *q = (module && name) ? PyUnicode_FromFormat("%S.%S", module, name) : NULL;
    Py_XDECREF(module);
    Py_XDECREF(name);
    if (q)
        gm_pk_fail(r, "global", q);
    return -1;
}

/* ---------------------------------------------------------------- the loop */

static PyObject *length_prefixed(gm_pk_t *r, int width, int kind) {
    if (gm_pk_need(r, width) < 0)
        return NULL;
    uint64_t n = gm_pk_le(r->p, width);
    r->p += width;
    if (n > (uint64_t)(r->end - r->p)) {
        gm_pk_fail(r, "truncated", NULL);
        return NULL;
    }
    const char *s = (const char *)r->p;
    r->p += n;
    PyObject *v = kind == 's'   ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "surrogatepass")
                  : kind == 'b' ? PyBytes_FromStringAndSize(s, (Py_ssize_t)n)
                                : PyByteArray_FromStringAndSize(s, (Py_ssize_t)n);
    if (!v)
        gm_pk_error(r);
    return v;
}

static PyObject *long_bytes(gm_pk_t *r, int width) {
    if (gm_pk_need(r, width) < 0)
        return NULL;
    uint64_t n = gm_pk_le(r->p, width);
    if (width == 4 && n >= (1ull << 31))
        return gm_pk_corrupt(r, "LONG pickle has negative byte count");
    r->p += width;
    if (n > (uint64_t)(r->end - r->p))
        return gm_pk_fail(r, "truncated", NULL);
    PyObject *v;
    if (n && n <= 8) { /* two's complement, little-endian, that fits in 64 bits */
        v = PyLong_FromLongLong((long long)gm_pk_le_signed(r->p, (int)n));
    } else {
        v = n ? _PyLong_FromByteArray(r->p, (size_t)n, 1, 1) : PyLong_FromLong(0);
    }
    r->p += n;
    return v;
}

static PyObject *run(gm_pk_t *r) {
    for (;;) {
        r->op_at = r->p;
        if (r->p >= r->end)
            return gm_pk_fail(r, "truncated", NULL);
        unsigned char op = *r->p++;
        Py_ssize_t mark;
        PyObject *v;
        switch (op) {
        case 0x80: /* PROTO */
            if (gm_pk_need(r, 1) < 0)
                return NULL;
            r->proto = *r->p++;
            if (r->proto > 5)
                return gm_pk_fail(r, "unsupported", NULL);
            break;
        case 0x95: /* FRAME */
            if (gm_pk_need(r, 8) < 0)
                return NULL;
            if (gm_pk_le(r->p, 8) > (uint64_t)(r->end - r->p - 8))
                return gm_pk_fail(r, "truncated", NULL);
            r->p += 8;
            break;
        case '.': /* STOP */
            return pop(r);
        case '(':
            if (r->compact && gm_pk_stage_direct(r))
                break; /* a trace entry's pairs, staged up to its SETITEMS */
            if (r->nmarks == r->mcap) {
                if (r->mcap >= MAX_MARKS)
                    return gm_pk_corrupt(r, "nesting deeper than any snapshot's");
                Py_ssize_t cap = r->mcap ? r->mcap * 2 : 64;
                Py_ssize_t *m = PyMem_Realloc(r->marks, (size_t)cap * sizeof *m);
                if (!m)
                    return PyErr_NoMemory();
                r->marks = m;
                r->mcap = cap;
            }
            r->marks[r->nmarks++] = r->sp;
            break;
        case '0': /* POP: the top value, or an empty mark */
            if (r->nmarks && r->marks[r->nmarks - 1] == r->sp) {
                r->nmarks--;
            } else {
                if (!(v = pop(r)))
                    return NULL;
                Py_DECREF(v);
            }
            break;
        case '1': /* POP_MARK */
            if ((mark = gm_pk_pop_mark(r)) < 0 || gm_pk_unstage_range(r, mark, r->sp) < 0)
                return NULL;
            while (r->sp > mark)
                Py_DECREF(r->stack[--r->sp]);
            break;
        case '2': /* DUP */
            if (r->sp <= 0)
                return gm_pk_corrupt(r, "unpickling stack underflow");
            Py_INCREF(r->stack[r->sp - 1]);
            if (gm_pk_push(r, r->stack[r->sp - 1]) < 0)
                return NULL;
            break;
        case 'N':
            Py_INCREF(Py_None);
            if (gm_pk_push(r, Py_None) < 0)
                return NULL;
            break;
        case 0x88:
        case 0x89:
            if (gm_pk_push(r, PyBool_FromLong(op == 0x88)) < 0)
                return NULL;
            break;
        case 'K':
        case 'M':
        case 'J': {
            int w = op == 'K' ? 1 : op == 'M' ? 2 : 4;
            if (gm_pk_need(r, w) < 0)
                return NULL;
            uint64_t x = gm_pk_le(r->p, w);
            r->p += w;
            long val = w == 4 ? (long)(int32_t)(uint32_t)x : (long)x;
            if (gm_pk_push(r, PyLong_FromLong(val)) < 0)
                return NULL;
            break;
        }
        case 0x8a:
        case 0x8b:
            if (gm_pk_push(r, long_bytes(r, op == 0x8a ? 1 : 4)) < 0)
                return NULL;
            break;
        case 'G':
            if (gm_pk_need(r, 8) < 0)
                return NULL;
            {
                double d = PyFloat_Unpack8((const char *)r->p, 0);
                r->p += 8;
                if (d == -1.0 && PyErr_Occurred())
                    return gm_pk_error(r);
                if (gm_pk_push(r, PyFloat_FromDouble(d)) < 0)
                    return NULL;
            }
            break;
        case 0x8c:
        case 'X':
        case 0x8d:
            if (gm_pk_push(r, length_prefixed(r, op == 0x8c ? 1 : op == 'X' ? 4 : 8, 's')) < 0)
                return NULL;
            break;
        case 'C':
        case 'B':
        case 0x8e:
            if (gm_pk_push(r, length_prefixed(r, op == 'C' ? 1 : op == 'B' ? 4 : 8, 'b')) < 0)
                return NULL;
            break;
        case 0x96: /* BYTEARRAY8 */
            if (gm_pk_push(r, length_prefixed(r, 8, 'a')) < 0)
                return NULL;
            break;
        case ']':
            if (gm_pk_push(r, PyList_New(0)) < 0)
                return NULL;
            break;
        case '}':
            if (gm_pk_push(r, PyDict_New()) < 0)
                return NULL;
            break;
        case ')':
            if (gm_pk_push(r, PyTuple_New(0)) < 0)
                return NULL;
            break;
        case 'a': /* APPEND */
            if (r->sp - gm_pk_fence(r) < 2)
                return gm_pk_corrupt(r, "unpickling stack underflow");
            if (gm_pk_appends(r, r->sp - 1) < 0)
                return NULL;
            break;
        case 'e':
            if ((mark = gm_pk_pop_mark(r)) < 0 || gm_pk_appends(r, mark) < 0)
                return NULL;
            break;
        case 's':
            if (r->sp - gm_pk_fence(r) < 3)
                return gm_pk_corrupt(r, "unpickling stack underflow");
            if (gm_pk_setitems(r, r->sp - 2, 0) < 0)
                return NULL;
            break;
        case 'u':
            if ((mark = gm_pk_pop_mark(r)) < 0 || gm_pk_setitems(r, mark, 1) < 0)
                return NULL;
            break;
        case 'l':
        case 't':
        case 'd': {
            if ((mark = gm_pk_pop_mark(r)) < 0)
                return NULL;
            PyObject *t = take_tuple(r, mark);
            if (!t)
                return NULL;
            if (op == 'l') {
                v = PySequence_List(t);
            } else if (op == 't') {
                v = t;
                Py_INCREF(t);
            } else {
                v = PyDict_New();
                if (v && PyTuple_GET_SIZE(t) % 2) {
                    Py_DECREF(v);
                    Py_DECREF(t);
                    return gm_pk_corrupt(r, "odd number of items for DICT");
                }
                for (Py_ssize_t i = 0; v && i < PyTuple_GET_SIZE(t); i += 2)
                    if (PyDict_SetItem(v, PyTuple_GET_ITEM(t, i), PyTuple_GET_ITEM(t, i + 1)) <
                        0) {
                        Py_CLEAR(v);
                        gm_pk_error(r);
                    }
            }
            Py_DECREF(t);
            if (gm_pk_push(r, v) < 0)
                return NULL;
            break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
            Py_ssize_t n = op - 0x84;
            if (r->sp - gm_pk_fence(r) < n)
                return gm_pk_corrupt(r, "unpickling stack underflow");
            if (gm_pk_push(r, take_tuple(r, r->sp - n)) < 0)
                return NULL;
            break;
        }
        case 'h':
        case 'j':
            if (gm_pk_need(r, op == 'h' ? 1 : 4) < 0)
                return NULL;
            {
                uint64_t i = gm_pk_le(r->p, op == 'h' ? 1 : 4);
                r->p += op == 'h' ? 1 : 4;
                if (gm_pk_memo_get(r, i) < 0)
                    return NULL;
            }
            break;
        case 'q':
        case 'r':
            if (gm_pk_need(r, op == 'q' ? 1 : 4) < 0)
                return NULL;
            {
                uint64_t i = gm_pk_le(r->p, op == 'q' ? 1 : 4);
                r->p += op == 'q' ? 1 : 4;
                if (gm_pk_memo_put(r, i) < 0)
                    return NULL;
            }
            break;
        case 0x94: /* MEMOIZE: the next free index, as CPython's unpickler counts */
            if (gm_pk_memo_put(r, (uint64_t)r->mcount) < 0)
                return NULL;
            break;
        case 0x93: { /* STACK_GLOBAL */
            if (r->proto < 3)
                return gm_pk_fail(r, "unsupported", NULL);
            PyObject *name = pop(r);
            PyObject *module = name ? pop(r) : NULL;
            if (!module) {
                Py_XDECREF(name);
                return NULL;
            }
            if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(module)) {
                Py_DECREF(name);
                Py_DECREF(module);
                return gm_pk_corrupt(r, "STACK_GLOBAL requires str");
            }
            refuse_global(r, module, name);
            return NULL;
        }
        case 'c':
        case 'i': { /* GLOBAL, INST: module and name lines */
            if (r->proto < 3)
                return gm_pk_fail(r, "unsupported", NULL); /* names mapped by fix_imports */
            PyObject *module = line(r);
            PyObject *name = module ? line(r) : NULL;
            if (!name) {
                Py_XDECREF(module);
                return NULL;
            }
            refuse_global(r, module, name);
            return NULL;
        }
        case 'P': /* PERSID */
            v = line(r);
            return v ? gm_pk_fail(r, "persid", v) : NULL;
        case 'Q': /* BINPERSID */
            v = pop(r);
            return v ? gm_pk_fail(r, "persid", v) : NULL;
        case 'R':
        case 'b':
        case 'o':
        case 0x81:
        case 0x92:
        case 0x82:
        case 0x83:
        case 0x84:
        case 0x97:
        case 0x98: {
            char text[96];
            snprintf(text, sizeof text,
                     "opcode 0x%02x calls or builds an object, which plain data never does", op);
            return gm_pk_corrupt(r, text);
        }
        case 'I':
        case 'L':
        case 'F':
        case 'S':
        case 'V':
        case 'p':
        case 'g':
        case 'U':
        case 'T':
        case 0x8f:
        case 0x90:
        case 0x91:
            return gm_pk_fail(r, "unsupported", NULL);
        default: {
            char text[64];
            snprintf(text, sizeof text, "invalid load key, '\\x%02x'.", op);
            return gm_pk_corrupt(r, text);
        }
        }
    }
}

/* Each device trace list that became records, replaced by its TraceColumns
 * where nothing else refers to the list; every other builder spilled. */
static PyObject *read_snapshot_pickle(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *names[] = {"data", "compact", NULL};
    Py_buffer buf;
    int compact = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|p:read_snapshot_pickle", names, &buf,
                                     &compact))
        return NULL;
    gm_pk_t r;
    memset(&r, 0, sizeof r);
    r.start = r.p = r.op_at = buf.buf;
    r.end = r.start + buf.len;
    r.proto = 0;
    r.compact = compact;
    r.stg_free = -1;
    r.builders = PyList_New(0);
    PyObject *out = NULL;
    if (r.builders && gm_ptrmap_init(&r.builder_of, 16) == 0 &&
        gm_ptrmap_init(&r.memo_dict, 1024) == 0 && gm_ptrmap_init(&r.staged_of, 1024) == 0) {
        out = run(&r);
        if (out && gm_pk_finish(&r, out) < 0)
            Py_CLEAR(out);
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    gm_pk_stage_free(&r); /* before the stack: it reads no staged dict */
    while (r.sp > 0)
        Py_DECREF(r.stack[--r.sp]);
    for (Py_ssize_t i = 0; i < r.mtop; i++)
        if (r.memo[i] && !((uintptr_t)r.memo[i] & 1))
            Py_DECREF(r.memo[i]);
    PyMem_Free(r.stack);
    PyMem_Free(r.marks);
    PyMem_Free(r.memo);
    gm_ptrmap_free(&r.builder_of);
    gm_ptrmap_free(&r.memo_dict);
    Py_XDECREF(r.builders);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"read_snapshot_pickle", (PyCFunction)(void (*)(void))read_snapshot_pickle,
     METH_VARARGS | METH_KEYWORDS,
     "read_snapshot_pickle(data, compact=True): the plain data of a snapshot pickle, device "
     "traces as TraceColumns; ValueError((kind, detail, offset)) when refused."},
    {NULL, NULL, 0, NULL},
};

int gm_py_pickle_reader_init(PyObject *module) {
    if (gm_pk_lists_init() < 0)
        return -1;
    if (gm_py_trace_columns_init(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, methods);
}
