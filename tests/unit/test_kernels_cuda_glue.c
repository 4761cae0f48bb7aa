/* test_kernels_cuda_glue.c - the CUDA memory members (kernels/mem.h), glue ops (kernels/glue.h)
 * and greedy argmax (kernels/sample.h) of kern_ops_cuda() against the CPU table on random
 * inputs. Every glue op is exact (kernels/glue.h), so each comparison is bit for bit. Device
 * memory is had and moved only through the CUDA table's own mem_* members, which the first test
 * checks against host copies. Without a usable device (or without the CUDA backend in this
 * build) every test prints why and skips; none passes without running.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/kv_page.h"
#include "kernels/ops.h"

#include "cuda_test_util.h"
#include "moe_ffn_check.h"

#define POISON 0xFF /* device outputs start as all-ones bytes (NaN floats) */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *floats(int64_t n, float scale)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)((urand() * 2.0 - 1.0) * scale);
    }
    return x;
}

/* Device copy of host bytes (through the CUDA table). */
static void *dev_from(const kern_ops_t *cuda, const void *host, size_t n_bytes)
{
    kern_ctx_t ctx = {0};
    void *p = NULL;

    ctx.backend = KERN_BACKEND_CUDA;
    assert_int_equal(cuda->mem_alloc(&ctx, n_bytes, &p), TDM_OK);
    assert_int_equal(cuda->mem_set(&ctx, p, POISON, n_bytes), TDM_OK);
    if (host != NULL) {
        assert_int_equal(cuda->mem_copy(&ctx, p, host, n_bytes, KERN_COPY_H2D), TDM_OK);
    }
    return p;
}

/* Host copy of device bytes (waits for the stream), then frees the device buffer. */
static void *host_from(const kern_ops_t *cuda, void *dev, size_t n_bytes)
{
    kern_ctx_t ctx = {0};
    void *h = malloc(n_bytes > 0 ? n_bytes : 1);

    assert_non_null(h);
    ctx.backend = KERN_BACKEND_CUDA;
    assert_int_equal(cuda->sync(&ctx), TDM_OK);
    assert_int_equal(cuda->mem_copy(&ctx, h, dev, n_bytes, KERN_COPY_D2H), TDM_OK);
    cuda->mem_free(&ctx, dev);
    return h;
}

static void assert_same_bytes(const char *what, const void *got, const void *want, size_t n)
{
    if (memcmp(got, want, n) != 0) {
        const unsigned char *g = got, *w = want;
        size_t first = 0;
        while (first < n && g[first] == w[first]) {
            first++;
        }
        fail_msg("%s: cuda and cpu differ (first at byte %zu of %zu)", what, first, n);
    }
    print_message("cuda == cpu: %s: %zu bytes bit-identical\n", what, n);
}

/*
 * FP32 arrays equal bit for bit, except that any NaN equals any NaN: an IEEE 754 addition with a
 * NaN operand returns a NaN whose payload the standard leaves open (x86 returns the first
 * operand's payload quieted, CUDA the canonical 0x7fffffff), and NaN payloads are not part of
 * the kernels' contract (kernels/glue.h).
 */
static void assert_same_floats(const char *what, const float *got, const float *want, int64_t n)
{
    int64_t n_nan = 0;

    for (int64_t i = 0; i < n; i++) {
        uint32_t g, w;
        memcpy(&g, got + i, sizeof(g));
        memcpy(&w, want + i, sizeof(w));
        if (isnan(got[i]) && isnan(want[i])) {
            n_nan++;
            continue;
        }
        if (g != w) {
            fail_msg("%s: cuda and cpu differ at element %lld of %lld: cuda 0x%08x cpu 0x%08x",
                     what, (long long)i, (long long)n, (unsigned)g, (unsigned)w);
        }
    }
    print_message("cuda == cpu: %s: %lld floats bit-identical (%lld NaN on both, payload "
                  "free)\n",
                  what, (long long)n, (long long)n_nan);
}

static void test_cuda_mem_members_round_trip(void **state)
{
    const kern_ops_t *cuda;
    kern_ctx_t ctx = {0};
    unsigned char host[4096], back[4096];
    void *a, *b;

    (void)state;
    cuda = ctu_require_cuda();
    ctx.backend = KERN_BACKEND_CUDA;
    for (int i = 0; i < 4096; i++) {
        host[i] = (unsigned char)(i * 13 + 1);
    }
    a = dev_from(cuda, host, sizeof(host));
    b = dev_from(cuda, NULL, sizeof(host));
    assert_int_equal(cuda->mem_copy(&ctx, b, a, sizeof(host), KERN_COPY_D2D), TDM_OK);
    assert_int_equal(cuda->mem_set(&ctx, (unsigned char *)b + 100, 0x3C, 50), TDM_OK);
    assert_int_equal(cuda->mem_copy(&ctx, back, b, sizeof(back), KERN_COPY_D2H), TDM_OK);
    for (int i = 0; i < 4096; i++) {
        assert_int_equal(back[i], i >= 100 && i < 150 ? 0x3C : host[i]);
    }
    assert_int_equal(cuda->mem_copy(&ctx, NULL, a, 4, KERN_COPY_D2D), TDM_ERR_INVALID_ARG);
    assert_int_equal(cuda->mem_copy(&ctx, b, a, 4, (kern_copy_kind_t)9), TDM_ERR_INVALID_ARG);
    assert_int_equal(cuda->mem_alloc(&ctx, 8, NULL), TDM_ERR_INVALID_ARG);
    cuda->mem_free(&ctx, a);
    cuda->mem_free(&ctx, b);
    cuda->mem_free(&ctx, NULL);
}

static void test_embed_and_stream_mean_cuda_bit_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t V = 300, H = 160, n = 9;
    int m = 4;
    uint16_t *table = malloc(sizeof(uint16_t) * (size_t)(V * H));
    int32_t ids[9] = {0, 299, 5, 5, 17, 128, 3, 250, 1};
    float *x_cpu = malloc(sizeof(float) * (size_t)(n * m * H));
    float *pre_cpu = malloc(sizeof(float) * (size_t)(n * m));
    float *mean_cpu = malloc(sizeof(float) * (size_t)(n * 2 * H));

    (void)state;
    assert_non_null(table);
    for (int64_t i = 0; i < V * H; i++) {
        table[i] = (uint16_t)(urand() * 65535.0);
        if ((table[i] & 0x7F80u) == 0x7F80u) {
            table[i] &= 0xBFFFu; /* no Inf/NaN in the table */
        }
    }
    memset(mean_cpu, POISON, sizeof(float) * (size_t)(n * 2 * H));
    assert_int_equal(cpu->embed(&ctx, table, V, ids, n, H, m, x_cpu, pre_cpu), TDM_OK);
    assert_int_equal(cpu->stream_mean(&ctx, x_cpu, n, m, H, mean_cpu + H, 2 * H), TDM_OK);

    ctx.backend = KERN_BACKEND_CUDA;
    void *d_table = dev_from(cuda, table, sizeof(uint16_t) * (size_t)(V * H));
    void *d_ids = dev_from(cuda, ids, sizeof(ids));
    void *d_x = dev_from(cuda, NULL, sizeof(float) * (size_t)(n * m * H));
    void *d_pre = dev_from(cuda, NULL, sizeof(float) * (size_t)(n * m));
    void *d_mean = dev_from(cuda, NULL, sizeof(float) * (size_t)(n * 2 * H)); /* POISON */
    assert_int_equal(cuda->embed(&ctx, d_table, V, d_ids, n, H, m, d_x, d_pre), TDM_OK);
    assert_int_equal(cuda->stream_mean(&ctx, d_x, n, m, H, (float *)d_mean + H, 2 * H), TDM_OK);
    float *x = host_from(cuda, d_x, sizeof(float) * (size_t)(n * m * H));
    float *pre = host_from(cuda, d_pre, sizeof(float) * (size_t)(n * m));
    float *mean = host_from(cuda, d_mean, sizeof(float) * (size_t)(n * 2 * H));
    assert_same_bytes("embed x", x, x_cpu, sizeof(float) * (size_t)(n * m * H));
    assert_same_bytes("embed pre", pre, pre_cpu, sizeof(float) * (size_t)(n * m));
    /* the untouched halves of the strided rows keep the poison on both */
    assert_same_bytes("stream_mean", mean, mean_cpu, sizeof(float) * (size_t)(n * 2 * H));
    cuda->mem_free(&ctx, d_table);
    cuda->mem_free(&ctx, d_ids);
    free(x);
    free(pre);
    free(mean);
    free(table);
    free(x_cpu);
    free(pre_cpu);
    free(mean_cpu);
}

static void test_elementwise_cuda_bit_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t n = 70001;
    size_t bytes = sizeof(float) * (size_t)n;
    float *a = floats(n, 1e3f), *b = floats(n, 1.0f);
    float *r_cpu = malloc(bytes), *s_cpu = malloc(bytes), *w_cpu = malloc(bytes);
    float *p_cpu = malloc(bytes);

    (void)state;
    a[0] = NAN;
    a[1] = -INFINITY;
    a[2] = 3.4e38f; /* above the largest BF16: rounds to +inf */
    assert_int_equal(cpu->bf16_round(&ctx, a, n, r_cpu), TDM_OK);
    assert_int_equal(cpu->add_bf16(&ctx, a, b, n, s_cpu), TDM_OK);
    assert_int_equal(cpu->add(&ctx, a, b, n, p_cpu), TDM_OK);
    memcpy(w_cpu, b, bytes);
    assert_int_equal(cpu->scale2(&ctx, w_cpu, n, 0.0883883f, 0.1767767f), TDM_OK);

    ctx.backend = KERN_BACKEND_CUDA;
    void *da = dev_from(cuda, a, bytes), *db = dev_from(cuda, b, bytes);
    void *dr = dev_from(cuda, NULL, bytes), *ds = dev_from(cuda, NULL, bytes);
    void *dw = dev_from(cuda, b, bytes), *dp = dev_from(cuda, NULL, bytes);
    assert_int_equal(cuda->bf16_round(&ctx, da, n, dr), TDM_OK);
    assert_int_equal(cuda->add_bf16(&ctx, da, db, n, ds), TDM_OK);
    assert_int_equal(cuda->scale2(&ctx, dw, n, 0.0883883f, 0.1767767f), TDM_OK);
    assert_int_equal(cuda->add(&ctx, da, db, n, dp), TDM_OK);
    float *p = host_from(cuda, dp, bytes);
    assert_same_floats("add", p, p_cpu, n);
    free(p);
    free(p_cpu);
    float *r = host_from(cuda, dr, bytes), *s = host_from(cuda, ds, bytes);
    float *w = host_from(cuda, dw, bytes);
    assert_same_floats("bf16_round", r, r_cpu, n);
    assert_same_floats("add_bf16", s, s_cpu, n);
    assert_same_floats("scale2", w, w_cpu, n);
    cuda->mem_free(&ctx, da);
    cuda->mem_free(&ctx, db);
    free(a);
    free(b);
    free(r);
    free(s);
    free(w);
    free(r_cpu);
    free(s_cpu);
    free(w_cpu);
}

static void test_rows_gather_scatter_add_cuda_bit_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t n_src = 40, C = 257, n_idx = 30;
    int64_t idx[30];
    size_t src_bytes = sizeof(float) * (size_t)(n_src * C);
    size_t y_bytes = sizeof(float) * (size_t)(n_idx * C);
    float *x = floats(n_src * C, 5.0f), *acc_cpu = floats(n_src * C, 5.0f);
    float *g_cpu = malloc(y_bytes), *y = floats(n_idx * C, 1.0f);

    (void)state;
    for (int64_t k = 0; k < n_idx; k++) {
        idx[k] = (int64_t)(urand() * (double)n_src); /* repeats on purpose */
    }
    void *dx = dev_from(cuda, x, src_bytes), *dacc = dev_from(cuda, acc_cpu, src_bytes);
    void *dy = dev_from(cuda, y, y_bytes), *dg = dev_from(cuda, NULL, y_bytes);
    void *didx = dev_from(cuda, idx, sizeof(idx));
    assert_int_equal(cpu->rows_gather(&ctx, x, C, idx, n_idx, C, g_cpu, C), TDM_OK);
    assert_int_equal(cpu->rows_scatter_add(&ctx, y, C, idx, n_idx, C, acc_cpu, C), TDM_OK);
    ctx.backend = KERN_BACKEND_CUDA;
    assert_int_equal(cuda->rows_gather(&ctx, dx, C, didx, n_idx, C, dg, C), TDM_OK);
    assert_int_equal(cuda->rows_scatter_add(&ctx, dy, C, didx, n_idx, C, dacc, C), TDM_OK);
    float *g = host_from(cuda, dg, y_bytes), *acc = host_from(cuda, dacc, src_bytes);
    assert_same_bytes("rows_gather", g, g_cpu, y_bytes);
    assert_same_bytes("rows_scatter_add", acc, acc_cpu, src_bytes);
    cuda->mem_free(&ctx, dx);
    cuda->mem_free(&ctx, dy);
    cuda->mem_free(&ctx, didx);
    free(x);
    free(acc_cpu);
    free(g_cpu);
    free(y);
    free(g);
    free(acc);
}

static void test_candidate_pool_and_argmax_cuda_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t n = 5000, Bc = 64, nb = (n + Bc - 1) / Bc, V = 4099, rows = 5;
    int32_t pool[7] = {3, 77, 0, 12, 40, 41, 78};
    float *s = floats(n, 3.0f), *beta_cpu = malloc(sizeof(float) * (size_t)nb);
    float *m_cpu = malloc(sizeof(float) * (size_t)n);
    float *logits = floats(rows * V, 8.0f);
    int32_t ids_cpu[5];

    (void)state;
    s[100] = NAN;
    logits[1 * V + 10] = 100.0f;
    logits[1 * V + 4000] = 100.0f; /* tie: id 10 */
    logits[2 * V + V - 1] = 200.0f;
    assert_int_equal(cpu->cand_blocks(&ctx, s, n, Bc, beta_cpu), TDM_OK);
    memcpy(m_cpu, s, sizeof(float) * (size_t)n);
    assert_int_equal(cpu->cand_mask(&ctx, m_cpu, n, Bc, pool, 7), TDM_OK);
    assert_int_equal(cpu->argmax(&ctx, logits, V, rows, V, ids_cpu), TDM_OK);

    ctx.backend = KERN_BACKEND_CUDA;
    void *ds = dev_from(cuda, s, sizeof(float) * (size_t)n);
    void *dm = dev_from(cuda, s, sizeof(float) * (size_t)n);
    void *dbeta = dev_from(cuda, NULL, sizeof(float) * (size_t)nb);
    void *dpool = dev_from(cuda, pool, sizeof(pool));
    void *dl = dev_from(cuda, logits, sizeof(float) * (size_t)(rows * V));
    void *dids = dev_from(cuda, NULL, sizeof(ids_cpu));
    assert_int_equal(cuda->cand_blocks(&ctx, ds, n, Bc, dbeta), TDM_OK);
    assert_int_equal(cuda->cand_mask(&ctx, dm, n, Bc, dpool, 7), TDM_OK);
    assert_int_equal(cuda->argmax(&ctx, dl, V, rows, V, dids), TDM_OK);
    float *beta = host_from(cuda, dbeta, sizeof(float) * (size_t)nb);
    float *masked = host_from(cuda, dm, sizeof(float) * (size_t)n);
    int32_t *ids = host_from(cuda, dids, sizeof(ids_cpu));
    assert_same_bytes("cand_blocks", beta, beta_cpu, sizeof(float) * (size_t)nb);
    assert_same_bytes("cand_mask", masked, m_cpu, sizeof(float) * (size_t)n);
    assert_same_bytes("argmax", ids, ids_cpu, sizeof(ids_cpu));
    assert_int_equal(ids[1], 10);
    /* a NaN logit: INTERNAL on both */
    float nan_val = NAN;
    assert_int_equal(
        cuda->mem_copy(&ctx, (float *)dl + 3 * V + 7, &nan_val, sizeof(float), KERN_COPY_H2D),
        TDM_OK);
    void *dids2 = dev_from(cuda, NULL, sizeof(ids_cpu));
    assert_int_equal(cuda->argmax(&ctx, dl, V, rows, V, dids2), TDM_ERR_INTERNAL);
    cuda->mem_free(&ctx, dids2);
    cuda->mem_free(&ctx, ds);
    cuda->mem_free(&ctx, dpool);
    cuda->mem_free(&ctx, dl);
    free(s);
    free(beta_cpu);
    free(m_cpu);
    free(logits);
    free(beta);
    free(masked);
    free(ids);
}

static void test_expert_rows_cuda_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t N = 37, E = 64;
    int K = 6;
    int32_t experts[37 * 6];
    float *wts = floats(N * K, 1.0f);
    int64_t off_cpu[65], rows_cpu[37 * 6];
    float we_cpu[37 * 6];

    (void)state;
    for (int64_t r = 0; r < N; r++) {
        for (int k = 0; k < K; k++) {
            experts[r * K + k] = (int32_t)((r * 7 + k * 11) % E);
        }
    }
    assert_int_equal(cpu->expert_rows(&ctx, experts, wts, N, K, E, off_cpu, rows_cpu, we_cpu),
                     TDM_OK);
    ctx.backend = KERN_BACKEND_CUDA;
    void *dex = dev_from(cuda, experts, sizeof(experts));
    void *dw = dev_from(cuda, wts, sizeof(float) * (size_t)(N * K));
    void *doff = dev_from(cuda, NULL, sizeof(off_cpu));
    void *drows = dev_from(cuda, NULL, sizeof(rows_cpu));
    void *dwe = dev_from(cuda, NULL, sizeof(we_cpu));
    assert_int_equal(cuda->expert_rows(&ctx, dex, dw, N, K, E, doff, drows, dwe), TDM_OK);
    int64_t *off = host_from(cuda, doff, sizeof(off_cpu));
    int64_t *rows = host_from(cuda, drows, sizeof(rows_cpu));
    float *we = host_from(cuda, dwe, sizeof(we_cpu));
    assert_same_bytes("expert_rows offsets", off, off_cpu, sizeof(off_cpu));
    assert_same_bytes("expert_rows rows", rows, rows_cpu, sizeof(rows_cpu));
    assert_same_bytes("expert_rows weights", we, we_cpu, sizeof(we_cpu));
    cuda->mem_free(&ctx, dex);
    cuda->mem_free(&ctx, dw);
    free(wts);
    free(off);
    free(rows);
    free(we);
}

static void test_dequant_rows_cuda_bit_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda(), *cpu = kern_ops_cpu(); /* before any malloc */
    kern_ctx_t ctx = {0};
    int64_t n_src = 20, dim = 128, n = 15;
    float *src = floats(n_src * dim, 6.0f);
    size_t c_bytes = (size_t)(n_src * dim), s_bytes = (size_t)(n_src * dim / 16);
    uint8_t *cb = malloc(c_bytes), *sb = malloc(s_bytes);
    float *want = malloc(sizeof(float) * (size_t)(n * dim));
    const uint8_t *hc[15], *hs[15];
    const uint8_t *dc_rows[15], *ds_rows[15];

    (void)state;
    for (int f = KERN_ROWS_ACT8; f <= KERN_ROWS_MX4; f++) {
        int64_t crow = f == KERN_ROWS_ACT8 ? dim : dim / 2;
        int64_t srow = f == KERN_ROWS_CKV ? dim / 16 : dim / 32;
        ctx.backend = KERN_BACKEND_CPU;
        if (f == KERN_ROWS_ACT8) {
            assert_int_equal(cpu->quant_act8(&ctx, src, n_src, dim, cb, sb), TDM_OK);
        } else if (f == KERN_ROWS_CKV) {
            assert_int_equal(cpu->quant_ckv(&ctx, src, n_src, dim, cb, sb), TDM_OK);
        } else {
            assert_int_equal(cpu->quant_mx4(&ctx, src, n_src, dim, cb, sb), TDM_OK);
        }
        for (int64_t r = 0; r < n; r++) {
            int64_t j = (r * 7 + 3) % n_src;
            hc[r] = cb + j * crow;
            hs[r] = sb + j * srow;
        }
        assert_int_equal(cpu->dequant_rows(&ctx, (kern_rows_format_t)f, hc, hs, n, dim, want),
                         TDM_OK);
        ctx.backend = KERN_BACKEND_CUDA;
        uint8_t *dcb = dev_from(cuda, cb, c_bytes), *dsb = dev_from(cuda, sb, s_bytes);
        for (int64_t r = 0; r < n; r++) { /* the same rows, as device pointers */
            dc_rows[r] = dcb + (hc[r] - cb);
            ds_rows[r] = dsb + (hs[r] - sb);
        }
        void *dpc = dev_from(cuda, dc_rows, sizeof(dc_rows));
        void *dps = dev_from(cuda, ds_rows, sizeof(ds_rows));
        void *dy = dev_from(cuda, NULL, sizeof(float) * (size_t)(n * dim));
        assert_int_equal(cuda->dequant_rows(&ctx, (kern_rows_format_t)f, dpc, dps, n, dim, dy),
                         TDM_OK);
        float *got = host_from(cuda, dy, sizeof(float) * (size_t)(n * dim));
        assert_same_bytes(f == KERN_ROWS_ACT8  ? "dequant_rows act8"
                          : f == KERN_ROWS_CKV ? "dequant_rows ckv"
                                               : "dequant_rows mx4",
                          got, want, sizeof(float) * (size_t)(n * dim));
        free(got);
        dy = dev_from(cuda, NULL, sizeof(float) * (size_t)(n * dim)); /* host_from freed it */
        /* the same gather started ahead on the side stream: it sees the fill queued before it
         * on the context's stream, and what is queued after the wait sees the gather */
        {
            kern_ahead_t t = {0};
            assert_int_equal(cuda->mem_set(&ctx, dy, 0xff, sizeof(float) * (size_t)(n * dim)),
                             TDM_OK);
            assert_int_equal(cuda->ahead_wait(&ctx, &t), TDM_ERR_INVALID_ARG); /* not started */
            assert_int_equal(
                cuda->rows_ahead(&ctx, (kern_rows_format_t)f, dpc, dps, n, dim, dy, NULL),
                TDM_ERR_INVALID_ARG);
            assert_int_equal(
                cuda->rows_ahead(&ctx, (kern_rows_format_t)f, dpc, dps, n, dim, dy, &t), TDM_OK);
            assert_int_equal(t.pending, 1);
            assert_int_equal(
                cuda->rows_ahead(&ctx, (kern_rows_format_t)f, dpc, dps, n, dim, dy, &t),
                TDM_ERR_INVALID_ARG); /* pending: wait first */
            assert_int_equal(cuda->ahead_wait(&ctx, &t), TDM_OK);
            assert_int_equal(t.pending, 0);
            got = host_from(cuda, dy, sizeof(float) * (size_t)(n * dim));
            assert_same_bytes("rows_ahead", got, want, sizeof(float) * (size_t)(n * dim));
            cuda->ahead_free(&ctx, &t);
            assert_null(t.queue);
        }
        cuda->mem_free(&ctx, dcb);
        cuda->mem_free(&ctx, dsb);
        cuda->mem_free(&ctx, dpc);
        cuda->mem_free(&ctx, dps); /* dy: freed by the second host_from */
        free(got);
    }
    free(src);
    free(cb);
    free(sb);
    free(want);
}

/* The routed experts of a layer in one call (grouped GEMMs over device offsets) equal the
 * per-expert CUDA calls bit for bit, with the pairs in one window and in three, and for a layer
 * that mixes dtypes. */
static void test_moe_ffn_cuda_equals_per_expert_calls(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda();
    kern_ctx_t ctx = {0};

    (void)state;
    ctx.backend = KERN_BACKEND_CUDA;
    mfc_check(cuda, &ctx, MFC_PAIRS, 0);
    mfc_check(cuda, &ctx, MFC_N, 0);
    mfc_check(cuda, &ctx, MFC_N, 1); /* a BF16 expert among MXFP4 ones: expert by expert */
}

/* A page header marked on the device equals kern_kv_page_mark_rows on the host (two marks, the
 * second below the first; the word stays 0); a page without the magic is left untouched and
 * reported through the status word; no status word: refused. */
static void test_page_mark_cuda_identical(void **state)
{
    const kern_ops_t *cuda = ctu_require_cuda();
    kern_ctx_t ctx = {0};
    const kern_kv_page_params_t params = {3, 128, 2, 64, 32, 0x1234u};
    kern_kv_page_layout_t ly;
    int32_t word = 0;

    (void)state;
    assert_int_equal(kern_kv_page_layout(params.d, params.d_I, &ly), TDM_OK);
    uint8_t *page = malloc(ly.page_bytes);
    uint8_t *want = malloc(ly.page_bytes);
    assert_non_null(page);
    assert_non_null(want);
    assert_int_equal(kern_kv_page_init(page, ly.page_bytes, &params), TDM_OK);
    memcpy(want, page, ly.page_bytes);
    assert_int_equal(kern_kv_page_mark_rows(want, 5), TDM_OK);
    assert_int_equal(kern_kv_page_mark_rows(want, 3), TDM_OK);
    ctx.backend = KERN_BACKEND_CUDA;
    void *dpage = dev_from(cuda, page, ly.page_bytes);
    assert_int_equal(cuda->page_mark(&ctx, dpage, 5), TDM_ERR_INVALID_ARG); /* no status word */
    void *dword = dev_from(cuda, &word, sizeof(word));
    ctx.status_word = dword;
    assert_int_equal(cuda->page_mark(&ctx, dpage, 5), TDM_OK);
    assert_int_equal(cuda->page_mark(&ctx, dpage, 3), TDM_OK);
    assert_int_equal(cuda->page_mark(&ctx, dpage, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(cuda->page_mark(&ctx, dpage, KERN_KV_PAGE_ROWS + 1), TDM_ERR_INVALID_ARG);
    uint8_t *got = host_from(cuda, dpage, ly.page_bytes);
    assert_same_bytes("page_mark", got, want, ly.page_bytes);
    /* no magic: untouched, the word's bit */
    page[0] = 'X';
    dpage = dev_from(cuda, page, ly.page_bytes);
    assert_int_equal(cuda->page_mark(&ctx, dpage, 7), TDM_OK);
    ctx.status_word = NULL;
    uint8_t *bad = host_from(cuda, dpage, ly.page_bytes);
    int32_t *w = host_from(cuda, dword, sizeof(word));
    assert_memory_equal(bad, page, ly.page_bytes);
    assert_int_equal(*w, KERN_STATUS_PAGE_HEADER);
    free(w);
    free(bad);
    free(got);
    free(want);
    free(page);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_mem_members_round_trip),
        cmocka_unit_test(test_embed_and_stream_mean_cuda_bit_identical),
        cmocka_unit_test(test_elementwise_cuda_bit_identical),
        cmocka_unit_test(test_rows_gather_scatter_add_cuda_bit_identical),
        cmocka_unit_test(test_candidate_pool_and_argmax_cuda_identical),
        cmocka_unit_test(test_expert_rows_cuda_identical),
        cmocka_unit_test(test_moe_ffn_cuda_equals_per_expert_calls),
        cmocka_unit_test(test_page_mark_cuda_identical),
        cmocka_unit_test(test_dequant_rows_cuda_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
