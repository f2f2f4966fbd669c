/*
 * vdev_call.c - one backend call of the virtual device: counting it and
 * applying failure injection (gm_vdev_inject), keeping the last error,
 * checking the device index, and growing the device's arrays. Used by
 * vdev.c (events, the backend table) and vdev_memory.c (memory); calls
 * neither, so the arrows point one way: vdev, vdev_memory -> vdev_call.
 * Everything here runs under the device set's mutex (GM_VDEV_ENTER).
 * Must not: call into the allocator, or touch device memory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "vdev_internal.h"

/* ------------------------------------------------------------ helpers */

int gm_vdev_set_error(gm_vdev_t *s, int code, const char *text) {
    strncpy(s->last_error, text, sizeof s->last_error - 1);
    s->last_error[sizeof s->last_error - 1] = 0;
    return code;
}

/* Counts the call and applies failure injection. */
int gm_vdev_inject(gm_vdev_t *s, gm_vdev_fn_t fn, size_t size) {
    s->calls[fn]++;
    long n = ++s->inject_calls[fn];
    if (s->cfg.fail_fn == (int)fn && s->cfg.fail_nth == n)
        return gm_vdev_set_error(s, s->cfg.fail_code ? s->cfg.fail_code : GM_EOOM,
                                 "injected failure");
    if (s->cfg.fail_above && size > s->cfg.fail_above &&
        (fn == GM_VDEV_FN_SEG_ALLOC || fn == GM_VDEV_FN_MAP))
        return gm_vdev_set_error(s, GM_EOOM, "injected failure: size above limit");
    return GM_OK;
}

int gm_vdev_bad_device(gm_vdev_t *s, int device) {
    return device < 0 || device >= s->cfg.num_devices;
}

int gm_vdev_grow(void **v, size_t *cap, size_t n, size_t elem) {
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*v, c * elem);
    if (!p)
        return -1;
    *v = p;
    *cap = c;
    return 0;
}
