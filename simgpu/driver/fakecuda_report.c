/*
 * fakecuda_report.c - error names and strings, the accounting report (JSON)
 * and the fakecuda_* test-control functions.
 *
 * The report is built under fc.mu into a private buffer and copied out, so a
 * reader never sees a half-updated state. At process exit (library
 * destructor) it is written to $GPUMEM_FAKECUDA_REPORT atomically: a
 * temporary file in the same directory, then rename().
 *
 * Must not: block forever at exit if another thread died holding the lock
 * (the destructor only tries the lock for a while, then gives up).
 */
#include "fakecuda_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* error names and strings                                              */

/* Names are the CUresult enumerators of cuda.h. Strings are the driver's
 * texts for the common codes and short descriptions for the rest. */
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled while using external profiling tool"},
    {CUDA_ERROR_PROFILER_NOT_INITIALIZED, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {CUDA_ERROR_PROFILER_ALREADY_STARTED, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {CUDA_ERROR_PROFILER_ALREADY_STOPPED, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "API call is not supported in the installed CUDA driver"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {CUDA_ERROR_ARRAY_IS_MAPPED, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_ALREADY_ACQUIRED, "CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "resource not mapped as array"},
    {CUDA_ERROR_NOT_MAPPED_AS_POINTER, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "resource not mapped as pointer"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, "CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "exclusive-thread device already in use by a different thread"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid OpenGL or DirectX context"},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error detected during the execution"},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation was disabled"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "the provided PTX contains unsupported call to cudaDeviceSynchronize"},
    {CUDA_ERROR_CONTAINED, "CUDA_ERROR_CONTAINED", "Invalid access of peer GPU memory over nvlink or a hardware error"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_LOSSY_QUERY, "CUDA_ERROR_LOSSY_QUERY", "attempted introspection would be semantically lossy"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch uses incompatible texturing mode"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid program counter"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory not completely freed"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED", "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {CUDA_ERROR_MPS_RPC_FAILURE, "CUDA_ERROR_MPS_RPC_FAILURE", "the remote procedural call between the MPS server and the MPS client failed"},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY", "MPS server is not ready to accept new MPS client requests"},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "the hardware resources required to create MPS client have been exhausted"},
    {CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "the hardware resources required to support device connections have been exhausted"},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client has been terminated by the server"},
    {CUDA_ERROR_CDP_NOT_SUPPORTED, "CUDA_ERROR_CDP_NOT_SUPPORTED", "the module is using CUDA Dynamic Parallelism, but the current configuration does not support it"},
    {CUDA_ERROR_CDP_VERSION_MISMATCH, "CUDA_ERROR_CDP_VERSION_MISMATCH", "the module uses CUDA Dynamic Parallelism with mismatched versions"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {CUDA_ERROR_EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE", "an async error has occurred in an external entity outside of CUDA"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "a kernel launch error has occurred due to cluster misconfiguration"},
    {CUDA_ERROR_FUNCTION_NOT_LOADED, "CUDA_ERROR_FUNCTION_NOT_LOADED", "the function handle is not loaded when calling an API that requires a loaded function"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "one or more resources passed in are not valid resource types for the operation"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "one or more resources are insufficient or non-applicable for the operation"},
    {CUDA_ERROR_KEY_ROTATION, "CUDA_ERROR_KEY_ROTATION", "an error happened during the key rotation sequence"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int find_error(CUresult code)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code)
            return (int)i;
    return -1;
}

/* Both work before cuInit. Unknown code: CUDA_ERROR_INVALID_VALUE and
 * *pStr = NULL, as documented. */
FC_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    FC_BEGIN(FN_cuGetErrorString, 0);
    if (!pStr)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    int i = find_error(error);
    *pStr = i >= 0 ? errors[i].text : NULL;
    if (i < 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    FC_END();
}

FC_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    FC_BEGIN(FN_cuGetErrorName, 0);
    if (!pStr)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    int i = find_error(error);
    *pStr = i >= 0 ? errors[i].name : NULL;
    if (i < 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    FC_END();
}

static void event_mode_string(char *buf, size_t len)
{
    if (fc.ev_mode == FC_EV_TIMELINE)
        snprintf(buf, len, "timeline");
    else if (fc.ev_mode == FC_EV_IMMEDIATE)
        snprintf(buf, len, "immediate");
    else if (fc.ev_mode == FC_EV_NEVER)
        snprintf(buf, len, "never");
    else
        snprintf(buf, len, "after:%ld", fc.ev_after);
}

#define LEAK_DETAIL_LIMIT 100

int fc_leak_slot(sim_sb_t *sb, int *first, int *left)
{
    if (*left <= 0) {
        *left = -1;
        return 0;
    }
    (*left)--;
    sim_sb_printf(sb, "%s\n   ", *first ? "" : ",");
    *first = 0;
    return 1;
}

static void build_report_unlocked(sim_sb_t *sb)
{
    char mode[64];
    event_mode_string(mode, sizeof mode);

    sim_sb_printf(sb, "{\"version\": 1, \"initialized\": %s, \"pid\": %ld,\n",
                 fc.initialized ? "true" : "false", (long)getpid());
    sim_sb_printf(sb, " \"config\": {\"devices\": %d, \"memory\": %zu, \"granularity\": %zu, "
                     "\"events\": ", fc.ndev, fc.memory, fc.granularity);
    sim_sb_json_str(sb, mode);
    sim_sb_printf(sb, ", \"fail\": ");
    sim_sb_json_str(sb, fc.fail_spec);
    sim_sb_printf(sb, ", \"fail_above\": %zu, \"no_host_memory\": %s, \"report\": ", fc.fail_above,
                  fc.no_host_memory ? "true" : "false");
    if (fc.report_path)
        sim_sb_json_str(sb, fc.report_path);
    else
        sim_sb_printf(sb, "null");
    sim_sb_printf(sb, "},\n \"calls\": {");
    uint64_t total = 0;
    for (int i = 0; i < FN_COUNT; i++) {
        sim_sb_printf(sb, "%s\"%s\": %llu", i ? ", " : "", fc_func_names[i],
                     (unsigned long long)fc.calls[i]);
        total += fc.calls[i];
    }
    sim_sb_printf(sb, "},\n \"total_calls\": %llu,\n \"devices\": [", (unsigned long long)total);

    size_t lk_allocs = 0, lk_alloc_bytes = 0, lk_handles = 0, lk_created = 0, lk_res = 0;
    size_t lk_maps = 0, lk_mapped = 0, lk_events = 0, lk_streams = 0, lk_refs = 0;
    for (int i = 0; i < fc.ndev; i++) {
        const fc_device_t *d = &fc.dev[i];
        size_t used = fc_used(d);
        sim_sb_printf(sb,
                     "%s\n  {\"ordinal\": %d, \"capacity\": %zu, \"bytes_allocated\": %zu, "
                     "\"bytes_created\": %zu, \"bytes_mapped\": %zu, \"bytes_reserved\": %zu, "
                     "\"bytes_context\": %zu, "
                     "\"bytes_used\": %zu, \"bytes_free\": %zu, \"peak_bytes_used\": %zu, "
                     "\"allocations\": %zu, \"handles\": %zu, \"handles_released_but_mapped\": %zu, "
                     "\"reservations\": %zu, \"mappings\": %zu, \"events\": %zu, "
                     "\"events_pending\": %zu, \"streams\": %zu, \"primary_ctx_refcount\": %d, "
                     "\"primary_ctx_active\": %s}",
                     i ? "," : "", i, d->capacity, d->bytes_allocated, d->bytes_created,
                     d->bytes_mapped, d->bytes_reserved, d->bytes_context, used,
                     used < d->capacity ? d->capacity - used : 0, d->peak_used, d->n_allocs,
                     d->n_handles, d->n_phys - d->n_handles, d->n_reservations, d->n_mappings,
                     d->n_events, fc_sync_pending_events_unlocked(i), d->n_streams,
                     d->ctx.refcount, d->ctx.refcount > 0 ? "true" : "false");
        lk_allocs += d->n_allocs;
        lk_alloc_bytes += d->bytes_allocated;
        lk_handles += d->n_handles;
        lk_created += d->bytes_created;
        lk_res += d->n_reservations;
        lk_maps += d->n_mappings;
        lk_mapped += d->bytes_mapped;
        lk_events += d->n_events;
        lk_streams += d->n_streams;
        lk_refs += (size_t)d->ctx.refcount;
    }
    size_t lk_total = lk_allocs + lk_handles + lk_res + lk_maps + lk_events + lk_streams +
                      fc.graphs.n + fc.execs.n;
    sim_sb_printf(sb, "],\n \"leaks\": {\"total\": %zu, \"allocations\": %zu, \"bytes_allocated\": %zu, "
                     "\"handles\": %zu, \"bytes_created\": %zu, \"reservations\": %zu, "
                     "\"mappings\": %zu, \"bytes_mapped\": %zu, \"events\": %zu, \"streams\": %zu, "
                     "\"graphs\": %zu, \"graph_execs\": %zu, "
                     "\"primary_ctx_refs\": %zu, \"details\": [",
                 lk_total, lk_allocs, lk_alloc_bytes, lk_handles, lk_created, lk_res, lk_maps,
                 lk_mapped, lk_events, lk_streams, fc.graphs.n, fc.execs.n, lk_refs);
    int first = 1, left = LEAK_DETAIL_LIMIT;
    left = fc_mem_report_leaks_unlocked(sb, &first, left);
    left = fc_sync_report_leaks_unlocked(sb, &first, left);
    left = fc_graph_report_leaks_unlocked(sb, &first, left);
    sim_sb_printf(sb, "], \"details_truncated\": %s},\n", left < 0 ? "true" : "false");
    sim_sb_printf(sb, " \"reclaimed_by_ctx_reset\": {\"allocations\": %zu, \"bytes\": %zu, "
                     "\"streams\": %zu, \"events\": %zu}\n}\n",
                 fc.reclaimed.allocations, fc.reclaimed.bytes, fc.reclaimed.streams,
                 fc.reclaimed.events);
}

/* ------------------------------------------------------------------ */
/* test control                                                         */

FC_API int fakecuda_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    fc_lock();
    build_report_unlocked(&sb);
    fc_unlock();
    return sim_sb_finish(&sb, buf, len);
}

FC_API void fakecuda_complete_events(void)
{
    fc_lock();
    fc_sync_complete_all_unlocked();
    fc_unlock();
}

FC_API void fakecuda_set_event_mode(const char *mode)
{
    int m;
    long after;
    if (!mode || fc_parse_event_mode(mode, &m, &after)) {
        fprintf(stderr, "fakecuda: fakecuda_set_event_mode('%s') ignored: expected 'timeline', "
                        "'immediate', 'never' or 'after:N'\n", mode ? mode : "(null)");
        return;
    }
    fc_lock();
    fc.ev_mode = m;
    fc.ev_after = after;
    fc_unlock();
}

FC_API int fakecuda_set_fail(const char *spec)
{
    fc_fail_rule_t rules[FC_MAX_FAIL_RULES];
    int n = 0;
    char err[256];
    if (spec && fc_parse_fail_spec(spec, rules, &n, err, sizeof err)) {
        fprintf(stderr, "fakecuda: fakecuda_set_fail('%s') rejected: %s\n", spec, err);
        return -1;
    }
    fc_lock();
    fc_set_fail_unlocked(rules, n, spec);
    fc_unlock();
    return 0;
}

FC_API void fakecuda_reset_counters(void)
{
    fc_lock();
    memset(fc.calls, 0, sizeof fc.calls);
    memset(fc.fail_seen, 0, sizeof fc.fail_seen);
    for (int i = 0; i < fc.ndev; i++)
        fc.dev[i].peak_used = fc.dev[i].bytes_allocated + fc.dev[i].bytes_created;
    fc_unlock();
}

/* Capacity and use of one device, without a context (for the simulator's
 * NVML, which reports memory per device). Works before cuInit, from the
 * configuration: -1 for an ordinal that is not a device. */
FC_API int fakecuda_device_memory(int device, size_t *total, size_t *used)
{
    int ret = -1;
    fc_lock();
    if (!fc.config_loaded)
        ret = -2;
    else if (fc_valid_device(device)) {
        const fc_device_t *d = &fc.dev[device];
        if (total)
            *total = d->capacity;
        if (used)
            *used = fc_used(d);
        ret = 0;
    }
    fc_unlock();
    return ret == -2 ? -1 : ret;
}

/* One number of the accounting, without JSON (README.md lists the keys).
 * Device keys read fc.dev[device]; global keys ignore `device`. -1 for an
 * unknown key, an ordinal that is not a device, or a device key before the
 * configuration is loaded. */
FC_API long long fakecuda_query(const char *key, int device)
{
    if (!key)
        return -1;
    long long v = -1;
    fc_lock();
    if (strncmp(key, "calls.", 6) == 0) {
        for (int i = 0; i < FN_COUNT; i++)
            if (strcmp(key + 6, fc_func_names[i]) == 0) {
                v = (long long)fc.calls[i];
                break;
            }
    } else if (strcmp(key, "total_calls") == 0) {
        uint64_t t = 0;
        for (int i = 0; i < FN_COUNT; i++)
            t += fc.calls[i];
        v = (long long)t;
    } else if (strcmp(key, "initialized") == 0) {
        v = fc.initialized;
    } else if (strcmp(key, "host_ns") == 0) {
        v = (long long)fc.host_ns;
    } else if (strcmp(key, "devices") == 0) {
        v = fc.ndev;
    } else if (strcmp(key, "memory") == 0) {
        v = (long long)fc.memory;
    } else if (strcmp(key, "granularity") == 0) {
        v = (long long)fc.granularity;
    } else if (strcmp(key, "fail_above") == 0) {
        v = (long long)fc.fail_above;
    } else if (strcmp(key, "no_host_memory") == 0) {
        v = fc.no_host_memory;
    } else if (strcmp(key, "no_host_memory_keep") == 0) {
        v = FC_NOHOST_KEEP;
    } else if (strcmp(key, "reclaimed.allocations") == 0) {
        v = (long long)fc.reclaimed.allocations;
    } else if (strcmp(key, "reclaimed.bytes") == 0) {
        v = (long long)fc.reclaimed.bytes;
    } else if (strcmp(key, "reclaimed.streams") == 0) {
        v = (long long)fc.reclaimed.streams;
    } else if (strcmp(key, "reclaimed.events") == 0) {
        v = (long long)fc.reclaimed.events;
    } else if (strcmp(key, "leaks") == 0) {
        size_t t = 0;
        for (int i = 0; i < fc.ndev; i++) {
            const fc_device_t *d = &fc.dev[i];
            t += d->n_allocs + d->n_handles + d->n_reservations + d->n_mappings + d->n_events +
                 d->n_streams;
        }
        t += fc.graphs.n + fc.execs.n;
        v = (long long)t;
    } else if (fc.config_loaded && fc_valid_device(device)) {
        const fc_device_t *d = &fc.dev[device];
        size_t used = fc_used(d);
        static const char *const keys[] = {
            "capacity", "bytes_allocated", "bytes_created", "bytes_mapped", "bytes_reserved",
            "bytes_context", "bytes_used", "bytes_free", "peak_bytes_used", "allocations", "handles",
            "handles_released_but_mapped", "reservations", "mappings", "events",
            "events_pending", "streams", "primary_ctx_refcount",
        };
        size_t vals[] = {
            d->capacity, d->bytes_allocated, d->bytes_created, d->bytes_mapped, d->bytes_reserved,
            d->bytes_context, used, used < d->capacity ? d->capacity - used : 0, d->peak_used, d->n_allocs,
            d->n_handles, d->n_phys - d->n_handles, d->n_reservations, d->n_mappings,
            d->n_events, fc_sync_pending_events_unlocked(device), d->n_streams,
            (size_t)d->ctx.refcount,
        };
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (strcmp(key, keys[i]) == 0) {
                v = (long long)vals[i];
                break;
            }
    }
    fc_unlock();
    return v;
}

/* ------------------------------------------------------------------ */
/* report at exit                                                       */

static void write_report_file(const char *path, const char *data, size_t n)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 64);
    if (!tmp)
        return;
    snprintf(tmp, plen + 64, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "fakecuda: cannot write report %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return;
    }
    int ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "fakecuda: cannot write report %s: %s\n", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
}

__attribute__((destructor)) static void fakecuda_at_exit(void)
{
    /* Another thread may still be inside the driver at exit; wait up to about
     * a second for the lock, then report without it rather than hang. */
    int locked = 0;
    for (int i = 0; i < 1000 && !locked; i++) {
        if (pthread_mutex_trylock(&fc.mu) == 0)
            locked = 1;
        else {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (fc.report_path && fc.report_pid == (long)getpid()) { /* not in a forked child */
        sim_sb_t sb = {0};
        build_report_unlocked(&sb);
        if (!sb.oom)
            write_report_file(fc.report_path, sb.p, sb.n);
        free(sb.p);
    }
    if (locked)
        fc_unlock();
}
