/*
 * fakecuda_gpu.c - the device properties the fake driver reports: which GPU
 * model it pretends to be.
 *
 * Without GPUMEM_SIM_GPU the device is an H100 SXM5 80GB, as the fake
 * always was. gpumem simulate --gpu MODEL sets GPUMEM_SIM_GPU to the
 * model's properties (gpumem/sim/gpus.py holds the presets, from NVIDIA's
 * published specifications), as ';'-separated key=value pairs:
 *
 *   name=NVIDIA L4;sm=58;cc=8.9;threads_per_sm=1536;blocks_per_sm=24;
 *   smem_per_sm=102400;smem_per_block_optin=101376;l2=50331648;
 *   regs_per_sm=65536;clock_khz=2040000;mem_clock_khz=6251000;bus_bits=192;
 *   mem_bw_gbs=300;pcie_gbs=32;context_mib=340
 *
 * mem_bw_gbs and pcie_gbs set the speed of copies and memsets on the device
 * timeline (Note [Device timeline]); context_mib the device memory the
 * primary context holds (Note [Context memory]; GPUMEM_SIM_CONTEXT_MEMORY
 * overrides it), or context_kib, the same in KiB, for a figure measured on
 * a real GPU (it wins over context_mib).
 *
 * Keys not given keep the H100's value; an unknown key or a bad number
 * makes cuInit fail (with one line on stderr), as every other bad
 * GPUMEM_SIM_* variable does.
 */
#include "fakecuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fc_gpu_default(fc_gpu_t *g)
{
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    g->sm_count = 132;
    g->cc_major = 9;
    g->cc_minor = 0;
    g->threads_per_sm = 2048;
    g->blocks_per_sm = 32;
    g->smem_per_sm = 233472;
    g->smem_per_block_optin = 232448;
    g->l2_bytes = 52428800;
    g->regs_per_sm = 65536;
    g->clock_khz = 1980000;
    g->mem_clock_khz = 2619000;
    g->bus_bits = 5120;
    g->mem_bw_gbs = 3350; /* HBM3, H100 SXM5 data sheet */
    g->pcie_gbs = 64;     /* PCIe Gen5 x16, one direction */
    g->context_mib = 0;   /* the bare driver's context holds nothing (Note [Context memory]) */
}

/* *out = the decimal integer s (1 .. 2**31 - 1); 0 on success. */
static int parse_int(const char *s, size_t len, int *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] < '0' || buf[i] > '9')
            return -1;
    errno = 0;
    long v = strtol(buf, NULL, 10);
    if (errno || v <= 0 || v > 0x7fffffffL)
        return -1;
    *out = (int)v;
    return 0;
}

/* "M.N" with single-digit-or-more parts. */
static int parse_cc(const char *s, size_t len, int *major, int *minor)
{
    const char *dot = memchr(s, '.', len);
    if (!dot)
        return -1;
    int mi = 0;
    size_t nmin = len - (size_t)(dot - s) - 1;
    if (parse_int(s, (size_t)(dot - s), major))
        return -1;
    if (nmin == 1 && dot[1] == '0') /* minor 0 is allowed, parse_int refuses 0 */
        mi = 0;
    else if (parse_int(dot + 1, nmin, &mi))
        return -1;
    *minor = mi;
    return 0;
}

int fc_gpu_parse(const char *spec, fc_gpu_t *g, char *err, size_t errlen)
{
    static const struct {
        const char *key;
        size_t off;
    } ints[] = {
        {"sm", offsetof(fc_gpu_t, sm_count)},
        {"threads_per_sm", offsetof(fc_gpu_t, threads_per_sm)},
        {"blocks_per_sm", offsetof(fc_gpu_t, blocks_per_sm)},
        {"smem_per_sm", offsetof(fc_gpu_t, smem_per_sm)},
        {"smem_per_block_optin", offsetof(fc_gpu_t, smem_per_block_optin)},
        {"l2", offsetof(fc_gpu_t, l2_bytes)},
        {"regs_per_sm", offsetof(fc_gpu_t, regs_per_sm)},
        {"clock_khz", offsetof(fc_gpu_t, clock_khz)},
        {"mem_clock_khz", offsetof(fc_gpu_t, mem_clock_khz)},
        {"bus_bits", offsetof(fc_gpu_t, bus_bits)},
        {"mem_bw_gbs", offsetof(fc_gpu_t, mem_bw_gbs)},
        {"pcie_gbs", offsetof(fc_gpu_t, pcie_gbs)},
        {"context_mib", offsetof(fc_gpu_t, context_mib)},
        {"context_kib", offsetof(fc_gpu_t, context_kib)},
    };
    fc_gpu_default(g);
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        if (n == 0) {
            p += end ? 1 : 0;
            continue;
        }
        if (!eq) {
            snprintf(err, errlen, "entry '%.*s' is not key=value", (int)(n > 40 ? 40 : n), p);
            return -1;
        }
        size_t klen = (size_t)(eq - p), vlen = n - klen - 1;
        const char *v = eq + 1;
        int ok = -1;
        if (klen == 4 && !strncmp(p, "name", 4)) {
            if (vlen > 0 && vlen < sizeof g->name) {
                memcpy(g->name, v, vlen);
                g->name[vlen] = 0;
                ok = 0;
            }
        } else if (klen == 2 && !strncmp(p, "cc", 2)) {
            ok = parse_cc(v, vlen, &g->cc_major, &g->cc_minor);
        } else {
            size_t i;
            for (i = 0; i < sizeof ints / sizeof ints[0]; i++)
                if (strlen(ints[i].key) == klen && !strncmp(p, ints[i].key, klen))
                    break;
            if (i == sizeof ints / sizeof ints[0]) {
                snprintf(err, errlen, "unknown key '%.*s'", (int)(klen > 40 ? 40 : klen), p);
                return -1;
            }
            ok = parse_int(v, vlen, (int *)((char *)g + ints[i].off));
        }
        if (ok) {
            snprintf(err, errlen, "bad value for '%.*s'", (int)(klen > 40 ? 40 : klen), p);
            return -1;
        }
        p += n + (end ? 1 : 0);
    }
    return 0;
}
