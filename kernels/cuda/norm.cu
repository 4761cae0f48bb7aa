/* norm.cu - CUDA RMSNorm (kern_rmsnorm_cuda, kernels/norm.h; MODEL.md R2).
 *
 * One block of 256 threads per row: warp 0 sums the squares in the 16-lane order of
 * kern_sum_sq_cpu (kc_dot16: a half-warp's lanes, the fixed tree, the tail), thread 0 takes the
 * CPU's scale = 1 / sqrtf(sum / dim + eps) (IEEE division and square root), and every thread
 * writes y = BF16((x * scale) * gamma): the CPU's operations in the CPU's order, so its bits. The
 * result of a row depends only on that row (batch-invariant).
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

__global__ void __launch_bounds__(KC_BLOCK)
    rmsnorm_kernel(const float *x, int64_t ldx, int64_t n_rows, int64_t dim, const float *gamma,
                   float eps, float *y, int64_t ldy)
{
    __shared__ float scale_shared;

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;

        if (threadIdx.x < KC_WARP) { /* both half-warps of warp 0 compute it; lane 0 keeps it */
            const float sum = kc_dot16(xr, xr, dim);
            if (threadIdx.x == 0) {
                scale_shared = kc_rms_scale(sum, dim, eps);
            }
        }
        __syncthreads();
        const float s = scale_shared;

        /* the barrier orders every read of the row for the sum before these writes, and each
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
