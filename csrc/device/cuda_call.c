/*
 * cuda_call.c - one driver call of the CUDA driver backend: the calling
 * thread's last error (CUresult and text, thread-local), turning a failed
 * CUresult into a GM_E* code, and the guard that makes the device's primary
 * context current for the call. Used by cuda_backend.c (plain memory,
 * events, the backend table) and cuda_vmm.c (virtual memory management);
 * calls neither, so the arrows point one way: backend, vmm -> call.
 *
 * Rules (see cuda_backend.c's header for the context rules):
 *   - CUDA_ERROR_OUT_OF_MEMORY becomes GM_EOOM, CUDA_ERROR_NOT_READY
 *     GM_ENOTREADY; the text comes from cuGetErrorName / cuGetErrorString.
 *   - A thread whose current context is another one gets the primary
 *     context pushed for the call and popped afterwards.
 * Must not: call into the allocator, take the GIL, or abort.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

/* ------------------------------------------------------------ errors */

static _Thread_local int tls_result;                   /* thread-local */
static _Thread_local char tls_error[GM_CUDA_ERROR_LEN]; /* thread-local */

int gm_cuda_last_result(void) { return tls_result; }

const char *gm_cuda_last_error(void) { return tls_error; }

int gm_cuda_fail(gm_cuda_t *c, const char *fn, CUresult r) {
    const char *name = NULL, *text = NULL;
    if (c && c->p_cuGetErrorName)
        c->p_cuGetErrorName(r, &name);
    if (c && c->p_cuGetErrorString)
        c->p_cuGetErrorString(r, &text);
    tls_result = (int)r;
    snprintf(tls_error, sizeof tls_error, "%s failed: %s (%d): %s", fn, name ? name : "CUDA_ERROR",
             (int)r, text ? text : "unknown error");
    switch ((int)r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        return GM_EOOM;
    case CUDA_ERROR_NOT_READY:
        return GM_ENOTREADY;
    case CUDA_ERROR_NOT_SUPPORTED:
        return GM_ENOTSUP;
    default:
        return GM_EDEVICE;
    }
}

int gm_cuda_ok_or(gm_cuda_t *c, CUresult r, const char *fn) {
    return r == CUDA_SUCCESS ? GM_OK : gm_cuda_fail(c, fn, r);
}

int gm_cuda_set_error(int code, int result, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tls_result = result;
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    return code;
}

void gm_cuda_error_save(gm_cuda_error_state_t *out) {
    out->result = tls_result;
    memcpy(out->text, tls_error, sizeof out->text);
}

void gm_cuda_error_restore(const gm_cuda_error_state_t *saved) {
    tls_result = saved->result;
    memcpy(tls_error, saved->text, sizeof tls_error);
}

/* ------------------------------------------------------------ contexts */

static int primary_ctx(gm_cuda_t *c, int device, CUcontext *out) {
    if (device < 0 || device >= c->n_devices)
        return gm_cuda_set_error(GM_EINVAL, 0, "invalid device ordinal %d (%d devices)", device,
                                 c->n_devices);
    pthread_mutex_lock(&c->lock);
    if (!c->primary[device]) {
        CUdevice dev;
        CUresult r = c->p_cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS)
            r = c->p_cuDevicePrimaryCtxRetain(&c->primary[device], dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&c->lock);
            return gm_cuda_fail(c, "cuDevicePrimaryCtxRetain", r);
        }
    }
    *out = c->primary[device];
    pthread_mutex_unlock(&c->lock);
    return GM_OK;
}

/* Make the device's primary context current for one call. */
int gm_cuda_enter(gm_cuda_t *c, int device, gm_cuda_guard_t *g) {
    g->pushed = 0;
    CUcontext want = NULL, cur = NULL;
    int rc = primary_ctx(c, device, &want);
    if (rc)
        return rc;
    GM_CUDA_CHECK(c, c->p_cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
    if (cur == want)
        return GM_OK;
    if (!cur) {
        GM_CUDA_CHECK(c, c->p_cuCtxSetCurrent(want), "cuCtxSetCurrent");
        return GM_OK;
    }
    GM_CUDA_CHECK(c, c->p_cuCtxPushCurrent_v2(want), "cuCtxPushCurrent");
    g->pushed = 1;
    return GM_OK;
}

int gm_cuda_leave(gm_cuda_t *c, gm_cuda_guard_t *g, int rc) {
    if (g->pushed) {
        CUcontext popped;
        CUresult r = c->p_cuCtxPopCurrent_v2(&popped);
        if (r != CUDA_SUCCESS && rc == GM_OK)
            return gm_cuda_fail(c, "cuCtxPopCurrent", r);
    }
    return rc;
}
