/* moe.c - router and SwiGLU (kernels/moe.h). */
#include "kernels/moe.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/topk.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#define MOE_MAX_E    4096 /* most experts the router's stack scratch holds */
#define SWIGLU_CHUNK 16   /* elements per vector SwiGLU call (one expf pass, then the vector) */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a;
    int32_t y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

tdm_status_t kern_moe_route_cpu(kern_ctx_t *ctx, const float *logits, const float *bias,
                                int64_t n_rows, int64_t E, int K, float rho, int32_t *ids_out,
                                float *weights_out)
{
    float s[MOE_MAX_E];
    float biased[MOE_MAX_E];
    int32_t scratch[MOE_MAX_E];

    if (logits == NULL || bias == NULL || ids_out == NULL || weights_out == NULL || K < 1 ||
        K > KERN_MOE_MAX_K || K > E || E > MOE_MAX_E) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        int32_t *ids = ids_out + r * K;
        int64_t n_sel = 0;
        float sum = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            float z = logits[r * E + e];
            float sp = log1pf(expf(-fabsf(z))) + (z > 0.0f ? z : 0.0f);
            s[e] = sqrtf(sp);
            biased[e] = s[e] + bias[e];
        }
        tdm_status_t status = kern_topk_cpu(ctx, biased, E, K, scratch, ids, &n_sel);
        if (status != TDM_OK) {
            return status;
        }
        if (n_sel != K) {
            return TDM_ERR_INTERNAL;
        }
        qsort(ids, (size_t)K, sizeof(int32_t), cmp_i32);
        for (int k = 0; k < K; k++) {
            sum += s[ids[k]];
        }
        for (int k = 0; k < K; k++) {
            weights_out[r * K + k] = (rho * s[ids[k]]) / (sum + 1e-20f);
        }
    }
    return TDM_OK;
}

tdm_status_t kern_swiglu_cpu(kern_ctx_t *ctx, const float *gu, const float *w, int64_t n_rows,
                             int64_t I, float lambda, float *h_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (gu == NULL || h_out == NULL || I <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        float wr = w != NULL ? w[r] : 1.0f;
        int64_t i = 0;
        /* SWIGLU_CHUNK elements at a time: expf per element (libm), then the rest of the
         * loop's operations, lane by lane, on the vector set */
        for (; vec != NULL && i + SWIGLU_CHUNK <= I; i += SWIGLU_CHUNK) {
            const float *g = gu + r * 2 * I + i;
            float e[SWIGLU_CHUNK];
            for (int k = 0; k < SWIGLU_CHUNK; k++) {
                e[k] = expf(-(g[k] < lambda ? g[k] : lambda));
            }
            vec->swiglu(g, g + I, e, SWIGLU_CHUNK, lambda, wr, h_out + r * I + i);
        }
        for (; i < I; i++) {
            float g = gu[r * 2 * I + i];
            float u = gu[r * 2 * I + I + i];
            float gm = g < lambda ? g : lambda;
            float uc = u < -lambda ? -lambda : (u > lambda ? lambda : u);
            float h = (gm * (1.0f / (1.0f + expf(-gm)))) * uc;
            h_out[r * I + i] = cpu_bf16_round(wr * h);
        }
    }
    return TDM_OK;
}
