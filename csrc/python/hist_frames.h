/*
 * hist_frames.h - interned ids as Python objects, once per snapshot
 * (hist_frames.c): a traceback id becomes a list of frame dicts
 * {name, filename, line} (innermost first, C frames spliced as torch
 * splices them), a metadata id becomes a str. Every use of the same id in
 * one snapshot gets the same object, and equal frames are the same dict, so
 * pickle memoizes them. Everything here needs the GIL and no allocator lock.
 */
#ifndef GM_PYTHON_HIST_FRAMES_H
#define GM_PYTHON_HIST_FRAMES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

typedef struct gm_cframe_entry {
    uintptr_t addr; /* 0 = empty slot */
    PyObject *dict;
    int is_eval;
} gm_cframe_entry_t;

/* The objects of one snapshot. */
typedef struct gm_frames {
    int clamp;              /* fold ints >= 2^53 (dump_snapshot) */
    uint32_t ntb, nfr, nmeta;
    PyObject **tb;          /* tb[id]: frames list, NULL until built */
    PyObject **fr;          /* fr[id]: frame dict */
    PyObject **meta;        /* meta[id]: str */
    gm_cframe_entry_t *cf;  /* address -> frame dict */
    size_t cf_mask, cf_count;
    PyObject *empty;        /* the shared [] */
} gm_frames_t;

/* Intern the keys (module init). */
int gm_py_hist_frames_init(void);

/* Call after the state the ids come from was copied: every id in the copy
 * is below the counts read here. -1 with an exception on failure. */
int gm_frames_init(gm_frames_t *b, int clamp);
void gm_frames_free(gm_frames_t *b);

/* Borrowed: the frames list of traceback `id` (the shared empty list for 0
 * or an unknown id); NULL on error. */
PyObject *gm_frames_list(gm_frames_t *b, uint32_t id);
/* Borrowed: the str of metadata string `id` ("" for 0); NULL on error. */
PyObject *gm_frames_meta(gm_frames_t *b, uint32_t id);
/* New reference: v as an int, folded into 53 bits when b->clamp. */
PyObject *gm_frames_int(const gm_frames_t *b, uint64_t v);

#endif /* GM_PYTHON_HIST_FRAMES_H */
