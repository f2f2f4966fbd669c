/*
 * fakecuda_timeline.c - simulated time of the fake CUDA driver: one host
 * clock, a clock per stream, and the cost model that moves them (Note
 * [Device timeline]). Used only in the "timeline" event mode (the default);
 * the other modes (immediate, never, after:N) never look at a clock.
 *
 * Invariants: fc.host_ns never decreases; a stream's ready time never
 * decreases; ctx->tl_all >= every ready time of the context's streams and
 * ctx->tl_blocking >= every ready time of its blocking streams; an event
 * recorded in this mode completes when fc.host_ns reaches its time.
 *
 * Must not: read a wall clock (runs must be reproducible), or call an
 * exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

/*
 * Note [Device timeline]
 * Rationale: PyTorch's allocator behaves differently when device work is
 *   still running: a block freed after record_stream is reused only once
 *   the event recorded on the using stream completes, and the OOM path
 *   synchronises before it frees cached blocks. With events that complete
 *   at once none of that is exercised.
 * Approach: simulated nanoseconds. The host clock advances by
 *   FC_TL_HOST_CALL_NS at every driver call (fc_enter_unlocked) and jumps
 *   forward when the host waits (stream/event/context synchronisation,
 *   synchronous copies). Work enqueued on a stream starts at the later of
 *   the host clock and the stream's ready time and lasts its cost: a
 *   kernel FC_TL_KERNEL_NS (torch's _sleep kernel its cycles at the GPU's
 *   clock, see rt_launch.c); a copy or memset FC_TL_COPY_NS plus its bytes
 *   at the GPU memory's bandwidth (device to device: read and write) or at
 *   the PCIe bandwidth when host memory is involved. An event takes the
 *   ready time of its stream at the record; cuStreamWaitEvent moves the
 *   waiting stream's ready time up to the event's. The legacy default
 *   stream synchronises implicitly with the blocking streams of its
 *   context (work on it starts after theirs, and theirs after its).
 * Limitations: one cost per kernel whatever its size; no overlap limits
 *   (any number of streams run at once); the per-thread default stream
 *   shares the legacy stream's clock; peer copies are charged to the
 *   current context's stream; several host threads share one host clock.
 */

/* A stream's ready time as work enqueued on it now sees it. */
static uint64_t *clock_of(struct CUctx_st *ctx, uint64_t key, fc_stream_t **out)
{
    fc_stream_t *s = fc_vec_find(&fc.streams, key);
    *out = s;
    return s ? &s->tl_ready : &ctx->tl_legacy;
}

static uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* When work enqueued on the stream now may start, host aside. */
static uint64_t stream_after_unlocked(struct CUctx_st *ctx, const fc_stream_t *s,
                                      uint64_t own)
{
    if (!s) /* legacy: after every blocking stream */
        return max64(own, ctx->tl_blocking);
    if (!(s->flags & CU_STREAM_NON_BLOCKING)) /* blocking: after the legacy stream */
        return max64(own, ctx->tl_legacy);
    return own;
}

static void set_ready_unlocked(struct CUctx_st *ctx, fc_stream_t *s, uint64_t *clk, uint64_t t)
{
    *clk = max64(*clk, t);
    if (s && !(s->flags & CU_STREAM_NON_BLOCKING))
        ctx->tl_blocking = max64(ctx->tl_blocking, *clk);
    ctx->tl_all = max64(ctx->tl_all, *clk);
}

uint64_t fc_tl_ready_unlocked(struct CUctx_st *ctx, uint64_t key)
{
    fc_stream_t *s;
    uint64_t *clk = clock_of(ctx, key, &s);
    return stream_after_unlocked(ctx, s, *clk);
}

void fc_tl_enqueue_unlocked(struct CUctx_st *ctx, uint64_t key, uint64_t cost_ns)
{
    if (fc.ev_mode != FC_EV_TIMELINE)
        return;
    fc_stream_t *s;
    uint64_t *clk = clock_of(ctx, key, &s);
    uint64_t start = max64(fc.host_ns, stream_after_unlocked(ctx, s, *clk));
    set_ready_unlocked(ctx, s, clk, start + cost_ns);
}

void fc_tl_wait_unlocked(struct CUctx_st *ctx, uint64_t key, uint64_t t)
{
    fc_stream_t *s;
    uint64_t *clk = clock_of(ctx, key, &s);
    set_ready_unlocked(ctx, s, clk, t);
}

void fc_tl_host_wait_unlocked(uint64_t t) { fc.host_ns = max64(fc.host_ns, t); }

uint64_t fc_tl_kernel_ns(long long cycles)
{
    if (cycles < 0)
        return FC_TL_KERNEL_NS;
    /* cycles at clock_khz: cycles / (khz * 1e3) s = cycles * 1e6 / khz ns */
    return (uint64_t)((double)cycles * 1e6 / (double)fc.gpu.clock_khz);
}

/* A copy of n bytes; dev_dst/dev_src: is that side device memory? */
uint64_t fc_tl_copy_ns(size_t n, int dev_dst, int dev_src)
{
    double gbs; /* GB/s = bytes per ns */
    double bytes = (double)n;
    if (dev_dst && dev_src) {
        gbs = fc.gpu.mem_bw_gbs;
        bytes *= 2; /* read and write */
    } else if (dev_dst < 0) { /* a memset: write only */
        gbs = fc.gpu.mem_bw_gbs;
    } else {
        gbs = fc.gpu.pcie_gbs;
    }
    return FC_TL_COPY_NS + (uint64_t)(bytes / gbs);
}

/* Does p lie in device memory? */
static int on_device_unlocked(uint64_t p)
{
    uint64_t base;
    size_t size;
    int dev;
    return fc_lookup_device_ptr_unlocked(p, &base, &size, &dev);
}

void fc_tl_copy_unlocked(CUstream h, uint64_t dst, uint64_t src, size_t n, int host_waits)
{
    if (fc.ev_mode != FC_EV_TIMELINE)
        return;
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if (fc_current_ctx_unlocked(&c) != CUDA_SUCCESS ||
        fc_resolve_stream_unlocked(h, c, &key, &sctx) != CUDA_SUCCESS)
        return;
    int dd = on_device_unlocked(dst), ds = src ? on_device_unlocked(src) : -1;
    fc_tl_enqueue_unlocked(sctx, key, src ? fc_tl_copy_ns(n, dd, ds) : fc_tl_copy_ns(n, -1, 0));
    if (host_waits && !(dd && ds))
        fc_tl_host_wait_unlocked(fc_tl_ready_unlocked(sctx, key));
}

/* The fake runtime's kernel launches: the checks of a launch on hStream,
 * then its work (cycles >= 0: torch's _sleep kernel; -1: any other), or,
 * on a capturing stream, a kernel node (Note [Stream capture] in
 * fakecuda_capture.c). Not a cu* function, so neither counted nor open to
 * failure injection. */
FC_API CUresult fakecuda_launch(CUstream hStream, long long cycles)
{
    struct CUctx_st *c, *sctx;
    uint64_t key;
    int captured;
    CUresult res = CUDA_ERROR_NOT_INITIALIZED;
    fc_lock();
    fc.host_ns += FC_TL_HOST_CALL_NS;
    if (fc.initialized && (res = fc_current_ctx_unlocked(&c)) == CUDA_SUCCESS &&
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) == CUDA_SUCCESS) {
        struct CUgraphNode_st proto = {.type = FC_NODE_KERNEL, .u.cycles = cycles};
        res = fc_cap_work_unlocked(sctx, key, &proto, &captured);
        if (res == CUDA_SUCCESS && !captured) {
            fc_spin_kernel_unlocked(); /* Note [Reads that wait on kernels] */
            fc_tl_enqueue_unlocked(sctx, key, fc_tl_kernel_ns(cycles));
        }
    }
    fc_unlock();
    return res;
}
