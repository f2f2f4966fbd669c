/*
 * errors.h - the error codes every layer returns (base: includes nothing of
 * gpumem's).
 *
 * 0 is success; every failure is a negative GM_E* code. core/ and device/
 * return them and hand results back through out-parameters; only the
 * Python layer turns them into exceptions. gm_strerror never returns NULL.
 */
#ifndef GM_BASE_ERRORS_H
#define GM_BASE_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GM_OK = 0,
    GM_EOOM = -1,        /* out of memory: device refused, or the limit was hit */
    GM_EINVAL = -2,      /* bad argument */
    GM_ENOTFOUND = -3,   /* pointer not allocated by this allocator */
    GM_EDOUBLEFREE = -4, /* pointer was already freed */
    GM_ENOTREADY = -5,   /* event not complete yet (normal answer) */
    GM_ENOTSUP = -6,     /* operation not supported by this backend */
    GM_EDEVICE = -7,     /* any other device/driver error; see last_error() */
    GM_ENOMEM = -8,      /* host memory for bookkeeping ran out */
    GM_ESTATE = -9       /* operation not valid in the current state */
};

/* 1 if rc is 0 or one of the codes above: all that a function of core/ or
 * device/ may return. */
static inline int gm_is_code(int rc) { return rc <= GM_OK && rc >= GM_ESTATE; }

const char *gm_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif /* GM_BASE_ERRORS_H */
