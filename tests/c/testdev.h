/*
 * testdev.h - the device under the C tests, backend-neutral.
 *
 * A test device (tdev_t) is either the virtual device (csrc/device/vdev*.c,
 * the default) or the CUDA driver backend (csrc/device/cuda_*.c) over
 * the fake libcuda.so.1 of simgpu/driver, chosen once per process with
 * --backend=virtual|cuda on the command line (tdev_parse_args) or
 * GM_TEST_BACKEND=virtual|cuda. The fake is loaded from $GPUMEM_LIBCUDA.
 *
 * Both backends take the same configuration (capacity, VMM granularity,
 * event completion mode, failure injection) and answer the same counters, so
 * a test states what it needs once and runs on either:
 *
 *   vdev   a fresh gm_vdev_t per tdev_open.
 *   cuda  the fake has two devices unless GPUMEM_FAKECUDA_DEVICES says
 *         otherwise (set before its cuInit, which tdev_open calls once);
 *         one gm_cuda_t per process for devices with VMM and one for devices
 *         without (the backend caches VMM support per device, as it may:
 *         it does not change on a real GPU), and the fake reconfigured per
 *         tdev_open with fakecuda_configure + fakecuda_reset_counters. The
 *         fake only accepts streams it created, so tdev_open creates real
 *         streams (cuStreamCreate, in the primary context) and tdev_stream()
 *         returns them; tdev_close destroys them and then checks, through
 *         fakecuda_query, that the driver holds nothing: no allocation,
 *         handle, mapping, reservation, event or stream, and nothing was
 *         reclaimed by a context reset.
 *
 * Failure injection names the virtual device's functions (TDEV_FN_*); on cuda
 * they become driver entry points: seg_alloc -> cuMemAlloc_v2,
 * seg_free -> cuMemFree_v2, event_create -> cuEventCreate,
 * event_record -> cuEventRecord, event_query -> cuEventQuery,
 * map -> cuMemCreate (the backend creates one handle per granule, so the
 * Nth map is the Nth granule), unmap -> cuMemUnmap,
 * va_reserve -> cuMemAddressReserve; GM_EOOM -> CUDA_ERROR_OUT_OF_MEMORY,
 * any other code -> CUDA_ERROR_UNKNOWN. Counters map the same way
 * (calls[TDEV_FN_MAP] counts cuMemMap calls: one per granule on cuda, one
 * per map() on the virtual device).
 *
 * Must not: be used from two threads at once (a tdev_t belongs to one test).
 */
#ifndef GM_TEST_TESTDEV_H
#define GM_TEST_TESTDEV_H

#include <stddef.h>
#include <stdint.h>

#include "device/backend.h"

enum { TDEV_VDEV = 0, TDEV_CUDA = 1 };

/* Event completion policy (the virtual device's GM_VDEV_EVENTS_*). */
enum {
    TDEV_EVENTS_IMMEDIATE = 0, /* every query says complete */
    TDEV_EVENTS_NEVER = 1,     /* not ready until tdev_complete_events() or a sync */
    TDEV_EVENTS_AFTER_N = 2    /* the first N queries say "not ready" */
};

/* Functions whose Nth call can be made to fail (the virtual device's gm_vdev_fn_t). */
enum {
    TDEV_FN_SEG_ALLOC = 0,
    TDEV_FN_SEG_FREE,
    TDEV_FN_EVENT_CREATE,
    TDEV_FN_EVENT_RECORD,
    TDEV_FN_EVENT_QUERY,
    TDEV_FN_MAP,
    TDEV_FN_UNMAP,
    TDEV_FN_VA_RESERVE,
    TDEV_FN_COUNT
};

typedef struct tdev_config {
    int num_devices;    /* default 1; cuda: the fake must have at least this many */
    size_t capacity;    /* bytes per device; default 80 GiB */
    size_t granularity; /* VMM granularity; default 2 MiB; 0 = no VMM */
    int host_memory;    /* vdev: real host memory (GM_VDEV_HOST); cuda: always real */
    int event_mode;     /* TDEV_EVENTS_* */
    int event_after_n;  /* for TDEV_EVENTS_AFTER_N */
    size_t fail_above;  /* a seg_alloc/map of more than this fails with OOM; 0 = off.
                           cuda: a cuMemAlloc_v2/cuMemCreate of more than this, and
                           cuMemCreate is one granule */
    int fail_fn;        /* TDEV_FN_*, or -1 */
    long fail_nth;      /* the 1-based call number of fail_fn that fails */
    int fail_code;      /* GM_EOOM (default) or another GM_E* code */
} tdev_config_t;

typedef struct tdev_counters {
    long calls[TDEV_FN_COUNT]; /* since tdev_open */
    size_t bytes_allocated;    /* plain segments live now */
    size_t bytes_mapped;       /* VMM granules mapped now */
    size_t bytes_reserved_va;
    long live_segments;
    long live_events;
    long live_reservations;
    size_t peak_used; /* peak of allocated + mapped (cuda: + created) */
} tdev_counters_t;

/* Streams: index 0 is the default stream (0); 1 .. TDEV_NSTREAMS-1 are
 * distinct streams of device 0. */
#define TDEV_NSTREAMS 16

typedef struct tdev tdev_t;

/* The backend chosen for this process (TDEV_VDEV unless --backend=cuda or
 * GM_TEST_BACKEND=cuda). tdev_parse_args removes --backend=... from argv
 * and returns -1 (after printing why) for a bad value. */
int tdev_parse_args(int *argc, char **argv);
int tdev_kind(void);
const char *tdev_kind_name(void);

void tdev_config_default(tdev_config_t *cfg);
/* 0, or a GM_E* code with one sentence in err. */
int tdev_open(const tdev_config_t *cfg, tdev_t **out, char *err, size_t errlen);
/* Checks that the device got everything back (call after gm_alloc_destroy),
 * then releases it. 0 when clean; otherwise -1 and what is left in err.
 * Always releases the tdev_t. */
int tdev_close(tdev_t *d, char *err, size_t errlen);
/* Process exit: closes the driver backend and releases the primary
 * contexts the test layer retained (cuda); nothing for vdev. */
void tdev_shutdown(void);

const gm_backend_t *tdev_backend(tdev_t *d);
uintptr_t tdev_stream(tdev_t *d, int index);
void tdev_counters(tdev_t *d, int device, tdev_counters_t *out);
/* How many stream and context synchronize calls the driver has seen
 * (cuda: each completes the events recorded on that stream or context,
 * see stress.c); 0 on vdev, whose stream_synchronize completes nothing. */
long tdev_sync_calls(tdev_t *d);
/* Mark every recorded event complete. */
void tdev_complete_events(tdev_t *d);
/* For events recorded from now on (cuda) / the next queries (vdev). */
void tdev_set_event_mode(tdev_t *d, int mode, int after_n);
/* Replace the failure injection (fn = -1: none); the Nth-call count starts
 * again from here. code GM_EOOM or another GM_E* code. */
void tdev_set_failure(tdev_t *d, int fn, long nth, int code, size_t fail_above);
/* Stream capture in the global mode, as torch.cuda.graph begins it (cuda:
 * cuStreamBeginCapture_v2 / cuStreamEndCapture on the fake, whose capture
 * rules fail and invalidate the calls a capture forbids; the graph is
 * destroyed at once). 0, or the CUresult; sim: nothing, 0. */
int tdev_capture_begin(tdev_t *d, uintptr_t stream);
int tdev_capture_end(tdev_t *d, uintptr_t stream);

#endif /* GM_TEST_TESTDEV_H */
