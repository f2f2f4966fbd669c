/*
 * model_passes.c - _C.model_*: the passes summary, diff and view make over
 * a DeviceModel's columns (gpumem/snapshots/timeline.py), over the arrays'
 * buffers instead of a Python loop per allocation or per trace entry.
 *
 * Each pass is the Python expression named in its docstring, result for
 * result (ties broken the same way), so reports do not change; the Python
 * forms stay in timeline.py for models whose columns are lists (traces
 * that stayed lists, values past 64 bits), and tests compare the two.
 * Columns are buffers of 8-byte items: allocation starts, ends and stacks
 * and the allocated curve signed, sizes unsigned.
 * Must not: keep a buffer past the call; assume columns of equal length
 * without checking.
 */
#include "model_passes.h"

#include <stdlib.h>
#include <string.h>

#include "../base/ptrmap.h"

typedef struct cols {
    Py_buffer b[6];
    int n;
} cols_t;

/* Borrow obj's buffer as n 8-byte items (writable if asked). */
static const int64_t *col(cols_t *c, PyObject *obj, int writable, Py_ssize_t *n) {
    Py_buffer *b = &c->b[c->n];
    if (PyObject_GetBuffer(obj, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT |
                                       PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    c->n++;
    if (b->itemsize != 8 || !b->format || !strchr("qQlL", b->format[0])) {
        PyErr_SetString(PyExc_TypeError, "model column: expected an array of 8-byte integers");
        return NULL;
    }
    *n = b->len / 8;
    return b->buf;
}

static void release(cols_t *c) {
    while (c->n > 0)
        PyBuffer_Release(&c->b[--c->n]);
}

static int same_len(Py_ssize_t a, Py_ssize_t b) {
    if (a == b)
        return 1;
    PyErr_SetString(PyExc_ValueError, "model columns of different lengths");
    return 0;
}

static PyObject *u128_long(unsigned __int128 x) {
    if (x <= UINT64_MAX)
        return PyLong_FromUnsignedLongLong((unsigned long long)x);
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(x >> 64));
    PyObject *sh = PyLong_FromLong(64), *lo = PyLong_FromUnsignedLongLong((uint64_t)x);
    PyObject *up = hi && sh ? PyNumber_Lshift(hi, sh) : NULL;
    PyObject *out = up && lo ? PyNumber_Or(up, lo) : NULL;
    Py_XDECREF(hi);
    Py_XDECREF(sh);
    Py_XDECREF(lo);
    Py_XDECREF(up);
    return out;
}

static int selected(const int64_t *start, const int64_t *end, Py_ssize_t a, int all,
                    int64_t index) {
    return all ? start[a] >= 0 : start[a] <= index && index < end[a];
}

/* model_live(a_start, a_end, index): bytes of the int64 indexes a with
 * a_start[a] <= index < a_end[a], in order (DeviceModel.live_at). */
static PyObject *model_live(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *s_o, *e_o;
    long long index;
    if (!PyArg_ParseTuple(args, "OOL:model_live", &s_o, &e_o, &index))
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0, ne = 0;
    const int64_t *start = col(&c, s_o, 0, &n), *end = start ? col(&c, e_o, 0, &ne) : NULL;
    PyObject *out = NULL;
    if (end && same_len(n, ne)) {
        Py_ssize_t k = 0;
        for (Py_ssize_t a = 0; a < n; a++)
            k += selected(start, end, a, 0, index);
        out = PyByteArray_FromStringAndSize(NULL, k * 8);
        if (out) {
            int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
            for (Py_ssize_t a = 0; a < n; a++)
                if (selected(start, end, a, 0, index))
                    *o++ = a;
        }
    }
    release(&c);
    return out;
}

typedef struct group {
    int64_t stack;
    Py_ssize_t first, count, largest_at;
    uint64_t largest;
    unsigned __int128 bytes;
} group_t;

/* model_group(a_size, a_stack, a_start, a_end, index): the selected
 * allocations (live just after entry index, or with a_start >= 0 when
 * index is None) grouped by stack: [(stack, count, bytes, largest, position
 * of the first allocation of that size)] in order of each stack's first
 * allocation; positions count the selected allocations. */
static PyObject *model_group(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sz_o, *st_o, *s_o, *e_o, *idx_o;
    if (!PyArg_ParseTuple(args, "OOOOO:model_group", &sz_o, &st_o, &s_o, &e_o, &idx_o))
        return NULL;
    int all = idx_o == Py_None;
    long long index = all ? 0 : PyLong_AsLongLong(idx_o);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0, n1 = 0, n2 = 0, n3 = 0;
    const int64_t *size = col(&c, sz_o, 0, &n);
    const int64_t *stack = size ? col(&c, st_o, 0, &n1) : NULL;
    const int64_t *start = stack ? col(&c, s_o, 0, &n2) : NULL;
    const int64_t *end = start ? col(&c, e_o, 0, &n3) : NULL;
    PyObject *out = NULL;
    group_t *g = NULL;  /* the groups in order of their first allocation */
    gm_ptrmap_t slot;   /* stack + 1 -> index in g */
    int have_map = 0;
    if (!end || !same_len(n, n1) || !same_len(n, n2) || !same_len(n, n3))
        goto done;
    g = PyMem_RawCalloc((size_t)n + 1, sizeof *g);
    have_map = gm_ptrmap_init(&slot, 64) == 0;
    if (!g || !have_map) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t pos = 0, ng = 0;
    for (Py_ssize_t a = 0; a < n; a++) {
        if (!selected(start, end, a, all, index))
            continue;
        if (stack[a] < 0 || stack[a] == INT64_MAX) {
            PyErr_SetString(PyExc_ValueError, "model_group: a stack id out of range");
            goto done;
        }
        uintptr_t k;
        if (!gm_ptrmap_get(&slot, (uintptr_t)stack[a] + 1, &k)) {
            k = (uintptr_t)ng++;
            if (gm_ptrmap_put(&slot, (uintptr_t)stack[a] + 1, k) != 0) {
                PyErr_NoMemory();
                goto done;
            }
            g[k].stack = stack[a];
            g[k].first = pos;
        }
        group_t *x = &g[k];
        uint64_t sz = (uint64_t)size[a];
        if (!x->count || sz > x->largest) {
            x->largest = sz;
            x->largest_at = pos;
        }
        x->count++;
        x->bytes += sz;
        pos++;
    }
    out = PyList_New(ng);
    for (Py_ssize_t k = 0; out && k < ng; k++) {
        group_t *x = &g[k];
        PyObject *row = Py_BuildValue("(LnNKn)", (long long)x->stack, x->count, u128_long(x->bytes),
                                      (unsigned long long)x->largest, x->largest_at);
        if (!row) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, row);
    }
done:
    PyMem_RawFree(g);
    if (have_map)
        gm_ptrmap_free(&slot);
    release(&c);
    return out;
}

/* model_samples(allocated, max_samples, peak_index): view's _samples, the
 * first highest and first lowest entry of each of max_samples // 2 equal
 * ranges and the peak (an entry of the trace), sorted; all entries when
 * there are few. */
static PyObject *model_samples(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a_o;
    Py_ssize_t max_samples, peak;
    if (!PyArg_ParseTuple(args, "Onn:model_samples", &a_o, &max_samples, &peak))
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0;
    const int64_t *v = col(&c, a_o, 0, &n);
    PyObject *out = NULL;
    if (!v)
        goto done;
    Py_ssize_t buckets = max_samples / 2;
    if (n > max_samples && buckets < 1) {
        PyErr_SetString(PyExc_ValueError, "model_samples: max_samples below 2");
        goto done;
    }
    uint8_t *pick = PyMem_RawCalloc((size_t)n + 1, 1);
    if (!pick) {
        PyErr_NoMemory();
        goto done;
    }
    if (n <= max_samples) {
        memset(pick, 1, (size_t)n);
    } else {
        for (Py_ssize_t b = 0; b < buckets; b++) {
            Py_ssize_t lo = (Py_ssize_t)((long long)b * n / buckets);
            Py_ssize_t hi = (Py_ssize_t)((long long)(b + 1) * n / buckets), imax = lo, imin = lo;
            for (Py_ssize_t i = lo + 1; i < hi; i++) {
                if (v[i] > v[imax])
                    imax = i;
                if (v[i] < v[imin])
                    imin = i;
            }
            pick[imax] = pick[imin] = 1;
        }
        if (peak >= 0 && peak < n)
            pick[peak] = 1;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        k += pick[i];
    out = PyList_New(k);
    for (Py_ssize_t i = 0, j = 0; out && i < n; i++) {
        if (!pick[i])
            continue;
        PyObject *x = PyLong_FromSsize_t(i);
        if (!x)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j++, x);
    }
    PyMem_RawFree(pick);
done:
    release(&c);
    return out;
}

/* First position in s[0..S) whose value is >= x (bisect.bisect_left). */
static Py_ssize_t lower_bound(const Py_ssize_t *s, Py_ssize_t S, int64_t x) {
    Py_ssize_t lo = 0, hi = S;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (s[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

typedef struct cand {
    uint64_t size;
    Py_ssize_t life, a, s0, s1;
} cand_t;

static int cand_order(const void *pa, const void *pb) {
    const cand_t *x = pa, *y = pb;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    if (x->life != y->life)
        return x->life > y->life ? -1 : 1;
    return (x->a > y->a) - (x->a < y->a);
}

/* Reorders c[0..n) so that its k first items (in cand_order) come first, in
 * any order (quickselect; the order is total: ties end on the allocation). */
static void select_first(cand_t *c, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        cand_t pivot = c[lo + (hi - lo) / 2], t;
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (cand_order(&c[i], &pivot) < 0)
                i++;
            while (cand_order(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                t = c[i], c[i] = c[j], c[j] = t;
                i++, j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return;
    }
}

/* model_bands(a_start, a_end, a_size, samples, max_bands, budget): view's
 * bands, (visible, [(a, s0, s1)]): the allocations live at some sample,
 * largest first (then longest, then first allocated), taken while fewer
 * than max_bands are and their lifetimes in samples fit the budget. */
static PyObject *model_bands(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *s_o, *e_o, *sz_o, *samp_o;
    Py_ssize_t max_bands;
    long long budget;
    if (!PyArg_ParseTuple(args, "OOOO!nL:model_bands", &s_o, &e_o, &sz_o, &PyList_Type,
                          &samp_o, &max_bands, &budget))
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0, n1 = 0, n2 = 0, S = PyList_GET_SIZE(samp_o), nc = 0;
    const int64_t *start = col(&c, s_o, 0, &n);
    const int64_t *end = start ? col(&c, e_o, 0, &n1) : NULL;
    const int64_t *size = end ? col(&c, sz_o, 0, &n2) : NULL;
    PyObject *out = NULL, *chosen = NULL;
    Py_ssize_t *samples = NULL;
    cand_t *cands = NULL;
    if (!size || !same_len(n, n1) || !same_len(n, n2))
        goto done;
    samples = PyMem_RawMalloc(((size_t)S + 1) * sizeof *samples);
    cands = PyMem_RawMalloc(((size_t)n + 1) * sizeof *cands);
    if (!samples || !cands) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < S; k++) {
        samples[k] = PyLong_AsSsize_t(PyList_GET_ITEM(samp_o, k));
        if (samples[k] == -1 && PyErr_Occurred())
            goto done;
    }
    for (Py_ssize_t a = 0; a < n; a++) {
        Py_ssize_t s0 = lower_bound(samples, S, start[a]);
        Py_ssize_t s1 = lower_bound(samples, S, end[a]) - 1;
        if (s0 <= s1)
            cands[nc++] = (cand_t){(uint64_t)size[a], s1 - s0, a, s0, s1};
    }
    /* Only the first candidates in order are looked at (max_bands of them,
     * or a few more where the budget skips some): sort a head selected
     * ahead of the rest, and the rest only if the walk gets there. */
    if (max_bands < 0)
        max_bands = 0; /* no band, as the walk below gives (and no negative head) */
    Py_ssize_t head = max_bands < nc / 4 ? 4 * max_bands : nc;
    if (head < nc)
        select_first(cands, nc, head);
    qsort(cands, (size_t)head, sizeof *cands, cand_order);
    chosen = PyList_New(0);
    for (Py_ssize_t k = 0; chosen && k < nc; k++) {
        if (PyList_GET_SIZE(chosen) >= max_bands)
            break;
        if (k == head)
            qsort(cands + head, (size_t)(nc - head), sizeof *cands, cand_order);
        if (cands[k].life + 1 > budget)
            continue;
        budget -= cands[k].life + 1;
        PyObject *t = Py_BuildValue("(nnn)", cands[k].a, cands[k].s0, cands[k].s1);
        if (!t || PyList_Append(chosen, t) < 0)
            Py_CLEAR(chosen);
        Py_XDECREF(t);
    }
    if (chosen)
        out = Py_BuildValue("(nO)", nc, chosen);
done:
    Py_XDECREF(chosen);
    PyMem_RawFree(samples);
    PyMem_RawFree(cands);
    release(&c);
    return out;
}

/* model_ranges(a_start, a_size, allocated, [(start, end), ...]): per range
 * (count, bytes, peak): the allocations made at entries start .. end - 1,
 * their bytes, and the highest allocated value there (summary's steps). */
static PyObject *model_ranges(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *s_o, *sz_o, *al_o, *pairs;
    if (!PyArg_ParseTuple(args, "OOOO!:model_ranges", &s_o, &sz_o, &al_o, &PyList_Type, &pairs))
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0, n1 = 0, ne = 0;
    const int64_t *start = col(&c, s_o, 0, &n);
    const int64_t *size = start ? col(&c, sz_o, 0, &n1) : NULL;
    const int64_t *alloc = size ? col(&c, al_o, 0, &ne) : NULL;
    PyObject *out = NULL;
    unsigned __int128 *csum = NULL;
    Py_ssize_t *starts = NULL;
    if (!alloc || !same_len(n, n1))
        goto done;
    /* per entry: the bytes allocated by entries before it (starts are entry indexes) */
    csum = PyMem_RawCalloc((size_t)ne + 2, sizeof *csum);
    starts = PyMem_RawCalloc((size_t)ne + 2, sizeof *starts);
    if (!csum || !starts) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t a = 0; a < n; a++) {
        if (start[a] < 0)
            continue;
        if (start[a] >= ne) {
            PyErr_SetString(PyExc_ValueError, "model_ranges: an allocation past the trace");
            goto done;
        }
        csum[start[a] + 1] += (uint64_t)size[a];
        starts[start[a] + 1]++;
    }
    for (Py_ssize_t i = 1; i <= ne; i++) {
        csum[i] += csum[i - 1];
        starts[i] += starts[i - 1];
    }
    Py_ssize_t np = PyList_GET_SIZE(pairs);
    out = PyList_New(np);
    for (Py_ssize_t k = 0; out && k < np; k++) {
        Py_ssize_t lo = 0, hi = 0;
        PyObject *pair = PyList_GET_ITEM(pairs, k);
        if (!PyTuple_Check(pair) || !PyArg_ParseTuple(pair, "nn", &lo, &hi) || lo < 0 ||
            hi > ne || hi <= lo) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "model_ranges: a range outside the trace");
            Py_CLEAR(out);
            break;
        }
        int64_t peak = alloc[lo];
        for (Py_ssize_t i = lo + 1; i < hi; i++)
            peak = alloc[i] > peak ? alloc[i] : peak;
        PyObject *row = Py_BuildValue("(nNL)", starts[hi] - starts[lo],
                                      u128_long(csum[hi] - csum[lo]), (long long)peak);
        if (!row)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, row);
    }
done:
    PyMem_RawFree(csum);
    PyMem_RawFree(starts);
    release(&c);
    return out;
}

/* model_remap(column, ids): column[i] = ids[column[i]] in place. */
static PyObject *model_remap(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *c_o, *ids;
    if (!PyArg_ParseTuple(args, "OO!:model_remap", &c_o, &PyList_Type, &ids))
        return NULL;
    cols_t c = {.n = 0};
    Py_ssize_t n = 0, m = PyList_GET_SIZE(ids);
    int64_t *v = (int64_t *)col(&c, c_o, 1, &n);
    int64_t *map = v ? PyMem_RawMalloc(((size_t)m + 1) * sizeof *map) : NULL;
    int ok = map != NULL;
    if (v && !map)
        PyErr_NoMemory();
    for (Py_ssize_t k = 0; ok && k < m; k++) {
        map[k] = PyLong_AsLongLong(PyList_GET_ITEM(ids, k));
        ok = !(map[k] == -1 && PyErr_Occurred());
    }
    for (Py_ssize_t i = 0; ok && i < n; i++)
        if (v[i] >= 0 && v[i] < m) {
            v[i] = map[v[i]];
        } else {
            PyErr_SetString(PyExc_ValueError, "model_remap: an id outside the table");
            ok = 0;
        }
    PyMem_RawFree(map);
    release(&c);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"model_live", model_live, METH_VARARGS,
     "model_live(a_start, a_end, index): bytes of the allocations live after entry index."},
    {"model_group", model_group, METH_VARARGS,
     "model_group(a_size, a_stack, a_start, a_end, index): selected allocations by stack."},
    {"model_samples", model_samples, METH_VARARGS,
     "model_samples(allocated, max_samples, peak_index): the timeline's sample entries."},
    {"model_bands", model_bands, METH_VARARGS,
     "model_bands(a_start, a_end, a_size, samples, max_bands, budget): the timeline's bands."},
    {"model_ranges", model_ranges, METH_VARARGS,
     "model_ranges(a_start, a_size, allocated, ranges): count, bytes and peak per range."},
    {"model_remap", model_remap, METH_VARARGS,
     "model_remap(column, ids): column[i] = ids[column[i]], in place."},
    {NULL, NULL, 0, NULL},
};

int gm_py_model_passes_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
