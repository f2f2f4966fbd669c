/*
 * hist_frames.c - interned tracebacks and strings as the Python objects of
 * one snapshot (hist_frames.h).
 *
 * A traceback holds Python frames (code object, location), TorchScript
 * frames (an interned "name\0filename" string and a line; intern.h
 * GM_LOC_SCRIPT) and C return addresses. Its list is built once per
 * snapshot, innermost first: C frames in order, with one Python frame
 * spliced in where CPython's eval loop appears and the rest appended, as
 * torch splices them; TorchScript frames, innermost of all, go before the
 * first Python frame. Frames are symbolized here: code objects through
 * their attributes, C addresses with dladdr (cframes.c).
 * Must not: be called with an allocator lock held.
 */
#include <stdint.h>
#include <string.h>

#include "../history/hist.h"
#include "../history/intern.h"
#include "hist_frames.h"
#include "pycompat.h"

#define MAX_JS_INT (((uint64_t)1 << 53) - 1)

/* Interned keys; created at module init, kept forever (protected by: GIL). */
enum { K_NAME, K_FILENAME, K_LINE, K_CO_FILENAME, K_CO_NAME, V_UNKNOWN, K_COUNT };
static const char *const key_text[K_COUNT] = {"name", "filename", "line", "co_filename",
                                              "co_name", "??"};
static PyObject *keys[K_COUNT];

int gm_py_hist_frames_init(void) {
    for (int i = 0; i < K_COUNT; i++)
        if (!(keys[i] = PyUnicode_InternFromString(key_text[i])))
            return -1;
    return 0;
}

PyObject *gm_frames_int(const gm_frames_t *b, uint64_t v) {
    if (b->clamp && v > MAX_JS_INT)
        v &= MAX_JS_INT;
    return PyLong_FromUnsignedLongLong(v);
}

void gm_frames_free(gm_frames_t *b) {
    for (uint32_t i = 0; b->tb && i <= b->ntb; i++)
        Py_XDECREF(b->tb[i]);
    for (uint32_t i = 0; b->fr && i <= b->nfr; i++)
        Py_XDECREF(b->fr[i]);
    for (uint32_t i = 0; b->meta && i <= b->nmeta; i++)
        Py_XDECREF(b->meta[i]);
    for (size_t i = 0; b->cf && i <= b->cf_mask; i++)
        Py_XDECREF(b->cf[i].dict);
    PyMem_Free(b->tb);
    PyMem_Free(b->fr);
    PyMem_Free(b->meta);
    PyMem_Free(b->cf);
    Py_XDECREF(b->empty);
}

int gm_frames_init(gm_frames_t *b, int clamp) {
    memset(b, 0, sizeof *b);
    b->clamp = clamp;
    gm_intern_counts(&b->ntb, &b->nfr, &b->nmeta);
    b->tb = PyMem_Calloc((size_t)b->ntb + 1, sizeof *b->tb);
    b->fr = PyMem_Calloc((size_t)b->nfr + 1, sizeof *b->fr);
    b->meta = PyMem_Calloc((size_t)b->nmeta + 1, sizeof *b->meta);
    b->cf_mask = 255;
    b->cf = PyMem_Calloc(b->cf_mask + 1, sizeof *b->cf);
    b->empty = PyList_New(0);
    if (!b->tb || !b->fr || !b->meta || !b->cf || !b->empty) {
        gm_frames_free(b);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- frames */

static PyObject *frame_dict(PyObject *name, PyObject *filename, long line) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    PyObject *l = PyLong_FromLong(line);
    /* torch's key order: name, filename, line */
    if (!l || PyDict_SetItem(d, keys[K_NAME], name) < 0 ||
        PyDict_SetItem(d, keys[K_FILENAME], filename) < 0 ||
        PyDict_SetItem(d, keys[K_LINE], l) < 0) {
        Py_XDECREF(l);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(l);
    return d;
}

static PyObject *code_str(PyObject *code, PyObject *attr) {
    PyObject *s = PyObject_GetAttr(code, attr);
    if (s && PyUnicode_Check(s))
        return s;
    Py_XDECREF(s);
    PyErr_Clear();
    return Py_NewRef(keys[V_UNKNOWN]);
}

/* A TorchScript frame: its interned "name\0filename" string and line. */
static PyObject *script_frame(const gm_rawframe_t *raw) {
    const char *s = "";
    size_t len = 0;
    if (gm_intern_string_view((uint32_t)raw->code, &s, &len))
        len = 0;
    size_t nlen = strnlen(s, len);
    const char *file = nlen < len ? s + nlen + 1 : "";
    PyObject *name = PyUnicode_DecodeUTF8(s, (Py_ssize_t)nlen, "replace");
    PyObject *filename = PyUnicode_DecodeUTF8(file, (Py_ssize_t)strlen(file), "replace");
    PyObject *d = name && filename ? frame_dict(name, filename, raw->loc) : NULL;
    Py_XDECREF(name);
    Py_XDECREF(filename);
    return d;
}

/* Borrowed reference to the dict of frame `fid` (Python or TorchScript),
 * NULL on error. fr[0] holds the dict used for an unknown id. */
static PyObject *py_frame(gm_frames_t *b, uint32_t fid) {
    gm_rawframe_t raw;
    if (fid >= 1 && fid <= b->nfr && b->fr[fid])
        return b->fr[fid];
    if (fid > b->nfr || gm_intern_frame(fid, &raw))
        fid = 0;
    if (b->fr[fid])
        return b->fr[fid];
    if (fid == 0)
        return b->fr[0] = frame_dict(keys[V_UNKNOWN], keys[V_UNKNOWN], 0);
    if (raw.kind == GM_LOC_SCRIPT)
        return b->fr[fid] = script_frame(&raw);
    /* The intern table holds a reference to the code object. */
    PyObject *code = (PyObject *)raw.code;
    long line = raw.kind == GM_LOC_LINE ? raw.loc
                                        : PyCode_Addr2Line((PyCodeObject *)code, raw.loc);
    PyObject *name = code_str(code, keys[K_CO_NAME]);
    PyObject *filename = code_str(code, keys[K_CO_FILENAME]);
    PyObject *d = frame_dict(name, filename, line);
    Py_DECREF(name);
    Py_DECREF(filename);
    return b->fr[fid] = d;
}

static int c_frames_grow(gm_frames_t *b) {
    size_t ncap = (b->cf_mask + 1) * 2;
    gm_cframe_entry_t *n = PyMem_Calloc(ncap, sizeof *n);
    if (!n) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i <= b->cf_mask; i++) {
        if (!b->cf[i].addr)
            continue;
        size_t k = (size_t)((b->cf[i].addr * 0x9e3779b97f4a7c15ULL) >> 17) & (ncap - 1);
        while (n[k].addr)
            k = (k + 1) & (ncap - 1);
        n[k] = b->cf[i];
    }
    PyMem_Free(b->cf);
    b->cf = n;
    b->cf_mask = ncap - 1;
    return 0;
}

/* Borrowed reference to the dict of C frame `addr`; *is_eval set. */
static PyObject *c_frame(gm_frames_t *b, uintptr_t addr, int *is_eval) {
    if ((b->cf_count + 1) * 2 > b->cf_mask + 1 && c_frames_grow(b) < 0)
        return NULL;
    size_t j = (size_t)((addr * 0x9e3779b97f4a7c15ULL) >> 17) & b->cf_mask;
    while (b->cf[j].addr && b->cf[j].addr != addr)
        j = (j + 1) & b->cf_mask;
    if (b->cf[j].addr) {
        *is_eval = b->cf[j].is_eval;
        return b->cf[j].dict;
    }
    char name[512], file[512];
    int ev = gm_cframes_symbolize(addr, name, sizeof name, file, sizeof file);
    PyObject *n = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
    PyObject *f = PyUnicode_DecodeFSDefault(file);
    PyObject *d = n && f ? frame_dict(n, f, 0) : NULL;
    Py_XDECREF(n);
    Py_XDECREF(f);
    if (!d)
        return NULL;
    b->cf[j].addr = addr;
    b->cf[j].dict = d;
    b->cf[j].is_eval = ev;
    b->cf_count++;
    *is_eval = ev;
    return d;
}

static int append_frame(gm_frames_t *b, PyObject *list, uint32_t fid) {
    PyObject *pf = py_frame(b, fid);
    return pf ? PyList_Append(list, pf) : -1;
}

PyObject *gm_frames_list(gm_frames_t *b, uint32_t id) {
    if (id == 0 || id > b->ntb)
        return b->empty;
    if (b->tb[id])
        return b->tb[id];
    gm_tb_view_t v;
    if (gm_intern_tb_view(id, &v))
        return b->empty;
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    /* TorchScript frames lead the Python ones; without C frames they are
     * simply the innermost, with C frames they go where the first Python
     * frame is spliced in. */
    uint32_t nscript = 0;
    while (nscript < v.npy && v.raw[nscript].kind == GM_LOC_SCRIPT)
        nscript++;
    uint32_t pi = v.nc ? nscript : 0;
    for (uint32_t i = 0; i < v.nc; i++) {
        int is_eval = 0;
        PyObject *cf = c_frame(b, v.c[i], &is_eval);
        if (!cf)
            goto fail;
        if (is_eval && pi < v.npy) {
            if (pi == nscript)
                for (uint32_t s = 0; s < nscript; s++)
                    if (append_frame(b, list, v.fids[s]) < 0)
                        goto fail;
            if (append_frame(b, list, v.fids[pi++]) < 0)
                goto fail;
        }
        if (PyList_Append(list, cf) < 0)
            goto fail;
    }
    if (v.nc && pi == nscript)
        pi = 0; /* no eval frame was seen: the script frames go at the end too */
    for (; pi < v.npy; pi++)
        if (append_frame(b, list, v.fids[pi]) < 0)
            goto fail;
    b->tb[id] = list;
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

PyObject *gm_frames_meta(gm_frames_t *b, uint32_t id) {
    if (id > b->nmeta)
        id = 0;
    if (b->meta[id])
        return b->meta[id];
    const char *s;
    size_t len;
    if (gm_intern_string_view(id, &s, &len)) {
        s = "";
        len = 0;
    }
    b->meta[id] = PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "replace");
    return b->meta[id];
}
