/* norm.cu - CUDA RMSNorm (kern_rmsnorm_cuda, kernels/norm.h; MODEL.md R2).
 *
 * One block of 256 threads per row: the sum of squares is a fixed-order block reduction (each
 * thread sums its strided elements in ascending order, then kc_block_sum), not the CPU's single
 * ascending loop, so the scale may differ from the CPU's in the last bit and an output by one
 * BF16 ulp (MODEL.md 12.6: summation order is not normative). The rest is the CPU's arithmetic:
 * scale = 1 / sqrtf(sum / dim + eps) (IEEE division and square root), y = BF16((x * scale) *
 * gamma). The result of a row depends only on that row (batch-invariant).
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

/* (mean(x^2) + eps)^-1/2 of x [n] for the whole block (all threads get it). */
__device__ __forceinline__ float block_rms_scale(const float *x, int64_t n, float eps, float *red)
{
    float sum = 0.0f;

    for (int64_t i = threadIdx.x; i < n; i += KC_BLOCK) {
        sum = __fadd_rn(sum, __fmul_rn(x[i], x[i]));
    }
    sum = kc_block_sum(sum, red);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)n), eps)));
}

__global__ void __launch_bounds__(KC_BLOCK)
    rmsnorm_kernel(const float *x, int64_t ldx, int64_t n_rows, int64_t dim, const float *gamma,
                   float eps, float *y, int64_t ldy)
{
    __shared__ float red[KC_BLOCK / KC_WARP + 1];

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;
        const float s = block_rms_scale(xr, dim, eps, red);

        /* the reduction's barriers order every read of the row before these writes, and each
         * thread writes only the elements it reads here: y may alias x */
        for (int64_t i = threadIdx.x; i < dim; i += KC_BLOCK) {
            yr[i] = kc_bf16_round(__fmul_rn(__fmul_rn(xr[i], s), gamma[i]));
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_rmsnorm_cuda(kern_ctx_t *ctx, const float *x, int64_t ldx,
                                          int64_t n_rows, int64_t dim, const float *gamma,
                                          float eps, float *y_out, int64_t ldy)
{
    if (x == NULL || gamma == NULL || y_out == NULL || dim <= 0 || n_rows < 0 || ldx < dim ||
        ldy < dim) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    rmsnorm_kernel<<<kc_grid(n_rows, 1), KC_BLOCK, 0, kc_stream(ctx)>>>(x, ldx, n_rows, dim, gamma,
                                                                        eps, y_out, ldy);
    return kc_launch_status("rmsnorm_cuda", n_rows, dim);
}
