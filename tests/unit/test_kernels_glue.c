/* test_kernels_glue.c - the CPU memory members (kernels/mem.h), glue ops (kernels/glue.h) and
 * greedy argmax (kernels/sample.h) of kern_ops_cpu() against plain loops written here (sums in
 * double, rounded once: exact for one FP32 addition or product; BF16 rounding by its bits), their
 * INVALID_ARG paths (nothing written), and the argmax against engine_sampler_sample at
 * temperature 0. The CUDA versions are compared with these in test_kernels_cuda_glue.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/arena.h"
#include "engine/sampler.h"
#include "kernels/guard.h"
#include "kernels/kv_page.h"
#include "kernels/ops.h"

#include "moe_ffn_check.h"

#define POISON 0x5A /* bytes an output starts as, to see what an op wrote */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float nrand(void)
{
    double u1 = urand() + 1e-12, u2 = urand();
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static float *floats(int64_t n, float scale)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) {
        x[i] = nrand() * scale;
    }
    return x;
}

static float *poisoned(int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    assert_non_null(x);
    memset(x, POISON, sizeof(float) * (size_t)(n > 0 ? n : 1));
    return x;
}

static uint32_t bits_of(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof(b));
    return b;
}

static float float_of(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof(x));
    return x;
}

/* BF16 round to nearest even by the bits, NaN kept NaN: the test's own rounding. */
static float ref_bf16(float x)
{
    uint32_t b = bits_of(x);
    if (isnan(x)) {
        return float_of((b | 0x00400000u) & 0xFFFF0000u);
    }
    b += 0x7FFFu + ((b >> 16) & 1u);
    return float_of(b & 0xFFFF0000u);
}

static void assert_same_bits(const float *got, const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (bits_of(got[i]) != bits_of(want[i])) {
            fail_msg("element %lld: got %.9g (0x%08x) want %.9g (0x%08x)", (long long)i,
                     (double)got[i], bits_of(got[i]), (double)want[i], bits_of(want[i]));
        }
    }
}

static int all_poison(const void *p, size_t n_bytes)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n_bytes; i++) {
        if (c[i] != POISON) {
            return 0;
        }
    }
    return 1;
}

/* ---- memory --------------------------------------------------------------------------- */

static void test_mem_alloc_copy_set_round_trip(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    unsigned char host[300], back[300];
    void *dev = NULL, *dev2 = NULL, *zero = NULL;

    (void)state;
    for (int i = 0; i < 300; i++) {
        host[i] = (unsigned char)(i * 7 + 3);
    }
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), &dev), TDM_OK);
    assert_int_equal(ops->mem_alloc(&ctx, sizeof(host), &dev2), TDM_OK);
    assert_int_equal(ops->mem_alloc(&ctx, 0, &zero), TDM_OK);
    assert_non_null(zero);
    assert_int_equal((uintptr_t)dev % 64, 0);
    assert_int_equal(ops->mem_copy(&ctx, dev, host, sizeof(host), KERN_COPY_H2D), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, dev2, dev, sizeof(host), KERN_COPY_D2D), TDM_OK);
    assert_int_equal(ops->mem_set(&ctx, (unsigned char *)dev2 + 10, 0x1AB, 5), TDM_OK);
    assert_int_equal(ops->sync(&ctx), TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, back, dev2, sizeof(back), KERN_COPY_D2H), TDM_OK);
    for (int i = 0; i < 300; i++) {
        unsigned char want = i >= 10 && i < 15 ? 0xAB : host[i];
        assert_int_equal(back[i], want);
    }
    /* overlapping D2D (memmove semantics) */
    assert_int_equal(ops->mem_copy(&ctx, (unsigned char *)dev + 1, dev, 100, KERN_COPY_D2D),
                     TDM_OK);
    assert_int_equal(ops->mem_copy(&ctx, back, dev, 101, KERN_COPY_D2H), TDM_OK);
    for (int i = 1; i < 101; i++) {
        assert_int_equal(back[i], host[i - 1]);
    }
    ops->mem_free(&ctx, dev);
    ops->mem_free(&ctx, dev2);
    ops->mem_free(&ctx, zero);
    ops->mem_free(&ctx, NULL);
}

static void test_mem_bad_arguments_change_nothing(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    unsigned char buf[16];
    void *keep = buf;

    (void)state;
    memset(buf, POISON, sizeof(buf));
    assert_int_equal(ops->mem_alloc(&ctx, 8, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->mem_alloc(&ctx, SIZE_MAX, &keep), TDM_ERR_NO_MEMORY);
    assert_ptr_equal(keep, buf);
    assert_int_equal(ops->mem_copy(&ctx, NULL, buf, 4, KERN_COPY_D2D), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->mem_copy(&ctx, buf, NULL, 4, KERN_COPY_H2D), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->mem_copy(&ctx, buf, buf + 8, 4, (kern_copy_kind_t)7),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->mem_set(&ctx, NULL, 0, 4), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->mem_copy(&ctx, NULL, NULL, 0, KERN_COPY_D2H), TDM_OK);
    assert_int_equal(ops->mem_set(&ctx, NULL, 0, 0), TDM_OK);
    assert_true(all_poison(buf, sizeof(buf)));
}

/* ---- glue ops ------------------------------------------------------------------------- */

static void test_embed_widens_rows_into_every_stream(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t V = 11, H = 24, n = 5;
    int m = 3;
    uint16_t *table = malloc(sizeof(uint16_t) * (size_t)(V * H));
    int32_t ids[5] = {7, 0, 10, 7, 3};
    float *x = poisoned(n * m * H), *pre = poisoned(n * m);

    (void)state;
    for (int64_t i = 0; i < V * H; i++) {
        table[i] = (uint16_t)(bits_of(nrand()) >> 16);
    }
    assert_int_equal(ops->embed(&ctx, table, V, ids, n, H, m, x, pre), TDM_OK);
    for (int64_t r = 0; r < n; r++) {
        for (int k = 0; k < m; k++) {
            for (int64_t c = 0; c < H; c++) {
                float want = float_of((uint32_t)table[ids[r] * H + c] << 16);
                assert_int_equal(bits_of(x[(r * m + k) * H + c]), bits_of(want));
            }
            assert_true(pre[r * m + k] == (k == 0 ? 1.0f : 0.0f));
        }
    }
    /* pre_out NULL: the plain row gather (m = 1), nothing else written */
    memset(x, POISON, sizeof(float) * (size_t)(n * m * H));
    assert_int_equal(ops->embed(&ctx, table, V, ids + 2, 1, H, 1, x, NULL), TDM_OK);
    for (int64_t c = 0; c < H; c++) {
        assert_int_equal(bits_of(x[c]), (uint32_t)table[ids[2] * H + c] << 16);
    }
    assert_true(all_poison(x + H, sizeof(float) * (size_t)H));
    /* an id out of range: INVALID_ARG, nothing written */
    memset(x, POISON, sizeof(float) * (size_t)(n * m * H));
    memset(pre, POISON, sizeof(float) * (size_t)(n * m));
    ids[3] = (int32_t)V;
    assert_int_equal(ops->embed(&ctx, table, V, ids, n, H, m, x, pre), TDM_ERR_INVALID_ARG);
    ids[3] = -1;
    assert_int_equal(ops->embed(&ctx, table, V, ids, n, H, m, x, pre), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->embed(&ctx, table, V, ids, n, H, 0, x, pre), TDM_ERR_INVALID_ARG);
    assert_true(all_poison(x, sizeof(float) * (size_t)(n * m * H)));
    assert_true(all_poison(pre, sizeof(float) * (size_t)(n * m)));
    free(table);
    free(x);
    free(pre);
}

static void test_stream_mean_is_fp32_ascending_sum_over_m(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t n = 6, H = 40, ldy = 3 * H;
    int m = 4;
    float *x = floats(n * m * H, 3.0f);
    float *y = poisoned(n * ldy);

    (void)state;
    assert_int_equal(ops->stream_mean(&ctx, x, n, m, H, y + H, ldy), TDM_OK);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t c = 0; c < H; c++) {
            float sum = 0.0f;
            for (int i = 0; i < m; i++) {
                sum = (float)((double)sum + (double)x[(r * m + i) * H + c]);
            }
            float want = (float)((double)sum / (double)m);
            assert_int_equal(bits_of(y[r * ldy + H + c]), bits_of(want));
        }
        /* the rest of the strided row is untouched */
        assert_true(all_poison(y + r * ldy, sizeof(float) * (size_t)H));
        assert_true(all_poison(y + r * ldy + 2 * H, sizeof(float) * (size_t)H));
    }
    assert_int_equal(ops->stream_mean(&ctx, x, n, m, H, y, H - 1), TDM_ERR_INVALID_ARG);
    free(x);
    free(y);
}

static void test_bf16_round_adds_and_scale2_match_plain_loops(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t n = 1000;
    float *a = floats(n, 10.0f), *b = floats(n, 0.01f);
    float *y = poisoned(n), *want = poisoned(n);
    float s0 = 0.0883883f, s1 = 0.25f;

    (void)state;
    a[0] = NAN;
    a[1] = INFINITY;
    a[2] = 3.4e38f; /* above the largest BF16 (3.3895e38): rounds to +inf */
    assert_int_equal(ops->bf16_round(&ctx, a, n, y), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ref_bf16(a[i]);
    }
    assert_same_bits(y, want, n);
    assert_true(isinf(y[2]));

    assert_int_equal(ops->add_bf16(&ctx, a, b, n, y), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ref_bf16((float)((double)a[i] + (double)b[i]));
    }
    assert_same_bits(y, want, n);

    assert_int_equal(ops->add(&ctx, a, b, n, y), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        want[i] = (float)((double)a[i] + (double)b[i]);
    }
    assert_same_bits(y, want, n);

    memcpy(y, b, sizeof(float) * (size_t)n);
    assert_int_equal(ops->scale2(&ctx, y, n, s0, s1), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        float t = (float)((double)b[i] * (double)s0);
        want[i] = (float)((double)t * (double)s1);
    }
    assert_same_bits(y, want, n);

    /* in place (y aliases x) */
    memcpy(y, a, sizeof(float) * (size_t)n);
    assert_int_equal(ops->bf16_round(&ctx, y, n, y), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ref_bf16(a[i]);
    }
    assert_same_bits(y, want, n);

    assert_int_equal(ops->bf16_round(&ctx, NULL, n, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->add_bf16(&ctx, a, NULL, n, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->add(&ctx, NULL, b, n, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->scale2(&ctx, y, -1, s0, s1), TDM_ERR_INVALID_ARG);
    free(a);
    free(b);
    free(y);
    free(want);
}

static void test_rows_gather_and_scatter_add_in_index_order(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t n_src = 9, C = 33, ldx = 40, n_idx = 6, ldy = 35;
    int64_t idx[6] = {4, 0, 8, 4, 2, 4}; /* row 4 three times: additions in k order */
    float *x = floats(n_src * ldx, 1.0f);
    float *y = poisoned(n_idx * ldy);
    float *acc = floats(n_src * ldx, 1.0f);
    float *want = malloc(sizeof(float) * (size_t)(n_src * ldx));

    (void)state;
    assert_non_null(want);
    assert_int_equal(ops->rows_gather(&ctx, x, ldx, idx, n_idx, C, y, ldy), TDM_OK);
    for (int64_t k = 0; k < n_idx; k++) {
        assert_same_bits(y + k * ldy, x + idx[k] * ldx, C);
        assert_true(all_poison(y + k * ldy + C, sizeof(float) * (size_t)(ldy - C)));
    }
    /* scatter-add y (now random) into acc */
    for (int64_t i = 0; i < n_idx * ldy; i++) {
        y[i] = nrand();
    }
    memcpy(want, acc, sizeof(float) * (size_t)(n_src * ldx));
    for (int64_t k = 0; k < n_idx; k++) {
        for (int64_t c = 0; c < C; c++) {
            float *w = &want[idx[k] * ldx + c];
            *w = (float)((double)*w + (double)y[k * ldy + c]);
        }
    }
    assert_int_equal(ops->rows_scatter_add(&ctx, y, ldy, idx, n_idx, C, acc, ldx), TDM_OK);
    assert_same_bits(acc, want, n_src * ldx);

    /* bad arguments: nothing written */
    memcpy(want, acc, sizeof(float) * (size_t)(n_src * ldx));
    idx[2] = -1;
    assert_int_equal(ops->rows_scatter_add(&ctx, y, ldy, idx, n_idx, C, acc, ldx),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->rows_gather(&ctx, x, C - 1, idx, n_idx, C, y, ldy), TDM_ERR_INVALID_ARG);
    assert_same_bits(acc, want, n_src * ldx);
    free(x);
    free(y);
    free(acc);
    free(want);
}

static void test_candidate_blocks_and_mask(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t n = 70, Bc = 16, nb = 5;
    float *s = floats(n, 1.0f);
    float *beta = poisoned(nb + 1);
    float *masked = malloc(sizeof(float) * (size_t)n);
    int32_t pool[3] = {3, 0, 99}; /* 99 is outside: matches nothing */

    (void)state;
    assert_non_null(masked);
    s[5] = NAN; /* ignored by the running max */
    s[20] = -INFINITY;
    assert_int_equal(ops->cand_blocks(&ctx, s, n, Bc, beta), TDM_OK);
    for (int64_t blk = 0; blk < nb; blk++) {
        double mx = -INFINITY;
        for (int64_t j = blk * Bc; j < (blk + 1) * Bc && j < n; j++) {
            if (!isnan(s[j]) && s[j] > mx) {
                mx = s[j];
            }
        }
        if (blk == nb - 1) {
            assert_true(isinf(beta[blk]) && beta[blk] > 0.0f);
        } else {
            assert_true((double)beta[blk] == mx);
        }
    }
    assert_true(all_poison(beta + nb, sizeof(float)));

    memcpy(masked, s, sizeof(float) * (size_t)n);
    assert_int_equal(ops->cand_mask(&ctx, masked, n, Bc, pool, 3), TDM_OK);
    for (int64_t j = 0; j < n; j++) {
        int64_t blk = j / Bc;
        if (blk == 0 || blk == 3) {
            assert_int_equal(bits_of(masked[j]), bits_of(s[j]));
        } else {
            assert_true(isinf(masked[j]) && masked[j] < 0.0f);
        }
    }
    memcpy(masked, s, sizeof(float) * (size_t)n);
    assert_int_equal(ops->cand_mask(&ctx, masked, n, 0, pool, 3), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->cand_mask(&ctx, masked, n, Bc, NULL, 3), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->cand_blocks(&ctx, s, 0, Bc, beta), TDM_ERR_INVALID_ARG);
    assert_same_bits(masked + 6, s + 6, n - 6); /* (s[5] is NaN: compared apart) */
    free(s);
    free(beta);
    free(masked);
}

static void test_expert_rows_groups_in_row_then_slot_order(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t N = 13, E = 9;
    int K = 3;
    int32_t experts[13 * 3];
    float *wts = floats(N * K, 1.0f);
    int64_t off[10], rows[13 * 3];
    float we[13 * 3];

    (void)state;
    for (int64_t r = 0; r < N; r++) { /* K distinct ids per row, as the router gives */
        for (int k = 0; k < K; k++) {
            experts[r * K + k] = (int32_t)((r * 5 + k * 2 + (r % 3)) % E);
        }
    }
    assert_int_equal(ops->expert_rows(&ctx, experts, wts, N, K, E, off, rows, we), TDM_OK);
    assert_int_equal(off[0], 0);
    assert_int_equal(off[E], N * K);
    for (int64_t e = 0; e < E; e++) {
        int64_t at = off[e];
        /* the engine's former scan: rows in r order, weight of the matching slot */
        for (int64_t r = 0; r < N; r++) {
            for (int k = 0; k < K; k++) {
                if (experts[r * K + k] == e) {
                    assert_true(at < off[e + 1]);
                    assert_int_equal(rows[at], r);
                    assert_int_equal(bits_of(we[at]), bits_of(wts[r * K + k]));
                    at++;
                }
            }
        }
        assert_int_equal(at, off[e + 1]);
    }
    /* an id outside [0, E): INVALID_ARG, nothing written */
    memset(off, POISON, sizeof(off));
    experts[7] = (int32_t)E;
    assert_int_equal(ops->expert_rows(&ctx, experts, wts, N, K, E, off, rows, we),
                     TDM_ERR_INVALID_ARG);
    assert_true(all_poison(off, sizeof(off)));
    assert_int_equal(ops->expert_rows(&ctx, experts, wts, N, 0, E, off, rows, we),
                     TDM_ERR_INVALID_ARG);
    free(wts);
}

/* Enough rows (>= 32 K elements) that kern_dequant_rows_cpu splits them over a worker pool: the
 * same bits as one call per row, at 2 and 3 threads, every format. */
static void test_dequant_rows_on_a_pool_equals_one_call_per_row(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    const int64_t n_src = 37, dim = 128, n = 301; /* 38,528 elements */
    kern_ctx_t one = {0};
    float *src = floats(n_src * dim, 4.0f);
    uint8_t *c8 = malloc((size_t)(n_src * dim)), *s8 = malloc((size_t)(n_src * dim / 32));
    uint8_t *c4 = malloc((size_t)(n_src * dim / 2)), *sc = malloc((size_t)(n_src * dim / 16));
    const uint8_t **codes = malloc(sizeof(*codes) * (size_t)n);
    const uint8_t **scales = malloc(sizeof(*scales) * (size_t)n);
    float *got = poisoned(n * dim), *want = poisoned(n * dim);

    (void)state;
    assert_non_null(c8);
    assert_non_null(s8);
    assert_non_null(c4);
    assert_non_null(sc);
    assert_non_null(codes);
    assert_non_null(scales);
    assert_int_equal(ops->quant_act8(&one, src, n_src, dim, c8, s8), TDM_OK);
    assert_int_equal(ops->quant_ckv(&one, src, n_src, dim, c4, sc), TDM_OK);
    for (int f = KERN_ROWS_ACT8; f <= KERN_ROWS_CKV; f++) {
        for (int64_t r = 0; r < n; r++) {
            int64_t pick = (r * 13 + 5) % n_src;
            codes[r] = f == KERN_ROWS_ACT8 ? c8 + pick * dim : c4 + pick * dim / 2;
            scales[r] = f == KERN_ROWS_ACT8 ? s8 + pick * dim / 32 : sc + pick * dim / 16;
            assert_int_equal(ops->dequant_rows(&one, (kern_rows_format_t)f, codes + r, scales + r,
                                               1, dim, want + r * dim),
                             TDM_OK);
        }
        for (int n_threads = 2; n_threads <= 3; n_threads++) {
            kern_ctx_t ctx = {.n_threads = n_threads};
            assert_int_equal(kern_pool_create(n_threads, &ctx.pool), TDM_OK);
            memset(got, POISON, sizeof(float) * (size_t)(n * dim));
            assert_int_equal(
                ops->dequant_rows(&ctx, (kern_rows_format_t)f, codes, scales, n, dim, got), TDM_OK);
            assert_same_bits(got, want, n * dim);
            kern_pool_destroy(ctx.pool);
        }
    }
    free(src);
    free(c8);
    free(s8);
    free(c4);
    free(sc);
    free(codes);
    free(scales);
    free(got);
    free(want);
}

static void test_dequant_rows_equals_one_call_per_row(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t n_src = 12, dim = 64, n = 9;
    float *src = floats(n_src * dim, 4.0f);
    uint8_t *c8 = malloc((size_t)(n_src * dim)), *s8 = malloc((size_t)(n_src * dim / 32));
    uint8_t *c4 = malloc((size_t)(n_src * dim / 2)), *sc = malloc((size_t)(n_src * dim / 16));
    uint8_t *sm = malloc((size_t)(n_src * dim / 32));
    const uint8_t *codes[9], *scales[9];
    int64_t pick[9] = {11, 0, 5, 5, 3, 10, 1, 7, 2};
    float *got = poisoned(n * dim), *want = poisoned(n * dim);

    (void)state;
    assert_int_equal(ops->quant_act8(&ctx, src, n_src, dim, c8, s8), TDM_OK);
    for (int f = KERN_ROWS_ACT8; f <= KERN_ROWS_MX4; f++) {
        const uint8_t *cb = f == KERN_ROWS_ACT8 ? c8 : c4;
        const uint8_t *sb = f == KERN_ROWS_ACT8 ? s8 : f == KERN_ROWS_CKV ? sc : sm;
        int64_t crow = f == KERN_ROWS_ACT8 ? dim : dim / 2;
        int64_t srow = f == KERN_ROWS_CKV ? dim / 16 : dim / 32;
        if (f == KERN_ROWS_CKV) {
            assert_int_equal(ops->quant_ckv(&ctx, src, n_src, dim, c4, sc), TDM_OK);
        } else if (f == KERN_ROWS_MX4) {
            assert_int_equal(ops->quant_mx4(&ctx, src, n_src, dim, c4, sm), TDM_OK);
        }
        for (int64_t r = 0; r < n; r++) {
            codes[r] = cb + pick[r] * crow;
            scales[r] = sb + pick[r] * srow;
            kern_dequant_act8_fn *one = f == KERN_ROWS_ACT8  ? ops->dequant_act8
                                        : f == KERN_ROWS_CKV ? ops->dequant_ckv
                                                             : ops->dequant_mx4;
            assert_int_equal(one(&ctx, codes[r], scales[r], 1, dim, want + r * dim), TDM_OK);
        }
        assert_int_equal(ops->dequant_rows(&ctx, (kern_rows_format_t)f, codes, scales, n, dim, got),
                         TDM_OK);
        assert_same_bits(got, want, n * dim);
        /* started ahead (the CPU has no side queue: done at once), then waited for */
        {
            kern_ahead_t t = {0};
            memset(got, POISON, sizeof(float) * (size_t)(n * dim));
            assert_int_equal(ops->ahead_wait(&ctx, &t), TDM_ERR_INVALID_ARG); /* not started */
            assert_int_equal(
                ops->rows_ahead(&ctx, (kern_rows_format_t)f, codes, scales, n, dim, got, NULL),
                TDM_ERR_INVALID_ARG);
            assert_true(all_poison(got, sizeof(float) * (size_t)(n * dim)));
            assert_int_equal(
                ops->rows_ahead(&ctx, (kern_rows_format_t)f, codes, scales, n, dim, got, &t),
                TDM_OK);
            assert_int_equal(t.pending, 1);
            assert_int_equal(
                ops->rows_ahead(&ctx, (kern_rows_format_t)f, codes, scales, n, dim, got, &t),
                TDM_ERR_INVALID_ARG); /* pending: wait first */
            assert_int_equal(ops->ahead_wait(&ctx, &t), TDM_OK);
            assert_int_equal(t.pending, 0);
            assert_int_equal(ops->ahead_wait(&ctx, &t), TDM_ERR_INVALID_ARG); /* waited once */
            assert_same_bits(got, want, n * dim);
            ops->ahead_free(&ctx, &t);
            ops->ahead_free(&ctx, NULL);
        }
    }
    /* bad arguments: nothing written */
    memset(got, POISON, sizeof(float) * (size_t)(n * dim));
    codes[4] = NULL;
    assert_int_equal(ops->dequant_rows(&ctx, KERN_ROWS_ACT8, codes, scales, n, dim, got),
                     TDM_ERR_INVALID_ARG);
    codes[4] = c8;
    assert_int_equal(ops->dequant_rows(&ctx, KERN_ROWS_CKV, codes, scales, n, 40, got),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_rows(&ctx, (kern_rows_format_t)3, codes, scales, n, dim, got),
                     TDM_ERR_INVALID_ARG);
    {
        kern_ahead_t t = {0};
        assert_int_equal(ops->rows_ahead(&ctx, KERN_ROWS_CKV, codes, scales, n, 40, got, &t),
                         TDM_ERR_INVALID_ARG);
        assert_int_equal(t.pending, 0); /* refused: nothing started */
    }
    assert_true(all_poison(got, sizeof(float) * (size_t)(n * dim)));
    free(src);
    free(c8);
    free(s8);
    free(c4);
    free(sc);
    free(sm);
    free(got);
    free(want);
}

/* ---- greedy argmax -------------------------------------------------------------------- */

static void test_argmax_equals_sampler_at_temperature_zero(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    int64_t V = 257, n_rows = 6, ld = 260;
    float *logits = floats(n_rows * ld, 2.0f);
    int32_t ids[6];
    engine_sampler_params_t params;
    tdm_arena_t arena;

    (void)state;
    engine_sampler_params_default(&params);
    params.temperature = 0.0;
    assert_int_equal(tdm_arena_init(&arena, engine_sampler_scratch_bytes(V) + 4096), TDM_OK);
    /* row 1: a tie (lower id wins); row 2: -inf everywhere but two; row 3: max at the end */
    logits[1 * ld + 40] = 9.0f;
    logits[1 * ld + 200] = 9.0f;
    for (int64_t x = 0; x < V; x++) {
        logits[2 * ld + x] = -INFINITY;
    }
    logits[2 * ld + 17] = -3.0f;
    logits[2 * ld + 90] = -2.5f;
    logits[3 * ld + V - 1] = 50.0f;
    assert_int_equal(ops->argmax(&ctx, logits, ld, n_rows, V, ids), TDM_OK);
    assert_int_equal(ids[1], 40);
    assert_int_equal(ids[2], 90);
    assert_int_equal(ids[3], V - 1);
    for (int64_t r = 0; r < n_rows; r++) {
        engine_sample_t sample;
        assert_int_equal(engine_sampler_sample(&params, logits + r * ld, V, r, &arena, &sample),
                         TDM_OK);
        assert_int_equal(ids[r], sample.token);
    }
    /* NaN, +inf, all -inf: INTERNAL; bad shapes: INVALID_ARG */
    logits[4 * ld + 3] = NAN;
    logits[5 * ld + 9] = INFINITY;
    assert_int_equal(ops->argmax(&ctx, logits + 4 * ld, ld, 1, V, ids), TDM_ERR_INTERNAL);
    assert_int_equal(ops->argmax(&ctx, logits + 5 * ld, ld, 1, V, ids), TDM_ERR_INTERNAL);
    for (int64_t x = 0; x < V; x++) {
        logits[x] = -INFINITY;
    }
    assert_int_equal(ops->argmax(&ctx, logits, ld, 1, V, ids), TDM_ERR_INTERNAL);
    assert_int_equal(ops->argmax(&ctx, logits, V - 1, 1, V, ids), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->argmax(&ctx, logits, ld, 1, 0, ids), TDM_ERR_INVALID_ARG);
    tdm_arena_fini(&arena);
    free(logits);
}

static void test_cpu_table_has_every_new_member(void **state)
{
    const kern_ops_t *ops = kern_ops_cpu();

    (void)state;
    assert_non_null(ops->mem_alloc);
    assert_non_null(ops->mem_free);
    assert_non_null(ops->mem_copy);
    assert_non_null(ops->mem_set);
    assert_non_null(ops->sync);
    assert_non_null(ops->embed);
    assert_non_null(ops->stream_mean);
    assert_non_null(ops->bf16_round);
    assert_non_null(ops->add_bf16);
    assert_non_null(ops->add);
    assert_non_null(ops->scale2);
    assert_non_null(ops->rows_gather);
    assert_non_null(ops->rows_scatter_add);
    assert_non_null(ops->cand_blocks);
    assert_non_null(ops->cand_mask);
    assert_non_null(ops->argmax);
    assert_non_null(ops->expert_rows);
    assert_non_null(ops->dequant_rows);
    assert_non_null(ops->rows_ahead);
    assert_non_null(ops->ahead_wait);
    assert_non_null(ops->ahead_free);
}

/* A layer's routed experts in one moe_ffn call equal the per-expert calls, bit for bit, on the
 * CPU table (scratch of N and of every pair) and on the guard table (which also proves the op
 * reads its offsets, rows, weights, experts and pointer table only as backend memory). */
static void test_moe_ffn_equals_per_expert_calls(void **state)
{
    kern_ctx_t ctx = {0};
    const kern_ops_t *guard = NULL;

    (void)state;
    mfc_check(kern_ops_cpu(), &ctx, MFC_N, 0);
    mfc_check(kern_ops_cpu(), &ctx, MFC_PAIRS, 1);
    assert_int_equal(kern_guard_create((size_t)64 << 20, &guard), TDM_OK);
    ctx.backend = KERN_BACKEND_GUARD;
    mfc_check(guard, &ctx, MFC_N, 0);
    assert_int_equal(kern_guard_destroy(), 0); /* every guard byte given back */
}

/* page_mark on the CPU table: the bytes of kern_kv_page_mark_rows (two marks, the second below
 * the first: row_count keeps the larger); refusals (slot_end 0 or > 64, no magic) change
 * nothing. */
static void test_page_mark_equals_mark_rows(void **state)
{
    const kern_ops_t *cpu = kern_ops_cpu();
    kern_ctx_t ctx = {0};
    const kern_kv_page_params_t params = {3, 128, 2, 64, 32, 0x1234u};
    kern_kv_page_layout_t ly;
    kern_kv_page_header_t h;

    (void)state;
    assert_int_equal(kern_kv_page_layout(params.d, params.d_I, &ly), TDM_OK);
    uint8_t *page = malloc(ly.page_bytes), *want = malloc(ly.page_bytes);
    assert_non_null(page);
    assert_non_null(want);
    assert_int_equal(kern_kv_page_init(page, ly.page_bytes, &params), TDM_OK);
    memcpy(want, page, ly.page_bytes);
    assert_int_equal(kern_kv_page_mark_rows(want, 5), TDM_OK);
    assert_int_equal(cpu->page_mark(&ctx, page, 5), TDM_OK);
    assert_int_equal(cpu->page_mark(&ctx, page, 3), TDM_OK);
    assert_memory_equal(page, want, ly.page_bytes);
    assert_int_equal(kern_kv_page_header_read(page, ly.page_bytes, &h), TDM_OK);
    assert_int_equal(h.row_count, 5);
    assert_int_equal(cpu->page_mark(&ctx, page, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(cpu->page_mark(&ctx, page, KERN_KV_PAGE_ROWS + 1), TDM_ERR_INVALID_ARG);
    page[0] = 'X';
    want[0] = 'X';
    assert_int_equal(cpu->page_mark(&ctx, page, 9), TDM_ERR_INVALID_ARG);
    assert_memory_equal(page, want, ly.page_bytes);
    free(page);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_table_has_every_new_member),
        cmocka_unit_test(test_mem_alloc_copy_set_round_trip),
        cmocka_unit_test(test_mem_bad_arguments_change_nothing),
        cmocka_unit_test(test_embed_widens_rows_into_every_stream),
        cmocka_unit_test(test_stream_mean_is_fp32_ascending_sum_over_m),
        cmocka_unit_test(test_bf16_round_adds_and_scale2_match_plain_loops),
        cmocka_unit_test(test_rows_gather_and_scatter_add_in_index_order),
        cmocka_unit_test(test_candidate_blocks_and_mask),
        cmocka_unit_test(test_expert_rows_groups_in_row_then_slot_order),
        cmocka_unit_test(test_moe_ffn_equals_per_expert_calls),
        cmocka_unit_test(test_page_mark_equals_mark_rows),
        cmocka_unit_test(test_dequant_rows_equals_one_call_per_row),
        cmocka_unit_test(test_dequant_rows_on_a_pool_equals_one_call_per_row),
        cmocka_unit_test(test_argmax_equals_sampler_at_temperature_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
