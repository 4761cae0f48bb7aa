/* gemm.cu - CUDA y = x . W^T (kern_gemm_cuda, kern_gemm_q_cuda) and the Q_act8 operand
 * (kern_qdq_act8_rows_cuda) of kernels/gemm.h and kernels/cuda/ops_cuda.h.
 *
 * Every output is computed in the order kernels/gemm.h makes normative for the CPU: 16 partial
 * sums, lane j += w[k] * x[k] (one FMA) for k = j, j + 16, ... ascending, then the tree 8, 4,
 * 2, 1. Lane j of a half-warp is partial sum j, so the bits equal kern_gemm_cpu's, whatever the
 * tile shape; the tile shape (chosen by n_rows) only changes which outputs share a block.
 * Hence batch invariance (MODEL.md 6(e)) holds inside the CUDA backend and across backends.
 *
 * One thread block of 256 threads per output tile (TO outputs x TR rows): 16 micro-tiles of
 * MO outputs x MR rows, one half-warp each. The block streams K in chunks of TK: weights are
 * read as 16-byte vectors (BF16, FP32, FP8 codes or packed MXFP4), dequantized exactly to FP32
 * into shared memory, the activation chunk next to them, the next chunk's loads in flight
 * while the current one is multiplied. FP32 accumulation only; no tensor cores (their
 * accumulation order is not the CPU's).
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/codec.h"
#include "kernels/codec_bits.h"
#include "kernels/cuda/cuda_common.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define GEMM_THREADS    256
#define GEMM_MICROTILES (GEMM_THREADS / KC_DOT_LANES) /* half-warps per block */
#define GEMM_VEC_BYTES  16                            /* one uint4 weight load */
#define QMAT_BLOCK      32 /* FP8: 32 x 32 scale blocks; MXFP4: 32 along K (MODEL.md 3) */

/* How the weight elements are stored in device memory. */
enum wkind { W_BF16 = 0, W_F32 = 1, W_FP8 = 2, W_MXFP4 = 3 };

/* Device view of a weight matrix (plain data, passed by value to the kernel). */
struct wview {
    const uint8_t *data;   /* element bytes (codes for FP8 / MXFP4) */
    const uint8_t *scales; /* UE8M0 (FP8 / MXFP4 only) */
    int64_t n_out;
    int64_t n_in;
    int64_t row_bytes;    /* bytes per weight row */
    int64_t n_scale_cols; /* scale row length (FP8: ceil(n_in/32), MXFP4: n_in/32) */
    int aligned;          /* data is 16-byte aligned: whole-vector loads */
};

/* Grouped form (kc_gemm_grouped): blockIdx.z is an expert e whose matrix is data[e] / scales[e]
 * and whose rows are the pairs [off[e], off[e + 1]) clipped to the window [p0, p1), at rows
 * (pair - p0) of x and y. off == NULL: the plain form (one matrix, rows [0, n_rows)). */
struct wgroup {
    const void *const *data;
    const void *const *scales;
    const int64_t *off;
    int64_t p0;
    int64_t p1;
};

template <int KIND> struct wtraits;
template <> struct wtraits<W_BF16> {
    static constexpr int per_vec = 8;
};
template <> struct wtraits<W_F32> {
    static constexpr int per_vec = 4;
};
template <> struct wtraits<W_FP8> {
    static constexpr int per_vec = 16;
};
template <> struct wtraits<W_MXFP4> {
    static constexpr int per_vec = 32;
};

/* 16 bytes at p: one vector load when the matrix is aligned, else byte loads (same bytes). */
__device__ __forceinline__ uint4 load_vec(const uint8_t *p, int aligned)
{
    uint4 v;

    if (aligned) {
        return __ldg((const uint4 *)p);
    }
    uint32_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (uint32_t)__ldg(p + 4 * i) | ((uint32_t)__ldg(p + 4 * i + 1) << 8) |
               ((uint32_t)__ldg(p + 4 * i + 2) << 16) | ((uint32_t)__ldg(p + 4 * i + 3) << 24);
    }
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    return v;
}

/* Byte i (0..15) of a vector. */
__device__ __forceinline__ uint32_t vec_byte(const uint4 &v, int i)
{
    uint32_t word = i < 4 ? v.x : (i < 8 ? v.y : (i < 12 ? v.z : v.w));
    return (word >> (8 * (i % 4))) & 0xFFu;
}

/* 16-bit unit i (0..7) of a vector. */
__device__ __forceinline__ uint32_t vec_half(const uint4 &v, int i)
{
    uint32_t word = i < 2 ? v.x : (i < 4 ? v.y : (i < 6 ? v.z : v.w));
    return (word >> (16 * (i % 2))) & 0xFFFFu;
}

__device__ __forceinline__ uint32_t vec_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

/* Two E4M3 codes (low byte first) -> FP32, exact: cuda_fp8.h's conversion to f16x2 (one
 * cvt.rn.f16x2.e4m3x2 on sm_89+; every E4M3 value is an f16), then f16 -> f32. Equal to
 * codec_e4m3_to_f32 for every code a weight can hold (0x7F / 0xFF, NaN, are never written). */
__device__ __forceinline__ void e4m3x2_to_f32(uint32_t pair, float *lo, float *hi)
{
    const __half2_raw h2 =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFFu), __NV_E4M3);
    __half_raw l;
    __half_raw h;

    l.x = h2.x;
    h.x = h2.y;
    *lo = __half2float(__half(l));
    *hi = __half2float(__half(h));
}

/* Smallest UE8M0 byte for which every E4M3 code times the scale is a normal FP32 number:
 * 2^-9 * 2^(10 - 127) = 2^-126. Such products have at most 4 significant bits, so they are
 * BF16 values already; below it, round to BF16 as kern_mat_bf16_from_fp8 does. Every MXFP4
 * product (at most 2 significant bits, >= 2^-128) is a BF16 value for every scale byte. */
#define FP8_EXACT_SCALE_MIN 10

/*
 * Write the per_vec weights of vector `raw` (row o, elements k .. k + per_vec - 1) as FP32 into
 * dst. Quantized formats become BF16(code value * scale), the bits of kern_mat_bf16_from_*
 * (the product is exact in FP32, or infinite as on the CPU). e2m1 is the 16-entry table lut.
 */
template <int KIND>
__device__ __forceinline__ void store_weights(const wview &w, const uint4 &raw, int64_t o,
                                              int64_t k, const float *lut, float *dst)
{
    if (KIND == W_BF16) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            dst[i] = kc_bf16_to_f32(vec_half(raw, i));
        }
    } else if (KIND == W_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            dst[i] = __uint_as_float(vec_word(raw, i));
        }
    } else if (KIND == W_FP8) {
        const uint8_t sb = w.scales[(o / QMAT_BLOCK) * w.n_scale_cols + k / QMAT_BLOCK];
        const float s = codec_ue8m0_to_f32(sb);
        const int exact = sb >= FP8_EXACT_SCALE_MIN;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float lo;
            float hi;
            e4m3x2_to_f32(vec_word(raw, i / 2) >> (16 * (i % 2)), &lo, &hi);
            lo = __fmul_rn(lo, s);
            hi = __fmul_rn(hi, s);
            dst[2 * i] = exact ? lo : kc_bf16_round(lo);
            dst[2 * i + 1] = exact ? hi : kc_bf16_round(hi);
        }
    } else {
        const float s = codec_ue8m0_to_f32(w.scales[o * w.n_scale_cols + k / QMAT_BLOCK]);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint32_t byte = vec_byte(raw, i);
            dst[2 * i] = __fmul_rn(lut[byte & 0xFu], s);
            dst[2 * i + 1] = __fmul_rn(lut[byte >> 4], s);
        }
    }
}

/* Bytes from the start of a row to element k (k a multiple of per_vec). */
template <int KIND> __device__ __forceinline__ int64_t byte_offset(int64_t k)
{
    return KIND == W_BF16 ? 2 * k : (KIND == W_F32 ? 4 * k : (KIND == W_FP8 ? k : k / 2));
}

/*
 * The tile kernel. Block (bx, by) computes outputs [bx*TO, bx*TO + TO) of rows
 * [by*TR, by*TR + TR). Thread t: lane = t % 16 (its partial sum), micro-tile t / 16 ->
 * (mt_o, mt_r) with mt_r = mt % MT_R, so the two half-warps of a warp share weight rows when
 * MT_R > 1. Row strides are padded so that the two half-warps of a warp hit disjoint banks.
 */
template <int KIND, int MO, int MR, int MT_O, int MT_R, int TK, int MIN_BLOCKS>
__global__ void __launch_bounds__(GEMM_THREADS, MIN_BLOCKS)
    gemm_tile_kernel(wview w, wgroup grp, const float *x, int64_t ldx, int64_t n_rows,
                     uint32_t flags, float *y, int64_t ldy)
{
    constexpr int TO = MT_O * MO;
    constexpr int TR = MT_R * MR;
    constexpr int PER_VEC = wtraits<KIND>::per_vec;
    constexpr int W_STRIDE = TK + KC_DOT_LANES / MO;
    constexpr int X_STRIDE = TK + KC_DOT_LANES / MR;
    constexpr int W_VECS = TO * TK / PER_VEC; /* vectors per chunk */
    constexpr int W_PER_THREAD = (W_VECS + GEMM_THREADS - 1) / GEMM_THREADS;
    constexpr int X_PER_THREAD = TR * TK / GEMM_THREADS;
    static_assert(MT_O * MT_R <= GEMM_MICROTILES && (MT_O * MT_R) % 2 == 0,
                  "at most 16 micro-tiles per block, whole warps");
    static_assert(TK % 32 == 0 && (TR * TK) % GEMM_THREADS == 0, "chunk shape");

    __shared__ float ws[TO * W_STRIDE];
    __shared__ float xs[TR * X_STRIDE];
    __shared__ float e2m1_lut[16]; /* MXFP4 nibble -> value */

    if (grp.off != nullptr) {
        /* this block's expert: its rows inside the window; a block past them has nothing to do
         * (uniform over the block, before any barrier) */
        const int64_t e = (int64_t)blockIdx.z;
        const int64_t r0 = grp.off[e] > grp.p0 ? grp.off[e] : grp.p0;
        const int64_t r1 = grp.off[e + 1] < grp.p1 ? grp.off[e + 1] : grp.p1;
        if ((int64_t)blockIdx.y * TR >= r1 - r0 || grp.data[e] == nullptr) {
            return;
        }
        w.data = (const uint8_t *)grp.data[e];
        w.scales = grp.scales != nullptr ? (const uint8_t *)grp.scales[e] : nullptr;
        w.aligned = ((uintptr_t)w.data % GEMM_VEC_BYTES) == 0;
        x += (r0 - grp.p0) * ldx;
        y += (r0 - grp.p0) * ldy;
        n_rows = r1 - r0;
    }
    const int tid = (int)threadIdx.x;
    const int lane = tid % KC_DOT_LANES;
    const int mt = tid / KC_DOT_LANES;
    const int mt_r = mt % MT_R;
    const int mt_o = mt / MT_R;
    /* warps past the micro-tiles only help to load (warp-uniform: micro-tiles come in pairs) */
    const int computes = mt < MT_O * MT_R;
    const int64_t o_blk = (int64_t)blockIdx.x * TO;
    const int64_t r_blk = (int64_t)blockIdx.y * TR;

    uint4 w_raw[W_PER_THREAD];
    float x_raw[X_PER_THREAD];
    float acc[MO][MR];

#pragma unroll
    for (int a = 0; a < MO; a++) {
#pragma unroll
        for (int b = 0; b < MR; b++) {
            acc[a][b] = 0.0f;
        }
    }

    /* Start the loads of the chunk at kc (elements beyond the matrix are not read). */
    auto load_chunk = [&](int64_t kc) {
        for (int i = 0; i < W_PER_THREAD; i++) {
            const int v = tid + i * GEMM_THREADS;
            const int row = v / (TK / PER_VEC);
            const int64_t o = o_blk + row;
            const int64_t k = kc + (int64_t)(v % (TK / PER_VEC)) * PER_VEC;
            if (v < W_VECS && o < w.n_out && k < w.n_in) {
                w_raw[i] = load_vec(w.data + o * w.row_bytes + byte_offset<KIND>(k), w.aligned);
            }
        }
        for (int i = 0; i < X_PER_THREAD; i++) {
            const int e = tid + i * GEMM_THREADS;
            const int64_t r = r_blk + e / TK;
            const int64_t k = kc + e % TK;
            x_raw[i] = (r < n_rows && k < w.n_in) ? __ldg(x + r * ldx + k) : 0.0f;
        }
    };

    /* Dequantize the chunk at kc from registers into shared memory. */
    auto store_chunk = [&](int64_t kc) {
        for (int i = 0; i < W_PER_THREAD; i++) {
            const int v = tid + i * GEMM_THREADS;
            const int row = v / (TK / PER_VEC);
            const int kk = (v % (TK / PER_VEC)) * PER_VEC;
            const int64_t o = o_blk + row;
            const int64_t k = kc + kk;
            if (v >= W_VECS) {
                continue;
            }
            float *dst = ws + row * W_STRIDE + kk;
            if (o < w.n_out && k < w.n_in) {
                store_weights<KIND>(w, w_raw[i], o, k, e2m1_lut, dst);
            } else {
                for (int j = 0; j < PER_VEC; j++) {
                    dst[j] = 0.0f;
                }
            }
        }
        for (int i = 0; i < X_PER_THREAD; i++) {
            const int e = tid + i * GEMM_THREADS;
            xs[(e / TK) * X_STRIDE + e % TK] = x_raw[i];
        }
    };

    if (KIND == W_MXFP4) {
        if (tid < 16) {
            e2m1_lut[tid] = codec_e2m1_to_f32((uint8_t)tid);
        }
        __syncthreads();
    }
    load_chunk(0);
    for (int64_t kc = 0; kc < w.n_in; kc += TK) {
        store_chunk(kc);
        __syncthreads();
        if (kc + TK < w.n_in) {
            load_chunk(kc + TK);
        }
        /* only whole groups of 16 inside the matrix: no FMA beyond n_in (bits as the CPU) */
        const int n_steps =
            computes ? (int)((w.n_in - kc < TK ? w.n_in - kc : TK) / KC_DOT_LANES) : 0;
        const float *wrow = ws + (computes ? mt_o * MO : 0) * W_STRIDE + lane;
        const float *xrow = xs + (computes ? mt_r * MR : 0) * X_STRIDE + lane;
        for (int t = 0; t < n_steps; t++) {
            float wv[MO];
            float xv[MR];
#pragma unroll
            for (int a = 0; a < MO; a++) {
                wv[a] = wrow[a * W_STRIDE + t * KC_DOT_LANES];
            }
#pragma unroll
            for (int b = 0; b < MR; b++) {
                xv[b] = xrow[b * X_STRIDE + t * KC_DOT_LANES];
            }
#pragma unroll
            for (int a = 0; a < MO; a++) {
#pragma unroll
                for (int b = 0; b < MR; b++) {
                    acc[a][b] = __fmaf_rn(wv[a], xv[b], acc[a][b]);
                }
            }
        }
        __syncthreads();
    }

    if (!computes) {
        return;
    }
#pragma unroll
    for (int a = 0; a < MO; a++) {
#pragma unroll
        for (int b = 0; b < MR; b++) {
            const float v = kc_lane_tree16(acc[a][b]);
            const int64_t o = o_blk + mt_o * MO + a;
            const int64_t r = r_blk + mt_r * MR + b;
            if (lane == 0 && o < w.n_out && r < n_rows) {
                y[r * ldy + o] = (flags & KERN_GEMM_OUT_BF16) != 0u ? kc_bf16_round(v) : v;
            }
        }
    }
}

/* n_rows: the rows of the plain form; in the grouped form the most rows one expert can have
 * in the window (grid.y), with grid.z = n_groups experts. */
template <int KIND, int MO, int MR, int MT_O, int MT_R, int TK, int MIN_BLOCKS>
static void launch_tile(const wview &w, const wgroup &grp, int64_t n_groups, const float *x,
                        int64_t ldx, int64_t n_rows, uint32_t flags, float *y, int64_t ldy,
                        cudaStream_t stream)
{
    const int64_t to = MT_O * MO;
    const int64_t tr = MT_R * MR;
    const dim3 grid((unsigned int)((w.n_out + to - 1) / to),
                    (unsigned int)((n_rows + tr - 1) / tr), (unsigned int)n_groups);

    gemm_tile_kernel<KIND, MO, MR, MT_O, MT_R, TK, MIN_BLOCKS>
        <<<grid, GEMM_THREADS, 0, stream>>>(w, grp, x, ldx, n_rows, flags, y, ldy);
}

/* Tile shape by batch size (bits do not depend on it): decode GEMV (1 row: 2 outputs per block
 * up to GEMM_NARROW_MAX_OUT outputs, so that small matrices such as the mHC mixes [24, 4H] still
 * spread over many SMs, else 16; up to 4 rows), small batches, prefill. The last parameter is
 * the resident blocks per SM that the register budget must allow (__launch_bounds__). */
#define GEMM_NARROW_MAX_OUT 2048
template <int KIND>
static void launch_gemm(const wview &w, const wgroup &grp, int64_t n_groups, const float *x,
                        int64_t ldx, int64_t n_rows, uint32_t flags, float *y, int64_t ldy,
                        cudaStream_t stream)
{
    if (n_rows == 1 && w.n_out <= GEMM_NARROW_MAX_OUT) {
        launch_tile<KIND, 1, 1, 2, 1, 2048, 3>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy,
                                               stream);
    } else if (n_rows == 1) {
        launch_tile<KIND, 1, 1, 16, 1, 512, 4>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy,
                                               stream);
    } else if (n_rows <= 4) {
        launch_tile<KIND, 1, 4, 16, 1, 512, 2>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy,
                                               stream);
    } else if (n_rows <= 32) {
        launch_tile<KIND, 2, 8, 8, 2, 256, 1>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy,
                                              stream);
    } else {
        launch_tile<KIND, 8, 8, 4, 4, 64, 1>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy,
                                             stream);
    }
}

/* Rows per launch: grid.y stays below 65536 for every tile shape (TR <= 32). */
#define GEMM_ROWS_PER_LAUNCH (32 * 65535)

static int shape_ok(int64_t n_out, int64_t n_in, int64_t n_rows, int64_t ldx, int64_t ldy)
{
    return n_rows >= 0 && n_out > 0 && n_in > 0 && n_in % KERN_GEMM_K_MULTIPLE == 0 &&
           ldx >= n_in && ldy >= n_out;
}

static void launch_kind(int kind, const wview &w, const wgroup &grp, int64_t n_groups,
                        const float *x, int64_t ldx, int64_t n_rows, uint32_t flags, float *y,
                        int64_t ldy, cudaStream_t stream)
{
    switch (kind) {
    case W_BF16:
        launch_gemm<W_BF16>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy, stream);
        break;
    case W_F32:
        launch_gemm<W_F32>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy, stream);
        break;
    case W_FP8:
        launch_gemm<W_FP8>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy, stream);
        break;
    default:
        launch_gemm<W_MXFP4>(w, grp, n_groups, x, ldx, n_rows, flags, y, ldy, stream);
        break;
    }
}

static tdm_status_t run_gemm(const char *op, int kind, const wview &w, kern_ctx_t *ctx,
                             const float *x, int64_t ldx, int64_t n_rows, uint32_t flags,
                             float *y_out, int64_t ldy)
{
    cudaStream_t stream = kc_stream(ctx);
    const wgroup plain = {nullptr, nullptr, nullptr, 0, 0};

    for (int64_t r0 = 0; r0 < n_rows; r0 += GEMM_ROWS_PER_LAUNCH) {
        const int64_t n = n_rows - r0 < GEMM_ROWS_PER_LAUNCH ? n_rows - r0 : GEMM_ROWS_PER_LAUNCH;
        const float *xr = x + r0 * ldx;
        float *yr = y_out + r0 * ldy;
        launch_kind(kind, w, plain, 1, xr, ldx, n, flags, yr, ldy, stream);
    }
    return kc_launch_status(op, n_rows, w.n_in);
}

/* The device view and kind of a compute-layout matrix of any dtype (kernels/gemm.h: FP8 scales
 * [ceil(n_out/32), n_in/32], MXFP4 [n_out, n_in/32], the layouts kern_qmat_t has); 0 when w or
 * its shape is unusable. */
static int mat_view(const kern_mat_t *w, wview *view, int *kind)
{
    const int q = w->dtype == KERN_MAT_FP8 || w->dtype == KERN_MAT_MXFP4;

    if (w->data == NULL ||
        (w->dtype != KERN_MAT_BF16 && w->dtype != KERN_MAT_F32 && !q) ||
        (q && (w->scales == NULL || w->n_in % QMAT_BLOCK != 0))) {
        return 0;
    }
    view->data = (const uint8_t *)w->data;
    view->scales = q ? w->scales : NULL;
    view->n_out = w->n_out;
    view->n_in = w->n_in;
    view->row_bytes = w->dtype == KERN_MAT_F32    ? w->n_in * 4
                      : w->dtype == KERN_MAT_BF16 ? w->n_in * 2
                      : w->dtype == KERN_MAT_FP8  ? w->n_in
                                                  : w->n_in / 2;
    view->n_scale_cols = q ? w->n_in / QMAT_BLOCK : 0;
    view->aligned = ((uintptr_t)w->data % GEMM_VEC_BYTES) == 0;
    *kind = w->dtype == KERN_MAT_F32    ? W_F32
            : w->dtype == KERN_MAT_BF16 ? W_BF16
            : w->dtype == KERN_MAT_FP8  ? W_FP8
                                        : W_MXFP4;
    return 1;
}

/* Every dtype of kernels/gemm.h: BF16 and F32 as stored, FP8 and MXFP4 dequantized on the fly
 * as kern_gemm_q_cuda does (the engine keeps its quantized weights resident in these dtypes). */
extern "C" tdm_status_t kern_gemm_cuda(kern_ctx_t *ctx, const kern_mat_t *w, const float *x,
                                       int64_t ldx, int64_t n_rows, uint32_t flags, float *y_out,
                                       int64_t ldy)
{
    wview view;
    int kind = W_BF16;

    if (w == NULL || x == NULL || y_out == NULL || !mat_view(w, &view, &kind) ||
        !shape_ok(w->n_out, w->n_in, n_rows, ldx, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
    return run_gemm(kind == W_FP8     ? "gemm_cuda(fp8)"
                    : kind == W_MXFP4 ? "gemm_cuda(mxfp4)"
                                      : "gemm_cuda",
                    kind, view, ctx, x, ldx, n_rows, flags, y_out, ldy);
}

extern "C" tdm_status_t kern_gemm_q_cuda(kern_ctx_t *ctx, const kern_qmat_t *w, const float *x,
                                         int64_t ldx, int64_t n_rows, uint32_t flags, float *y_out,
                                         int64_t ldy)
{
    wview view;
    int fp8;

    if (w == NULL || w->codes == NULL || w->scales == NULL || x == NULL || y_out == NULL ||
        (w->format != KERN_QMAT_FP8 && w->format != KERN_QMAT_MXFP4) ||
        !shape_ok(w->n_out, w->n_in, n_rows, ldx, ldy) || w->n_in % QMAT_BLOCK != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    fp8 = w->format == KERN_QMAT_FP8;
    view.data = w->codes;
    view.scales = w->scales;
    view.n_out = w->n_out;
    view.n_in = w->n_in;
    view.row_bytes = fp8 ? w->n_in : w->n_in / 2;
    view.n_scale_cols = w->n_in / QMAT_BLOCK;
    view.aligned = ((uintptr_t)w->codes % GEMM_VEC_BYTES) == 0;
    return run_gemm(fp8 ? "gemm_q_cuda(fp8)" : "gemm_q_cuda(mxfp4)", fp8 ? W_FP8 : W_MXFP4, view,
                    ctx, x, ldx, n_rows, flags, y_out, ldy);
}

extern "C" tdm_status_t kc_gemm_grouped(kern_ctx_t *ctx, const kern_mat_t *proto,
                                        const void *const *data, const void *const *scales,
                                        const int64_t *offsets, int64_t n_groups,
                                        int64_t max_group_rows, int64_t p0, int64_t p1,
                                        const float *x, int64_t ldx, uint32_t flags, float *y,
                                        int64_t ldy)
{
    wview view;
    int kind = W_BF16;
    kern_mat_t shape;

    if (proto == NULL || data == NULL || offsets == NULL || x == NULL || y == NULL ||
        n_groups < 1 || n_groups > 65535 || max_group_rows < 0 || p0 < 0 || p1 < p0 ||
        max_group_rows > GEMM_ROWS_PER_LAUNCH) {
        return TDM_ERR_INVALID_ARG;
    }
    /* the shape and dtype of every group's matrix; data and scales come from the tables (a
     * non-NULL stand-in pointer passes mat_view's checks) */
    shape = *proto;
    shape.data = (const void *)data;
    shape.scales = (const uint8_t *)(scales != NULL ? (const void *)scales : (const void *)data);
    if (!mat_view(&shape, &view, &kind) ||
        !shape_ok(view.n_out, view.n_in, max_group_rows, ldx, ldy) ||
        ((kind == W_FP8 || kind == W_MXFP4) && scales == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (max_group_rows == 0 || p1 == p0) {
        return TDM_OK;
    }
    const wgroup grp = {data, scales, offsets, p0, p1};
    launch_kind(kind, view, grp, n_groups, x, ldx, max_group_rows, flags, y, ldy, kc_stream(ctx));
    return kc_launch_status("gemm_grouped_cuda", max_group_rows, view.n_in);
}

/* ---- Q_act8 QDQ rows -------------------------------------------------------------------- */

/* One warp per group of 32: exact amax by shuffles, then the codec of kernels/codec_bits.h. */
__global__ void __launch_bounds__(KC_BLOCK)
    qdq_act8_kernel(const float *x, int64_t n_groups, float *y)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int64_t first = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / KC_WARP;
    const int64_t stride = ((int64_t)gridDim.x * blockDim.x) / KC_WARP;

    for (int64_t g = first; g < n_groups; g += stride) {
        const int64_t i = g * KERN_ACT8_GROUP + lane;
        const float v = x[i];
        float amax = codec_amax_term(v);

        for (int s = KC_WARP / 2; s >= 1; s /= 2) {
            amax = codec_amax_merge(amax, __shfl_xor_sync(KC_FULL_MASK, amax, s));
        }
        const float scale = codec_ue8m0_to_f32(codec_act8_scale(amax));
        y[i] = __fmul_rn(codec_e4m3_to_f32(codec_e4m3_from_f32(codec_div_rn(v, scale))), scale);
    }
}

extern "C" tdm_status_t kern_qdq_act8_rows_cuda(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                                int64_t dim, float *y_out)
{
    int64_t n_groups;

    if (x == NULL || y_out == NULL || n_rows < 0 || dim <= 0 || dim % KERN_ACT8_GROUP != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    n_groups = n_rows * (dim / KERN_ACT8_GROUP);
    qdq_act8_kernel<<<kc_grid(n_groups * KC_WARP, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(
        x, n_groups, y_out);
    return kc_launch_status("qdq_act8_cuda", n_rows, dim);
}
