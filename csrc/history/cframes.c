/*
 * cframes.c - C return addresses for stacks='all': capture with the cached
 * unwinder (cunwind.c), or glibc's backtrace() where it cannot walk a stack;
 * symbolize lazily (at snapshot time) with dladdr, or the
 * object's symbol table for functions dladdr cannot name (elfsyms.c).
 *
 * Capture stores raw addresses only; symbolization happens once per unique
 * address per snapshot. C++ names are demangled with __cxa_demangle when the
 * process already has it (libstdc++ loaded, as it is under torch); this file
 * never links C++ itself. libstdc++ is usually loaded after gpumem (torch
 * brings it, into a local scope), so the look-up is retried at each
 * symbolization until it succeeds, also through the loaded library's own
 * handle (RTLD_NOLOAD: never loads it).
 * Must not: allocate Python objects or take locks other than libc's.
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cunwind.h"
#include "hist.h"

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);

static pthread_once_t warm_once = PTHREAD_ONCE_INIT;
/* Set once found, never changed after (protected by: atomic access). */
static _Atomic(demangle_fn) demangle;

static void warm(void) {
    void *tmp[2];
    backtrace(tmp, 2); /* loads the unwinder now, not under a lock later */
}

/* __cxa_demangle if the process has it now, else NULL. */
static demangle_fn find_demangle(void) {
    demangle_fn fn = atomic_load(&demangle);
    if (fn)
        return fn;
    fn = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!fn) {
        void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            fn = (demangle_fn)dlsym(h, "__cxa_demangle");
            dlclose(h); /* drops only the reference NOLOAD took */
        }
    }
    if (fn)
        atomic_store(&demangle, fn);
    return fn;
}

void gm_cframes_warmup(void) { pthread_once(&warm_once, warm); }

int gm_cframes_capture(uintptr_t *out, int max, int skip) {
    enum { CAP = 256 };
    /* The cached walk first (Note [Cached unwind]); its first address, like
     * backtrace()'s, is the return address into this function. */
    int got = gm_cunwind(out, max, skip + 1);
    if (got >= 0)
        return got;
    void *buf[CAP];
    gm_cframes_warmup();
    int want = max + skip + 1; /* +1: this function */
    if (want > CAP)
        want = CAP;
    int n = backtrace(buf, want);
    int first = skip + 1, k = 0;
    for (int i = first; i < n && k < max; i++)
        out[k++] = (uintptr_t)buf[i];
    return k;
}

static void copy_str(char *dst, size_t n, const char *src) {
    if (!n)
        return;
    size_t len = strlen(src);
    if (len >= n)
        len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

int gm_cframes_symbolize(uintptr_t addr, char *name, size_t nlen, char *file, size_t flen) {
    gm_cframes_warmup();
    Dl_info info;
    memset(&info, 0, sizeof info);
    /* A return address points after the call; addr - 1 is inside it. */
    int found = addr && dladdr((void *)(addr - 1), &info);
    copy_str(file, flen, found && info.dli_fname ? info.dli_fname : "??");
    const char *sym = found ? info.dli_sname : NULL, *src = NULL;
    /* A hidden or static function (all of gpumem's own): its object's .symtab,
     * with its source file in place of the object's path, as torch gives. */
    if (found && !sym && info.dli_fname &&
        gm_elfsyms_lookup(info.dli_fname, addr - 1 - (uintptr_t)info.dli_fbase, &sym, &src) &&
        src)
        copy_str(file, flen, src);
    if (!sym) {
        unsigned long off = found ? (unsigned long)(addr - (uintptr_t)info.dli_fbase) : addr;
        snprintf(name, nlen, "?? (+0x%lx)", off);
        return 0;
    }
    char *dem = NULL;
    demangle_fn fn = sym[0] == '_' && sym[1] == 'Z' ? find_demangle() : NULL;
    if (fn) {
        int status = -1;
        dem = fn(sym, NULL, NULL, &status);
        if (status != 0) {
            free(dem);
            dem = NULL;
        }
    }
    copy_str(name, nlen, dem ? dem : sym);
    free(dem);
    /* CPython's eval loop: _PyEval_EvalFrameDefault (3.10-3.13) and its
     * relatives. One Python frame is spliced in per such C frame. */
    return strstr(sym, "PyEval_EvalFrame") != NULL;
}
