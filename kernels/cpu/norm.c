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

tdm_status_t kern_rmsnorm_cpu(kern_ctx_t *ctx, const float *x, int64_t ldx, int64_t n_rows,
                              int64_t dim, const float *gamma, float eps, float *y_out,
                              int64_t ldy)
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
        float s = kern_rms_scale_cpu(xr, dim, eps); /* a sequential sum: stays scalar */
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
