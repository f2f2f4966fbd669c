/*
 * fakecuda_ptx.c - reads the kernels of a PTX module (text) for
 * cuModuleLoadData*: the `.version`, the `.target`, every `.entry` name and
 * the performance-tuning directives that follow it (Note [PTX modules]).
 *
 * Invariants: reads only up to the text's terminating NUL.
 * Must not: take the driver lock or touch driver state (pure parsing).
 */
#include "fakecuda_internal.h"
#include "fakecuda_image.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Note [PTX modules]
 * Rationale: a PTX image is compiled by the driver's JIT for the device;
 *   there is no JIT here, so the attributes come from the text.
 * Approach: per the PTX ISA: `.version M.N` must come first and a
 *   `.target sm_XY[a|f]` must follow; the driver rejects PTX whose ISA is
 *   newer than it knows (CUDA_ERROR_UNSUPPORTED_PTX_VERSION; a 13.0 driver
 *   knows ISA 9.0) and a target above the device
 *   (CUDA_ERROR_INVALID_PTX, as the JIT fails). Each `.entry NAME` is a
 *   kernel; `.maxntid`, `.reqntid`, `.reqnctapercluster` and `.maxnreg`
 *   between its parameter list and its body are read; `.shared`
 *   declarations in the body add to its static shared memory (element size
 *   times count).
 * Limitations: no JIT, so the register count is .maxnreg when given and
 *   otherwise 32 (a typical small kernel; the real count is what ptxas would
 *   choose); no local memory, spills or parameter sizes; module-scope
 *   .shared variables are not charged to kernels.
 */

#define FC_PTX_ISA_MAX 90 /* PTX ISA 9.0, the newest a CUDA 13.0 driver knows */
#define FC_PTX_DEFAULT_REGS 32

static const char *skip_ws(const char *p)
{
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
        } else {
            return p;
        }
    }
}

/* The next occurrence of directive d (followed by a non-identifier char). */
static const char *find_dir(const char *p, const char *d, const char *end)
{
    size_t n = strlen(d);
    for (const char *q = strstr(p, d); q && (!end || q < end); q = strstr(q + 1, d)) {
        char c = q[n];
        if (!isalnum((unsigned char)c) && c != '_')
            return q;
    }
    return NULL;
}

/* Up to 3 comma-separated numbers after a directive; their product. */
static long dims(const char *p, unsigned out[3])
{
    long prod = 1;
    out[0] = out[1] = out[2] = 1;
    for (int i = 0; i < 3; i++) {
        p = skip_ws(p);
        if (!isdigit((unsigned char)*p))
            return i ? prod : 0;
        char *e;
        unsigned long v = strtoul(p, &e, 10);
        out[i] = (unsigned)v;
        prod *= (long)(v ? v : 1);
        if (prod > 1L << 30)
            prod = 1L << 30;
        p = skip_ws(e);
        if (*p != ',')
            return prod;
        p++;
    }
    return prod;
}

static int type_bytes(const char *t)
{
    if (!strncmp(t, ".b8", 3) || !strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3))
        return 1;
    if (!strncmp(t, ".b16", 4) || !strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4) ||
        !strncmp(t, ".f16", 4))
        return 2;
    if (!strncmp(t, ".b64", 4) || !strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) ||
        !strncmp(t, ".f64", 4))
        return 8;
    return 4;
}

/* Static shared bytes declared in a body [p, end): `.shared` at the start
 * of a statement (not the state space of ld.shared / st.shared). */
static long shared_in(const char *p, const char *end)
{
    long total = 0;
    for (const char *q = p; (q = find_dir(q, ".shared", end)) != NULL; q += 7) {
        if (q > p && !isspace((unsigned char)q[-1]) && q[-1] != ';' && q[-1] != '{')
            continue;
        const char *semi = strchr(q, ';');
        if (!semi || semi > end)
            break;
        int sz = 4;
        for (const char *t = q + 7; t < semi; t++)
            if (*t == '.' && strncmp(t, ".align", 6)) {
                sz = type_bytes(t);
                break;
            }
        const char *br = memchr(q, '[', (size_t)(semi - q));
        long count = br ? strtol(br + 1, NULL, 10) : 1;
        total += sz * (count > 0 ? count : 1);
    }
    return total;
}

/* The '}' that closes the '{' at p, or NULL. */
static const char *closing(const char *p)
{
    int depth = 0;
    for (; *p; p++) {
        if (*p == '{')
            depth++;
        else if (*p == '}' && --depth == 0)
            return p;
    }
    return NULL;
}

int fc_ptx_parse(const char *text, int cc_major, int cc_minor, fc_image_t *out)
{
    out->kind = FC_IMG_PTX;
    const char *v = find_dir(text, ".version", NULL);
    const char *t = find_dir(text, ".target", NULL);
    if (!v || !t || skip_ws(text) != v)
        return CUDA_ERROR_INVALID_IMAGE; /* not PTX */
    unsigned maj = 0, min = 0;
    if (sscanf(v + 8, " %u.%u", &maj, &min) != 2)
        return CUDA_ERROR_INVALID_PTX;
    out->ptx_version = (int)(maj * 10 + min);
    if (out->ptx_version > FC_PTX_ISA_MAX)
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    unsigned sm = 0;
    char suffix = 0;
    if (sscanf(skip_ws(t + 7), "sm_%u%c", &sm, &suffix) < 1)
        return CUDA_ERROR_INVALID_PTX;
    out->sm = (int)sm;
    out->arch_specific = suffix == 'a';
    int dev = cc_major * 10 + cc_minor;
    if ((int)sm > dev || (out->arch_specific && (int)sm != dev))
        return CUDA_ERROR_INVALID_PTX;
    for (const char *p = text; (p = find_dir(p, ".entry", NULL)) != NULL;) {
        p = skip_ws(p + 6);
        const char *n = p;
        while (isalnum((unsigned char)*p) || *p == '_' || *p == '$' || *p == '.')
            p++;
        if (p == n)
            return CUDA_ERROR_INVALID_PTX;
        const char *body = strchr(p, '{');
        const char *close = body ? closing(body) : NULL;
        if (!body || !close)
            return CUDA_ERROR_INVALID_PTX;
        fc_kinfo_t *k = fc_image_add_kernel(out, n, (size_t)(p - n));
        if (!k)
            return CUDA_ERROR_OUT_OF_MEMORY;
        k->regs = FC_PTX_DEFAULT_REGS;
        /* directives sit between the parameter list and the body */
        const char *params_end = strchr(p, ')');
        const char *d0 = params_end && params_end < body ? params_end : p;
        unsigned tmp[3];
        const char *d;
        if ((d = find_dir(d0, ".maxntid", body)))
            k->max_threads = (int)dims(d + 8, tmp);
        if ((d = find_dir(d0, ".reqntid", body)))
            k->req_threads = (int)dims(d + 8, tmp);
        if ((d = find_dir(d0, ".reqnctapercluster", body)) && dims(d + 18, k->cluster) == 0)
            memset(k->cluster, 0, sizeof k->cluster);
        if ((d = find_dir(d0, ".maxnreg", body)))
            k->regs = (int)strtol(d + 8, NULL, 10);
        k->shared_bytes = (int)shared_in(body, close);
        p = body;
    }
    return 0;
}
