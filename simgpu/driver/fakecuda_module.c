/*
 * fakecuda_module.c - modules and the functions in them: cuModuleLoad,
 * cuModuleLoadData, cuModuleLoadDataEx, cuModuleUnload,
 * cuModuleGetFunction, cuFuncGetName.
 *
 * A module is the parsed image (fakecuda_image.c, Note [Module images]) and
 * one fc_func_t per kernel; nothing is executed, so no code is kept.
 * Invariants: module and function handles are opaque numbers from the
 * never-repeating id counter (FC_HANDLE_MODULE / FC_HANDLE_FUNC), so a
 * handle used after cuModuleUnload, or after a reset of the context the
 * module was loaded in, is always CUDA_ERROR_INVALID_HANDLE; fc.functions
 * holds exactly the functions of the modules in fc.modules.
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The default of CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h):
 * the per-block limit less the static shared memory, 0 if that is above. */
#define FC_SMEM_PER_BLOCK 49152

static void module_free(fc_module_t *m)
{
    if (!m)
        return;
    fc_image_free(&m->img);
    free(m->funcs);
    free(m);
}

static void module_remove_unlocked(fc_module_t *m)
{
    for (int i = 0; i < m->img.nkernels; i++)
        fc_vec_remove(&fc.functions, m->funcs[i].handle);
    fc_vec_remove(&fc.modules, m->handle);
    module_free(m);
}

void fc_module_reset_ctx_unlocked(struct CUctx_st *ctx)
{
    for (size_t i = fc.modules.n; i-- > 0;) {
        fc_module_t *m = fc.modules.v[i].val;
        if (m->ctx == ctx)
            module_remove_unlocked(m);
    }
}

CUresult fc_func_lookup_unlocked(CUfunction h, fc_func_t **out)
{
    fc_func_t *f = h ? fc_vec_find(&fc.functions, (uint64_t)(uintptr_t)h) : NULL;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = f;
    return CUDA_SUCCESS;
}

/* Parse and register an image (len 0: unknown) in the current context. */
static CUresult load_unlocked(CUmodule *module, const void *image, size_t len)
{
    struct CUctx_st *ctx;
    CUresult res = fc_current_ctx_unlocked(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    fc_module_t *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int rc = fc_image_parse(image, len, fc.gpu.cc_major, fc.gpu.cc_minor, &m->img);
    if (rc) {
        free(m);
        return (CUresult)rc;
    }
    m->ctx = ctx;
    m->handle = FC_HANDLE_MODULE | fc_new_id_unlocked();
    m->funcs = calloc((size_t)m->img.nkernels + 1, sizeof *m->funcs);
    if (!m->funcs || fc_vec_insert(&fc.modules, m->handle, m) != 0) {
        module_free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < m->img.nkernels; i++) {
        fc_func_t *f = &m->funcs[i];
        f->handle = FC_HANDLE_FUNC | fc_new_id_unlocked();
        f->mod = m;
        f->k = &m->img.k[i];
        f->max_dyn_shared = f->k->shared_bytes > FC_SMEM_PER_BLOCK
                                ? 0 : FC_SMEM_PER_BLOCK - f->k->shared_bytes;
        f->carveout = -1;
        for (int d = 0; d < 3; d++)
            f->cluster[d] = (int)f->k->cluster[d];
        if (fc_vec_insert(&fc.functions, f->handle, f) != 0) {
            module_remove_unlocked(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *module = (CUmodule)(uintptr_t)m->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    FC_BEGIN(FN_cuModuleLoadData, 1);
    if (!module || !image)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    res = load_unlocked(module, image, 0);
    FC_END();
}

/* The JIT options only steer a compilation that does not happen here; they
 * are checked for presence as documented and otherwise ignored. */
FC_API CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                           unsigned int numOptions, CUjit_option *options,
                                           void **optionValues)
{
    FC_BEGIN(FN_cuModuleLoadDataEx, 1);
    if (!module || !image || (numOptions && (!options || !optionValues)))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    res = load_unlocked(module, image, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    FC_BEGIN(FN_cuModuleLoad, 1);
    if (!module || !fname)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    FILE *fp = fopen(fname, "rb");
    if (!fp)
        FC_FAIL(CUDA_ERROR_FILE_NOT_FOUND);
    char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, fp) == (size_t)n) {
        buf[n] = 0; /* PTX text needs its NUL */
        res = n == 0 ? CUDA_ERROR_INVALID_IMAGE : load_unlocked(module, buf, (size_t)n + 1);
    } else {
        res = buf ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_OUT_OF_MEMORY;
    }
    free(buf);
    fclose(fp);
    FC_END();
}

FC_API CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    FC_BEGIN(FN_cuModuleUnload, 1);
    fc_module_t *m = hmod ? fc_vec_find(&fc.modules, (uint64_t)(uintptr_t)hmod) : NULL;
    if (!m)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    module_remove_unlocked(m);
    FC_END();
}

FC_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FC_BEGIN(FN_cuModuleGetFunction, 1);
    if (!hfunc || !name)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc_module_t *m = hmod ? fc_vec_find(&fc.modules, (uint64_t)(uintptr_t)hmod) : NULL;
    if (!m)
        FC_FAIL(CUDA_ERROR_INVALID_HANDLE);
    for (int i = 0; i < m->img.nkernels; i++) {
        if (!strcmp(m->img.k[i].name, name)) {
            *hfunc = (CUfunction)(uintptr_t)m->funcs[i].handle;
            FC_FAIL(CUDA_SUCCESS);
        }
    }
    res = CUDA_ERROR_NOT_FOUND;
    FC_END();
}

FC_API CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
    FC_BEGIN(FN_cuFuncGetName, 1);
    fc_func_t *f;
    if (!name)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = fc_func_lookup_unlocked(hfunc, &f)) != CUDA_SUCCESS)
        goto done;
    *name = f->k->name;
    FC_END();
}
