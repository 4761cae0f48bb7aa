/* norm.c - kern_rmsnorm_cpu (kernels/norm.h). */
#include "kernels/norm.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stddef.h>

CPU_FMA_CLONES float kern_sum_sq_cpu(const float *x, int64_t n)
{
    int64_t n16 = n - n % 16;
    float sum = n16 > 0 ? kern_dot_cpu(x, x, n16) : 0.0f;

    for (int64_t i = n16; i < n; i++) {
        sum = fmaf(x[i], x[i], sum);
    }
    return sum;
}

float kern_rms_scale_cpu(const float *x, int64_t n, float eps)
{
    return 1.0f / sqrtf(kern_sum_sq_cpu(x, n) / (float)n + eps);
}

void kern_rms_scales_cpu(const float *x, int64_t ldx, int64_t n_rows, int64_t n, float eps,
                         float *scales_out)
{
    for (int64_t r = 0; r < n_rows; r++) {
        scales_out[r] = kern_rms_scale_cpu(x + r * ldx, n, eps);
    }
}

tdm_status_t kern_rmsnorm_cpu(kern_ctx_t *ctx, const float *x, int64_t ldx, int64_t n_rows,
                              int64_t dim, const float *gamma, float eps, float *y_out, int64_t ldy)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (x == NULL || gamma == NULL || y_out == NULL || dim <= 0 || n_rows < 0 || ldx < dim ||
        ldy < dim) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * ldx;
        float *yr = y_out + r * ldy;
        /* the row's scale before the row is written (y may alias x) */
        float s = kern_rms_scale_cpu(xr, dim, eps);
        if (vec != NULL) {
            vec->scale_gamma_bf16(xr, s, gamma, dim, yr);
            continue;
        }
        for (int64_t i = 0; i < dim; i++) {
            yr[i] = cpu_bf16_round((xr[i] * s) * gamma[i]);
        }
    }
    return TDM_OK;
}
