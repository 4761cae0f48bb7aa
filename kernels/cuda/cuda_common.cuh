/* cuda_common.cuh - helpers shared by the CUDA forward-pass kernels (internal to kernels/cuda).
 *
 * The stream of a kern_ctx_t, launch-error reporting (one error line, TDM_ERR_INTERNAL), BF16
 * rounding with the bits of kern_bf16_round, kern_exp's and kern_log1p's steps (kc_exp, kc_log1p),
 * the sigmoid and RMS scale of the CPU kernels, the 16-lane dot-product order of kernels/gemm.h for
 * a half-warp (kc_lane_tree16, kc_dot16), and fixed-order block reductions. Every reduction here
 * has a fixed shape (block size, lane tree), so a result depends only on its own inputs: never on
 * the grid, the batch size or scheduling. Kernels must be compiled with --fmad=false
 * (kernels/CMakeLists.txt) so that "a * b + c" is two roundings, as in the CPU reference (ISO C11,
 * no contraction). Owns no state.
 */
#ifndef TANDEM_KERNELS_CUDA_CUDA_COMMON_CUH
#define TANDEM_KERNELS_CUDA_CUDA_COMMON_CUH

extern "C" {
#include "common/log.h"
#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
}

#include <cuda_runtime.h>
#include <stdint.h>

#define KC_LOG          "kernels"
#define KC_WARP         32
#define KC_FULL_MASK    0xFFFFFFFFu
#define KC_DOT_LANES    16    /* partial sums of the batch-invariant dot (kernels/gemm.h) */
#define KC_BLOCK        256   /* threads per block of the row kernels */
#define KC_MAX_BLOCKS   65535 /* grid-stride kernels cap their grid here */
#define KC_BF16_QNAN    0x0040u
#define KC_F32_ABS_MASK 0x7FFFFFFFu
#define KC_F32_INF_BITS 0x7F800000u

static inline cudaStream_t kc_stream(const kern_ctx_t *ctx)
{
    return ctx != NULL ? (cudaStream_t)ctx->cuda_stream : (cudaStream_t)0;
}

/* Blocks for n items at `per_block` items each, capped for grid-stride loops. */
static inline unsigned int kc_grid(int64_t n, int64_t per_block)
{
    int64_t blocks = (n + per_block - 1) / per_block;

    if (blocks < 1) {
        blocks = 1;
    }
    return (unsigned int)(blocks < KC_MAX_BLOCKS ? blocks : KC_MAX_BLOCKS);
}

/* The status of the launches just queued: TDM_ERR_INTERNAL (logged once) on a CUDA error. */
static inline tdm_status_t kc_launch_status(const char *op, int64_t n_rows, int64_t dim)
{
    cudaError_t err = cudaGetLastError();

    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "%s launch failed: n_rows=%lld dim=%lld cuda=%s", op,
                (long long)n_rows, (long long)dim, cudaGetErrorString(err));
        return TDM_ERR_INTERNAL;
    }
    return TDM_OK;
}

/* Same as kc_launch_status for a CUDA runtime call's result. */
static inline tdm_status_t kc_call_status(const char *op, const char *call, cudaError_t err)
{
    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "%s failed: call=%s cuda=%s", op, call,
                cudaGetErrorString(err));
        return TDM_ERR_INTERNAL;
    }
    return TDM_OK;
}

/* BF16(x) as FP32, round to nearest even; NaN stays NaN (quiet bit set), as kern_bf16_round. */
__device__ __forceinline__ float kc_bf16_round(float x)
{
    uint32_t bits = __float_as_uint(x);

    if ((bits & KC_F32_ABS_MASK) > KC_F32_INF_BITS) {
        return __uint_as_float(((bits >> 16) | KC_BF16_QNAN) << 16);
    }
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return __uint_as_float(bits & 0xFFFF0000u);
}

__device__ __forceinline__ float kc_bf16_to_f32(uint32_t bf16_bits)
{
    return __uint_as_float(bf16_bits << 16);
}

/* kern_exp (kernels/attention.h) on one thread: its steps in order with the _rn intrinsics, so
 * the CPU's bits (cpu_exp). */
__device__ __forceinline__ float kc_exp(float x)
{
    if (x != x) {
        return x;
    }
    float xc = KERN_EXP_LO > x ? KERN_EXP_LO : x;
    xc = xc > KERN_EXP_HI ? KERN_EXP_HI : xc;
    const float k =
        __fsub_rn(__fadd_rn(__fmul_rn(xc, KERN_EXP_LOG2E), KERN_EXP_ROUND), KERN_EXP_ROUND);
    float r = __fmaf_rn(k, -KERN_EXP_LN2_HI, xc);
    r = __fmaf_rn(k, -KERN_EXP_LN2_LO, r);
    float p = __fmaf_rn(KERN_EXP_C7, r, KERN_EXP_C6);
    p = __fmaf_rn(p, r, KERN_EXP_C5);
    p = __fmaf_rn(p, r, KERN_EXP_C4);
    p = __fmaf_rn(p, r, KERN_EXP_C3);
    p = __fmaf_rn(p, r, KERN_EXP_C2);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    const float k1 =
        __fsub_rn(__fadd_rn(__fmul_rn(k, 0.5f), KERN_EXP_ROUND), KERN_EXP_ROUND);
    const float k2 = __fsub_rn(k, k1);
    const float s1 = __int_as_float(((int)k1 + 127) << 23);
    const float s2 = __int_as_float(((int)k2 + 127) << 23);
    return __fmul_rn(__fmul_rn(p, s1), s2);
}

/* kern_log1p (kernels/attention.h) on one thread: its steps in order with the _rn intrinsics. */
__device__ __forceinline__ float kc_log1p(float t)
{
    const float s = __fdiv_rn(t, __fadd_rn(2.0f, t));
    const float u = __fmul_rn(s, s);
    float p = __fmaf_rn(KERN_LOG1P_C15, u, KERN_LOG1P_C13);
    p = __fmaf_rn(p, u, KERN_LOG1P_C11);
    p = __fmaf_rn(p, u, KERN_LOG1P_C9);
    p = __fmaf_rn(p, u, KERN_LOG1P_C7);
    p = __fmaf_rn(p, u, KERN_LOG1P_C5);
    p = __fmaf_rn(p, u, KERN_LOG1P_C3);
    p = __fmaf_rn(p, u, 1.0f);
    return __fmul_rn(__fmul_rn(2.0f, s), p);
}

/* 1 / (1 + kern_exp(-z)): the CPU's cpu_sigmoid (kernels/mhc.h), the same bits. */
__device__ __forceinline__ float kc_sigmoid(float z)
{
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, kc_exp(-z)));
}

/* 1 / sqrtf(sum_sq / n + eps): kern_rms_scale_cpu's last steps (kernels/norm.h). */
__device__ __forceinline__ float kc_rms_scale(float sum_sq, int64_t n, float eps)
{
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, (float)n), eps)));
}

/*
 * The lane tree of kernels/gemm.h over the 16 lanes of a half-warp: lane j holds partial sum j
 * (k = j, j + 16, ... in ascending k); lane j += lane j + s for s = 8, 4, 2, 1. Lane 0 of the
 * half-warp returns the dot product with the bits of kern_dot_cpu; other lanes return partial
 * values. All 32 lanes of the warp must call it.
 */
__device__ __forceinline__ float kc_lane_tree16(float acc)
{
    for (int s = KC_DOT_LANES / 2; s >= 1; s /= 2) {
        float other = __shfl_down_sync(KC_FULL_MASK, acc, s, KC_DOT_LANES);
        acc = __fadd_rn(acc, other);
    }
    return acc;
}

/*
 * sum_i a[i] * b[i] for i < n (n >= 0) in the 16-lane order of kern_sum_sq_cpu (kernels/norm.h),
 * on one half-warp: lane j fuses i = j, j + 16, ... below n - n % 16 ascending, the lane tree,
 * then lane 0 fuses the tail. Lane 0 of the half-warp returns the CPU's bits (kern_sum_sq_cpu for
 * a == b, kern_dot_cpu for n a multiple of 16); other lanes return partial values. All 32 lanes
 * of the warp must call it (each half-warp may pass its own a, b and n).
 */
__device__ __forceinline__ float kc_dot16(const float *a, const float *b, int64_t n)
{
    const int lane = (int)(threadIdx.x % KC_DOT_LANES);
    const int64_t n16 = n - n % KC_DOT_LANES;
    float acc = 0.0f;

    for (int64_t i = lane; i < n16; i += KC_DOT_LANES) {
        acc = __fmaf_rn(a[i], b[i], acc);
    }
    acc = kc_lane_tree16(acc);
    if (lane == 0) {
        for (int64_t i = n16; i < n; i++) {
            acc = __fmaf_rn(a[i], b[i], acc);
        }
    }
    return acc;
}

/*
 * Sum over a block of KC_BLOCK threads in a fixed order (per-warp shuffle tree, then warp
 * totals in ascending warp order by thread 0). Every thread gets the total. `red` is
 * KC_BLOCK / KC_WARP + 1 floats of shared memory; the call ends with a barrier, so `red` may
 * be reused right after. All threads of the block must call it.
 */
__device__ __forceinline__ float kc_block_sum(float v, float *red)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int warp = (int)(threadIdx.x / KC_WARP);

    for (int s = KC_WARP / 2; s >= 1; s /= 2) {
        v = __fadd_rn(v, __shfl_down_sync(KC_FULL_MASK, v, s));
    }
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = red[0];
        for (int w = 1; w < KC_BLOCK / KC_WARP; w++) {
            total = __fadd_rn(total, red[w]);
        }
        red[KC_BLOCK / KC_WARP] = total;
    }
    __syncthreads();
    v = red[KC_BLOCK / KC_WARP];
    __syncthreads();
    return v;
}

/* Maximum over a block of KC_BLOCK threads (exact, order-free for non-NaN values); as
 * kc_block_sum. */
__device__ __forceinline__ float kc_block_max(float v, float *red)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int warp = (int)(threadIdx.x / KC_WARP);

    for (int s = KC_WARP / 2; s >= 1; s /= 2) {
        float other = __shfl_down_sync(KC_FULL_MASK, v, s);
        v = other > v ? other : v;
    }
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = red[0];
        for (int w = 1; w < KC_BLOCK / KC_WARP; w++) {
            total = red[w] > total ? red[w] : total;
        }
        red[KC_BLOCK / KC_WARP] = total;
    }
    __syncthreads();
    v = red[KC_BLOCK / KC_WARP];
    __syncthreads();
    return v;
}

#endif
