/*
 * fakecuda_image.h - what the fake driver reads from a module image: the
 * kernels of a cubin (ELF), of PTX text, or of a fatbin holding either
 * (fakecuda_image.c, Note [Module images]).
 *
 * Pure parsing: no lock, no driver state. The parser never reads outside
 * the bounds the image's own headers declare, and every kernel it returns
 * has a NUL-terminated, malloc'ed name.
 */
#ifndef FAKECUDA_IMAGE_H
#define FAKECUDA_IMAGE_H

#include <stddef.h>

enum { FC_IMG_CUBIN = 1, FC_IMG_PTX = 2 };

/* One kernel (an entry function) and the attributes its image records. */
typedef struct {
    char *name;
    int regs;           /* registers per thread */
    int local_bytes;    /* per-thread local memory (frame: spills, local arrays) */
    int shared_bytes;   /* static shared memory */
    int const_bytes;    /* user constant memory (bank 3) */
    int param_bytes;    /* size of the parameters in constant bank 0 */
    int max_threads;    /* product of .maxntid / EIATTR_MAX_THREADS; 0: none */
    int req_threads;    /* product of .reqntid / EIATTR_REQNTID; 0: none */
    unsigned cluster[3];/* .reqnctapercluster; all 0: none */
} fc_kinfo_t;

typedef struct {
    int kind;           /* FC_IMG_CUBIN or FC_IMG_PTX */
    int sm;             /* target, e.g. 90 for sm_90 */
    int arch_specific;  /* sm_90a: runs only on exactly that compute capability */
    int ptx_version;    /* PTX ISA as major*10+minor (PTX), else the cubin's virtual arch */
    int nkernels;
    fc_kinfo_t *k;
} fc_image_t;

/* Parse `image` (cubin, PTX text, or fatbin; `len` 0 when unknown, as for
 * cuModuleLoadData) for a device of compute capability major.minor.
 * Returns 0 with *out filled, or the CUresult the real driver gives:
 * CUDA_ERROR_INVALID_IMAGE (not an image), CUDA_ERROR_NO_BINARY_FOR_GPU (no
 * code this device can run), CUDA_ERROR_INVALID_PTX,
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_OUT_OF_MEMORY. */
int fc_image_parse(const void *image, size_t len, int cc_major, int cc_minor, fc_image_t *out);
void fc_image_free(fc_image_t *im);
/* Append a zeroed kernel named name[0..len) (NULL: out of memory). */
fc_kinfo_t *fc_image_add_kernel(fc_image_t *im, const char *name, size_t len);

/* fakecuda_ptx.c: the PTX half of fc_image_parse (text NUL-terminated). */
int fc_ptx_parse(const char *text, int cc_major, int cc_minor, fc_image_t *out);

#endif /* FAKECUDA_IMAGE_H */
