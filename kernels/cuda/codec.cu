/* codec.cu - CUDA versions of the row quantizers and dequantizers in kernels/codec.h.
 *
 * Same bytes as kernels/cpu/codec.c: both compile the scalar codec of kernels/codec_bits.h
 * (integer bit manipulation, __fdiv_rn for fl(a/b), single FP32 multiplies for dequantizing).
 * Must be built without --use_fast_math / -ftz=true (docs/NUMERICS.md). A warp quantizes 32
 * consecutive elements (one act8/mx4 group, two ckv groups): one coalesced load per lane, an
 * exact max-reduction by shuffles, one code per lane.
 */
#include "kernels/codec.h"

extern "C" {
#include "common/log.h"
}
#include "kernels/codec_bits.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define CODEC_LOG         "kernels"
#define THREADS_PER_BLOCK 256
#define WARP_THREADS      32
#define FULL_WARP_MASK    0xFFFFFFFFu
#define MAX_BLOCKS        65535

enum quant_kind { QUANT_ACT8 = 0, QUANT_CKV = 1, QUANT_MX4 = 2 };

/* x holds n_chunks * 32 elements; each warp walks chunks of 32 (grid-stride, warp-uniform). */
template <int KIND>
__global__ void __launch_bounds__(THREADS_PER_BLOCK)
    quant_kernel(const float *x, int64_t n_chunks, uint8_t *codes, uint8_t *scales)
{
    const uint32_t lane = threadIdx.x & (WARP_THREADS - 1);
    const int64_t first_warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_THREADS;
    const int64_t n_warps = ((int64_t)gridDim.x * blockDim.x) / WARP_THREADS;

    for (int64_t chunk = first_warp; chunk < n_chunks; chunk += n_warps) {
        const int64_t i = chunk * WARP_THREADS + lane;
        const float v = x[i];
        float amax = codec_amax_term(v);

        /* Q_ckv groups are 16 lanes: xor offsets below 16 stay inside each half-warp. */
        for (int offset = KIND == QUANT_CKV ? 8 : 16; offset > 0; offset >>= 1) {
            amax = codec_amax_merge(amax, __shfl_xor_sync(FULL_WARP_MASK, amax, offset));
        }
        if (KIND == QUANT_ACT8) {
            const uint8_t scale = codec_act8_scale(amax);

            codes[i] = codec_e4m3_from_f32(codec_div_rn(v, codec_ue8m0_to_f32(scale)));
            if (lane == 0) {
                scales[chunk] = scale;
            }
        } else {
            const uint8_t scale = KIND == QUANT_CKV ? codec_ckv_scale(amax) : codec_mx4_scale(amax);
            const float s =
                KIND == QUANT_CKV ? codec_e4m3_to_f32(scale) : codec_ue8m0_to_f32(scale);
            const uint32_t code = codec_e2m1_from_f32(codec_div_rn(v, s));
            const uint32_t high = __shfl_down_sync(FULL_WARP_MASK, code, 1);

            if ((lane & 1u) == 0u) {
                codes[i / 2] = (uint8_t)(code | (high << 4));
            }
            if (KIND == QUANT_CKV && (lane % KERN_CKV_GROUP) == 0u) {
                scales[i / KERN_CKV_GROUP] = scale;
            }
            if (KIND == QUANT_MX4 && lane == 0u) {
                scales[chunk] = scale;
            }
        }
    }
}

template <int KIND>
__global__ void __launch_bounds__(THREADS_PER_BLOCK)
    dequant_kernel(const uint8_t *codes, const uint8_t *scales, int64_t n, float *y)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (KIND == QUANT_ACT8) {
            y[i] = codec_e4m3_to_f32(codes[i]) * codec_ue8m0_to_f32(scales[i / KERN_ACT8_GROUP]);
        } else {
            const uint8_t nibble = (uint8_t)(codes[i / 2] >> (4 * (i & 1)));
            const float s = KIND == QUANT_CKV ? codec_e4m3_to_f32(scales[i / KERN_CKV_GROUP])
                                              : codec_ue8m0_to_f32(scales[i / KERN_MX4_GROUP]);
            y[i] = codec_e2m1_to_f32(nibble) * s;
        }
    }
}

static cudaStream_t ctx_stream(const kern_ctx_t *ctx)
{
    return ctx != NULL ? (cudaStream_t)ctx->cuda_stream : (cudaStream_t)0;
}

static unsigned int grid_blocks(int64_t n_threads)
{
    int64_t blocks = (n_threads + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;

    return (unsigned int)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS);
}

static tdm_status_t launch_status(const char *op, int64_t n_rows, int64_t dim)
{
    cudaError_t err = cudaGetLastError();

    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, CODEC_LOG, "%s launch failed: n_rows=%lld dim=%lld cuda=%s", op,
                (long long)n_rows, (long long)dim, cudaGetErrorString(err));
        return TDM_ERR_INTERNAL;
    }
    return TDM_OK;
}

template <int KIND>
static tdm_status_t quant_launch(const char *op, int64_t group, kern_ctx_t *ctx, const float *x,
                                 int64_t n_rows, int64_t dim, uint8_t *codes_out,
                                 uint8_t *scales_out)
{
    tdm_status_t status =
        kern_codec_check_rows(op, x, x, codes_out, scales_out, n_rows, dim, group);
    int64_t n_chunks;

    if (status != TDM_OK) {
        return status;
    }
    n_chunks = n_rows * dim / WARP_THREADS; /* every group size divides 32 */
    quant_kernel<KIND>
        <<<grid_blocks(n_chunks * WARP_THREADS), THREADS_PER_BLOCK, 0, ctx_stream(ctx)>>>(
            x, n_chunks, codes_out, scales_out);
    return launch_status(op, n_rows, dim);
}

template <int KIND>
static tdm_status_t dequant_launch(const char *op, int64_t group, kern_ctx_t *ctx,
                                   const uint8_t *codes, const uint8_t *scales, int64_t n_rows,
                                   int64_t dim, float *y_out)
{
    tdm_status_t status =
        kern_codec_check_rows(op, codes, scales, y_out, y_out, n_rows, dim, group);

    if (status != TDM_OK) {
        return status;
    }
    dequant_kernel<KIND><<<grid_blocks(n_rows * dim), THREADS_PER_BLOCK, 0, ctx_stream(ctx)>>>(
        codes, scales, n_rows * dim, y_out);
    return launch_status(op, n_rows, dim);
}

extern "C" tdm_status_t kern_quant_act8_cuda(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                             int64_t dim, uint8_t *codes_out, uint8_t *scales_out)
{
    return quant_launch<QUANT_ACT8>("quant_act8_cuda", KERN_ACT8_GROUP, ctx, x, n_rows, dim,
                                    codes_out, scales_out);
}

extern "C" tdm_status_t kern_quant_ckv_cuda(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                            int64_t dim, uint8_t *codes_out, uint8_t *scales_out)
{
    return quant_launch<QUANT_CKV>("quant_ckv_cuda", KERN_CKV_GROUP, ctx, x, n_rows, dim, codes_out,
                                   scales_out);
}

extern "C" tdm_status_t kern_quant_mx4_cuda(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                            int64_t dim, uint8_t *codes_out, uint8_t *scales_out)
{
    return quant_launch<QUANT_MX4>("quant_mx4_cuda", KERN_MX4_GROUP, ctx, x, n_rows, dim, codes_out,
                                   scales_out);
}

extern "C" tdm_status_t kern_dequant_act8_cuda(kern_ctx_t *ctx, const uint8_t *codes,
                                               const uint8_t *scales, int64_t n_rows, int64_t dim,
                                               float *y_out)
{
    return dequant_launch<QUANT_ACT8>("dequant_act8_cuda", KERN_ACT8_GROUP, ctx, codes, scales,
                                      n_rows, dim, y_out);
}

extern "C" tdm_status_t kern_dequant_ckv_cuda(kern_ctx_t *ctx, const uint8_t *codes,
                                              const uint8_t *scales, int64_t n_rows, int64_t dim,
                                              float *y_out)
{
    return dequant_launch<QUANT_CKV>("dequant_ckv_cuda", KERN_CKV_GROUP, ctx, codes, scales, n_rows,
                                     dim, y_out);
}

extern "C" tdm_status_t kern_dequant_mx4_cuda(kern_ctx_t *ctx, const uint8_t *codes,
                                              const uint8_t *scales, int64_t n_rows, int64_t dim,
                                              float *y_out)
{
    return dequant_launch<QUANT_MX4>("dequant_mx4_cuda", KERN_MX4_GROUP, ctx, codes, scales, n_rows,
                                     dim, y_out);
}
