/* moe.c - router and SwiGLU (kernels/moe.h). */
#include "kernels/moe.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"
#include "kernels/glue.h"
#include "kernels/topk.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#define MOE_MAX_E    4096 /* most experts the router's stack scratch holds */
#define SWIGLU_CHUNK 16   /* elements per vector SwiGLU call (one exp_n pass, then the vector) */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a;
    int32_t y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

CPU_FMA_CLONES tdm_status_t kern_moe_route_cpu(kern_ctx_t *ctx, const float *logits,
                                               const float *bias, int64_t n_rows, int64_t E, int K,
                                               float rho, int32_t *ids_out, float *weights_out)
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
            float sp = cpu_log1p(cpu_exp(-fabsf(z))) + (z > 0.0f ? z : 0.0f);
            s[e] = sqrtf(sp);
            biased[e] = s[e] + bias[e];
        }
        kern_ctx_t plain = ctx != NULL ? *ctx : (kern_ctx_t){0};
        plain.status_word = NULL; /* the top-k's own status comes back here */
        tdm_status_t status = kern_topk_cpu(&plain, biased, E, K, scratch, ids, &n_sel);
        if ((status == TDM_ERR_INTERNAL || (status == TDM_OK && n_sel != K)) && ctx != NULL &&
            ctx->status_word != NULL) {
            /* deferred: a row later ops accept (experts 0 .. K-1, weight 0), the bit set */
            for (int k = 0; k < K; k++) {
                ids[k] = k;
                weights_out[r * K + k] = 0.0f;
            }
            *ctx->status_word |= KERN_STATUS_ROUTE_NAN;
            continue;
        }
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

CPU_FMA_CLONES tdm_status_t kern_swiglu_cpu(kern_ctx_t *ctx, const float *gu, const float *w,
                                            int64_t n_rows, int64_t I, float lambda, float *h_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (gu == NULL || h_out == NULL || I <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        float wr = w != NULL ? w[r] : 1.0f;
        int64_t i = 0;
        /* SWIGLU_CHUNK elements at a time: the exponentials (exp_n: kern_exp's bits), then the
         * rest of the loop's operations, lane by lane, on the vector set */
        for (; vec != NULL && i + SWIGLU_CHUNK <= I; i += SWIGLU_CHUNK) {
            const float *g = gu + r * 2 * I + i;
            float e[SWIGLU_CHUNK];
            for (int k = 0; k < SWIGLU_CHUNK; k++) {
                e[k] = -(g[k] < lambda ? g[k] : lambda);
            }
            vec->exp_n(e, SWIGLU_CHUNK, e);
            vec->swiglu(g, g + I, e, SWIGLU_CHUNK, lambda, wr, h_out + r * I + i);
        }
        for (; i < I; i++) {
            float g = gu[r * 2 * I + i];
            float u = gu[r * 2 * I + I + i];
            float gm = g < lambda ? g : lambda;
            float uc = u < -lambda ? -lambda : (u > lambda ? lambda : u);
            float h = (gm * (1.0f / (1.0f + cpu_exp(-gm)))) * uc;
            h_out[r * I + i] = cpu_bf16_round(wr * h);
        }
    }
    return TDM_OK;
}

tdm_status_t kern_moe_table_fill(const kern_moe_experts_t *ex, const void **table_out)
{
    int64_t E;

    if (ex == NULL || table_out == NULL || ex->n_experts < 1 || ex->w1 == NULL || ex->w3 == NULL ||
        ex->w2 == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    E = ex->n_experts;
    for (int64_t e = 0; e < E; e++) {
        table_out[e] = ex->w1[e].data;
        table_out[E + e] = ex->w1[e].scales;
        table_out[2 * E + e] = ex->w3[e].data;
        table_out[3 * E + e] = ex->w3[e].scales;
        table_out[4 * E + e] = ex->w2[e].data;
        table_out[5 * E + e] = ex->w2[e].scales;
    }
    return TDM_OK;
}

/* The checks kern_moe_ffn_cpu makes before it writes anything: shapes, then the groups. */
static int moe_ffn_args_ok(const kern_moe_experts_t *ex, const float *xq, int64_t n_tokens,
                           int64_t H, int64_t I, const int64_t *offsets, const int64_t *rows,
                           const float *wts, int64_t n_pairs, const float *scratch,
                           int64_t scratch_rows, const float *acc)
{
    int64_t E;

    if (ex == NULL || ex->w1 == NULL || ex->w3 == NULL || ex->w2 == NULL || ex->n_experts < 1 ||
        offsets == NULL || n_tokens < 0 || n_pairs < 0 || H < 1 || I < 1 ||
        (n_pairs > 0 &&
         (xq == NULL || rows == NULL || wts == NULL || scratch == NULL || acc == NULL ||
          scratch_rows < (n_tokens < n_pairs ? n_tokens : n_pairs)))) {
        return 0;
    }
    E = ex->n_experts;
    if (offsets[0] != 0 || offsets[E] > n_pairs) {
        return 0;
    }
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = offsets[e + 1] - offsets[e];
        if (ne < 0 || ne > scratch_rows) {
            return 0;
        }
        if (ne > 0 && (ex->w1[e].data == NULL || ex->w3[e].data == NULL || ex->w2[e].data == NULL ||
                       ex->w1[e].n_out != I || ex->w1[e].n_in != H || ex->w3[e].n_out != I ||
                       ex->w3[e].n_in != H || ex->w2[e].n_out != H || ex->w2[e].n_in != I)) {
            return 0;
        }
    }
    for (int64_t p = 0; p < offsets[E]; p++) {
        if (rows[p] < 0 || rows[p] >= n_tokens) {
            return 0;
        }
    }
    return 1;
}

tdm_status_t kern_moe_ffn_cpu(kern_ctx_t *ctx, const kern_moe_experts_t *ex, const float *xq,
                              int64_t n_tokens, int64_t H, int64_t I, const int64_t *offsets,
                              const int64_t *rows, const float *wts, int64_t n_pairs, float lambda,
                              float *scratch, int64_t scratch_rows, float *acc, int64_t *active_out)
{
    float *xe, *gu, *h, *ye;
    tdm_status_t st = TDM_OK;

    if (!moe_ffn_args_ok(ex, xq, n_tokens, H, I, offsets, rows, wts, n_pairs, scratch, scratch_rows,
                         acc)) {
        return TDM_ERR_INVALID_ARG;
    }
    kern_moe_scratch_split(scratch, scratch_rows, H, I, &xe, &gu, &h, &ye);
    /* the per-expert sequence of calls the engine made before this op (same order, same bits) */
    for (int64_t e = 0; e < ex->n_experts && st == TDM_OK; e++) {
        int64_t p0 = offsets[e], ne = offsets[e + 1] - offsets[e];
        if (ne == 0) {
            continue;
        }
        st = kern_rows_gather_cpu(ctx, xq, H, rows + p0, ne, H, xe, H);
        if (st == TDM_OK) {
            st = kern_gemm_cpu(ctx, &ex->w1[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu, 2 * I);
        }
        if (st == TDM_OK) {
            st = kern_gemm_cpu(ctx, &ex->w3[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu + I, 2 * I);
        }
        if (st == TDM_OK) {
            st = kern_swiglu_cpu(ctx, gu, wts + p0, ne, I, lambda, h);
        }
        if (st == TDM_OK) {
            st = kern_qdq_act8_rows_cpu(ctx, h, ne, I, h);
        }
        if (st == TDM_OK) {
            st = kern_gemm_cpu(ctx, &ex->w2[e], h, I, ne, KERN_GEMM_OUT_BF16, ye, H);
        }
        if (st == TDM_OK) {
            st = kern_rows_scatter_add_cpu(ctx, ye, H, rows + p0, ne, H, acc, H);
        }
    }
    for (int64_t e = 0; e < ex->n_experts && st == TDM_OK && active_out != NULL; e++) {
        active_out[e] += offsets[e + 1] > offsets[e];
    }
    return st;
}
