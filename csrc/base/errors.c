/*
 * errors.c - the text of each GM_E* code (errors.h).
 */
#include "errors.h"

const char *gm_strerror(int code) {
    switch (code) {
    case GM_OK: return "success";
    case GM_EOOM: return "out of memory";
    case GM_EINVAL: return "invalid argument";
    case GM_ENOTFOUND: return "pointer was not allocated by this allocator";
    case GM_EDOUBLEFREE: return "pointer was already freed";
    case GM_ENOTREADY: return "event not ready";
    case GM_ENOTSUP: return "not supported by this device";
    case GM_EDEVICE: return "device error";
    case GM_ENOMEM: return "out of host memory";
    case GM_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}
