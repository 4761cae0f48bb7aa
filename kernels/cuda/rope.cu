/* rope.cu - CUDA partial RoPE (kern_rope_cuda, kernels/rope.h; MODEL.md 5, R5).
 *
 * The [tandem] table rule on the device: angle = fl32(fl32(pos) * f_i), cos and sin in double
 * rounded to FP32, then the CPU's rotation (two products and a sum or difference, each rounded)
 * and BF16 rounding of every element. CUDA's double cos/sin are within 2 ulp of the exact
 * value, so after rounding to FP32 they equal the host's except in astronomically rare cases:
 * the outputs are expected to be bit-identical to kern_rope_cpu (the test counts differences).
 * One thread per element outside the rotated tail and per rotated pair.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

__global__ void __launch_bounds__(KC_BLOCK)
    rope_kernel(float *x, int64_t n_rows, int64_t n_heads, int64_t dim, int d_r, const int64_t *pos,
                const float *freqs, int inverse)
{
    const int64_t n_plain = dim - d_r;
    const int64_t per_head = n_plain + d_r / 2; /* items: plain elements, then pairs */
    const int64_t n_items = n_rows * n_heads * per_head;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < n_items; it += stride) {
        const int64_t vec = it / per_head; /* row * n_heads + head */
        const int64_t u = it % per_head;
        float *v = x + vec * dim;

        if (u < n_plain) {
            v[u] = kc_bf16_round(v[u]);
            continue;
        }
        const int i = (int)(u - n_plain);
        const float angle = __fmul_rn((float)pos[vec / n_heads], freqs[i]);
        const float c = (float)cos((double)angle);
        const float s = (float)sin((double)angle);
        float *tail = v + n_plain;
        const float a = tail[2 * i];
        const float b = tail[2 * i + 1];
        float ra;
        float rb;
        if (!inverse) {
            ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            rb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
        } else {
            ra = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            rb = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        }
        tail[2 * i] = kc_bf16_round(ra);
        tail[2 * i + 1] = kc_bf16_round(rb);
    }
}

extern "C" tdm_status_t kern_rope_cuda(kern_ctx_t *ctx, float *x, int64_t n_rows, int64_t n_heads,
                                       int64_t dim, int d_r, const int64_t *pos, const float *freqs,
                                       kern_rope_dir_t dir)
{
    int64_t n_items;

    if (x == NULL || pos == NULL || freqs == NULL || d_r <= 0 || d_r % 2 != 0 ||
        d_r > KERN_ROPE_MAX_DIMS || d_r > dim || n_rows < 0 || n_heads <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    n_items = n_rows * n_heads * (dim - d_r + d_r / 2);
    rope_kernel<<<kc_grid(n_items, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(
        x, n_rows, n_heads, dim, d_r, pos, freqs, dir != KERN_ROPE_FORWARD);
    return kc_launch_status("rope_cuda", n_rows, n_heads * dim);
}
