/* moe_ffn_check.h - one check of ops->moe_ffn (kernels/moe.h) usable on any kernel table (CPU,
 * guard, CUDA): a layer's routed experts through moe_ffn give, bit for bit, what the per-expert
 * calls on the same table give (rows_gather, gemm w1 and w3, swiglu with the routing weight,
 * qdq_act8, gemm w2, rows_scatter_add, in ascending expert order), added to a non-zero acc, and
 * the experts run are counted on the backend. Random MXFP4 experts (one of them absent, as in an
 * expert-parallel shard, and routed to by no token), random Q_act8 rows, K distinct experts per
 * token. Memory is had and moved only through the table's own mem_* members. Include from a
 * cmocka test after <cmocka.h> and "kernels/ops.h".
 */
#ifndef TANDEM_TESTS_MOE_FFN_CHECK_H
#define TANDEM_TESTS_MOE_FFN_CHECK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/codec.h"
#include "kernels/ops.h"

#define MFC_E      12
#define MFC_ABSENT 5 /* an expert without data (no token routes to it) */
#define MFC_H      64
#define MFC_I      32
#define MFC_N      9
#define MFC_K      3
#define MFC_PAIRS  (MFC_N * MFC_K)

static uint64_t mfc_rng = 0xC0FFEE1234567ull;

static uint64_t mfc_next(void)
{
    mfc_rng ^= mfc_rng << 13;
    mfc_rng ^= mfc_rng >> 7;
    mfc_rng ^= mfc_rng << 17;
    return mfc_rng;
}

static float mfc_float(void)
{
    return (float)((double)(mfc_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* n_bytes of backend memory holding host (or zeros). */
static void *mfc_dev(const kern_ops_t *ops, kern_ctx_t *ctx, const void *host, size_t n_bytes)
{
    void *p = NULL;

    assert_int_equal(ops->mem_alloc(ctx, n_bytes, &p), TDM_OK);
    assert_int_equal(ops->mem_set(ctx, p, 0, n_bytes), TDM_OK);
    if (host != NULL) {
        assert_int_equal(ops->mem_copy(ctx, p, host, n_bytes, KERN_COPY_H2D), TDM_OK);
    }
    return p;
}

static void mfc_to_host(const kern_ops_t *ops, kern_ctx_t *ctx, void *host, const void *dev,
                        size_t n_bytes)
{
    assert_int_equal(ops->mem_copy(ctx, host, dev, n_bytes, KERN_COPY_D2H), TDM_OK);
}

/* A random MXFP4 matrix [n_out, n_in] in backend memory (scale bytes 118..127); bf16: the same
 * values expanded to BF16 (what the loader does to an expert whose scales it cannot use as
 * stored). */
static kern_mat_t mfc_mxfp4(const kern_ops_t *ops, kern_ctx_t *ctx, int64_t n_out, int64_t n_in,
                            int bf16, void **allocs, int *n_allocs)
{
    size_t code_bytes = (size_t)(n_out * n_in / 2), scale_bytes = (size_t)(n_out * n_in / 32);
    uint8_t *codes = malloc(code_bytes), *scales = malloc(scale_bytes);
    kern_mat_t m;

    assert_non_null(codes);
    assert_non_null(scales);
    for (size_t i = 0; i < code_bytes; i++) {
        codes[i] = (uint8_t)mfc_next();
    }
    for (size_t i = 0; i < scale_bytes; i++) {
        scales[i] = (uint8_t)(118 + mfc_next() % 10);
    }
    if (bf16) {
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n_out * n_in));
        assert_non_null(w);
        assert_int_equal(kern_mat_bf16_from_mxfp4(codes, scales, n_out, n_in, w), TDM_OK);
        m = (kern_mat_t){
            KERN_MAT_BF16, n_out,
            n_in,          mfc_dev(ops, ctx, w, sizeof(uint16_t) * (size_t)(n_out * n_in)),
            NULL,          NULL};
        allocs[(*n_allocs)++] = (void *)m.data;
        free(w);
    } else {
        m = (kern_mat_t){KERN_MAT_MXFP4,
                         n_out,
                         n_in,
                         mfc_dev(ops, ctx, codes, code_bytes),
                         mfc_dev(ops, ctx, scales, scale_bytes),
                         NULL};
        allocs[(*n_allocs)++] = (void *)m.data;
        allocs[(*n_allocs)++] = (void *)m.scales;
    }
    free(codes);
    free(scales);
    return m;
}

/*
 * mfc_check - the check on `ops` (ctx: its kernel context). scratch_rows: the scratch moe_ffn
 * gets, in pairs (>= MFC_N; below MFC_PAIRS a CUDA table works through windows of it). mixed:
 * expert 1's matrices are BF16 (a layer mixing dtypes; CUDA then runs expert by expert).
 */
static void mfc_check(const kern_ops_t *ops, kern_ctx_t *ctx, int64_t scratch_rows, int mixed)
{
    const int64_t H = MFC_H, I = MFC_I, N = MFC_N, E = MFC_E;
    const float lambda = 7.0f;
    void *allocs[6 * MFC_E + 32];
    int n_allocs = 0;
    kern_mat_t w1[MFC_E], w3[MFC_E], w2[MFC_E];
    const void *table_host[KERN_MOE_TABLE_LEN(MFC_E)];
    int32_t experts[MFC_PAIRS];
    float x[MFC_N * MFC_H], wts[MFC_PAIRS], acc0[MFC_N * MFC_H];
    float got[MFC_N * MFC_H], want[MFC_N * MFC_H];
    int64_t off[MFC_E + 1], active[MFC_E], n_used = 0;
    int used[MFC_E] = {0};

    memset(w1, 0, sizeof(w1));
    memset(w3, 0, sizeof(w3));
    memset(w2, 0, sizeof(w2));
    for (int64_t e = 0; e < E; e++) {
        if (e == MFC_ABSENT) {
            w1[e] = w3[e] = (kern_mat_t){KERN_MAT_MXFP4, I, H, NULL, NULL, NULL};
            w2[e] = (kern_mat_t){KERN_MAT_MXFP4, H, I, NULL, NULL, NULL};
            continue;
        }
        w1[e] = mfc_mxfp4(ops, ctx, I, H, mixed && e == 1, allocs, &n_allocs);
        w3[e] = mfc_mxfp4(ops, ctx, I, H, mixed && e == 1, allocs, &n_allocs);
        w2[e] = mfc_mxfp4(ops, ctx, H, I, mixed && e == 1, allocs, &n_allocs);
    }
    kern_moe_experts_t ex = {E, w1, w3, w2, NULL};
    assert_int_equal(kern_moe_table_fill(&ex, table_host), TDM_OK);
    ex.table = mfc_dev(ops, ctx, table_host, sizeof(table_host));
    allocs[n_allocs++] = (void *)ex.table;

    /* tokens: Q_act8 rows; K distinct experts each (never the absent one), ascending */
    for (int64_t i = 0; i < N * H; i++) {
        x[i] = mfc_float() * 4.0f;
        acc0[i] = mfc_float();
    }
    for (int64_t r = 0; r < N; r++) {
        assert_int_equal(kern_qdq_act8_cpu(x + r * H, H, x + r * H), TDM_OK);
        int32_t e = (int32_t)(mfc_next() % (uint64_t)E);
        for (int k = 0; k < MFC_K; k++) {
            while (e == MFC_ABSENT) {
                e = (e + 1) % (int32_t)E;
            }
            experts[r * MFC_K + k] = e;
            used[e] = 1;
            e = (e + 1 + (int32_t)(mfc_next() % 2)) % (int32_t)E;
        }
        /* ascending, as the router returns them (three values: a small sort) */
        for (int a = 0; a < MFC_K; a++) {
            for (int b = a + 1; b < MFC_K; b++) {
                if (experts[r * MFC_K + b] < experts[r * MFC_K + a]) {
                    int32_t t = experts[r * MFC_K + a];
                    experts[r * MFC_K + a] = experts[r * MFC_K + b];
                    experts[r * MFC_K + b] = t;
                }
            }
        }
        for (int k = 0; k < MFC_K; k++) {
            wts[r * MFC_K + k] = 0.25f + 0.5f * (mfc_float() + 1.0f);
        }
    }
    for (int64_t e = 0; e < E; e++) {
        n_used += used[e];
    }
    float *dx = mfc_dev(ops, ctx, x, sizeof(x));
    int32_t *dex = mfc_dev(ops, ctx, experts, sizeof(experts));
    float *dw = mfc_dev(ops, ctx, wts, sizeof(wts));
    int64_t *doff = mfc_dev(ops, ctx, NULL, sizeof(off));
    int64_t *drows = mfc_dev(ops, ctx, NULL, sizeof(int64_t) * MFC_PAIRS);
    float *dwe = mfc_dev(ops, ctx, NULL, sizeof(float) * MFC_PAIRS);
    float *dacc = mfc_dev(ops, ctx, acc0, sizeof(acc0));
    float *dref = mfc_dev(ops, ctx, acc0, sizeof(acc0));
    int64_t *dactive = mfc_dev(ops, ctx, NULL, sizeof(active));
    float *dacc2 = mfc_dev(ops, ctx, acc0, sizeof(acc0));
    float *scratch = mfc_dev(ops, ctx, NULL,
                             sizeof(float) * (size_t)KERN_MOE_SCRATCH_FLOATS(scratch_rows, H, I));
    float *xe = mfc_dev(ops, ctx, NULL, sizeof(float) * (size_t)(N * H));
    float *gu = mfc_dev(ops, ctx, NULL, sizeof(float) * (size_t)(N * 2 * I));
    float *hh = mfc_dev(ops, ctx, NULL, sizeof(float) * (size_t)(N * I));
    float *ye = mfc_dev(ops, ctx, NULL, sizeof(float) * (size_t)(N * H));

    assert_int_equal(ops->expert_rows(ctx, dex, dw, N, MFC_K, E, doff, drows, dwe), TDM_OK);
    /* moe_ffn (and below a second call that adds to the same counters) */
    assert_int_equal(ops->moe_ffn(ctx, &ex, dx, N, H, I, doff, drows, dwe, MFC_PAIRS, lambda,
                                  scratch, scratch_rows, dacc, dactive),
                     TDM_OK);
    /* the per-expert calls, from the offsets on the host */
    mfc_to_host(ops, ctx, off, doff, sizeof(off));
    assert_int_equal(off[E], MFC_PAIRS);
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = off[e + 1] - off[e];
        if (ne == 0) {
            continue;
        }
        assert_int_equal(ops->rows_gather(ctx, dx, H, drows + off[e], ne, H, xe, H), TDM_OK);
        assert_int_equal(ops->gemm(ctx, &w1[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu, 2 * I), TDM_OK);
        assert_int_equal(ops->gemm(ctx, &w3[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu + I, 2 * I),
                         TDM_OK);
        assert_int_equal(ops->swiglu(ctx, gu, dwe + off[e], ne, I, lambda, hh), TDM_OK);
        assert_int_equal(ops->qdq_act8(ctx, hh, ne, I, hh), TDM_OK);
        assert_int_equal(ops->gemm(ctx, &w2[e], hh, I, ne, KERN_GEMM_OUT_BF16, ye, H), TDM_OK);
        assert_int_equal(ops->rows_scatter_add(ctx, ye, H, drows + off[e], ne, H, dref, H), TDM_OK);
    }
    assert_int_equal(ops->sync(ctx), TDM_OK);
    mfc_to_host(ops, ctx, got, dacc, sizeof(got));
    mfc_to_host(ops, ctx, want, dref, sizeof(want));
    /* a second call (into another sum) adds to the same counters */
    assert_int_equal(ops->moe_ffn(ctx, &ex, dx, N, H, I, doff, drows, dwe, MFC_PAIRS, lambda,
                                  scratch, scratch_rows, dacc2, dactive),
                     TDM_OK);
    mfc_to_host(ops, ctx, active, dactive, sizeof(active));
    assert_memory_equal(got, want, sizeof(got));
    assert_memory_not_equal(got, acc0, sizeof(got)); /* something was added */
    for (int64_t e = 0; e < E; e++) {
        assert_int_equal(active[e], 2 * used[e]);
    }
    print_message("%s: moe_ffn == per-expert calls, %d pairs over %lld experts%s, scratch %lld "
                  "rows: bit-identical\n",
                  ops->name, MFC_PAIRS, (long long)n_used, mixed ? " (one BF16)" : "",
                  (long long)scratch_rows);

    /* refusals: nothing written, nothing counted */
    memcpy(want, got, sizeof(got));
    assert_int_equal(ops->moe_ffn(ctx, NULL, dx, N, H, I, doff, drows, dwe, MFC_PAIRS, lambda,
                                  scratch, scratch_rows, dacc, dactive),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->moe_ffn(ctx, &ex, dx, N, H, I, doff, drows, dwe, MFC_PAIRS, lambda,
                                  scratch, N - 1, dacc, dactive),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->moe_ffn(ctx, &ex, dx, N, H + 32, I, doff, drows, dwe, MFC_PAIRS, lambda,
                                  scratch, scratch_rows, dacc, dactive),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->sync(ctx), TDM_OK);
    mfc_to_host(ops, ctx, got, dacc, sizeof(got));
    assert_memory_equal(got, want, sizeof(got));
    mfc_to_host(ops, ctx, active, dactive, sizeof(active));
    for (int64_t e = 0; e < E; e++) {
        assert_int_equal(active[e], 2 * used[e]);
    }

    void *bufs[] = {dx,   dex,     dw,      doff, drows, dwe, dacc, dacc2,
                    dref, dactive, scratch, xe,   gu,    hh,  ye};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        ops->mem_free(ctx, bufs[i]);
    }
    for (int i = 0; i < n_allocs; i++) {
        ops->mem_free(ctx, allocs[i]);
    }
}

#endif
