/*
 * cuda_backend.h - the CUDA driver backend: real GPU memory through libcuda.so.1,
 * loaded with dlopen at run time (nothing CUDA is linked, so gpumem builds
 * and imports on machines without CUDA).
 *
 * One gm_cuda_t per process serves every device: it holds the library,
 * the retained primary contexts and the physical handles of mapped
 * expandable-segment granules. Thread-safe. See cuda_backend.c and cuda_vmm.c
 * for the rules.
 */
#ifndef GM_DEVICE_CUDA_BACKEND_H
#define GM_DEVICE_CUDA_BACKEND_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_cuda gm_cuda_t;

/* Load the driver (path: NULL means $GPUMEM_LIBCUDA, else "libcuda.so.1")
 * and call cuInit(0). On failure returns GM_EDEVICE (or GM_ENOMEM) and
 * writes one sentence to err naming the library or symbol that is missing. */
int gm_cuda_open(const char *path, gm_cuda_t **out, char *err, size_t errlen);
/* Releases the retained primary contexts. The library stays loaded. */
void gm_cuda_close(gm_cuda_t *c);
const gm_backend_t *gm_cuda_backend(gm_cuda_t *c);
int gm_cuda_device_count(gm_cuda_t *c, int *count);
/* The path that was loaded. */
const char *gm_cuda_path(const gm_cuda_t *c);
/* CUresult of the calling thread's last failed driver call (0 if none). */
int gm_cuda_last_result(void);
/* 1 if the device supports virtual memory management (expandable segments),
 * 0 if not, or a negative GM_E* code if the driver could not be asked. */
int gm_cuda_vmm_supported(gm_cuda_t *c, int device);

#ifdef __cplusplus
}
#endif
#endif /* GM_DEVICE_CUDA_BACKEND_H */
