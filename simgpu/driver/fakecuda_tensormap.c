/*
 * fakecuda_tensormap.c - TMA descriptors: cuTensorMapEncodeTiled and
 * cuTensorMapEncodeIm2col, validated by the rules cuda.h documents for
 * each parameter (Note [Tensor maps]).
 *
 * Invariants: a call that fails writes nothing; one that succeeds fills all
 * 128 bytes of the CUtensorMap.
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

#include <string.h>

/*
 * Note [Tensor maps]
 * Rationale: Triton builds TMA descriptors on the host for its
 *   tensor-descriptor kernels; a descriptor the real driver refuses must
 *   be refused here, or such code works only on the simulator.
 * Approach: the requirements in cuda.h's documentation of the two
 *   functions, checked in its order, each failing with
 *   CUDA_ERROR_INVALID_VALUE: the map 64-byte aligned; a known data type;
 *   rank 1..5 (3..5 when interleaved; im2col: 3..5); the global address
 *   16-byte aligned (32 with 32-byte interleave or the packed 16U4/16U6
 *   ALIGN16B types); every global dimension 1..2^32; every stride (rank-1
 *   of them) a multiple of 16 (32 for the same cases) and below 2^40; box
 *   dimensions 1..256 with the inner box a multiple of 16 bytes when not
 *   interleaved and not above the swizzle span; element strides 1..8;
 *   32-byte interleave only with 32-byte swizzle; the NaN OOB fill only for
 *   floating-point types. Im2col: channelsPerPixel and pixelsPerColumn
 *   1..256 (128 for the packed ALIGN16B types) and not above the swizzle
 *   span, the pixel box corners within the documented ranges (rank 3:
 *   -32768..32767, 4: -128..127, 5: -16..15). Compute capability 9.0+. The
 *   descriptor's bytes: a digest of the arguments, so equal arguments give
 *   equal maps (its layout is opaque, "accessed only through CUDA APIs and
 *   PTX").
 * Limitations: the descriptor is not what the hardware would read (no
 *   kernel reads it here); im2col's "non-zero area" of the pixel box is not
 *   checked; cuTensorMapEncodeIm2colWide and
 *   cuTensorMapReplaceAddress are not exported.
 */

enum { DT_16U4_ALIGN8B = 13, DT_16U4_ALIGN16B = 14, DT_16U6_ALIGN16B = 15, DT_LAST = 15 };

/* Element size in bits of a CUtensorMapDataType (cuda.h's table). */
static int elem_bits(int dt)
{
    static const int bits[] = {8, 16, 32, 32, 64, 64, 16, 32, 64, 16, 32, 32, 32, 4, 4, 6};
    return dt >= 0 && dt <= DT_LAST ? bits[dt] : 0;
}

static int is_float(int dt) { return dt >= 6 && dt <= 12; }

typedef struct {
    CUtensorMap *map;
    int dt;
    cuuint32_t rank;
    uint64_t addr;
    const cuuint64_t *dim, *stride;
    const cuuint32_t *estride;
    int interleave, swizzle, l2, oob;
} common_t;

/* The checks both encoders share (a current context first); the box
 * (tiled) and the pixel box (im2col) are checked by the caller. */
static CUresult check_common_unlocked(const common_t *a, int min_rank)
{
    struct CUctx_st *c;
    CUresult res = fc_current_ctx_unlocked(&c);
    if (res != CUDA_SUCCESS)
        return res;
    int packed16 = a->dt == DT_16U4_ALIGN16B || a->dt == DT_16U6_ALIGN16B;
    int i32 = a->interleave == CU_TENSOR_MAP_INTERLEAVE_32B;
    if (!a->map || ((uintptr_t)a->map & 63) || !elem_bits(a->dt))
        return CUDA_ERROR_INVALID_VALUE;
    if (a->rank < (cuuint32_t)min_rank || a->rank > 5 ||
        (a->interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && a->rank < 3))
        return CUDA_ERROR_INVALID_VALUE;
    if (!a->addr || (a->addr & ((i32 || packed16) ? 31 : 15)))
        return CUDA_ERROR_INVALID_VALUE;
    if (!a->dim || (a->rank > 1 && !a->stride) || !a->estride)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)a->interleave > CU_TENSOR_MAP_INTERLEAVE_32B ||
        (unsigned)a->swizzle > 6 /* CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B */ ||
        (unsigned)a->l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B || (unsigned)a->oob > 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (i32 && a->swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
        return CUDA_ERROR_INVALID_VALUE;
    if (a->oob && (!is_float(a->dt)))
        return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t d = 0; d < a->rank; d++) {
        if (a->dim[d] == 0 || a->dim[d] > (1ull << 32))
            return CUDA_ERROR_INVALID_VALUE;
        if (a->estride[d] == 0 || a->estride[d] > 8)
            return CUDA_ERROR_INVALID_VALUE;
    }
    if ((packed16 && a->dim[0] % 128) || (a->dt == DT_16U4_ALIGN8B && a->dim[0] % 2))
        return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t d = 0; d + 1 < a->rank; d++)
        if (a->stride[d] % ((i32 || packed16) ? 32 : 16) || a->stride[d] >= (1ull << 40))
            return CUDA_ERROR_INVALID_VALUE;
    if (fc.gpu.cc_major < 9)
        return CUDA_ERROR_INVALID_VALUE; /* "only supported on ... 9.0 or higher" */
    return CUDA_SUCCESS;
}

/* FNV-1a over the arguments: an opaque but deterministic 128 bytes. */
static void fill(CUtensorMap *map, const void *args, size_t n, uint64_t seed)
{
    unsigned char out[128];
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < sizeof out; i++) {
        for (size_t j = 0; j < n; j++)
            h = (h ^ ((const unsigned char *)args)[j] ^ i) * 1099511628211ull;
        out[i] = (unsigned char)(h >> 32);
    }
    memcpy(map, out, sizeof out);
}

static void digest(const common_t *a, uint64_t *buf, size_t *n)
{
    size_t k = 0;
    buf[k++] = (uint64_t)a->dt, buf[k++] = a->rank, buf[k++] = a->addr;
    for (cuuint32_t d = 0; d < a->rank; d++) {
        buf[k++] = a->dim[d];
        buf[k++] = d + 1 < a->rank ? a->stride[d] : 0;
        buf[k++] = a->estride[d];
    }
    buf[k++] = (uint64_t)a->interleave << 24 | (uint64_t)a->swizzle << 16 |
               (uint64_t)a->l2 << 8 | (uint64_t)a->oob;
    *n = k;
}

FC_API CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
    const cuuint32_t *boxDim, const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    FC_BEGIN(FN_cuTensorMapEncodeTiled, 1);
    common_t a = {tensorMap, (int)tensorDataType, tensorRank, (uint64_t)(uintptr_t)globalAddress,
                  globalDim, globalStrides, elementStrides, (int)interleave, (int)swizzle,
                  (int)l2Promotion, (int)oobFill};
    if ((res = check_common_unlocked(&a, 1)) != CUDA_SUCCESS)
        goto done;
    if (!boxDim)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    for (cuuint32_t d = 0; d < tensorRank; d++)
        if (boxDim[d] == 0 || boxDim[d] > 256)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    uint64_t inner = (uint64_t)boxDim[0] * (uint64_t)elem_bits(a.dt) / 8;
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE) {
        static const unsigned span[] = {0, 32, 64, 128, 128, 128, 128};
        if (inner % 16 || (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && inner > span[swizzle]))
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    }
    if ((a.dt == DT_16U4_ALIGN16B || a.dt == DT_16U6_ALIGN16B) && boxDim[0] != 128)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    uint64_t buf[3 + 15 + 5 + 1];
    size_t n;
    digest(&a, buf, &n);
    for (cuuint32_t d = 0; d < tensorRank; d++)
        buf[n++] = boxDim[d];
    fill(tensorMap, buf, n * sizeof *buf, 0x711ed);
    FC_END();
}

FC_API CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
    const int *pixelBoxLowerCorner, const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
    cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    FC_BEGIN(FN_cuTensorMapEncodeIm2col, 1);
    common_t a = {tensorMap, (int)tensorDataType, tensorRank, (uint64_t)(uintptr_t)globalAddress,
                  globalDim, globalStrides, elementStrides, (int)interleave, (int)swizzle,
                  (int)l2Promotion, (int)oobFill};
    if ((res = check_common_unlocked(&a, 3)) != CUDA_SUCCESS)
        goto done;
    if (!pixelBoxLowerCorner || !pixelBoxUpperCorner || channelsPerPixel == 0 ||
        channelsPerPixel > 256 || pixelsPerColumn == 0 || pixelsPerColumn > 256)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    uint64_t inner = (uint64_t)channelsPerPixel * (uint64_t)elem_bits(a.dt) / 8;
    static const unsigned span[] = {0, 32, 64, 128, 128, 128, 128};
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_NONE &&
        inner > span[swizzle])
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if ((a.dt == DT_16U4_ALIGN16B || a.dt == DT_16U6_ALIGN16B) && channelsPerPixel != 128)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    /* the corners cover the spatial dimensions (rank - 2 of them) */
    int lim = tensorRank == 3 ? 32768 : tensorRank == 4 ? 128 : 16;
    for (cuuint32_t d = 0; d + 2 < tensorRank; d++)
        if (pixelBoxLowerCorner[d] < -lim || pixelBoxLowerCorner[d] >= lim ||
            pixelBoxUpperCorner[d] < -lim || pixelBoxUpperCorner[d] >= lim)
            FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    uint64_t buf[3 + 15 + 1 + 2 + 6];
    size_t n;
    digest(&a, buf, &n);
    buf[n++] = channelsPerPixel, buf[n++] = pixelsPerColumn;
    for (cuuint32_t d = 0; d + 2 < tensorRank; d++) {
        buf[n++] = (uint64_t)(int64_t)pixelBoxLowerCorner[d];
        buf[n++] = (uint64_t)(int64_t)pixelBoxUpperCorner[d];
    }
    fill(tensorMap, buf, n * sizeof *buf, 0x12c01);
    FC_END();
}
