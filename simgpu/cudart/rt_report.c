/*
 * rt_report.c - the simulator's report: what the program called and what
 * the simulated GPU saw.
 *
 *   int gpumem_sim_cudart_report_json(char *buf, size_t len);
 *
 * returns (snprintf semantics) one JSON object:
 *   {"version": 1, "library": "libcudart.so.13", "pid": ...,
 *    "calls": {name: count, ...}, "stubs_hit": [unimplemented names called],
 *    "kernels": {...}, "host": {...pinned memory...},
 *    "driver": <the fake libcuda's fakecuda_report_json: capacity, usage,
 *               peaks, per-function counts, leaks>,
 *    "cublas": <...>, "cublasLt": <...> and "nccl": <...> when those fakes
 *    are loaded}
 *
 * With GPUMEM_SIM_REPORT=PATH the same object is written to PATH when the
 * process exits (atomically; only by the process that loaded the library,
 * not by forked children). A "%p" in PATH stands for the process id, so
 * that every process of a launcher's job writes its own report
 * (python -m gpumem.sim --report gathers them); "rank" is $RANK, or null.
 */
#include "rt_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Exported by the fake libcuda.so.1 (simgpu/driver). Linking against it
 * also makes sure this runtime never runs on a real driver: with NVIDIA's
 * libcuda.so.1 loaded instead, loading this library fails on the name. */
int fakecuda_report_json(char *buf, size_t len);

typedef int (*report_fn)(char *, size_t);

/* Appends `"key": <fn's JSON>` (a JSON null if fn is missing or fails). */
static void embed(sim_sb_t *sb, const char *key, report_fn fn)
{
    sim_sb_printf(sb, ", \"%s\": ", key);
    int n = fn ? fn(NULL, 0) : -1;
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fn(buf, (size_t)n + 1) == n)
        sim_sb_printf(sb, "%s", buf);
    else
        sim_sb_printf(sb, "null");
    free(buf);
}

SIM_API int gpumem_sim_cudart_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    sim_sb_printf(&sb, "{\"version\": 1, \"library\": \"%s\", \"pid\": %ld, ", sim_table.soname,
                  (long)getpid());
    const char *rank = getenv("RANK");
    char *end = NULL;
    long r = rank && *rank ? strtol(rank, &end, 10) : -1;
    if (end && *end == '\0' && r >= 0)
        sim_sb_printf(&sb, "\"rank\": %ld, ", r);
    else
        sim_sb_printf(&sb, "\"rank\": null, ");
    sim_report_calls(&sb);
    sim_sb_printf(&sb, ", ");
    rt_launch_report(&sb);
    sim_sb_printf(&sb, ", ");
    rt_host_report(&sb);
    embed(&sb, "driver", fakecuda_report_json);
    embed(&sb, "cublas", (report_fn)dlsym(RTLD_DEFAULT, "gpumem_sim_cublas_report_json"));
    embed(&sb, "cublasLt", (report_fn)dlsym(RTLD_DEFAULT, "gpumem_sim_cublaslt_report_json"));
    embed(&sb, "nccl", (report_fn)dlsym(RTLD_DEFAULT, "gpumem_sim_nccl_report_json"));
    sim_sb_printf(&sb, "}");
    return sim_sb_finish(&sb, buf, len);
}

static long load_pid;

__attribute__((constructor)) static void rt_report_load(void) { load_pid = (long)getpid(); }

__attribute__((destructor)) static void rt_report_exit(void)
{
    const char *path = getenv("GPUMEM_SIM_REPORT");
    if (!path || !*path || (long)getpid() != load_pid)
        return;
    int n = gpumem_sim_cudart_report_json(NULL, 0);
    if (n < 0)
        return;
    char *buf = malloc((size_t)n + 2);
    if (!buf)
        return;
    gpumem_sim_cudart_report_json(buf, (size_t)n + 1);
    buf[n] = '\n';
    const char *pp = strstr(path, "%p");
    size_t plen = strlen(path);
    char *own = pp ? malloc(plen + 24) : NULL;
    if (own)   /* "%p": this process's id (the first one only) */
        snprintf(own, plen + 24, "%.*s%ld%s", (int)(pp - path), path, load_pid, pp + 2);
    sim_write_file_atomic(own ? own : path, buf, (size_t)n + 1);
    free(own);
    free(buf);
}
