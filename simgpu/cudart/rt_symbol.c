/*
 * rt_symbol.c - __device__ variables in the fake runtime: every
 * __cudaRegisterVar / __cudaRegisterManagedVar is remembered (host address
 * -> size); the symbol's "device" copy is host memory allocated on first
 * use, so cudaGetSymbolAddress/Size and cudaMemcpyToSymbol/FromSymbol
 * round-trip.
 *
 * Invariants: the table only grows; var_mu protects it and each entry's
 * storage pointer.
 *
 * Must not: touch a variable's host copy (the registering library owns it).
 */
#include "rt_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static uint64_t n_vars; /* atomic */

typedef struct {
    const void *host;
    size_t size;
    void *storage; /* allocated on first use */
} rt_var_t;

static pthread_mutex_t var_mu = PTHREAD_MUTEX_INITIALIZER;
static rt_var_t *vars;
static size_t nvars, capvars;
static void register_var(const void *host, size_t size)
{
    pthread_mutex_lock(&var_mu);
    if (nvars == capvars) {
        size_t cap = capvars ? capvars * 2 : 1024;
        rt_var_t *v = realloc(vars, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&var_mu);
            return;
        }
        vars = v;
        capvars = cap;
    }
    vars[nvars].host = host;
    vars[nvars].size = size;
    vars[nvars].storage = NULL;
    nvars++;
    pthread_mutex_unlock(&var_mu);
    __atomic_fetch_add(&n_vars, 1, __ATOMIC_RELAXED);
}

RT_API void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                        const char *deviceName, int ext, size_t size, int constant,
                                        int global)
{
    SIM_ENTRY("__cudaRegisterVar");
    (void)fatCubinHandle, (void)deviceAddress, (void)deviceName, (void)ext, (void)constant;
    (void)global;
    register_var(hostVar, size);
}

RT_API void CUDARTAPI __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                                               char *deviceAddress, const char *deviceName, int ext,
                                               size_t size, int constant, int global)
{
    SIM_ENTRY("__cudaRegisterManagedVar");
    (void)fatCubinHandle, (void)deviceAddress, (void)deviceName, (void)ext, (void)constant;
    (void)global;
    register_var(hostVarPtrAddress, size);
}
void *rt_symbol_address(const void *symbol, size_t *size)
{
    void *p = NULL;
    pthread_mutex_lock(&var_mu);
    for (size_t i = 0; i < nvars; i++) {
        if (vars[i].host != symbol)
            continue;
        if (!vars[i].storage)
            vars[i].storage = calloc(1, vars[i].size ? vars[i].size : 1);
        p = vars[i].storage;
        if (size)
            *size = vars[i].size;
        break;
    }
    pthread_mutex_unlock(&var_mu);
    return p;
}

RT_API cudaError_t CUDARTAPI cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    SIM_ENTRY("cudaGetSymbolAddress");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    void *p = rt_symbol_address(symbol, NULL);
    if (!devPtr || !p)
        return rt_err(devPtr ? cudaErrorInvalidSymbol : cudaErrorInvalidValue);
    *devPtr = p;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaGetSymbolSize(size_t *size, const void *symbol)
{
    SIM_ENTRY("cudaGetSymbolSize");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!size)
        return rt_err(cudaErrorInvalidValue);
    return rt_symbol_address(symbol, size) ? cudaSuccess : rt_err(cudaErrorInvalidSymbol);
}

static cudaError_t symbol_copy(void *dst, const void *src, const void *symbol, size_t count,
                               size_t offset, int to_symbol)
{
    size_t size = 0;
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    char *p = rt_symbol_address(symbol, &size);
    if (!p)
        return rt_err(cudaErrorInvalidSymbol);
    if (offset > size || count > size - offset)
        return rt_err(cudaErrorInvalidValue);
    if (count == 0)
        return cudaSuccess;
    if (to_symbol)
        memmove(p + offset, src, count);
    else
        memmove(dst, p + offset, count);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
                                                size_t offset, enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpyToSymbol");
    (void)kind;
    return symbol_copy(NULL, src, symbol, count, offset, 1);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyToSymbolAsync(const void *symbol, const void *src,
                                                     size_t count, size_t offset,
                                                     enum cudaMemcpyKind kind, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpyToSymbolAsync");
    (void)kind, (void)stream;
    return symbol_copy(NULL, src, symbol, count, offset, 1);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
                                                  size_t offset, enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpyFromSymbol");
    (void)kind;
    return symbol_copy(dst, NULL, symbol, count, offset, 0);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
                                                       size_t offset, enum cudaMemcpyKind kind,
                                                       cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpyFromSymbolAsync");
    (void)kind, (void)stream;
    return symbol_copy(dst, NULL, symbol, count, offset, 0);
}

uint64_t rt_symbol_count(void) { return __atomic_load_n(&n_vars, __ATOMIC_RELAXED); }
