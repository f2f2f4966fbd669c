/*
 * simcommon.c - call counting, stubs and logging shared by
 * the simulator's fake libraries (see simcommon.h).
 *
 * Environment (read once, at the first call that needs it):
 *   GPUMEM_SIM_LOG    where "not implemented" notes go: unset/empty/0 -> nowhere,
 *                     1/stderr/- -> stderr, anything else -> that file (appended).
 *   GPUMEM_SIM_TRACE  every call, one line "<soname> <name>", same destinations.
 *                     For finding out what a program calls; slow.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "simcommon.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((weak)) void sim_lib_on_unsupported(int code) { (void)code; }
__attribute__((weak)) int sim_lib_check_handle(void *handle)
{
    (void)handle;
    return 0;
}

/* ------------------------------------------------------------------ */
/* destinations                                                         */

static pthread_once_t dest_once = PTHREAD_ONCE_INIT;
static int log_fd = -1, trace_fd = -1;

static int open_dest(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v || strcmp(v, "0") == 0)
        return -1;
    if (strcmp(v, "1") == 0 || strcmp(v, "stderr") == 0 || strcmp(v, "-") == 0)
        return 2;
    int fd = open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return fd >= 0 ? fd : 2; /* an unwritable path still reports somewhere */
}

static void open_dests(void)
{
    log_fd = open_dest("GPUMEM_SIM_LOG");
    trace_fd = open_dest("GPUMEM_SIM_TRACE");
}

static void write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, s, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

int sim_log_enabled(void)
{
    pthread_once(&dest_once, open_dests);
    return log_fd >= 0;
}

void sim_log(const char *fmt, ...)
{
    if (!sim_log_enabled())
        return;
    char line[512];
    int k = snprintf(line, sizeof line, "gpumem-sim: %s: ", sim_table.soname);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < sizeof line)
        k += vsnprintf(line + k, sizeof line - (size_t)k, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k >= sizeof line - 1)
        k = (int)sizeof line - 2;
    line[k++] = '\n';
    write_all(log_fd, line, (size_t)k);
}

/* ------------------------------------------------------------------ */
/* counting and stubs                                                   */

static void trace(int idx)
{
    pthread_once(&dest_once, open_dests);
    if (trace_fd < 0)
        return;
    char line[256];
    int k = snprintf(line, sizeof line, "%s %s\n", sim_table.soname, sim_table.names[idx]);
    if (k > 0)
        write_all(trace_fd, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1);
}

static int lookup(const char *name)
{
    size_t lo = 0, hi = sim_table.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sim_table.names[mid], name);
        if (c == 0)
            return (int)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int)sim_table.n;
}

static void count(int idx)
{
    __atomic_fetch_add(&sim_table.calls[idx], 1, __ATOMIC_RELAXED);
    trace(idx);
}

void sim_count(int *slot, const char *name)
{
    int idx = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (idx < 0) {
        idx = lookup(name);
        __atomic_store_n(slot, idx, __ATOMIC_RELAXED);
    }
    if ((size_t)idx < sim_table.n)
        count(idx);
}

static void first_hit(int idx, const char *what)
{
    if (__atomic_exchange_n(&sim_table.stub_hit[idx], 1, __ATOMIC_RELAXED) == 0)
        sim_log("%s %s", sim_table.names[idx], what);
}

int sim_stub(int idx)
{
    count(idx);
    first_hit(idx, "is not implemented by the simulator; it returned \"not supported\"");
    sim_lib_on_unsupported(sim_table.unsupported_code);
    return sim_table.unsupported_code;
}

int sim_stub_noop(int idx, void *handle)
{
    count(idx);
    first_hit(idx, "does nothing in the simulator (no-op, success)");
    return sim_lib_check_handle(handle);
}

void sim_report_calls(sim_sb_t *sb)
{
    int first = 1;
    sim_sb_printf(sb, "\"calls\": {");
    for (size_t i = 0; i < sim_table.n; i++) {
        uint64_t c = __atomic_load_n(&sim_table.calls[i], __ATOMIC_RELAXED);
        if (!c)
            continue;
        sim_sb_printf(sb, "%s\"%s\": %llu", first ? "" : ", ", sim_table.names[i],
                      (unsigned long long)c);
        first = 0;
    }
    sim_sb_printf(sb, "}, \"stubs_hit\": [");
    first = 1;
    for (size_t i = 0; i < sim_table.n; i++) {
        if (!__atomic_load_n(&sim_table.stub_hit[i], __ATOMIC_RELAXED))
            continue;
        sim_sb_printf(sb, "%s\"%s\"", first ? "" : ", ", sim_table.names[i]);
        first = 0;
    }
    sim_sb_printf(sb, "]");
}

/* ------------------------------------------------------------------ */
/* the driver's no-host-memory mode                                     */

static pthread_once_t query_once = PTHREAD_ONCE_INIT;
static long long (*driver_query)(const char *, int);

static void find_query(void)
{
    driver_query = (long long (*)(const char *, int))dlsym(RTLD_DEFAULT, "fakecuda_query");
}

int sim_no_host_memory_drops(size_t n)
{
    pthread_once(&query_once, find_query);
    return driver_query && driver_query("no_host_memory", -1) == 1 &&
           n > (size_t)driver_query("no_host_memory_keep", -1);
}

int sim_write_file_atomic(const char *path, const char *text, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp)
        return -1;
    snprintf(tmp, plen + 32, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(tmp);
        return -1;
    }
    write_all(fd, text, len);
    int ok = close(fd) == 0 && rename(tmp, path) == 0;
    if (!ok)
        unlink(tmp);
    free(tmp);
    return ok ? 0 : -1;
}
