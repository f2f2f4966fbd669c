/*
 * fakecuda_config.c - the fake driver's configuration: the GPUMEM_FAKECUDA_*
 * (and GPUMEM_SIM_*) environment read at the first cuInit, the failure
 * injection spec, and fakecuda_configure, which changes them at run time.
 * README.md ("Configuration", "Test-control functions") documents both.
 *
 * Must not: print anything except the one-line configuration error and the
 * warning of fakecuda_configure/set_fail for a bad spec.
 */
#include "fakecuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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
 * user-facing spelling, see simgpu/README.md); *var names the one used. */
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
int fc_load_config_unlocked(void)
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
    fc.context_memory = context_set ? context_memory
                      : gpu.context_kib ? (size_t)gpu.context_kib << 10
                                        : (size_t)gpu.context_mib << 20;
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
    if (!err[0] && !fc.config_loaded && fc_load_config_unlocked() != 0)
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
