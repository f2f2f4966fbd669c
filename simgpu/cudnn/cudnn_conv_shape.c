/*
 * cudnn_conv_shape.c - convolution arithmetic shared by the legacy API and
 * the backend's convolution operations: the shape rules cuDNN checks, and
 * the workspace each simulated engine (legacy: algorithm) asks for.
 *
 * Layout convention (cuDNN's, for both APIs): x = [N, C, spatial...],
 * w = [K, C / groups, filter spatial...], y = [N, K, output spatial...]; for
 * the backward directions x and y are dx and dy.
 *
 * Must not: depend on which API asked (both fill a sim_conv_geom_t).
 */
#include "cudnn_internal.h"

int sim_conv_out_dims(const sim_conv_geom_t *g, int64_t *y)
{
    for (int i = 0; i < g->nspatial; i++) {
        int64_t in = g->x[2 + i] + g->pre[i] + g->post[i];
        int64_t k = (g->w[2 + i] - 1) * g->dilation[i] + 1;
        if (g->stride[i] <= 0 || in < k)
            return -1;
        y[2 + i] = (in - k) / g->stride[i] + 1;
    }
    y[0] = g->x[0];
    y[1] = g->w[0];
    return 0;
}

cudnnStatus_t sim_conv_check(sim_conv_geom_t *g)
{
    int nd = g->nspatial + 2;
    for (int i = 0; i < nd; i++)
        if (g->x[i] <= 0 || g->w[i] <= 0 || g->y[i] <= 0)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "convolution: dimension %d is not positive", i);
    for (int i = 0; i < g->nspatial; i++)
        if (g->stride[i] < 1 || g->dilation[i] < 1 || g->pre[i] < 0 || g->post[i] < 0)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "convolution: stride and dilation must be >= 1 and paddings >= 0 "
                                "(spatial dimension %d)", i);
    if (g->x[1] % g->w[1] != 0)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "convolution: input channels %lld are not a multiple of the filter's "
                            "%lld", (long long)g->x[1], (long long)g->w[1]);
    int64_t groups = g->x[1] / g->w[1];
    if (g->groups > 0 && g->groups != groups)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "convolution: group count %lld does not match channels %lld / %lld",
                            (long long)g->groups, (long long)g->x[1], (long long)g->w[1]);
    if (g->w[0] % groups != 0)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "convolution: %lld output channels do not split into %lld groups",
                            (long long)g->w[0], (long long)groups);
    int64_t want[SIM_CUDNN_DIM_MAX];
    if (sim_conv_out_dims(g, want) != 0)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "convolution: the dilated filter is larger than the padded input");
    for (int i = 0; i < nd; i++)
        if (want[i] != g->y[i])
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "convolution: output dimension %d is %lld, expected %lld", i,
                                (long long)g->y[i], (long long)want[i]);
    g->groups = groups;
    return CUDNN_STATUS_SUCCESS;
}

/* Note [cuDNN workspace sizes]
 * Rationale: NVIDIA does not publish how much workspace each cuDNN engine
 * needs; PyTorch allocates whatever the chosen plan (or legacy algorithm)
 * asks for through its caching allocator, and with
 * torch.backends.cudnn.benchmark it allocates every candidate's workspace
 * while timing them. The simulator must ask for plausible, deterministic
 * amounts that grow with the problem as real ones do.
 * Approach: three engines per convolution direction, modelled on cuDNN's
 * classic algorithm families:
 *   engine 0 "implicit GEMM": no workspace;
 *   engine 1 "implicit GEMM with precomputed indices": one 32-bit offset per
 *     (output position, filter tap): 4 * prod(y spatial) * prod(w spatial);
 *   engine 2 "explicit GEMM" (im2col / col2im): the unfolded input matrix,
 *     elem * N * (C / groups) * prod(w spatial) * prod(y spatial).
 * Each is rounded up to 256 bytes. The legacy algorithms map onto them
 * (IMPLICIT_GEMM / ALGO_0 -> 0, PRECOMP_GEMM / ALGO_1 -> 1, GEMM / ALGO_3
 * -> 2). Engine 1 of the backward directions carries the NONDETERMINISTIC
 * note (it accumulates with atomics), engine 2 in half or bfloat16 the
 * TENSOR_CORE note; heuristics rank 1, 0, 2 and the fallback list is 0.
 * Limitations: real sizes differ per GPU, cuDNN version and layout, and
 * real heuristics offer more engines; only the pattern (none, small, large,
 * growing with batch and spatial size) is modelled.
 */
int64_t sim_conv_workspace(const sim_conv_geom_t *g, int dir, int engine)
{
    (void)dir;
    int64_t ys = 1, ws = 1;
    for (int i = 0; i < g->nspatial; i++) {
        ys *= g->y[2 + i];
        ws *= g->w[2 + i];
    }
    int64_t bytes = 0;
    if (engine == 1)
        bytes = 4 * ys * ws;
    else if (engine == 2)
        bytes = (int64_t)(g->elem ? g->elem : 4) * g->x[0] * g->w[1] * ws * ys;
    return (bytes + 255) / 256 * 256;
}
