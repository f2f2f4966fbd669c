/*
 * fakecuda.c - the core of the fake CUDA driver: initialisation and
 * configuration (GPUMEM_FAKECUDA_*, and fakecuda_configure at run time),
 * failure injection, devices, primary contexts and the per-thread context
 * stack, and the sorted vector every table uses.
 *
 * Memory (cuMemAlloc and the VMM calls) is in fakecuda_mem.c, streams in
 * fakecuda_sync.c, events in fakecuda_event.c, simulated time in
 * fakecuda_timeline.c, error strings, the JSON report and the other
 * fakecuda_* control functions in fakecuda_report.c. README.md documents the
 * behaviour.
 *
 * Invariants: fc is only touched with fc.mu held; dev[i].ctx.refcount >= 0;
 * a primary context is active iff its refcount > 0, and when the last
 * reference goes, everything created in it is destroyed (as the driver
 * documents for cuDevicePrimaryCtxRelease) and counted in fc.reclaimed.
 *
 * Must not: print anything except the one-line configuration error at cuInit
 * and the warning of fakecuda_set_event_mode/set_fail/configure for a bad
 * spec.
 */
#include "fakecuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

fc_state_t fc = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .memfd = -1,
    .next_id = 1,
};

const char *const fc_func_names[FN_COUNT] = {
#define FC_NAME(name) #name,
    FC_FUNCS(FC_NAME)
#undef FC_NAME
};

#define FC_CTX_STACK 64
static __thread struct CUctx_st *tls_ctx_stack[FC_CTX_STACK];
static __thread int tls_ctx_depth;

void fc_lock(void) { pthread_mutex_lock(&fc.mu); }
void fc_unlock(void) { pthread_mutex_unlock(&fc.mu); }

/* fork() while another thread is inside the driver must not leave the child
 * with a lock nobody will release. */
static void atfork_prepare(void) { fc_lock(); }
static void atfork_release(void) { fc_unlock(); }

__attribute__((constructor)) static void fakecuda_load(void)
{
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

uint64_t fc_new_id_unlocked(void) { return fc.next_id++; }

int fc_valid_device(int dev) { return dev >= 0 && dev < fc.ndev; }

void fc_note_usage_unlocked(int dev)
{
    fc_device_t *d = &fc.dev[dev];
    size_t used = fc_used(d);
    if (used > d->peak_used)
        d->peak_used = used;
}

/* ------------------------------------------------------------------ */
/* sorted vector                                                        */

size_t fc_vec_lower(const fc_vec_t *vec, uint64_t key)
{
    size_t lo = 0, hi = vec->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (vec->v[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void *fc_vec_find(const fc_vec_t *vec, uint64_t key)
{
    size_t i = fc_vec_lower(vec, key);
    return (i < vec->n && vec->v[i].key == key) ? vec->v[i].val : NULL;
}

int fc_vec_insert(fc_vec_t *vec, uint64_t key, void *val)
{
    if (vec->n == vec->cap) {
        size_t cap = vec->cap ? vec->cap * 2 : 64;
        fc_kv_t *v = realloc(vec->v, cap * sizeof *v);
        if (!v)
            return -1;
        vec->v = v;
        vec->cap = cap;
    }
    size_t i = fc_vec_lower(vec, key);
    memmove(&vec->v[i + 1], &vec->v[i], (vec->n - i) * sizeof *vec->v);
    vec->v[i].key = key;
    vec->v[i].val = val;
    vec->n++;
    return 0;
}

void fc_vec_remove_at(fc_vec_t *vec, size_t idx)
{
    memmove(&vec->v[idx], &vec->v[idx + 1], (vec->n - idx - 1) * sizeof *vec->v);
    vec->n--;
}

void *fc_vec_remove(fc_vec_t *vec, uint64_t key)
{
    size_t i = fc_vec_lower(vec, key);
    if (i >= vec->n || vec->v[i].key != key)
        return NULL;
    void *val = vec->v[i].val;
    fc_vec_remove_at(vec, i);
    return val;
}

/* ------------------------------------------------------------------ */
/* configuration                                                        */

/* "80GiB", "512MiB", "2GB", "4096": an integer and an optional unit
 * (binary KiB..TiB or K..T, decimal kB..TB). "1.5GiB" is rejected. */
int fc_parse_size(const char *s, size_t *out)
{
    static const struct {
        const char *suffix;
        unsigned long long mult;
    } units[] = {
        {"", 1ull}, {"b", 1ull},
        {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
        {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
        {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    };
    while (*s == ' ')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    while (*end == ' ')
        end++;
    size_t len = strlen(end);
    while (len && end[len - 1] == ' ')
        len--;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) == len && strncasecmp(end, units[i].suffix, len) == 0) {
            if (v && units[i].mult > (unsigned long long)SIZE_MAX / v)
                return -1;
            *out = (size_t)(v * units[i].mult);
            return 0;
        }
    }
    return -1;
}

int fc_parse_event_mode(const char *s, int *mode, long *after)
{
    if (strcmp(s, "timeline") == 0) {
        *mode = FC_EV_TIMELINE;
        *after = 0;
        return 0;
    }
    if (strcmp(s, "immediate") == 0) {
        *mode = FC_EV_IMMEDIATE;
        *after = 0;
        return 0;
    }
    if (strcmp(s, "never") == 0) {
        *mode = FC_EV_NEVER;
        *after = 0;
        return 0;
    }
    if (strncmp(s, "after:", 6) == 0 && s[6] >= '0' && s[6] <= '9') {
        char *end;
        errno = 0;
        long n = strtol(s + 6, &end, 10);
        if (errno || *end || n < 0)
            return -1;
        *mode = FC_EV_AFTER;
        *after = n;
        return 0;
    }
    return -1;
}

static int lookup_func(const char *name, size_t len)
{
    for (int i = 0; i < FN_COUNT; i++)
        if (strlen(fc_func_names[i]) == len && strncmp(fc_func_names[i], name, len) == 0)
            return i;
    return -1;
}

static CUresult default_fail_code(int fn)
{
    switch (fn) {
    case FN_cuMemAlloc_v2:
    case FN_cuMemCreate:
    case FN_cuMemAddressReserve:
        return CUDA_ERROR_OUT_OF_MEMORY;
    default:
        return CUDA_ERROR_UNKNOWN;
    }
}

/* Grammar: ENTRY[,ENTRY...]; ENTRY = FUNC ":" N ["+"] [":" CODE]. On error
 * writes one sentence into err and returns -1; rules are left untouched. */
int fc_parse_fail_spec(const char *spec, fc_fail_rule_t *rules, int *nrules,
                           char *err, size_t errlen)
{
    int n = 0;
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *colon = strchr(p, ':');
        const char *comma = strchr(p, ',');
        if (!comma)
            comma = p + strlen(p);
        if (!colon || colon > comma) {
            snprintf(err, errlen, "entry '%.*s' has no ':N' call number", (int)(comma - p), p);
            return -1;
        }
        size_t namelen = (size_t)(colon - p);
        while (namelen && p[namelen - 1] == ' ')
            namelen--;
        int fn = lookup_func(p, namelen);
        if (fn < 0) {
            snprintf(err, errlen, "'%.*s' is not a function this libcuda exports", (int)namelen, p);
            return -1;
        }
        if (n == FC_MAX_FAIL_RULES) {
            snprintf(err, errlen, "more than %d entries", FC_MAX_FAIL_RULES);
            return -1;
        }
        char *end;
        errno = 0;
        unsigned long long nth = strtoull(colon + 1, &end, 10);
        if (errno || end == colon + 1 || nth == 0 || colon[1] == '-') {
            snprintf(err, errlen, "entry '%.*s': the call number must be an integer >= 1",
                     (int)(comma - p), p);
            return -1;
        }
        fc_fail_rule_t r = {.fn = fn, .nth = nth, .and_after = 0, .code = default_fail_code(fn)};
        if (*end == '+') {
            r.and_after = 1;
            end++;
        }
        if (*end == ':') {
            const char *cs = end + 1;
            errno = 0;
            long code = strtol(cs, &end, 0);
            if (errno || end == cs || code <= 0 || code > 0x7fffffff) {
                snprintf(err, errlen, "entry '%.*s': CODE must be a positive CUresult number",
                         (int)(comma - p), p);
                return -1;
            }
            r.code = (CUresult)code;
        }
        while (*end == ' ')
            end++;
        if (end != comma) {
            snprintf(err, errlen, "entry '%.*s' has trailing characters", (int)(comma - p), p);
            return -1;
        }
        rules[n++] = r;
        p = comma;
    }
    *nrules = n;
    return 0;
}

void fc_set_fail_unlocked(const fc_fail_rule_t *rules, int nrules, const char *spec)
{
    memcpy(fc.rules, rules, (size_t)nrules * sizeof *rules);
    fc.nrules = nrules;
    snprintf(fc.fail_spec, sizeof fc.fail_spec, "%s", spec ? spec : "");
    memset(fc.fail_seen, 0, sizeof fc.fail_seen);
}

/* GPUMEM_FAKECUDA_<name>, or else GPUMEM_SIM_<name> (the simulator's
 * user-facing spelling, see csrc/sim/README.md); *var names the one used. */
static const char *config_env(const char *name, const char **var)
{
    static __thread char buf[2][64];
    snprintf(buf[0], sizeof buf[0], "GPUMEM_FAKECUDA_%s", name);
    snprintf(buf[1], sizeof buf[1], "GPUMEM_SIM_%s", name);
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(buf[i]);
        if (v && *v) {
            *var = buf[i];
            return v;
        }
    }
    *var = buf[0];
    return NULL;
}

/* Parse every GPUMEM_FAKECUDA_* variable; all or nothing. DEVICES, MEMORY,
 * CONTEXT_MEMORY and EVENTS may also be given as GPUMEM_SIM_*. */
static int load_config_unlocked(void)
{
    const char *v;
    int ndev = 1;
    size_t memory = 80ull << 30, gran = 2ull << 20, fail_above = 0, context_memory = 0;
    int ev_mode = fc.ev_mode; /* FC_EV_TIMELINE unless set_event_mode ran before */
    int context_set = 0;
    long ev_after = fc.ev_after;
    fc_fail_rule_t rules[FC_MAX_FAIL_RULES];
    int nrules = -1;
    char err[256];
    const char *var;

    if ((v = config_env("DEVICES", &var))) {
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || *end || n < 0 || n > FC_MAX_DEVICES) {
            fprintf(stderr, "fakecuda: %s='%s' is invalid: expected an integer "
                            "from 0 to %d\n", var, v, FC_MAX_DEVICES);
            return -1;
        }
        ndev = (int)n;
    }
    if ((v = config_env("MEMORY", &var))) {
        if (fc_parse_size(v, &memory) || memory == 0) {
            fprintf(stderr, "fakecuda: %s='%s' is invalid: expected a positive "
                            "size such as 80GiB, 512MiB or 1048576\n", var, v);
            return -1;
        }
    }
    if ((v = config_env("CONTEXT_MEMORY", &var))) {
        context_set = 1;
        if (fc_parse_size(v, &context_memory)) {
            fprintf(stderr, "fakecuda: %s='%s' is invalid: expected a size such as 300MiB "
                            "(or 0)\n", var, v);
            return -1;
        }
    }
    fc_gpu_t gpu;
    fc_gpu_default(&gpu);
    if ((v = config_env("GPU", &var)) && fc_gpu_parse(v, &gpu, err, sizeof err)) {
        fprintf(stderr, "fakecuda: %s is invalid: %s (gpumem simulate --gpu MODEL sets it)\n",
                var, err);
        return -1;
    }
    if ((v = getenv("GPUMEM_FAKECUDA_GRANULARITY")) && *v) {
        long page = sysconf(_SC_PAGESIZE);
        if (fc_parse_size(v, &gran) || (gran && ((gran & (gran - 1)) || gran % (size_t)page))) {
            fprintf(stderr, "fakecuda: GPUMEM_FAKECUDA_GRANULARITY='%s' is invalid: expected 0 (no "
                            "VMM) or a power of two that is a multiple of the %ld-byte page, "
                            "such as 2MiB\n", v, page);
            return -1;
        }
    }
    if ((v = config_env("EVENTS", &var))) {
        if (fc_parse_event_mode(v, &ev_mode, &ev_after)) {
            fprintf(stderr, "fakecuda: %s='%s' is invalid: expected "
                            "'timeline', 'immediate', 'never' or 'after:N'\n", var, v);
            return -1;
        }
    }
    if ((v = getenv("GPUMEM_FAKECUDA_FAIL")) != NULL) {
        if (fc_parse_fail_spec(v, rules, &nrules, err, sizeof err)) {
            fprintf(stderr, "fakecuda: GPUMEM_FAKECUDA_FAIL='%s' is invalid: %s (expected "
                            "FUNC:N[+][:CODE][,...], e.g. cuMemAlloc_v2:3)\n", v, err);
            return -1;
        }
    }
    if ((v = getenv("GPUMEM_FAKECUDA_FAIL_ABOVE")) && *v) {
        if (fc_parse_size(v, &fail_above)) {
            fprintf(stderr, "fakecuda: GPUMEM_FAKECUDA_FAIL_ABOVE='%s' is invalid: expected a "
                            "size such as 1GiB\n", v);
            return -1;
        }
    }
    int no_host = 0; /* Note [No host memory] in fakecuda_nohost.c */
    if ((v = getenv("GPUMEM_FAKECUDA_NO_HOST_MEMORY")) && *v) {
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
            fprintf(stderr, "fakecuda: GPUMEM_FAKECUDA_NO_HOST_MEMORY='%s' is invalid: expected 1 "
                            "(device memory holds no data) or 0\n", v);
            return -1;
        }
        no_host = v[0] == '1';
    }
    char *report = NULL;
    if ((v = getenv("GPUMEM_FAKECUDA_REPORT")) && *v) {
        /* Made absolute now: the process may chdir before it exits. */
        char cwd[4096];
        if (v[0] != '/' && getcwd(cwd, sizeof cwd)) {
            size_t len = strlen(cwd) + strlen(v) + 2;
            report = malloc(len);
            if (report)
                snprintf(report, len, "%s/%s", cwd, v);
        } else {
            report = strdup(v);
        }
        if (!report) {
            fprintf(stderr, "fakecuda: out of memory reading GPUMEM_FAKECUDA_REPORT\n");
            return -1;
        }
    }

    fc.ndev = ndev;
    fc.memory = memory;
    /* GPUMEM_SIM_CONTEXT_MEMORY overrides the model's figure */
    fc.context_memory = context_set ? context_memory : (size_t)gpu.context_mib << 20;
    fc.gpu = gpu;
    fc.granularity = gran;
    fc.fail_above = fail_above;
    fc.no_host_memory = no_host;
    fc.ev_mode = ev_mode;
    fc.ev_after = ev_after;
    free(fc.report_path);
    fc.report_path = report;
    fc.report_pid = (long)getpid();
    if (nrules >= 0)
        fc_set_fail_unlocked(rules, nrules, getenv("GPUMEM_FAKECUDA_FAIL"));
    for (int i = 0; i < ndev; i++) {
        fc.dev[i].capacity = memory;
        fc.dev[i].ctx.device = i;
        fc.dev[i].ctx.refcount = 0;
    }
    fc.config_loaded = 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* configuration at run time (fakecuda_configure)                       */

/* Any memory object alive on any device: cuMemAlloc allocations, VMM
 * handles (also released ones still mapped), reservations, mappings. */
static int memory_live_unlocked(void)
{
    for (int i = 0; i < fc.ndev; i++) {
        const fc_device_t *d = &fc.dev[i];
        if (d->n_allocs || d->n_phys || d->n_reservations || d->n_mappings)
            return 1;
    }
    return fc.allocs.n || fc.reservations.n || fc.mappings.n || fc.handles.n;
}

/* One "KEY=VALUE" item of a configure spec; the value runs to the next
 * item. A "fail" value may itself hold commas (FUNC:N,FUNC:N): a piece
 * without '=' continues the previous item. */
typedef struct {
    const char *key;
    size_t keylen;
    char value[1024];
} cfg_item_t;

static int key_is(const cfg_item_t *it, const char *k)
{
    return strlen(k) == it->keylen && strncmp(it->key, k, it->keylen) == 0;
}

/* Grammar and rules: README.md, "Test-control functions". All or nothing:
 * on any error one line goes to stderr, nothing changes and -1 returns. */
FC_API int fakecuda_configure(const char *spec)
{
    cfg_item_t items[8];
    int n = 0;
    char err[320] = "";
    const char *p = spec ? spec : "";
    while (*p && !err[0]) {
        while (*p == ' ' || *p == ',' || *p == ';')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ",;");
        const char *eq = memchr(p, '=', len);
        if (!eq) {
            /* a continuation of the previous "fail=" list */
            if (n == 0 || !key_is(&items[n - 1], "fail")) {
                snprintf(err, sizeof err, "item '%.*s' is not KEY=VALUE", (int)len, p);
                break;
            }
            size_t have = strlen(items[n - 1].value);
            if (have + 1 + len >= sizeof items[n - 1].value) {
                snprintf(err, sizeof err, "the fail list is too long");
                break;
            }
            items[n - 1].value[have] = ',';
            memcpy(items[n - 1].value + have + 1, p, len);
            items[n - 1].value[have + 1 + len] = '\0';
            p += len;
            continue;
        }
        if (n == (int)(sizeof items / sizeof items[0])) {
            snprintf(err, sizeof err, "too many items");
            break;
        }
        cfg_item_t *it = &items[n++];
        it->key = p;
        it->keylen = (size_t)(eq - p);
        while (it->keylen && p[it->keylen - 1] == ' ')
            it->keylen--;
        size_t vlen = len - (size_t)(eq + 1 - p);
        if (vlen >= sizeof it->value) {
            snprintf(err, sizeof err, "the value of '%.*s' is too long", (int)it->keylen, p);
            break;
        }
        memcpy(it->value, eq + 1, vlen);
        it->value[vlen] = '\0';
        p += len;
    }

    int set_memory = 0, set_gran = 0, set_events = 0, set_fail = 0, set_above = 0;
    size_t memory = 0, gran = 0, above = 0;
    int ev_mode = 0;
    long ev_after = 0;
    fc_fail_rule_t rules[FC_MAX_FAIL_RULES];
    int nrules = 0;
    const char *fail_spec = "";
    for (int i = 0; i < n && !err[0]; i++) {
        cfg_item_t *it = &items[i];
        char *v = it->value;
        while (*v == ' ')
            v++;
        if (key_is(it, "memory")) {
            set_memory = 1;
            if (fc_parse_size(v, &memory) || memory == 0)
                snprintf(err, sizeof err, "memory='%s': expected a positive size such as "
                                          "64MiB", v);
        } else if (key_is(it, "granularity")) {
            set_gran = 1;
            long page = sysconf(_SC_PAGESIZE);
            if (fc_parse_size(v, &gran) ||
                (gran && ((gran & (gran - 1)) || gran % (size_t)page)))
                snprintf(err, sizeof err, "granularity='%s': expected 0 (no VMM) or a power "
                                          "of two that is a multiple of the %ld-byte page", v,
                         page);
        } else if (key_is(it, "events")) {
            set_events = 1;
            if (fc_parse_event_mode(v, &ev_mode, &ev_after))
                snprintf(err, sizeof err, "events='%s': expected 'timeline', 'immediate', "
                                          "'never' or 'after:N'", v);
        } else if (key_is(it, "fail")) {
            set_fail = 1;
            fail_spec = v;
            char why[256];
            if (fc_parse_fail_spec(v, rules, &nrules, why, sizeof why))
                snprintf(err, sizeof err, "fail='%s': %s", v, why);
        } else if (key_is(it, "fail_above")) {
            set_above = 1;
            if (fc_parse_size(v, &above))
                snprintf(err, sizeof err, "fail_above='%s': expected a size (0 = off)", v);
        } else {
            snprintf(err, sizeof err, "unknown key '%.*s' (expected memory, granularity, "
                                      "events, fail or fail_above)", (int)it->keylen, it->key);
        }
    }

    fc_lock();
    /* The environment is the starting point: read it now if no cuInit has,
     * so that a later cuInit does not overwrite what is set here. */
    if (!err[0] && !fc.config_loaded && load_config_unlocked() != 0)
        snprintf(err, sizeof err, "the GPUMEM_FAKECUDA_* environment is invalid");
    if (!err[0] && (set_memory || set_gran) && memory_live_unlocked())
        snprintf(err, sizeof err, "memory and granularity cannot change while device memory "
                                  "is allocated, mapped or reserved");
    if (err[0]) {
        fc_unlock();
        fprintf(stderr, "fakecuda: fakecuda_configure('%s') rejected: %s\n", spec ? spec : "",
                err);
        return -1;
    }
    if (set_memory) {
        fc.memory = memory;
        for (int i = 0; i < FC_MAX_DEVICES; i++)
            fc.dev[i].capacity = memory;
    }
    if (set_gran)
        fc.granularity = gran;
    if (set_events) {
        fc.ev_mode = ev_mode;
        fc.ev_after = ev_after;
    }
    if (set_fail)
        fc_set_fail_unlocked(rules, nrules, fail_spec);
    if (set_above)
        fc.fail_above = above;
    fc_unlock();
    return 0;
}

/* ------------------------------------------------------------------ */
/* call accounting, failure injection                                   */

CUresult fc_injected_unlocked(int fn)
{
    uint64_t seen = fc.fail_seen[fn];
    for (int i = 0; i < fc.nrules; i++) {
        const fc_fail_rule_t *r = &fc.rules[i];
        if (r->fn == fn && (seen == r->nth || (r->and_after && seen > r->nth)))
            return r->code;
    }
    return CUDA_SUCCESS;
}

CUresult fc_enter_unlocked(int fn, int need_init)
{
    fc.calls[fn]++;
    fc.fail_seen[fn]++;
    fc.host_ns += FC_TL_HOST_CALL_NS; /* Note [Device timeline] */
    CUresult r = fc_injected_unlocked(fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (need_init && !fc.initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* initialisation, version, devices                                     */

FC_API CUresult CUDAAPI cuInit(unsigned int Flags)
{
    CUresult res;
    fc_lock();
    fc.calls[FN_cuInit]++;
    /* The configuration is read first (it resets the "Nth call" counters),
     * so GPUMEM_FAKECUDA_FAIL can make this very cuInit fail. */
    if (!fc.config_loaded && load_config_unlocked() != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc.fail_seen[FN_cuInit]++;
    if ((res = fc_injected_unlocked(FN_cuInit)) != CUDA_SUCCESS)
        goto done;
    if (Flags != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (fc.ndev == 0)
        FC_FAIL(CUDA_ERROR_NO_DEVICE);
    fc.initialized = 1;
    FC_END();
}

FC_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    FC_BEGIN(FN_cuDriverGetVersion, 0); /* documented to work before cuInit */
    if (!driverVersion)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *driverVersion = FC_DRIVER_VERSION;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    FC_BEGIN(FN_cuDeviceGetCount, 1);
    if (!count)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *count = fc.ndev;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    FC_BEGIN(FN_cuDeviceGet, 1);
    if (!device)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(ordinal))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceGetName, 1);
    if (!name || len <= 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "%s", fc.gpu.name);
    FC_END();
}

static int attribute_value(int attrib, int dev)
{
    const fc_gpu_t *g = &fc.gpu;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return g->clock_khz;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return g->sm_count;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x18 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return g->mem_clock_khz;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return g->bus_bits;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return g->l2_bytes;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return g->threads_per_sm;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return g->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return g->cc_minor;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return g->smem_per_sm;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return g->regs_per_sm;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return 2;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return g->smem_per_block_optin;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return fc.granularity > 0;
    /* cuMemCreate accepts requestedHandleTypes = POSIX_FILE_DESCRIPTOR (it
     * cannot export one: cuMemExportToShareableHandle is not provided). */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return fc.granularity > 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return g->blocks_per_sm;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return g->cc_major >= 9;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return 4;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return g->cc_major >= 9;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return -1;
    /* Everything else, including managed memory, memory pools, fabric
     * handles and GPUDirect RDMA, which the fake does not provide. */
    default: return 0;
    }
}

FC_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceGetAttribute, 1);
    if (!pi || (int)attrib < 1 || (int)attrib >= FC_ATTR_LIMIT)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *pi = attribute_value((int)attrib, dev);
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceTotalMem_v2, 1);
    if (!bytes)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *bytes = fc.dev[dev].capacity;
    FC_END();
}

static CUresult device_uuid(int fn, CUuuid *uuid, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!uuid)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    /* A fixed, version-4-shaped UUID whose last byte is the ordinal. */
    static const unsigned char base[16] = {0x67, 0x70, 0x6d, 0x65, 0x6d, 0x2d, 0x46, 0x41,
                                           0x8b, 0x45, 0x43, 0x55, 0x44, 0x41, 0x00, 0x00};
    memcpy(uuid->bytes, base, 16);
    uuid->bytes[15] = (char)dev;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(FN_cuDeviceGetUuid, uuid, dev);
}

FC_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(FN_cuDeviceGetUuid_v2, uuid, dev);
}

/* ------------------------------------------------------------------ */
/* primary contexts                                                     */

static struct CUctx_st *ctx_from_handle(CUcontext c)
{
    for (int i = 0; i < fc.ndev; i++)
        if (c == &fc.dev[i].ctx)
            return c;
    return NULL;
}

CUresult fc_current_ctx_unlocked(struct CUctx_st **out)
{
    if (tls_ctx_depth == 0 || tls_ctx_stack[tls_ctx_depth - 1] == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = tls_ctx_stack[tls_ctx_depth - 1];
    if (c->refcount == 0)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

/* What the driver does when a primary context is reset: everything created
 * in it is destroyed. VMM objects are process-wide and survive. */
static void reset_ctx_unlocked(struct CUctx_st *c)
{
    fc_mem_reset_device_unlocked(c->device);
    fc_sync_reset_ctx_unlocked(c);
    fc_module_reset_ctx_unlocked(c);
    memset(c->limits, 0, sizeof c->limits);
}

/*
 * Note [Context memory]
 * Rationale: on a real GPU an active context holds device memory of its own
 *   (code, stacks, heaps: a few hundred MiB), which cudaMemGetInfo reports
 *   as used and allocations cannot have; programs and tests that reason
 *   about "half the device" depend on it.
 * Approach: GPUMEM_SIM_CONTEXT_MEMORY (also GPUMEM_FAKECUDA_CONTEXT_MEMORY)
 *   bytes are charged to a device when its primary context becomes active
 *   (first retain) and given back when the last reference is released; a
 *   device without that much free memory refuses the context with
 *   CUDA_ERROR_OUT_OF_MEMORY, as the driver does.
 * Limitations: the default is 0 (the charge varies with the GPU and the
 *   driver, and a simulation should not invent one); a reset keeps it, as
 *   the context stays retained.
 */
FC_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FC_BEGIN(FN_cuDevicePrimaryCtxRetain, 1);
    if (!pctx)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    fc_device_t *d = &fc.dev[dev];
    if (d->ctx.refcount == 0 && fc.context_memory) {
        size_t used = fc_used(d);
        if (used > d->capacity || fc.context_memory > d->capacity - used)
            FC_FAIL(CUDA_ERROR_OUT_OF_MEMORY);
        d->bytes_context = fc.context_memory;
        fc_note_usage_unlocked(dev);
    }
    fc.dev[dev].ctx.refcount++;
    *pctx = &fc.dev[dev].ctx;
    FC_END();
}

static CUresult primary_release(int fn, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    struct CUctx_st *c = &fc.dev[dev].ctx;
    if (c->refcount == 0) /* documented: releasing what was not retained */
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    if (--c->refcount == 0) {
        reset_ctx_unlocked(c);
        fc.dev[dev].bytes_context = 0;
    }
    FC_END();
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(FN_cuDevicePrimaryCtxRelease, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(FN_cuDevicePrimaryCtxRelease_v2, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FC_BEGIN(FN_cuDevicePrimaryCtxGetState, 1);
    if (!flags || !active)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    *active = fc.dev[dev].ctx.refcount > 0;
    FC_END();
}

/* Destroys everything created in the context; the retain count is kept
 * ("Resetting the primary context does not release it"). */
static CUresult primary_reset(int fn, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    reset_ctx_unlocked(&fc.dev[dev].ctx);
    FC_END();
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(FN_cuDevicePrimaryCtxReset, dev);
}

FC_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(FN_cuDevicePrimaryCtxReset_v2, dev);
}

/* ------------------------------------------------------------------ */
/* the per-thread context stack                                         */

FC_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    FC_BEGIN(FN_cuCtxGetCurrent, 1);
    if (!pctx)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *pctx = tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
    FC_END();
}

/* A context handle that is not one of ours, or a primary context released
 * to zero, cannot be made current. */
static CUresult check_bindable(CUcontext ctx)
{
    struct CUctx_st *c = ctx_from_handle(ctx);
    if (!c || c->refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    FC_BEGIN(FN_cuCtxSetCurrent, 1);
    if (ctx == NULL) {
        if (tls_ctx_depth > 0)
            tls_ctx_depth--;
        goto done;
    }
    if ((res = check_bindable(ctx)) != CUDA_SUCCESS)
        goto done;
    if (tls_ctx_depth == 0)
        tls_ctx_depth = 1;
    tls_ctx_stack[tls_ctx_depth - 1] = ctx;
    FC_END();
}

static CUresult ctx_push(int fn, CUcontext ctx)
{
    FC_BEGIN(fn, 1);
    if (ctx == NULL)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((res = check_bindable(ctx)) != CUDA_SUCCESS)
        goto done;
    if (tls_ctx_depth == FC_CTX_STACK)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    tls_ctx_stack[tls_ctx_depth++] = ctx;
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return ctx_push(FN_cuCtxPushCurrent, ctx); }

FC_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    return ctx_push(FN_cuCtxPushCurrent_v2, ctx);
}

static CUresult ctx_pop(int fn, CUcontext *pctx)
{
    FC_BEGIN(fn, 1);
    if (tls_ctx_depth == 0)
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    CUcontext top = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = top;
    FC_END();
}

FC_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return ctx_pop(FN_cuCtxPopCurrent, pctx); }

FC_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    return ctx_pop(FN_cuCtxPopCurrent_v2, pctx);
}

FC_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    FC_BEGIN(FN_cuCtxGetDevice, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!device)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *device = c->device;
    FC_END();
}
