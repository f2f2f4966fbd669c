/*
 * fakecuda_fatal.c - what a process that dies of a fatal signal held on
 * each simulated device.
 *
 * With GPUMEM_SIM_FATAL_PEAKS=PATH (a "%p" in PATH is the process id),
 * a process killed by SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT writes
 * one line per device, "DEVICE PEAK_USED CONTEXT_BYTES", to PATH before it
 * dies, so that `gpumem simulate` can say what peak the run reached before
 * the failure (Python writes nothing then: Note [How a process of the run
 * ends] in gpumem/sim/child.py). The handler then puts back the one
 * it replaced and raises the signal again; faulthandler, installed later,
 * chains to it the same way.
 *
 * Must not: take the driver lock or call anything that is not
 * async-signal-safe in the handler (the figures are read without the
 * lock: a torn read of a peak is possible and harmless).
 */
#include "fakecuda_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction previous[N_FATAL];
static char head[2048], tail[2048]; /* PATH split at "%p"; immutable after load */
static int has_pid;

static char *put_u64(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static void on_fatal(int sig)
{
    char path[sizeof head + sizeof tail + 24], *p = path;
    size_t hl = strlen(head), tl = strlen(tail);
    memcpy(p, head, hl);
    p += hl;
    if (has_pid)
        p = put_u64(p, (uint64_t)getpid());
    memcpy(p, tail, tl + 1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char buf[FC_MAX_DEVICES * 64], *q = buf;
        for (int i = 0; i < fc.ndev && i < FC_MAX_DEVICES; i++) {
            q = put_u64(q, (uint64_t)i);
            *q++ = ' ';
            q = put_u64(q, fc.dev[i].peak_used);
            *q++ = ' ';
            q = put_u64(q, fc.dev[i].bytes_context);
            *q++ = '\n';
        }
        ssize_t w = write(fd, buf, (size_t)(q - buf));
        (void)w;
        close(fd);
    }
    for (size_t i = 0; i < N_FATAL; i++)
        if (fatal_signals[i] == sig)
            sigaction(sig, &previous[i], NULL);
    raise(sig);
}

__attribute__((constructor)) static void fatal_peaks_setup(void)
{
    const char *v = getenv("GPUMEM_SIM_FATAL_PEAKS");
    if (!v || !*v || strlen(v) >= sizeof head)
        return;
    const char *pp = strstr(v, "%p");
    size_t hl = pp ? (size_t)(pp - v) : strlen(v);
    memcpy(head, v, hl);
    head[hl] = '\0';
    if (pp)
        strcpy(tail, pp + 2);
    has_pid = pp != NULL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++)
        sigaction(fatal_signals[i], &sa, &previous[i]);
}
