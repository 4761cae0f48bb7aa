/* norm.c - kern_rmsnorm_cpu (kernels/norm.h). */
#include "kernels/norm.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"

#include <math.h>
#include <stddef.h>

float kern_rms_scale_cpu(const float *x, int64_t n, float eps)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        sum += x[i] * x[i];
    }
    return 1.0f / sqrtf(sum / (float)n + eps);
}

void kern_rms_scales_cpu(const float *x, int64_t ldx, int64_t n_rows, int64_t n, float eps,
                         float *scales_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    int64_t r = 0;

    /* 16 rows at a time, one per vector lane, when the CPU has a vector set */
    for (; vec != NULL && r + KERN_RMS_VEC_ROWS / 2 < n_rows; r += KERN_RMS_VEC_ROWS) {
        float sum[KERN_RMS_VEC_ROWS];
        int64_t nb = n_rows - r < KERN_RMS_VEC_ROWS ? n_rows - r : KERN_RMS_VEC_ROWS;
        vec->sq_sums16(x + r * ldx, ldx, nb, n, sum);
        for (int64_t j = 0; j < nb; j++) {
            scales_out[r + j] = 1.0f / sqrtf(sum[j] / (float)n + eps);
        }
    }
    /* KERN_RMS_ROWS rows at a time: row j's sum is the loop of kern_rms_scale_cpu (x*x, then
     * one FP32 addition, ascending i); the rows only interleave, so each gets the same bits */
    for (; r + KERN_RMS_ROWS <= n_rows; r += KERN_RMS_ROWS) {
        const float *p = x + r * ldx;
        float sum[KERN_RMS_ROWS];
        for (int j = 0; j < KERN_RMS_ROWS; j++) {
            sum[j] = 0.0f;
        }
        for (int64_t i = 0; i < n; i++) {
            for (int j = 0; j < KERN_RMS_ROWS; j++) {
                float a = p[j * ldx + i];
                sum[j] += a * a;
            }
        }
        for (int j = 0; j < KERN_RMS_ROWS; j++) {
            scales_out[r + j] = 1.0f / sqrtf(sum[j] / (float)n + eps);
        }
    }
    for (; r < n_rows; r++) {
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
    for (int64_t r0 = 0; r0 < n_rows; r0 += KERN_RMS_VEC_ROWS) {
        int64_t nb = n_rows - r0 < KERN_RMS_VEC_ROWS ? n_rows - r0 : KERN_RMS_VEC_ROWS;
        float s[KERN_RMS_VEC_ROWS];
        /* every scale of the block before any row is written (y may alias x) */
        kern_rms_scales_cpu(x + r0 * ldx, ldx, nb, dim, eps, s);
        for (int64_t j = 0; j < nb; j++) {
            const float *xr = x + (r0 + j) * ldx;
            float *yr = y_out + (r0 + j) * ldy;
            if (vec != NULL) {
                vec->scale_gamma_bf16(xr, s[j], gamma, dim, yr);
                continue;
            }
            for (int64_t i = 0; i < dim; i++) {
                yr[i] = cpu_bf16_round((xr[i] * s[j]) * gamma[i]);
            }
        }
    }
    return TDM_OK;
}
