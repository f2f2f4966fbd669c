/*
 * segments.h - segment and block dicts in the layout of torch's memory
 * snapshot (segments.c): the one implementation behind
 * Allocator.segments() and the segments of a history snapshot
 * (hist_snapshot.c). Everything here needs the GIL and must be called with
 * no allocator lock held, except the walk inside gm_py_segments, which
 * holds it only while copying plain C values.
 */
#ifndef GM_PYTHON_SEGMENTS_H
#define GM_PYTHON_SEGMENTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* Intern the keys and shared values (module init). */
int gm_py_segments_init(PyObject *module);

/* {address, size, requested_size, state, frames}. frames is borrowed (the
 * dict takes its own reference). With clamp, integers of 2^53 and above
 * are folded into 53 bits (dump_snapshot, for JavaScript viewers). The
 * block's ctx is not read: the caller chose frames. */
PyObject *gm_py_block_dict(const gm_block_info_t *b, PyObject *frames, int clamp);

/* {device, address, total_size, allocated_size, active_size,
 * requested_size, stream, segment_type, segment_pool_id, is_expandable,
 * frames, blocks}, in torch's key order. frames is borrowed; blocks (a
 * list of block dicts) is stolen, also on failure. s->blocks is not read. */
PyObject *gm_py_segment_dict(int device, const gm_segment_info_t *s, PyObject *frames,
                             PyObject *blocks, int clamp);

/* The default pool's id, (0, 0): the one tuple every segment and trace
 * entry shares (borrowed; valid after gm_py_segments_init). gpumem has no
 * private pools. */
PyObject *gm_py_default_pool_id(void);

/* Allocator.segments(): the segment dicts of one allocator, in address
 * order, each dict with its own empty frames list. NULL + exception. */
PyObject *gm_py_segments(gm_alloc_t *a);

#endif /* GM_PYTHON_SEGMENTS_H */
