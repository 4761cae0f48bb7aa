/* mhc.c - mHC coefficients, collapse, update and the Engram gate (kernels/mhc.h). */
#include "kernels/mhc.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/norm.h"

#include <math.h>
#include <stddef.h>

/* Rows whose coefficients are computed together (one per lane of the vector Sinkhorn). */
#define MHC_LANES 16

/* The Engram gate's sum_c ((x_c * qw_c) * kw_c) * key_c (kern_engram_gate_fn) in the 16-lane
 * order of kern_sum_sq_cpu (kernels/norm.h): lane j fuses c = j, j + 16, ... below n - n % 16,
 * the fixed tree, then the tail. */
static CPU_FMA_CLONES float gate_dot(const float *x, const float *qw, const float *kw,
                                     const float *key, int64_t n)
{
    float lane[16] = {0.0f};
    int64_t n16 = n - n % 16;
    float sum;

    for (int64_t c = 0; c < n16; c += 16) {
        for (int j = 0; j < 16; j++) {
            lane[j] = fmaf((x[c + j] * qw[c + j]) * kw[c + j], key[c + j], lane[j]);
        }
    }
    sum = cpu_lane_tree16(lane);
    for (int64_t c = n16; c < n; c++) {
        sum = fmaf((x[c] * qw[c]) * kw[c], key[c], sum);
    }
    return sum;
}

/* The Sinkhorn normalisation of one row's M [m, m] (kern_mhc_coeffs_fn): column normalise, then
 * iters - 1 times row then column normalise, each dividing by sum + eh. */
static void sinkhorn_row(float *M, int m, int iters, float eh)
{
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            for (int i = 0; i < m; i++) { /* row normalise */
                float sum = 0.0f;
                for (int j = 0; j < m; j++) {
                    sum += M[i * m + j];
                }
                for (int j = 0; j < m; j++) {
                    M[i * m + j] = M[i * m + j] / (sum + eh);
                }
            }
        }
        for (int j = 0; j < m; j++) { /* column normalise */
            float sum = 0.0f;
            for (int i = 0; i < m; i++) {
                sum += M[i * m + j];
            }
            for (int i = 0; i < m; i++) {
                M[i * m + j] = M[i * m + j] / (sum + eh);
            }
        }
    }
}

/* The Sinkhorn normalisation of rows' M [n, m, m] (n <= 16): one row per vector lane when the
 * CPU has a vector set (each lane runs sinkhorn_row's operations on its own row), else row by
 * row. */
static void sinkhorn_rows(const cpu_vec_ops_t *vec, float *M, int64_t n, int m, int iters, float eh)
{
    float lanes[KERN_MHC_MAX_STREAMS * KERN_MHC_MAX_STREAMS * MHC_LANES];
    int mm = m * m;

    if (vec == NULL || n < 2) {
        for (int64_t r = 0; r < n; r++) {
            sinkhorn_row(M + r * mm, m, iters, eh);
        }
        return;
    }
    for (int k = 0; k < mm; k++) {
        for (int64_t r = 0; r < MHC_LANES; r++) {
            /* lanes past n repeat row 0 (computed, never stored) */
            lanes[k * MHC_LANES + r] = M[(r < n ? r : 0) * mm + k];
        }
    }
    vec->mhc_sinkhorn(lanes, m, iters, eh);
    for (int k = 0; k < mm; k++) {
        for (int64_t r = 0; r < n; r++) {
            M[r * mm + k] = lanes[k * MHC_LANES + r];
        }
    }
}

CPU_FMA_CLONES tdm_status_t kern_mhc_coeffs_cpu(kern_ctx_t *ctx, const kern_mhc_params_t *params,
                                                const float *x, int64_t n_rows, int64_t H,
                                                const float *mix_raw, float *pre_out,
                                                float *post_out, float *M_out)
{
    (void)ctx;
    if (params == NULL || x == NULL || mix_raw == NULL || pre_out == NULL || post_out == NULL ||
        M_out == NULL || params->m < 1 || params->m > KERN_MHC_MAX_STREAMS || H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    int m = params->m;
    int n_mix = (2 + m) * m;
    const float *b = params->base;
    const float *sc = params->scale;
    float eh = params->eps_hc;
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    for (int64_t r0 = 0; r0 < n_rows; r0 += MHC_LANES) {
        int64_t nb = n_rows - r0 < MHC_LANES ? n_rows - r0 : MHC_LANES;
        float rs_block[MHC_LANES];

        /* the block's scales (kern_rms_scales_cpu: its rows side by side) */
        kern_rms_scales_cpu(x + r0 * m * H, m * H, nb, m * H, params->eps, rs_block);
        for (int64_t r = r0; r < r0 + nb; r++) {
            float mix[(2 + KERN_MHC_MAX_STREAMS) * KERN_MHC_MAX_STREAMS];
            float *M = M_out + r * m * m;
            float rs = rs_block[r - r0];

            for (int k = 0; k < n_mix; k++) {
                mix[k] = mix_raw[r * n_mix + k] * rs;
            }
            for (int i = 0; i < m; i++) {
                pre_out[r * m + i] = cpu_sigmoid(mix[i] * sc[0] + b[i]) + eh;
                post_out[r * m + i] = 2.0f * cpu_sigmoid(mix[m + i] * sc[1] + b[m + i]);
            }
            for (int i = 0; i < m; i++) {
                float mx = -INFINITY;
                float sum = 0.0f;
                for (int j = 0; j < m; j++) {
                    float c = mix[2 * m + m * i + j] * sc[2] + b[2 * m + m * i + j];
                    M[i * m + j] = c;
                    mx = c > mx ? c : mx;
                }
                for (int j = 0; j < m; j++) {
                    M[i * m + j] = cpu_exp(M[i * m + j] - mx);
                    sum += M[i * m + j];
                }
                for (int j = 0; j < m; j++) {
                    M[i * m + j] = M[i * m + j] / sum + eh;
                }
            }
        }
        sinkhorn_rows(vec, M_out + r0 * m * m, nb, m, params->iters, eh);
    }
    return TDM_OK;
}

tdm_status_t kern_mhc_collapse_cpu(kern_ctx_t *ctx, const float *pre, const float *X,
                                   int64_t n_rows, int m, int64_t H, float *y_out)
{
    (void)ctx;
    if (pre == NULL || X == NULL || y_out == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS || H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    if (vec != NULL) { /* each lane: the loop below on one column */
        for (int64_t r = 0; r < n_rows; r++) {
            vec->mhc_collapse(pre + r * m, X + r * m * H, m, H, y_out + r * H);
        }
        return TDM_OK;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t c = 0; c < H; c++) {
            float acc = 0.0f;
            for (int i = 0; i < m; i++) {
                acc += pre[r * m + i] * X[(r * m + i) * H + c];
            }
            y_out[r * H + c] = cpu_bf16_round(acc);
        }
    }
    return TDM_OK;
}

tdm_status_t kern_mhc_update_cpu(kern_ctx_t *ctx, const float *post, const float *F, const float *M,
                                 int64_t n_rows, int m, int64_t H, float *X)
{
    (void)ctx;
    if (post == NULL || F == NULL || M == NULL || X == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS ||
        H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    if (vec != NULL) { /* each lane: the loop below on one column */
        for (int64_t r = 0; r < n_rows; r++) {
            vec->mhc_update(post + r * m, F + r * H, M + r * m * m, m, H, X + r * m * H);
        }
        return TDM_OK;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        const float *Mr = M + r * m * m;
        float *Xr = X + r * m * H;
        for (int64_t c = 0; c < H; c++) {
            float old[KERN_MHC_MAX_STREAMS];
            for (int i = 0; i < m; i++) {
                old[i] = Xr[i * H + c];
            }
            for (int j = 0; j < m; j++) {
                float acc = 0.0f;
                for (int i = 0; i < m; i++) {
                    acc += Mr[i * m + j] * old[i];
                }
                Xr[j * H + c] = cpu_bf16_round(post[r * m + j] * F[r * H + c] + acc);
            }
        }
    }
    return TDM_OK;
}

CPU_FMA_CLONES tdm_status_t kern_engram_gate_cpu(kern_ctx_t *ctx, float *X, const float *kv,
                                                 const float *qw, const float *kw, int64_t n_rows,
                                                 int m, int64_t H, float eps)
{
    (void)ctx;
    if (X == NULL || kv == NULL || qw == NULL || kw == NULL || m < 1 || m > KERN_MHC_MAX_STREAMS ||
        H <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    float sqrt_h = (float)sqrt((double)H);
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    for (int64_t r = 0; r < n_rows; r++) {
        const float *kvr = kv + r * (m + 1) * H;
        const float *value = kvr + m * H;
        float rs_x[KERN_MHC_MAX_STREAMS];
        float rs_k[KERN_MHC_MAX_STREAMS];
        /* every stream's scales before any stream is updated (stream i reads only X_i) */
        kern_rms_scales_cpu(X + r * m * H, H, m, H, eps, rs_x);
        kern_rms_scales_cpu(kvr, H, m, H, eps, rs_k);
        for (int i = 0; i < m; i++) {
            float *xi = X + (r * m + i) * H;
            const float *key = kvr + i * H;
            float dot = gate_dot(xi, qw + i * H, kw + i * H, key, H);
            float gam = dot * rs_x[i] * rs_k[i] / sqrt_h;
            float mag = fabsf(gam) > 1e-6f ? fabsf(gam) : 1e-6f;
            float z = (gam >= 0.0f ? 1.0f : -1.0f) * sqrtf(mag);
            float g = cpu_sigmoid(z);
            if (vec != NULL) {
                vec->axpy_bf16(xi, g, value, H);
                continue;
            }
            for (int64_t c = 0; c < H; c++) {
                xi[c] = cpu_bf16_round(xi[c] + g * value[c]);
            }
        }
    }
    return TDM_OK;
}
