/*
 * simcommon.h - what every fake library of the simulated GPU shares: the
 * table of exported names, call counting, the "not implemented" stubs,
 * logging (GPUMEM_SIM_LOG / GPUMEM_SIM_TRACE) and a JSON string builder.
 *
 * Each fake library (libcudart, libcublas, libcublasLt) is linked from its
 * own sources, simcommon.c and a file build.py generates from the library's
 * export list (simgpu/cudaNN/<soname>.syms). The generated file defines
 * `sim_table` (every exported name, sorted, with its call counter) and a
 * weak stub for every name; a source file that defines the same name
 * overrides the stub. So every name the real library exports exists, and
 * whatever is not implemented answers "not supported" and is logged once.
 *
 * Everything here has hidden visibility (-fvisibility=hidden): each
 * library has its own copy and its own counters.
 *
 * Must not: allocate in sim_count (it runs on every call) or print unless
 * GPUMEM_SIM_LOG / GPUMEM_SIM_TRACE ask for it.
 */
#ifndef GPUMEM_SIM_COMMON_H
#define GPUMEM_SIM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define SIM_API __attribute__((visibility("default")))
#define SIM_WEAK __attribute__((weak, visibility("default")))

/* What a stub does when called (the policy column of a .syms file). */
enum {
    SIM_POLICY_UNSUPPORTED = 0, /* log once, return the library's "not supported" code */
    SIM_POLICY_NOOP = 1,        /* check the handle (first argument), do nothing, succeed */
};

typedef struct sim_table {
    const char *soname;           /* "libcudart.so.13" */
    size_t n;                     /* number of exported API names */
    const char *const *names;     /* sorted by strcmp */
    const unsigned char *policy;  /* SIM_POLICY_* per name */
    uint64_t *calls;              /* per name; updated atomically */
    unsigned char *stub_hit;      /* 1 once the name's stub ran (logged) */
    int unsupported_code;         /* cudaErrorNotSupported, CUBLAS_STATUS_NOT_SUPPORTED */
} sim_table_t;

/* Defined by the generated file of each library. */
extern const sim_table_t sim_table;

/* Hooks a library may define (weak defaults in simcommon.c):
 * sim_lib_on_unsupported runs after a stub answered `code` (the runtime
 * records it as the thread's last error); sim_lib_check_handle validates
 * the first argument of a NOOP stub and returns 0 or an error code. */
void sim_lib_on_unsupported(int code);
int sim_lib_check_handle(void *handle);

/* Counts one call of `name`. *slot caches the name's index (-1 before the
 * first call; a name outside the table is counted nowhere). */
void sim_count(int *slot, const char *name);
#define SIM_ENTRY(name)                                                     \
    do {                                                                    \
        static int sim_slot_ = -1;                                          \
        sim_count(&sim_slot_, name);                                        \
    } while (0)

/* Bodies of the generated stubs. */
int sim_stub(int idx);
int sim_stub_noop(int idx, void *handle);

/* One line to the GPUMEM_SIM_LOG destination (nothing if unset). */
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int sim_log_enabled(void);

#include "simjson.h"

/* "calls": {...nonzero counts...}, "stubs_hit": [...names...] */
void sim_report_calls(sim_sb_t *sb);

/* Writes text to path atomically (temporary file + rename); 0 on success. */
/* 1 when a copy of n bytes moves no data: the fake driver (if loaded) runs
 * with GPUMEM_FAKECUDA_NO_HOST_MEMORY=1 and n is above its limit (Note
 * [No host memory] in driver/fakecuda_nohost.c); then a copy into device
 * memory stores nothing and one out of it yields zeros. 0 before the
 * driver's cuInit. */
int sim_no_host_memory_drops(size_t n);
int sim_write_file_atomic(const char *path, const char *text, size_t len);

#endif /* GPUMEM_SIM_COMMON_H */
