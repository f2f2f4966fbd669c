/*
 * testdev.c - the backend-neutral test device (see testdev.h).
 *
 * The CUDA side talks to the fake driver only through what it exports:
 * cu* entry points for the test's own streams and context, and the
 * fakecuda_* test controls (simgpu/driver/README.md). Everything is looked
 * up with dlsym on the library gm_cuda_open loads ($GPUMEM_LIBCUDA), so the
 * test binaries link no CUDA library.
 */
#include "testdev.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cuda_backend.h"
#include "device/vdev.h"

/* The virtual device takes TDEV_FN_* and TDEV_EVENTS_* as they are. */
_Static_assert((int)TDEV_FN_COUNT == (int)GM_VDEV_FN_COUNT &&
                   (int)TDEV_FN_SEG_ALLOC == (int)GM_VDEV_FN_SEG_ALLOC &&
                   (int)TDEV_FN_SEG_FREE == (int)GM_VDEV_FN_SEG_FREE &&
                   (int)TDEV_FN_EVENT_CREATE == (int)GM_VDEV_FN_EVENT_CREATE &&
                   (int)TDEV_FN_EVENT_RECORD == (int)GM_VDEV_FN_EVENT_RECORD &&
                   (int)TDEV_FN_EVENT_QUERY == (int)GM_VDEV_FN_EVENT_QUERY &&
                   (int)TDEV_FN_MAP == (int)GM_VDEV_FN_MAP &&
                   (int)TDEV_FN_UNMAP == (int)GM_VDEV_FN_UNMAP &&
                   (int)TDEV_FN_VA_RESERVE == (int)GM_VDEV_FN_VA_RESERVE,
               "TDEV_FN_* mirror gm_vdev_fn_t");
_Static_assert((int)TDEV_EVENTS_IMMEDIATE == (int)GM_VDEV_EVENTS_IMMEDIATE &&
                   (int)TDEV_EVENTS_NEVER == (int)GM_VDEV_EVENTS_NEVER &&
                   (int)TDEV_EVENTS_AFTER_N == (int)GM_VDEV_EVENTS_AFTER_N,
               "TDEV_EVENTS_* mirror GM_VDEV_EVENTS_*");

/* ------------------------------------------------------------ selection */

static int g_kind = -1;

static int kind_from(const char *v, int *out) {
    if (!strcmp(v, "virtual"))
        *out = TDEV_VDEV;
    else if (!strcmp(v, "cuda"))
        *out = TDEV_CUDA;
    else
        return -1;
    return 0;
}

int tdev_parse_args(int *argc, char **argv) {
    int kind = TDEV_VDEV;
    const char *env = getenv("GM_TEST_BACKEND");
    if (env && *env && kind_from(env, &kind)) {
        fprintf(stderr, "GM_TEST_BACKEND='%s': expected 'virtual' or 'cuda'\n", env);
        return -1;
    }
    int j = 1;
    for (int i = 1; i < *argc; i++) {
        if (!strncmp(argv[i], "--backend=", 10)) {
            if (kind_from(argv[i] + 10, &kind)) {
                fprintf(stderr, "%s: expected --backend=virtual or --backend=cuda\n", argv[i]);
                return -1;
            }
            continue;
        }
        argv[j++] = argv[i];
    }
    *argc = j;
    argv[j] = NULL;
    g_kind = kind;
    return 0;
}

int tdev_kind(void) {
    if (g_kind < 0) {
        int kind = TDEV_VDEV;
        const char *env = getenv("GM_TEST_BACKEND");
        if (env && *env)
            kind_from(env, &kind);
        g_kind = kind;
    }
    return g_kind;
}

const char *tdev_kind_name(void) { return tdev_kind() == TDEV_CUDA ? "cuda" : "virtual"; }

void tdev_config_default(tdev_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->num_devices = 1;
    cfg->capacity = (size_t)80 << 30;
    cfg->granularity = (size_t)2 << 20;
    cfg->event_mode = TDEV_EVENTS_IMMEDIATE;
    cfg->fail_fn = -1;
    cfg->fail_code = GM_EOOM;
}

struct tdev {
    int kind;
    int num_devices;
    gm_vdev_t *vdev;
    const gm_backend_t *be;
    uintptr_t streams[TDEV_NSTREAMS];
    long long reclaimed0[4]; /* cuda: fakecuda's reclaimed.* at open */
};

/* ------------------------------------------------------------ the fake */

/* The driver's types, as far as these calls need them: CUresult and
 * CUdevice are int, CUcontext and CUstream are pointers. */
typedef struct {
    void *lib;
    char path[512];
    int ndev;
    void *ctx0; /* device 0's primary context, retained here */
    gm_cuda_t *cuda[2]; /* [1]: devices with VMM, [0]: without */
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDeviceGetCount)(int *);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuDevicePrimaryCtxRelease_v2)(int);
    int (*cuDevicePrimaryCtxReset_v2)(int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamDestroy_v2)(void *);
    int (*cuStreamBeginCapture_v2)(void *, int);
    int (*cuStreamEndCapture)(void *, void **);
    int (*cuGraphDestroy)(void *);
    int (*fakecuda_configure)(const char *);
    long long (*fakecuda_query)(const char *, int);
    void (*fakecuda_complete_events)(void);
    void (*fakecuda_set_event_mode)(const char *);
    int (*fakecuda_set_fail)(const char *);
    void (*fakecuda_reset_counters)(void);
} fake_t;

static fake_t fake;

#define CU_STREAM_NON_BLOCKING 1u
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_UNKNOWN 999

static const char *const fn_driver_name[TDEV_FN_COUNT] = {
    [TDEV_FN_SEG_ALLOC] = "cuMemAlloc_v2",
    [TDEV_FN_SEG_FREE] = "cuMemFree_v2",
    [TDEV_FN_EVENT_CREATE] = "cuEventCreate",
    [TDEV_FN_EVENT_RECORD] = "cuEventRecord",
    [TDEV_FN_EVENT_QUERY] = "cuEventQuery",
    [TDEV_FN_MAP] = "cuMemCreate",
    [TDEV_FN_UNMAP] = "cuMemUnmap",
    [TDEV_FN_VA_RESERVE] = "cuMemAddressReserve",
};

/* What calls[] counts on cuda. */
static const char *const fn_count_key[TDEV_FN_COUNT] = {
    [TDEV_FN_SEG_ALLOC] = "calls.cuMemAlloc_v2",
    [TDEV_FN_SEG_FREE] = "calls.cuMemFree_v2",
    [TDEV_FN_EVENT_CREATE] = "calls.cuEventCreate",
    [TDEV_FN_EVENT_RECORD] = "calls.cuEventRecord",
    [TDEV_FN_EVENT_QUERY] = "calls.cuEventQuery",
    [TDEV_FN_MAP] = "calls.cuMemMap",
    [TDEV_FN_UNMAP] = "calls.cuMemUnmap",
    [TDEV_FN_VA_RESERVE] = "calls.cuMemAddressReserve",
};

static const char *const reclaimed_keys[4] = {"reclaimed.allocations", "reclaimed.bytes",
                                              "reclaimed.streams", "reclaimed.events"};

static int fake_load(char *err, size_t errlen) {
    if (fake.lib)
        return 0;
    const char *path = getenv("GPUMEM_LIBCUDA");
    if (!path || !*path) {
        snprintf(err, errlen, "--backend=cuda needs GPUMEM_LIBCUDA=/path/to/the fake libcuda.so.1");
        return GM_EDEVICE;
    }
    /* Two devices unless the environment says otherwise (read at cuInit). */
    setenv("GPUMEM_FAKECUDA_DEVICES", "2", 0);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load %s: %s", path, why ? why : "?");
        return GM_EDEVICE;
    }
#define SYM(name)                                                                          \
    do {                                                                                   \
        *(void **)&fake.name = dlsym(lib, #name);                                          \
        if (!fake.name) {                                                                  \
            snprintf(err, errlen, "%s has no %s: not gpumem's fake driver", path, #name);  \
            dlclose(lib);                                                                  \
            return GM_EDEVICE;                                                             \
        }                                                                                  \
    } while (0)
    SYM(cuInit);
    SYM(cuDeviceGet);
    SYM(cuDeviceGetCount);
    SYM(cuDevicePrimaryCtxRetain);
    SYM(cuDevicePrimaryCtxRelease_v2);
    SYM(cuDevicePrimaryCtxReset_v2);
    SYM(cuCtxSetCurrent);
    SYM(cuStreamCreate);
    SYM(cuStreamDestroy_v2);
    SYM(cuStreamBeginCapture_v2);
    SYM(cuStreamEndCapture);
    SYM(cuGraphDestroy);
    SYM(fakecuda_configure);
    SYM(fakecuda_query);
    SYM(fakecuda_complete_events);
    SYM(fakecuda_set_event_mode);
    SYM(fakecuda_set_fail);
    SYM(fakecuda_reset_counters);
#undef SYM
    int r = fake.cuInit(0), dev = 0;
    if (r == 0)
        r = fake.cuDeviceGetCount(&fake.ndev);
    if (r == 0)
        r = fake.cuDeviceGet(&dev, 0);
    if (r == 0)
        r = fake.cuDevicePrimaryCtxRetain(&fake.ctx0, dev);
    if (r != 0) {
        snprintf(err, errlen, "%s: initialisation failed with CUresult %d", path, r);
        dlclose(lib);
        return GM_EDEVICE;
    }
    snprintf(fake.path, sizeof fake.path, "%s", path);
    fake.lib = lib;
    return 0;
}

static void event_mode_text(int mode, int after_n, char *buf, size_t len) {
    if (mode == TDEV_EVENTS_NEVER)
        snprintf(buf, len, "never");
    else if (mode == TDEV_EVENTS_AFTER_N)
        snprintf(buf, len, "after:%d", after_n < 0 ? 0 : after_n);
    else
        snprintf(buf, len, "immediate");
}

static void fail_text(int fn, long nth, int code, char *buf, size_t len) {
    buf[0] = 0;
    if (fn >= 0 && fn < TDEV_FN_COUNT && nth >= 1)
        snprintf(buf, len, "%s:%ld:%d", fn_driver_name[fn], nth,
                 code == GM_EOOM || code == 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN);
}

static int cuda_open(tdev_t *d, const tdev_config_t *cfg, char *err, size_t errlen) {
    int rc = fake_load(err, errlen);
    if (rc)
        return rc;
    if (cfg->num_devices > fake.ndev) {
        snprintf(err, errlen, "the test needs %d devices, the fake has %d "
                              "(GPUMEM_FAKECUDA_DEVICES)", cfg->num_devices, fake.ndev);
        return GM_EINVAL;
    }
    char events[32], fail[128], spec[512];
    event_mode_text(cfg->event_mode, cfg->event_after_n, events, sizeof events);
    fail_text(cfg->fail_fn, cfg->fail_nth, cfg->fail_code, fail, sizeof fail);
    snprintf(spec, sizeof spec, "memory=%zu,granularity=%zu,events=%s,fail_above=%zu,fail=%s",
             cfg->capacity, cfg->granularity, events, cfg->fail_above, fail);
    if (fake.fakecuda_configure(spec) != 0) {
        snprintf(err, errlen, "fakecuda_configure(\"%s\") refused (an earlier test left device "
                              "memory behind?)", spec);
        return GM_ESTATE;
    }
    fake.fakecuda_reset_counters();
    int vmm = cfg->granularity > 0;
    if (!fake.cuda[vmm]) {
        rc = gm_cuda_open(fake.path, &fake.cuda[vmm], err, errlen);
        if (rc)
            return rc;
    }
    d->be = gm_cuda_backend(fake.cuda[vmm]);
    int r = fake.cuCtxSetCurrent(fake.ctx0);
    if (r != 0) {
        snprintf(err, errlen, "cuCtxSetCurrent failed: %d", r);
        return GM_EDEVICE;
    }
    for (int i = 0; i < 4; i++)
        d->reclaimed0[i] = fake.fakecuda_query(reclaimed_keys[i], -1);
    for (int i = 1; i < TDEV_NSTREAMS; i++) {
        void *s = NULL;
        r = fake.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        if (r != 0) {
            snprintf(err, errlen, "cuStreamCreate failed: %d", r);
            return GM_EDEVICE;
        }
        d->streams[i] = (uintptr_t)s;
    }
    return 0;
}

/* What the fake still holds, appended to err; returns how many things. */
static long cuda_leftovers(tdev_t *d, char *err, size_t errlen) {
    static const char *const keys[] = {
        "allocations",  "bytes_allocated", "handles", "handles_released_but_mapped",
        "bytes_created", "reservations",   "bytes_reserved", "mappings",
        "bytes_mapped", "events",          "streams",
    };
    long bad = 0;
    size_t used = strlen(err);
    for (int dev = 0; dev < fake.ndev; dev++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            long long v = fake.fakecuda_query(keys[k], dev);
            if (v != 0) {
                bad++;
                if (used + 1 < errlen)
                    used += (size_t)snprintf(err + used, errlen - used, " device %d %s=%lld;",
                                             dev, keys[k], v);
            }
        }
    for (int i = 0; i < 4; i++) {
        long long v = fake.fakecuda_query(reclaimed_keys[i], -1) - d->reclaimed0[i];
        if (v != 0) {
            bad++;
            if (used + 1 < errlen)
                used += (size_t)snprintf(err + used, errlen - used, " %s by a context reset=%lld;",
                                         reclaimed_keys[i], v);
        }
    }
    return bad;
}

static int cuda_close(tdev_t *d, char *err, size_t errlen) {
    int bad = 0;
    if (!fake.lib)
        return 0; /* never loaded: nothing was created */
    fake.cuCtxSetCurrent(fake.ctx0);
    for (int i = 1; i < TDEV_NSTREAMS; i++) {
        if (!d->streams[i])
            continue;
        int r = fake.cuStreamDestroy_v2((void *)d->streams[i]);
        if (r != 0) {
            bad = 1;
            snprintf(err, errlen, "cuStreamDestroy(stream %d) failed: %d;", i, r);
        }
    }
    if (bad)
        return -1;
    snprintf(err, errlen, "the fake driver is not clean:");
    if (cuda_leftovers(d, err, errlen) == 0) {
        err[0] = 0;
        return 0;
    }
    /* Reclaim what a context reset can (allocations, events, streams), so
     * that one leaking test does not make every later one fail. */
    for (int dev = 0; dev < fake.ndev; dev++)
        fake.cuDevicePrimaryCtxReset_v2(dev);
    return -1;
}

/* ------------------------------------------------------------ public */

int tdev_open(const tdev_config_t *cfg_in, tdev_t **out, char *err, size_t errlen) {
    tdev_config_t cfg;
    if (cfg_in)
        cfg = *cfg_in;
    else
        tdev_config_default(&cfg);
    if (cfg.num_devices < 1)
        cfg.num_devices = 1;
    *out = NULL;
    err[0] = 0;
    tdev_t *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of host memory");
        return GM_ENOMEM;
    }
    d->kind = tdev_kind();
    d->num_devices = cfg.num_devices;
    int rc;
    if (d->kind == TDEV_CUDA) {
        rc = cuda_open(d, &cfg, err, errlen);
        if (rc) {
            char ignored[256];
            cuda_close(d, ignored, sizeof ignored);
            free(d);
            return rc;
        }
    } else {
        gm_vdev_config_t sc;
        gm_vdev_config_default(&sc);
        sc.num_devices = cfg.num_devices;
        sc.capacity = cfg.capacity;
        sc.granularity = cfg.granularity;
        sc.mode = cfg.host_memory ? GM_VDEV_HOST : GM_VDEV_VIRTUAL;
        sc.event_mode = cfg.event_mode;
        sc.event_after_n = cfg.event_after_n;
        sc.fail_above = cfg.fail_above;
        sc.fail_fn = cfg.fail_fn;
        sc.fail_nth = cfg.fail_nth;
        sc.fail_code = cfg.fail_code;
        rc = gm_vdev_create(&sc, &d->vdev);
        if (rc || !d->vdev) {
            snprintf(err, errlen, "gm_vdev_create failed: %d (%s)", rc, gm_strerror(rc));
            free(d);
            return rc ? rc : GM_ENOMEM;
        }
        d->be = gm_vdev_backend(d->vdev);
        for (int i = 1; i < TDEV_NSTREAMS; i++)
            d->streams[i] = (uintptr_t)0x1100 * (uintptr_t)i;
    }
    *out = d;
    return 0;
}

int tdev_close(tdev_t *d, char *err, size_t errlen) {
    if (!d)
        return 0;
    err[0] = 0;
    int rc = 0;
    if (d->kind == TDEV_CUDA) {
        rc = cuda_close(d, err, errlen);
    } else {
        size_t used = 0;
        for (int dev = 0; dev < d->num_devices; dev++) {
            gm_vdev_counters_t c;
            gm_vdev_get_counters(d->vdev, dev, &c);
            if (c.live_segments || c.bytes_allocated || c.bytes_mapped || c.live_reservations ||
                c.bytes_reserved_va || c.live_events) {
                rc = -1;
                if (used + 1 < errlen)
                    used += (size_t)snprintf(err + used, errlen - used,
                                             "device %d not clean: segments=%ld allocated=%zu "
                                             "mapped=%zu reservations=%ld va=%zu events=%ld; ",
                                             dev, c.live_segments, c.bytes_allocated,
                                             c.bytes_mapped, c.live_reservations,
                                             c.bytes_reserved_va, c.live_events);
            }
        }
        gm_vdev_destroy(d->vdev);
    }
    free(d);
    return rc;
}

void tdev_shutdown(void) {
    if (!fake.lib)
        return;
    for (int v = 0; v < 2; v++) {
        gm_cuda_close(fake.cuda[v]);
        fake.cuda[v] = NULL;
    }
    if (fake.ctx0) {
        int dev = 0;
        fake.cuCtxSetCurrent(NULL);
        if (fake.cuDeviceGet(&dev, 0) == 0)
            fake.cuDevicePrimaryCtxRelease_v2(dev);
        fake.ctx0 = NULL;
    }
    /* The library stays loaded, as gm_cuda_close leaves it. */
}

const gm_backend_t *tdev_backend(tdev_t *d) { return d->be; }

uintptr_t tdev_stream(tdev_t *d, int index) {
    if (index <= 0 || index >= TDEV_NSTREAMS)
        return 0;
    return d->streams[index];
}

void tdev_counters(tdev_t *d, int device, tdev_counters_t *out) {
    memset(out, 0, sizeof *out);
    if (d->kind == TDEV_VDEV) {
        gm_vdev_counters_t c;
        gm_vdev_get_counters(d->vdev, device, &c);
        for (int i = 0; i < TDEV_FN_COUNT; i++)
            out->calls[i] = c.calls[i];
        out->bytes_allocated = c.bytes_allocated;
        out->bytes_mapped = c.bytes_mapped;
        out->bytes_reserved_va = c.bytes_reserved_va;
        out->live_segments = c.live_segments;
        out->live_events = c.live_events;
        out->live_reservations = c.live_reservations;
        out->peak_used = c.peak_used;
        return;
    }
    long long (*q)(const char *, int) = fake.fakecuda_query;
    for (int i = 0; i < TDEV_FN_COUNT; i++)
        out->calls[i] = (long)q(fn_count_key[i], -1);
    out->bytes_allocated = (size_t)q("bytes_allocated", device);
    out->bytes_mapped = (size_t)q("bytes_mapped", device);
    out->bytes_reserved_va = (size_t)q("bytes_reserved", device);
    out->live_segments = (long)q("allocations", device);
    out->live_events = (long)q("events", device);
    out->live_reservations = (long)q("reservations", device);
    out->peak_used = (size_t)q("peak_bytes_used", device);
}

long tdev_sync_calls(tdev_t *d) {
    if (d->kind == TDEV_VDEV)
        return 0;
    return (long)(fake.fakecuda_query("calls.cuStreamSynchronize", -1) +
                  fake.fakecuda_query("calls.cuCtxSynchronize", -1));
}

void tdev_complete_events(tdev_t *d) {
    if (d->kind == TDEV_VDEV)
        gm_vdev_complete_events(d->vdev);
    else
        fake.fakecuda_complete_events();
}

void tdev_set_event_mode(tdev_t *d, int mode, int after_n) {
    if (d->kind == TDEV_VDEV) {
        gm_vdev_set_event_mode(d->vdev, mode, after_n);
        return;
    }
    char buf[32];
    event_mode_text(mode, after_n, buf, sizeof buf);
    fake.fakecuda_set_event_mode(buf);
}

void tdev_set_failure(tdev_t *d, int fn, long nth, int code, size_t fail_above) {
    if (d->kind == TDEV_VDEV) {
        gm_vdev_set_failure(d->vdev, fn, nth, code, fail_above);
        return;
    }
    char fail[128], spec[256];
    fail_text(fn, nth, code, fail, sizeof fail);
    snprintf(spec, sizeof spec, "fail_above=%zu,fail=%s", fail_above, fail);
    if (fake.fakecuda_configure(spec) != 0)
        fprintf(stderr, "testdev: fakecuda_configure(\"%s\") refused\n", spec);
}

int tdev_capture_begin(tdev_t *d, uintptr_t stream) {
    if (d->kind == TDEV_VDEV)
        return 0;
    return fake.cuStreamBeginCapture_v2((void *)stream, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */);
}

int tdev_capture_end(tdev_t *d, uintptr_t stream) {
    if (d->kind == TDEV_VDEV)
        return 0;
    void *graph = NULL;
    int r = fake.cuStreamEndCapture((void *)stream, &graph);
    if (graph)
        fake.cuGraphDestroy(graph);
    return r;
}
