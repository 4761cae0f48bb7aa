/* test_kernels_fwd.c - the forward-pass CPU kernels (kernels/gemm.h ... topk.h) against naive
 * double-precision loops written here, and the batch invariance of the GEMM. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/codec.h"
#include "kernels/ops.h"

static uint64_t rng_state = 88172645463325252ull;

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

static void fill(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = nrand() * scale;
    }
}

static uint16_t *to_bf16(const float *w, int64_t n)
{
    uint16_t *b = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        b[i] = kern_bf16_from_f32(w[i]);
    }
    return b;
}

/* |got - want| <= tol * (1 + |want|) elementwise */
static void assert_close(const float *got, const double *want, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (err > tol * (1.0 + fabs(want[i]))) {
            fail_msg("element %lld: got %.9g want %.9g", (long long)i, (double)got[i], want[i]);
        }
    }
}

static void test_gemm_matches_double_loop_and_rounds_bf16(void **state)
{
    (void)state;
    int64_t n_rows = 7, n_out = 37, n_in = 96;
    float *w = malloc(sizeof(float) * n_out * n_in);
    float *x = malloc(sizeof(float) * n_rows * n_in);
    float *y = malloc(sizeof(float) * n_rows * n_out);
    double *ref = malloc(sizeof(double) * n_rows * n_out);
    fill(w, n_out * n_in, 0.1f);
    fill(x, n_rows * n_in, 1.0f);
    uint16_t *wb = to_bf16(w, n_out * n_in);
    kern_mat_t mat = {KERN_MAT_BF16, n_out, n_in, wb, NULL, NULL};
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t o = 0; o < n_out; o++) {
            double acc = 0.0;
            for (int64_t k = 0; k < n_in; k++) {
                acc += (double)kern_bf16_to_f32(wb[o * n_in + k]) * x[r * n_in + k];
            }
            ref[r * n_out + o] = acc;
        }
    }
    kern_ctx_t ctx = {0};
    assert_int_equal(kern_ops_cpu()->gemm(&ctx, &mat, x, n_in, n_rows, KERN_GEMM_OUT_F32, y, n_out),
                     TDM_OK);
    assert_close(y, ref, n_rows * n_out, 1e-5);
    assert_int_equal(
        kern_ops_cpu()->gemm(&ctx, &mat, x, n_in, n_rows, KERN_GEMM_OUT_BF16, y, n_out), TDM_OK);
    assert_close(y, ref, n_rows * n_out, 1.0 / 128);
    for (int64_t i = 0; i < n_rows * n_out; i++) {
        assert_true(kern_bf16_round(y[i]) == y[i]);
    }
    free(w);
    free(x);
    free(y);
    free(ref);
    free(wb);
}

static void test_gemm_is_batch_invariant_and_equals_plain_loop(void **state)
{
    (void)state;
    int64_t n_rows = 45, n_out = 70, n_in = 160;
    float *w = malloc(sizeof(float) * n_out * n_in);
    float *x = malloc(sizeof(float) * n_rows * n_in);
    float *y_all = malloc(sizeof(float) * n_rows * n_out);
    float *y_one = malloc(sizeof(float) * n_out);
    float *y_ref = malloc(sizeof(float) * n_rows * n_out);
    fill(w, n_out * n_in, 0.05f);
    fill(x, n_rows * n_in, 3.0f);
    kern_mat_t mf = {KERN_MAT_F32, n_out, n_in, w, NULL, NULL};
    kern_ctx_t ctx = {.n_threads = 2};
    assert_int_equal(kern_gemm_cpu(&ctx, &mf, x, n_in, n_rows, 0, y_all, n_out), TDM_OK);
    assert_int_equal(kern_gemm_ref_cpu(NULL, &mf, x, n_in, n_rows, 0, y_ref, n_out), TDM_OK);
    assert_memory_equal(y_all, y_ref, sizeof(float) * n_rows * n_out);
    for (int64_t r = 0; r < n_rows; r++) {
        assert_int_equal(kern_gemm_cpu(NULL, &mf, x + r * n_in, n_in, 1, 0, y_one, n_out), TDM_OK);
        assert_memory_equal(y_one, y_all + r * n_out, sizeof(float) * n_out);
        assert_true(kern_dot_cpu(w + 3 * n_in, x + r * n_in, n_in) == y_all[r * n_out + 3]);
    }
    free(w);
    free(x);
    free(y_all);
    free(y_one);
    free(y_ref);
}

static void test_gemm_rejects_bad_inner_dim_and_leaves_output(void **state)
{
    (void)state;
    float w[24] = {0}, x[24] = {0}, y[2] = {5.0f, 6.0f};
    kern_mat_t m = {KERN_MAT_F32, 1, 24, w, NULL, NULL};
    assert_int_equal(kern_gemm_cpu(NULL, &m, x, 24, 1, 0, y, 1), TDM_ERR_INVALID_ARG);
    assert_true(y[0] == 5.0f);
}

static void test_rmsnorm_matches_double(void **state)
{
    (void)state;
    int64_t n = 3, dim = 64;
    float x[192], g[64], y[192];
    double ref[192];
    fill(x, n * dim, 2.0f);
    fill(g, dim, 1.0f);
    for (int64_t r = 0; r < n; r++) {
        double ms = 0;
        for (int64_t i = 0; i < dim; i++) {
            ms += (double)x[r * dim + i] * x[r * dim + i];
        }
        ms /= dim;
        for (int64_t i = 0; i < dim; i++) {
            ref[r * dim + i] = x[r * dim + i] / sqrt(ms + 1e-20) * g[i];
        }
    }
    assert_int_equal(kern_ops_cpu()->rmsnorm(NULL, x, dim, n, dim, g, 1e-20f, y, dim), TDM_OK);
    assert_close(y, ref, n * dim, 1.0 / 128);
}

static void test_rope_inverse_undoes_forward_and_matches_double(void **state)
{
    (void)state;
    float f[8], x[2 * 32], y[2 * 32];
    double ref[2 * 32];
    int64_t pos[1] = {1234};
    kern_rope_yarn_t yarn = {16, 32, 1, 65536};
    assert_int_equal(kern_rope_freqs(16, 160000.0, &yarn, f), TDM_OK);
    fill(x, 64, 1.0f);
    for (int i = 0; i < 64; i++) {
        x[i] = kern_bf16_round(x[i]);
    }
    memcpy(y, x, sizeof(x));
    for (int h = 0; h < 2; h++) {
        for (int i = 0; i < 16; i++) {
            ref[h * 32 + i] = x[h * 32 + i];
        }
        for (int i = 0; i < 8; i++) {
            double ang = (double)(float)((float)pos[0] * f[i]);
            double a = x[h * 32 + 16 + 2 * i], b = x[h * 32 + 17 + 2 * i];
            ref[h * 32 + 16 + 2 * i] = a * cos(ang) - b * sin(ang);
            ref[h * 32 + 17 + 2 * i] = a * sin(ang) + b * cos(ang);
        }
    }
    assert_int_equal(kern_ops_cpu()->rope(NULL, y, 1, 2, 32, 16, pos, f, KERN_ROPE_FORWARD),
                     TDM_OK);
    assert_close(y, ref, 64, 1.0 / 64);
    assert_int_equal(kern_ops_cpu()->rope(NULL, y, 1, 2, 32, 16, pos, f, KERN_ROPE_INVERSE),
                     TDM_OK);
    for (int i = 0; i < 64; i++) {
        assert_true(fabsf(y[i] - x[i]) <= 0.02f * (1.0f + fabsf(x[i])));
    }
}

/* A kernel context with a RoPE cache gives the bits of one without: every table of a pass
 * (more tables than the cache holds, so some are replaced), positions hit, missed and sharing a
 * slot (pos and pos + n_slots), both directions. */
static void test_rope_cache_changes_no_bit(void **state)
{
    enum { NT = 6, NROWS = 9, NH = 3, DIM = 48, DR = 32 };
    float f[NT][DR / 2], x[NROWS * NH * DIM], y[NROWS * NH * DIM], z[NROWS * NH * DIM];
    int64_t pos[NROWS] = {0, 1, 7, 7, 16, 1000, 17, 1, 16 + 7};
    kern_ctx_t plain = {0}, cached = {0};
    kern_rope_cache_t *cache = NULL;

    (void)state;
    assert_int_equal(kern_rope_cache_create(0, &cache), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_rope_cache_create(12, &cache), TDM_ERR_INVALID_ARG);
    assert_null(cache);
    assert_int_equal(kern_rope_cache_create(16, &cache), TDM_OK);
    cached.rope_cache = cache;
    for (int t = 0; t < NT; t++) {
        kern_rope_yarn_t yarn = {16, 32, 1, 65536};
        assert_int_equal(kern_rope_freqs(DR, 10000.0 * (t + 1), t % 2 ? &yarn : NULL, f[t]),
                         TDM_OK);
    }
    fill(x, NROWS * NH * DIM, 2.0f);
    for (int round = 0; round < 3; round++) {
        for (int t = 0; t < NT; t++) {
            kern_rope_dir_t dir = (t + round) % 2 ? KERN_ROPE_INVERSE : KERN_ROPE_FORWARD;
            memcpy(y, x, sizeof(x));
            memcpy(z, x, sizeof(x));
            assert_int_equal(kern_ops_cpu()->rope(&plain, y, NROWS, NH, DIM, DR, pos, f[t], dir),
                             TDM_OK);
            assert_int_equal(kern_ops_cpu()->rope(&cached, z, NROWS, NH, DIM, DR, pos, f[t], dir),
                             TDM_OK);
            assert_memory_equal(y, z, sizeof(y));
        }
        pos[round] += 16; /* the same slot, another position */
    }
    kern_rope_cache_destroy(cache);
    kern_rope_cache_destroy(NULL);
}

static void test_yarn_ramp_of_full_model(void **state)
{
    (void)state;
    /* full model: d_r 64, theta 160000, lo = 15, hi = 25: f_i below 15 unscaled, above 25 / 16 */
    float f[32];
    kern_rope_yarn_t yarn = {16, 32, 1, 65536};
    assert_int_equal(kern_rope_freqs(64, 160000.0, &yarn, f), TDM_OK);
    assert_true(f[10] == (float)pow(160000.0, -20.0 / 64));
    assert_true(f[30] == (float)(pow(160000.0, -60.0 / 64) / 16));
}

static void test_mhc_coeffs_doubly_stochastic_and_collapse(void **state)
{
    (void)state;
    int m = 4;
    int64_t H = 32;
    float x[4 * 32], raw[24], base[24], scale[3] = {0.5f, 0.5f, 0.5f};
    float pre[4], post[4], M[16], y[32], F[32];
    fill(x, m * H, 1.0f);
    fill(raw, 24, 1.0f);
    fill(base, 24, 0.5f);
    kern_mhc_params_t p = {base, scale, m, 20, 1e-20f, 1e-6f};
    assert_int_equal(kern_ops_cpu()->mhc_coeffs(NULL, &p, x, 1, H, raw, pre, post, M), TDM_OK);
    for (int j = 0; j < m; j++) {
        double col = 0, row = 0;
        for (int i = 0; i < m; i++) {
            col += M[i * m + j];
            row += M[j * m + i];
        }
        assert_true(fabs(col - 1.0) < 1e-3 && fabs(row - 1.0) < 1e-2);
        assert_true(pre[j] > 0.0f && pre[j] < 1.001f && post[j] > 0.0f && post[j] < 2.0f);
    }
    assert_int_equal(kern_ops_cpu()->mhc_collapse(NULL, pre, x, 1, m, H, y), TDM_OK);
    for (int64_t c = 0; c < H; c++) {
        double acc = 0;
        for (int i = 0; i < m; i++) {
            acc += (double)pre[i] * x[i * H + c];
        }
        assert_true(fabs(y[c] - acc) <= (1.0 / 128) * (1 + fabs(acc)));
    }
    fill(F, H, 1.0f);
    float X2[4 * 32];
    memcpy(X2, x, sizeof(x));
    assert_int_equal(kern_ops_cpu()->mhc_update(NULL, post, F, M, 1, m, H, X2), TDM_OK);
    for (int j = 0; j < m; j++) {
        for (int64_t c = 0; c < H; c++) {
            double acc = (double)post[j] * F[c];
            for (int i = 0; i < m; i++) {
                acc += (double)M[i * m + j] * x[i * H + c];
            }
            assert_true(fabs(X2[j * H + c] - acc) <= (1.0 / 128) * (1 + fabs(acc)));
        }
    }
}

static void test_topk_tie_order_skips_minus_inf_and_rejects_nan(void **state)
{
    (void)state;
    float v[8] = {1.0f, 3.0f, 3.0f, -INFINITY, 2.0f, 3.0f, INFINITY, 0.5f};
    int32_t scratch[8], idx[8];
    int64_t n = 0;
    assert_int_equal(kern_topk_cpu(NULL, v, 8, 5, scratch, idx, &n), TDM_OK);
    assert_int_equal(n, 5);
    int32_t want[5] = {6, 1, 2, 5, 4};
    assert_memory_equal(idx, want, sizeof(want));
    assert_int_equal(kern_topk_cpu(NULL, v, 8, 8, scratch, idx, &n), TDM_OK);
    assert_int_equal(n, 7);
    v[7] = NAN;
    assert_int_equal(kern_topk_cpu(NULL, v, 8, 2, scratch, idx, &n), TDM_ERR_INTERNAL);
}

/* Long inputs (the heap fills, then runs of 16 are skipped when none beats its worst; from 128
 * values the histogram selection): the same selection and order as a full sort in the tie order
 * (value descending, index ascending), with many ties, signed zeros and -inf entries. */
static int32_t topk_cmp_vals_idx(const float *v, int32_t a, int32_t b)
{
    if (v[a] != v[b]) {
        return v[a] > v[b] ? -1 : 1;
    }
    return a < b ? -1 : (a > b);
}

static void test_topk_long_inputs_match_a_full_sort(void **state)
{
    enum { N = 1000 };
    static const int64_t ns[] = {16, 17, 31, 32, 100, 127, 128, 257, 512, N};
    static const int64_t ks[] = {1, 3, 7, 8, 16, 64, 128, 300, N};
    float v[N];
    int32_t scratch[N], idx[N], want[N];
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
            int64_t n = ns[a];
            for (int64_t i = 0; i < n; i++) {
                /* few distinct values (ties), rising or random, some -inf */
                double u = urand();
                v[i] = u < 0.05 ? -INFINITY
                                : (rep % 2 == 0 ? (float)(int)(urand() * 8)
                                                : (float)i * 0.01f + (float)(int)(u * 4));
                if (rep % 4 == 3) { /* signed zeros (equal), infinities, subnormals, negatives */
                    static const float odd[8] = {0.0f,     -0.0f,   INFINITY, -1e-40f,
                                                 1e-40f,   -2.5f,   -0.0f,    -3e38f};
                    v[i] = u < 0.05 ? -INFINITY : odd[(int)(urand() * 8)];
                }
            }
            for (size_t b = 0; b < sizeof(ks) / sizeof(ks[0]); b++) {
                int64_t k = ks[b], got = 0, n_fin = 0;
                for (int64_t i = 0; i < n; i++) {
                    if (v[i] != -INFINITY) {
                        want[n_fin++] = (int32_t)i;
                    }
                }
                /* insertion sort in the tie order; keep the first k */
                for (int64_t i = 1; i < n_fin; i++) {
                    int32_t t = want[i];
                    int64_t j = i;
                    while (j > 0 && topk_cmp_vals_idx(v, t, want[j - 1]) < 0) {
                        want[j] = want[j - 1];
                        j--;
                    }
                    want[j] = t;
                }
                assert_int_equal(kern_topk_cpu(NULL, v, n, k, scratch, idx, &got), TDM_OK);
                assert_int_equal(got, k < n_fin ? k : n_fin);
                assert_memory_equal(idx, want, (size_t)got * sizeof(int32_t));
            }
        }
    }
}

/* qsort's view of the tie order for test_topk_filter_inputs (the values through a file-scope
 * pointer: qsort has no context argument). */
static const float *g_tk_vals;

static int topk_qsort_cmp(const void *a, const void *b)
{
    return (int)topk_cmp_vals_idx(g_tk_vals, *(const int32_t *)a, *(const int32_t *)b);
}

/* Inputs of 2048 and more (at least 8k: the rising-threshold filter of kernels/cpu/topk.c):
 * random scores, rising and falling runs (every index a candidate, the list cut again and
 * again), few distinct values (ties at the threshold across cuts), -inf runs, all -inf, signed
 * zeros; the same selection and order as a full sort in the tie order. */
static void test_topk_filter_inputs_match_a_full_sort(void **state)
{
    enum { N = 20000 };
    static const int64_t ns[] = {2048, 4095, 9000, N};
    static const int64_t ks[] = {8, 64, 128, 250};
    static float v[N];
    static int32_t scratch[N], idx[N], want[N];
    (void)state;
    for (int kind = 0; kind < 8; kind++) {
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
            int64_t n = ns[a], n_fin = 0;
            for (int64_t i = 0; i < n; i++) {
                double u = urand();
                switch (kind) {
                case 0: /* scores of either sign */
                    v[i] = (float)(u * 10.0 - 5.0);
                    break;
                case 1: /* rising: every index beats the kept ones */
                    v[i] = (float)i * 0.5f;
                    break;
                case 2: /* falling */
                    v[i] = -(float)i;
                    break;
                case 3: /* few distinct values: ties at every threshold */
                    v[i] = (float)(int)(u * 5.0);
                    break;
                case 4: /* mostly -inf */
                    v[i] = u < 0.97 ? -INFINITY : (float)(u * 3.0);
                    break;
                case 5: /* signed zeros, infinities, subnormals */
                {
                    static const float odd[8] = {0.0f,   -0.0f, INFINITY, -1e-40f,
                                                 1e-40f, -2.5f, -0.0f,    -INFINITY};
                    v[i] = odd[(int)(u * 8)];
                    break;
                }
                case 6: /* all -inf: nothing to select */
                    v[i] = -INFINITY;
                    break;
                default: /* rising in steps with noise, then a late burst of the best */
                    v[i] = (float)(i / 512) + (float)u + (i > n - 100 ? 1e6f : 0.0f);
                    break;
                }
            }
            for (int64_t i = 0; i < n; i++) {
                if (v[i] != -INFINITY) {
                    want[n_fin++] = (int32_t)i;
                }
            }
            g_tk_vals = v;
            qsort(want, (size_t)n_fin, sizeof(int32_t), topk_qsort_cmp);
            for (size_t b = 0; b < sizeof(ks) / sizeof(ks[0]); b++) {
                int64_t k = ks[b], got = -1;
                assert_int_equal(kern_topk_cpu(NULL, v, n, k, scratch, idx, &got), TDM_OK);
                assert_int_equal(got, k < n_fin ? k : n_fin);
                assert_memory_equal(idx, want, (size_t)got * sizeof(int32_t));
            }
        }
    }
}

static void test_moe_route_weights_and_order(void **state)
{
    (void)state;
    float logits[8] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 3.0f, -3.0f, 0.0f};
    float bias[8] = {0};
    int32_t ids[3];
    float w[3];
    bias[0] = 10.0f; /* bias changes the selection, not the weights */
    assert_int_equal(kern_moe_route_cpu(NULL, logits, bias, 1, 8, 3, 1.5f, ids, w), TDM_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1); /* tie 1 vs 3: lower id */
    assert_int_equal(ids[2], 5);
    double s[3], sum = 0;
    for (int k = 0; k < 3; k++) {
        double z = logits[ids[k]];
        s[k] = sqrt(log1p(exp(z)));
        sum += s[k];
    }
    for (int k = 0; k < 3; k++) {
        assert_true(fabs(w[k] - 1.5 * s[k] / sum) < 1e-5);
    }
}

static void test_swiglu_clamps(void **state)
{
    (void)state;
    float gu[4] = {20.0f, -2.0f, 30.0f, 0.5f};
    float h[2], wt = 0.5f;
    assert_int_equal(kern_swiglu_cpu(NULL, gu, &wt, 1, 2, 10.0f, h), TDM_OK);
    double h0 = 0.5 * (10.0 / (1 + exp(-10.0))) * 10.0;
    double h1 = 0.5 * (-2.0 / (1 + exp(2.0))) * 0.5;
    assert_true(fabs(h[0] - h0) < h0 / 128 && fabs(h[1] - h1) < fabs(h1) / 128);
}

static void test_attention_matches_double_with_sink(void **state)
{
    (void)state;
    int64_t nh = 2, d = 32, na = 5, nb = 3;
    float q[64], ka[5 * 32], kb[3 * 32], sink[2] = {0.3f, -0.7f}, o[64], scratch[16];
    double ref[64];
    fill(q, nh * d, 1.0f);
    fill(ka, na * d, 1.0f);
    fill(kb, nb * d, 1.0f);
    float scale = (float)(1.0 / sqrt(32.0));
    for (int64_t h = 0; h < nh; h++) {
        double z[8], mx = -1e300, den = 0;
        for (int64_t e = 0; e < na + nb; e++) {
            const float *k = e < na ? ka + e * d : kb + (e - na) * d;
            double dot = 0;
            for (int64_t c = 0; c < d; c++) {
                dot += (double)q[h * d + c] * k[c];
            }
            z[e] = dot * scale;
            mx = z[e] > mx ? z[e] : mx;
        }
        for (int64_t e = 0; e < na + nb; e++) {
            den += exp(z[e] - mx);
        }
        den += exp(sink[h] - mx);
        for (int64_t c = 0; c < d; c++) {
            double acc = 0;
            for (int64_t e = 0; e < na + nb; e++) {
                const float *k = e < na ? ka + e * d : kb + (e - na) * d;
                acc += exp(z[e] - mx) / den * k[c];
            }
            ref[h * d + c] = acc;
        }
    }
    assert_int_equal(kern_attention_cpu(NULL, q, ka, na, kb, nb, sink, nh, d, scale, scratch, o),
                     TDM_OK);
    assert_close(o, ref, nh * d, 1.0 / 100);
}

static void test_index_scores_and_pool(void **state)
{
    (void)state;
    int64_t HI = 2, dI = 32, n = 4;
    float q[64], w[2] = {0.7f, -0.2f}, k[4 * 32], s[4], a[64], b[64], v[32];
    fill(q, HI * dI, 1.0f);
    fill(k, n * dI, 1.0f);
    assert_int_equal(kern_index_scores_cpu(NULL, q, w, HI, dI, k, n, s), TDM_OK);
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t h = 0; h < HI; h++) {
            double dot = 0;
            for (int64_t c = 0; c < dI; c++) {
                dot += (double)q[h * dI + c] * k[j * dI + c];
            }
            acc += w[h] * (dot > 0 ? dot : 0);
        }
        assert_true(fabs(s[j] - acc) < 1e-4 * (1 + fabs(acc)));
    }
    fill(a, 64, 1.0f);
    fill(b, 64, 2.0f);
    assert_int_equal(kern_compress_pool_cpu(NULL, a, b, 2, 32, v), TDM_OK);
    for (int c = 0; c < 32; c++) {
        double e0 = exp(b[c]), e1 = exp(b[32 + c]);
        double want = (e0 * a[c] + e1 * a[32 + c]) / (e0 + e1);
        assert_true(fabs(v[c] - want) <= (1.0 / 128) * (1 + fabs(want)));
    }
}

static void test_weight_dequant_is_exact(void **state)
{
    (void)state;
    int64_t n_out = 40, n_in = 64;
    float *w = malloc(sizeof(float) * n_out * n_in);
    float *back = malloc(sizeof(float) * n_out * n_in);
    uint8_t *codes = malloc((size_t)(n_out * n_in));
    uint8_t scales[2 * 2];
    uint16_t *bf = malloc((size_t)(n_out * n_in) * 2);
    fill(w, n_out * n_in, 0.1f);
    assert_int_equal(kern_weight_fp8_quantize(w, n_out, n_in, codes, scales), TDM_OK);
    assert_int_equal(kern_weight_fp8_dequantize(codes, scales, n_out, n_in, back), TDM_OK);
    assert_int_equal(kern_mat_bf16_from_fp8(codes, scales, n_out, n_in, bf), TDM_OK);
    for (int64_t i = 0; i < n_out * n_in; i++) {
        assert_true(kern_bf16_to_f32(bf[i]) == back[i]);
    }
    free(w);
    free(back);
    free(codes);
    free(bf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_double_loop_and_rounds_bf16),
        cmocka_unit_test(test_gemm_is_batch_invariant_and_equals_plain_loop),
        cmocka_unit_test(test_gemm_rejects_bad_inner_dim_and_leaves_output),
        cmocka_unit_test(test_rmsnorm_matches_double),
        cmocka_unit_test(test_rope_inverse_undoes_forward_and_matches_double),
        cmocka_unit_test(test_rope_cache_changes_no_bit),
        cmocka_unit_test(test_yarn_ramp_of_full_model),
        cmocka_unit_test(test_mhc_coeffs_doubly_stochastic_and_collapse),
        cmocka_unit_test(test_topk_tie_order_skips_minus_inf_and_rejects_nan),
        cmocka_unit_test(test_topk_long_inputs_match_a_full_sort),
        cmocka_unit_test(test_topk_filter_inputs_match_a_full_sort),
        cmocka_unit_test(test_moe_route_weights_and_order),
        cmocka_unit_test(test_swiglu_clamps),
        cmocka_unit_test(test_attention_matches_double_with_sink),
        cmocka_unit_test(test_index_scores_and_pool),
        cmocka_unit_test(test_weight_dequant_is_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
