/* test_kernels_simd.c - the CPU kernels' vector paths (every instruction set the CPU runs) and
 * worker pool give the bits of the plain scalar definitions: dequantizers, Q_act8 round trips
 * and the Q_act8 / Q_ckv / Q_mx4 quantizers against kernels/codec_bits.h on every code and
 * special values, the one-row GEMV (BF16, FP32) and the pooled GEMM against kern_gemm_ref_cpu,
 * mHC collapse/update and attention against the scalar loops written here, index scores,
 * RMSNorm, RoPE, the Engram gate, mHC and attention at sizes with tails against the scalar
 * set's plain loops, kern_exp against e^x in double and its vector form against it bit for
 * bit, and two threads sharing the pool. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/attention.h"
#include "kernels/codec.h"
#include "kernels/codec_bits.h"
#include "kernels/gemm.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/glue.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/topk.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float frand(float scale)
{
    return ((float)(rnd32() % 2000001u) / 1000000.0f - 1.0f) * scale;
}

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

static void assert_bits_equal(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fail_msg("%s: element %lld: got %a want %a", what, (long long)i, (double)got[i],
                     (double)want[i]);
        }
    }
}

static void test_dequant_every_code_and_scale(void **state)
{
    enum { N = 4096 };
    uint8_t codes[N], scales[N / 16];
    float y[N], want[N];
    (void)state;
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < N; i++) {
            codes[i] = (uint8_t)(rep == 0 ? (uint32_t)i : rnd32());
        }
        for (int i = 0; i < N / 16; i++) {
            scales[i] = (uint8_t)(rep == 0 ? (uint32_t)i : rnd32()); /* 0 and 0xFF (NaN) included */
        }
        assert_int_equal(kern_dequant_act8_cpu(NULL, codes, scales, N / 128, 128, y), TDM_OK);
        for (int i = 0; i < N; i++) { /* a NaN code keeps its NaN (kern_dequant_act8_cpu) */
            want[i] = (codes[i] & 0x7F) == 0x7F
                          ? codec_e4m3_to_f32(codes[i])
                          : codec_e4m3_to_f32(codes[i]) * codec_ue8m0_to_f32(scales[i / 32]);
        }
        assert_bits_equal(y, want, N, "dequant_act8");
        assert_int_equal(kern_dequant_ckv_cpu(NULL, codes, scales, N / 128, 128, y), TDM_OK);
        for (int i = 0; i < N; i++) {
            uint8_t nib = (uint8_t)(codes[i / 2] >> (4 * (i % 2)));
            want[i] = codec_e2m1_to_f32(nib) * codec_e4m3_to_f32(scales[i / 16]);
        }
        assert_bits_equal(y, want, N, "dequant_ckv");
        assert_int_equal(kern_dequant_mx4_cpu(NULL, codes, scales, N / 64, 64, y), TDM_OK);
        for (int i = 0; i < N; i++) {
            uint8_t nib = (uint8_t)(codes[i / 2] >> (4 * (i % 2)));
            want[i] = codec_e2m1_to_f32(nib) * codec_ue8m0_to_f32(scales[i / 32]);
        }
        assert_bits_equal(y, want, N, "dequant_mx4");
    }
}

/* One value of a Q_act8 test group: random bits, the e4m3 grid (ties), subnormal and huge. */
static float qdq_input(int mode, int i)
{
    switch (mode) {
    case 0:
        return from_bits(rnd32()); /* NaN, infinities, subnormals */
    case 1:
        return ldexpf(frand(1.0f), (int)(rnd32() % 60) - 30);
    case 2: /* exact midpoints between grid points of the group's scale */
        return (i == 0 ? 448.0f : (float)((int)(rnd32() % 1793) - 896) / 4.0f) *
               ldexpf(1.0f, (int)(rnd32() % 20) - 10);
    case 3:
        return from_bits((rnd32() & 0x80FFFFFFu) | ((rnd32() % 3u) << 23));
    default:
        return (float)((int)(rnd32() % 33) - 16) * ldexpf(1.0f, (int)(rnd32() % 14) - 16);
    }
}

static void test_qdq_act8_matches_scalar_composition(void **state)
{
    enum { N = 1024 };
    float x[N], y[N], want[N];
    (void)state;
    for (int rep = 0; rep < 500; rep++) {
        for (int i = 0; i < N; i++) {
            x[i] = qdq_input(rep % 5, i % 32);
        }
        for (int g = 0; g < N; g += 32) {
            float amax = 0.0f;
            float s;
            for (int i = g; i < g + 32; i++) {
                amax = codec_amax_merge(amax, codec_amax_term(x[i]));
            }
            s = codec_ue8m0_to_f32(codec_act8_scale(amax));
            for (int i = g; i < g + 32; i++) {
                want[i] = codec_e4m3_to_f32(codec_e4m3_from_f32(codec_div_rn(x[i], s))) * s;
            }
        }
        assert_int_equal(kern_qdq_act8_cpu(x, N, y), TDM_OK);
        assert_bits_equal(y, want, N, "qdq_act8");
        assert_int_equal(kern_qdq_act8_cpu(x, N, x), TDM_OK); /* in place */
        assert_bits_equal(x, want, N, "qdq_act8 in place");
    }
}

/* kern_gemm_cpu equals kern_gemm_ref_cpu bit for bit at n_rows rows and n_threads threads of
 * pool (borrowed; NULL = the caller alone). */
static void check_gemm_on(kern_pool_t *pool, int dtype, int64_t n_out, int64_t n_in, int64_t n_rows,
                          int n_threads, uint32_t flags)
{
    int64_t nw = n_out * n_in;
    void *wd = malloc((size_t)nw * (dtype == KERN_MAT_F32 ? 4 : 2));
    float *x = malloc(sizeof(float) * (size_t)(n_rows * n_in));
    float *y = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    float *y_ref = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    kern_mat_t m = {(kern_mat_dtype_t)dtype, n_out, n_in, wd, NULL, NULL};
    kern_ctx_t ctx = {.n_threads = n_threads, .pool = pool};

    for (int64_t i = 0; i < nw; i++) {
        if (dtype == KERN_MAT_F32) {
            ((float *)wd)[i] = frand(0.1f);
        } else {
            ((uint16_t *)wd)[i] = kern_bf16_from_f32(frand(0.1f));
        }
    }
    for (int64_t i = 0; i < n_rows * n_in; i++) {
        x[i] = frand(3.0f);
    }
    assert_int_equal(kern_gemm_cpu(&ctx, &m, x, n_in, n_rows, flags, y, n_out), TDM_OK);
    assert_int_equal(kern_gemm_ref_cpu(NULL, &m, x, n_in, n_rows, flags, y_ref, n_out), TDM_OK);
    assert_bits_equal(y, y_ref, n_rows * n_out, "gemm");
    free(wd);
    free(x);
    free(y);
    free(y_ref);
}

/* check_gemm_on with a pool of n_threads made for the call (none for one thread). */
static void check_gemm(int dtype, int64_t n_out, int64_t n_in, int64_t n_rows, int n_threads,
                       uint32_t flags)
{
    kern_pool_t *pool = NULL;
    if (n_threads > 1) {
        assert_int_equal(kern_pool_create(n_threads, &pool), TDM_OK);
    }
    check_gemm_on(pool, dtype, n_out, n_in, n_rows, n_threads, flags);
    kern_pool_destroy(pool);
}

static void test_gemv_and_pooled_gemm_match_reference(void **state)
{
    static const int64_t outs[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 24, 37, 100};
    (void)state;
    for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
        check_gemm(KERN_MAT_BF16, outs[i], 64, 1, 1, 0);
        check_gemm(KERN_MAT_F32, outs[i], 2048, 1, 1, KERN_GEMM_OUT_BF16);
        check_gemm(KERN_MAT_BF16, outs[i], 48, 3, 1, KERN_GEMM_OUT_BF16);
        /* 4-6 rows: one group in the quantized types' taller tile where a set has one (AVX2) */
        check_gemm(KERN_MAT_BF16, outs[i], 64, 4, 1, 0);
        check_gemm(KERN_MAT_BF16, outs[i], 48, 6, 1, KERN_GEMM_OUT_BF16);
    }
    /* above the threading threshold (4 M MACs): chunks on the pool, 2 and 3 threads */
    check_gemm(KERN_MAT_BF16, 8200, 512, 1, 2, 0);
    check_gemm(KERN_MAT_BF16, 1030, 512, 9, 3, KERN_GEMM_OUT_BF16);
    check_gemm(KERN_MAT_F32, 4100, 1024, 2, 2, 0);
    /* more rows than L1 holds at a short inner dimension: the output-block order (panels of
     * many outputs, each tile of rows over all of them); blocks and tiles with ragged ends */
    check_gemm(KERN_MAT_BF16, 1030, 256, 40, 1, KERN_GEMM_OUT_BF16);
    check_gemm(KERN_MAT_F32, 203, 128, 70, 2, 0);
    /* the few-row path's blocks of weight rows (gemm_body.inc GB_VR_BLOCK_BYTES) run by several
     * groups of rows in turn, the last block ragged: 16 KiB blocks of 16 BF16 rows, 2 F32 rows */
    check_gemm(KERN_MAT_BF16, 100, 512, 16, 1, KERN_GEMM_OUT_BF16);
    check_gemm(KERN_MAT_BF16, 37, 512, 8, 1, 0);
    check_gemm(KERN_MAT_F32, 37, 2048, 5, 1, 0);
}

/* An FP8 or MXFP4 matrix [n_out, n_in]: random codes (no E4M3 NaN) and scales in
 * [s_lo, s_hi]; bf16_out gets its BF16 expansion (kern_mat_bf16_from_*). Caller frees data,
 * scales (in m) and bf16_out. */
static void make_quant_mat(int dtype, int64_t n_out, int64_t n_in, int s_lo, int s_hi,
                           kern_mat_t *m, uint16_t **bf16_out)
{
    int64_t n_codes = dtype == KERN_MAT_FP8 ? n_out * n_in : n_out * n_in / 2;
    int64_t n_sc = dtype == KERN_MAT_FP8 ? (n_out + 31) / 32 * (n_in / 32) : n_out * (n_in / 32);
    uint8_t *codes = malloc((size_t)n_codes);
    uint8_t *scales = malloc((size_t)n_sc);
    uint16_t *bf16 = malloc((size_t)(n_out * n_in) * 2);
    assert_non_null(codes);
    assert_non_null(scales);
    assert_non_null(bf16);
    for (int64_t i = 0; i < n_codes; i++) {
        codes[i] = (uint8_t)rnd32();
        if (dtype == KERN_MAT_FP8 && (codes[i] & 0x7F) == 0x7F) {
            codes[i] ^= 1; /* NaN is never written (MODEL.md 4) */
        }
    }
    for (int64_t i = 0; i < n_sc; i++) {
        scales[i] = (uint8_t)(s_lo + (int)(rnd32() % (uint32_t)(s_hi - s_lo + 1)));
    }
    if (dtype == KERN_MAT_FP8) {
        assert_int_equal(kern_mat_bf16_from_fp8(codes, scales, n_out, n_in, bf16), TDM_OK);
    } else {
        assert_int_equal(kern_mat_bf16_from_mxfp4(codes, scales, n_out, n_in, bf16), TDM_OK);
    }
    *m = (kern_mat_t){(kern_mat_dtype_t)dtype, n_out, n_in, codes, scales, NULL};
    *bf16_out = bf16;
}

/* kern_gemm_cpu on an FP8 / MXFP4 matrix as stored equals kern_gemm_ref_cpu on it and on its
 * BF16 expansion, bit for bit. */
static void check_gemm_quant(int dtype, int64_t n_out, int64_t n_in, int64_t n_rows, int n_threads,
                             uint32_t flags, int s_lo, int s_hi)
{
    kern_mat_t m;
    uint16_t *bf16;
    float *x = malloc(sizeof(float) * (size_t)(n_rows * n_in));
    float *y = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    float *y_ref = malloc(sizeof(float) * (size_t)(n_rows * n_out));
    kern_ctx_t ctx = {.n_threads = n_threads};

    if (n_threads > 1) {
        assert_int_equal(kern_pool_create(n_threads, &ctx.pool), TDM_OK);
    }
    make_quant_mat(dtype, n_out, n_in, s_lo, s_hi, &m, &bf16);
    kern_mat_t mb = {KERN_MAT_BF16, n_out, n_in, bf16, NULL, NULL};
    assert_int_equal(kern_mat_check_quantized(&m), 1);
    for (int64_t i = 0; i < n_rows * n_in; i++) {
        x[i] = frand(3.0f);
    }
    assert_int_equal(kern_gemm_cpu(&ctx, &m, x, n_in, n_rows, flags, y, n_out), TDM_OK);
    assert_int_equal(kern_gemm_ref_cpu(NULL, &m, x, n_in, n_rows, flags, y_ref, n_out), TDM_OK);
    assert_bits_equal(y, y_ref, n_rows * n_out, dtype == KERN_MAT_FP8 ? "gemm fp8" : "gemm mxfp4");
    assert_int_equal(kern_gemm_ref_cpu(NULL, &mb, x, n_in, n_rows, flags, y_ref, n_out), TDM_OK);
    assert_bits_equal(y, y_ref, n_rows * n_out, "gemm quantized vs BF16 expansion");
    kern_pool_destroy(ctx.pool);
    free((void *)m.data);
    free((void *)m.scales);
    free(bf16);
    free(x);
    free(y);
    free(y_ref);
}

static void test_quantized_gemm_matches_bf16_expansion(void **state)
{
    static const int64_t outs[] = {1, 3, 4, 7, 8, 9, 17, 33, 70};
    static const int64_t rows[] = {1, 2, 3, 5, 7, 16};
    (void)state;
    for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
        for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
            check_gemm_quant(KERN_MAT_FP8, outs[i], 96, rows[r], 1, 0, 3, 134);
            check_gemm_quant(KERN_MAT_FP8, outs[i], 64, rows[r], 1, KERN_GEMM_OUT_BF16, 110, 130);
            check_gemm_quant(KERN_MAT_MXFP4, outs[i], 96, rows[r], 1, 0, 0, 200);
            check_gemm_quant(KERN_MAT_MXFP4, outs[i], 64, rows[r], 1, KERN_GEMM_OUT_BF16, 115, 130);
        }
    }
    /* threaded, and inner dimensions past a register tile's reach */
    check_gemm_quant(KERN_MAT_FP8, 1030, 1024, 1, 2, KERN_GEMM_OUT_BF16, 100, 134);
    check_gemm_quant(KERN_MAT_MXFP4, 1030, 1024, 1, 2, 0, 100, 140);
    check_gemm_quant(KERN_MAT_FP8, 300, 512, 40, 2, 0, 100, 134);
    /* FP8 rows in 16 KiB blocks (16 rows of 1024 codes) inside each 32-row scale block, several
     * groups of rows (3 on x86, 6 on NEON, 8 on the scalar set) */
    check_gemm_quant(KERN_MAT_FP8, 70, 1024, 16, 1, 0, 100, 134);
    /* folded few-row FP8 calls, threaded: 9 rows of 1024 (each group's scaled rows on the stack)
     * and of 8192, where one group's scaled rows outgrow the stack buffer on every set (2-6 rows
     * x 8192 floats: gemm_body.inc gemv_rows_fp8s takes them from the heap) */
    check_gemm_quant(KERN_MAT_FP8, 200, 1024, 9, 2, KERN_GEMM_OUT_BF16, 110, 130);
    check_gemm_quant(KERN_MAT_FP8, 64, 8192, 9, 2, KERN_GEMM_OUT_BF16, 110, 130);
    /* the same for MXFP4's permuted x (5 x 2048 floats: gemm_body.inc gb_mx4p_rows) */
    check_gemm_quant(KERN_MAT_MXFP4, 70, 2048, 5, 2, 0, 110, 130);
    check_gemm_quant(KERN_MAT_MXFP4, 300, 512, 40, 3, KERN_GEMM_OUT_BF16, 100, 140);
}

/* The few-row path (2 up to 16 rows on every set; panels past it): every row count 2..17, each
 * format, outputs that leave ragged tile ends (1, 5, 13, 33), both output roundings. */
static void test_few_row_gemm_matches_reference(void **state)
{
    static const int64_t outs[] = {1, 5, 13, 33};
    (void)state;
    for (int64_t rows = 2; rows <= 17; rows++) {
        for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
            uint32_t flags = (rows + (int64_t)i) % 2 == 0 ? KERN_GEMM_OUT_BF16 : 0;
            check_gemm(KERN_MAT_BF16, outs[i], 64, rows, 1, flags);
            check_gemm(KERN_MAT_F32, outs[i], 48, rows, 1, flags ^ KERN_GEMM_OUT_BF16);
            check_gemm_quant(KERN_MAT_FP8, outs[i], 96, rows, 1, flags, 3, 134);
            check_gemm_quant(KERN_MAT_MXFP4, outs[i], 64, rows, 1, flags ^ KERN_GEMM_OUT_BF16, 0,
                             200);
        }
    }
    /* an FP8 matrix past one 32-row scale block, threaded */
    check_gemm_quant(KERN_MAT_FP8, 1030, 512, 13, 2, KERN_GEMM_OUT_BF16, 100, 134);
}

/* MXFP4 at 1-13 rows (the one-row GEMV and the few-row tile, which take each weight row's 32
 * scaled products of a scale group at once: a lookup on AVX-512) over the whole UE8M0 range
 * 0..254 (subnormal products at the bottom, infinities at the top), several scale groups per
 * row, outputs that leave every tail of a block of 1-4 rows, both output roundings. */
static void test_mxfp4_few_rows_every_scale(void **state)
{
    static const int64_t outs[] = {1, 2, 3, 4, 5, 7, 9, 18};
    (void)state;
    for (int64_t rows = 1; rows <= 13; rows++) {
        for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
            uint32_t flags = (rows + (int64_t)i) % 2 == 0 ? KERN_GEMM_OUT_BF16 : 0;
            check_gemm_quant(KERN_MAT_MXFP4, outs[i], 96, rows, 1, flags, 0, 254);
            check_gemm_quant(KERN_MAT_MXFP4, outs[i], 160, rows, 1, flags, 100, 140);
        }
    }
}

/* The many-row register tiles (gemm_body.inc: the panel and the output-block orders) of every
 * weight format: row counts that leave every tail of a TILE_R of 2-8 rows (9-23 rows, 47),
 * output counts that leave every tail of a TILE_O of 2-4 (and blocks with ragged ends), inner
 * dimensions on either side of the order switch, BF16 and FP32 outputs. */
static void test_many_row_tiles_match_reference(void **state)
{
    static const int64_t rows[] = {9, 10, 11, 12, 13, 14, 15, 17, 19, 23, 47};
    static const int64_t outs[] = {5, 6, 7, 13, 98};
    (void)state;
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        for (size_t o = 0; o < sizeof(outs) / sizeof(outs[0]); o++) {
            uint32_t flags = (r + o) % 2 == 0 ? KERN_GEMM_OUT_BF16 : 0;
            check_gemm(KERN_MAT_BF16, outs[o], 96, rows[r], 1, flags);
            check_gemm(KERN_MAT_F32, outs[o], 48, rows[r], 1, flags ^ KERN_GEMM_OUT_BF16);
            check_gemm_quant(KERN_MAT_FP8, outs[o], 96, rows[r], 1, flags, 100, 134);
            check_gemm_quant(KERN_MAT_MXFP4, outs[o], 64, rows[r], 1, flags, 0, 200);
        }
    }
    /* x rows past L1 at a short inner dimension (output blocks), and long rows (panels) */
    check_gemm(KERN_MAT_BF16, 101, 512, 77, 1, KERN_GEMM_OUT_BF16);
    check_gemm(KERN_MAT_F32, 26, 2048, 37, 1, 0);
    check_gemm_quant(KERN_MAT_FP8, 99, 1536, 29, 1, KERN_GEMM_OUT_BF16, 100, 134);
    check_gemm_quant(KERN_MAT_MXFP4, 97, 512, 53, 1, KERN_GEMM_OUT_BF16, 0, 200);
    check_gemm_quant(KERN_MAT_MXFP4, 514, 96, 45, 1, 0, 100, 140);
}

/* The tile epilogue's BF16 rounding (a vector per group of outputs) on the values where it can
 * go wrong: ties to even both ways, the carry into the exponent and to infinity, zeros of both
 * signs and subnormals; and infinities and a NaN made inside the sum. Output o < 20 reads column
 * o % 16 alone (weight 1, the others 0: the output is that input exactly); outputs 20-22 add
 * columns 0 and 8 times +-2 (overflow to +-inf, inf - inf = NaN where both are huge). No input
 * is infinite, so no product is 0 * inf; the last rows hold a NaN with a payload in column 0,
 * the one NaN lane of each of their outputs (no NaN payload depends on an operand order). */
static void test_many_row_bf16_rounding_matches_reference(void **state)
{
    static const uint32_t special[] = {
        0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3F7FFFFFu, 0x7F7FFFFFu, 0xFF7FFF80u,
        0x7F7F8000u, 0xFF7FFFFFu, 0x80000000u, 0x00000000u, 0x00008000u, 0x00018000u,
        0x807FFFFFu, 0x3F800001u, 0xC0490FDBu, 0x7F000000u, 0x00400000u};
    enum { N_IN = 16, N_OUT = 23, N_ROWS = 19 };
    float w[N_OUT * N_IN] = {0};
    float x[N_ROWS * N_IN];
    float y[N_ROWS * N_OUT];
    float y_ref[N_ROWS * N_OUT];
    kern_mat_t m = {KERN_MAT_F32, N_OUT, N_IN, w, NULL, NULL};
    kern_ctx_t ctx = {.n_threads = 1};
    (void)state;
    for (int o = 0; o < 20; o++) {
        w[o * N_IN + o % 16] = 1.0f;
    }
    for (int o = 20; o < N_OUT; o++) {
        w[o * N_IN] = 2.0f;
        w[o * N_IN + 8] = o == 20 ? 2.0f : -2.0f;
    }
    for (int i = 0; i < N_ROWS * N_IN; i++) {
        uint32_t bits = special[(size_t)i % (sizeof(special) / sizeof(special[0]))];
        memcpy(&x[i], &bits, sizeof(bits));
    }
    for (int r = 16; r < N_ROWS; r++) { /* a quiet NaN with a full payload in lane 0 (alone) */
        uint32_t bits = r == 16 ? 0x7FFFFFFFu : 0xFFC0FFFFu;
        memcpy(&x[r * N_IN], &bits, sizeof(bits));
    }
    for (int bf16 = 0; bf16 < 2; bf16++) {
        uint32_t flags = bf16 ? KERN_GEMM_OUT_BF16 : 0;
        assert_int_equal(kern_gemm_cpu(&ctx, &m, x, N_IN, N_ROWS, flags, y, N_OUT), TDM_OK);
        assert_int_equal(kern_gemm_ref_cpu(NULL, &m, x, N_IN, N_ROWS, flags, y_ref, N_OUT), TDM_OK);
        assert_bits_equal(y, y_ref, N_ROWS * N_OUT, "gemm epilogue special values");
    }
}

static void test_quantized_checks(void **state)
{
    kern_mat_t m;
    uint16_t *bf16;
    (void)state;
    make_quant_mat(KERN_MAT_FP8, 40, 64, 3, 134, &m, &bf16);
    assert_int_equal(kern_mat_check_quantized(&m), 1);
    assert_int_equal(kern_mat_bytes(&m), 40 * 64 + 2 * 2);
    ((uint8_t *)m.scales)[1] = 2; /* a product could be a BF16 subnormal */
    assert_int_equal(kern_mat_check_quantized(&m), 0);
    ((uint8_t *)m.scales)[1] = 135;
    assert_int_equal(kern_mat_check_quantized(&m), 0);
    ((uint8_t *)m.scales)[1] = 127;
    ((uint8_t *)m.data)[77] = 0xFF; /* NaN code */
    assert_int_equal(kern_mat_check_quantized(&m), 0);
    free((void *)m.data);
    free((void *)m.scales);
    free(bf16);
    make_quant_mat(KERN_MAT_MXFP4, 5, 64, 0, 254, &m, &bf16);
    assert_int_equal(kern_mat_check_quantized(&m), 1);
    assert_int_equal(kern_mat_bytes(&m), 5 * 32 + 5 * 2);
    ((uint8_t *)m.scales)[3] = 255;
    assert_int_equal(kern_mat_check_quantized(&m), 0);
    m.n_in = 48; /* not a multiple of 32 */
    assert_int_equal(kern_mat_check_quantized(&m), 0);
    free((void *)m.data);
    free((void *)m.scales);
    free(bf16);
}

typedef struct {
    kern_pool_t *pool;
    int ok;
} pool_arg_t;

static void *gemm_thread(void *arg)
{
    pool_arg_t *a = arg;
    for (int rep = 0; rep < 3; rep++) {
        check_gemm_on(a->pool, KERN_MAT_BF16, 4100, 1024, 1, 2, 0); /* fails on a mismatch */
    }
    a->ok = 1;
    return NULL;
}

static void test_two_callers_share_the_pool(void **state)
{
    pthread_t th;
    pool_arg_t a = {0};
    (void)state;
    assert_int_equal(kern_pool_create(2, &a.pool), TDM_OK);
    assert_int_equal(pthread_create(&th, NULL, gemm_thread, &a), 0);
    for (int rep = 0; rep < 3; rep++) {
        check_gemm_on(a.pool, KERN_MAT_F32, 2050, 2048, 1, 2, KERN_GEMM_OUT_BF16);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(a.ok, 1);
    kern_pool_destroy(a.pool);
}

/* mhc_collapse and mhc_update against the scalar loops, bit for bit: at the model's 4 streams
 * (a constant in the vector code) over whole vectors, and at other stream counts from 1 to
 * KERN_MHC_MAX_STREAMS (the vector code's general path) with a column tail past the last whole
 * vector. */
static void test_mhc_matches_scalar_loops(void **state)
{
    enum { H_MAX = 96 };
    static const struct {
        int m, H, reps;
    } cases[] = {{4, 96, 50}, {1, 40, 10}, {2, 40, 10}, {3, 40, 10},
                 {4, 40, 10}, {5, 40, 10}, {8, 40, 10}, {KERN_MHC_MAX_STREAMS, 40, 10}};
    float pre[KERN_MHC_MAX_STREAMS], post[KERN_MHC_MAX_STREAMS];
    float Mx[KERN_MHC_MAX_STREAMS * KERN_MHC_MAX_STREAMS], F[H_MAX], y[H_MAX];
    float X[KERN_MHC_MAX_STREAMS * H_MAX], X2[KERN_MHC_MAX_STREAMS * H_MAX];
    float want[KERN_MHC_MAX_STREAMS * H_MAX];
    (void)state;
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        int m = cases[t].m, H = cases[t].H;
        for (int rep = 0; rep < cases[t].reps; rep++) {
            for (int i = 0; i < m; i++) {
                pre[i] = frand(1.0f);
                post[i] = frand(2.0f);
            }
            for (int i = 0; i < m * m; i++) {
                Mx[i] = frand(1.0f);
            }
            for (int i = 0; i < m * H; i++) {
                X[i] = kern_bf16_round(frand(4.0f));
            }
            for (int i = 0; i < H; i++) {
                F[i] = frand(4.0f);
            }
            assert_int_equal(kern_mhc_collapse_cpu(NULL, pre, X, 1, m, H, y), TDM_OK);
            for (int c = 0; c < H; c++) {
                float acc = 0.0f;
                for (int i = 0; i < m; i++) {
                    acc += pre[i] * X[i * H + c];
                }
                want[c] = kern_bf16_round(acc);
            }
            assert_bits_equal(y, want, H, "mhc_collapse");
            memcpy(X2, X, sizeof(float) * (size_t)(m * H));
            assert_int_equal(kern_mhc_update_cpu(NULL, post, F, Mx, 1, m, H, X2), TDM_OK);
            for (int c = 0; c < H; c++) {
                for (int j = 0; j < m; j++) {
                    float acc = 0.0f;
                    for (int i = 0; i < m; i++) {
                        acc += Mx[i * m + j] * X[i * H + c];
                    }
                    want[j * H + c] = kern_bf16_round(post[j] * F[c] + acc);
                }
            }
            assert_bits_equal(X2, want, m * H, "mhc_update");
        }
    }
    /* stream counts outside [1, KERN_MHC_MAX_STREAMS] are refused, outputs untouched (the
     * vector code keeps up to that many streams' factors in arrays of that size) */
    for (int bad = 0; bad < 2; bad++) {
        int m = bad == 0 ? 0 : KERN_MHC_MAX_STREAMS + 1;
        memcpy(want, X, sizeof(float) * 40);
        memcpy(y, X, sizeof(float) * 40);
        assert_int_equal(kern_mhc_collapse_cpu(NULL, pre, X, 1, m, 16, y), TDM_ERR_INVALID_ARG);
        assert_bits_equal(y, want, 40, "mhc_collapse refused");
        assert_int_equal(kern_mhc_update_cpu(NULL, post, F, Mx, 1, m, 16, X), TDM_ERR_INVALID_ARG);
        assert_bits_equal(X, want, 40, "mhc_update refused");
    }
}

static void test_attention_matches_scalar_loops(void **state)
{
    enum { D = 64, NH = 3, NA = 21, NB = 5 };
    float q[NH * D], ka[NA * D], kb[NB * D], sink[NH], o[NH * D], scratch[NH * (NA + NB)];
    float want[NH * D];
    (void)state;
    for (int rep = 0; rep < 50; rep++) {
        /* attention over a window part and a selected part, with sinks */
        for (int i = 0; i < NH * D; i++) {
            q[i] = frand(1.0f);
        }
        for (int i = 0; i < NA * D; i++) {
            ka[i] = frand(1.0f);
        }
        for (int i = 0; i < NB * D; i++) {
            kb[i] = frand(1.0f);
        }
        for (int h = 0; h < NH; h++) {
            sink[h] = frand(2.0f);
        }
        assert_int_equal(
            kern_attention_cpu(NULL, q, ka, NA, kb, NB, sink, NH, D, 0.125f, scratch, o), TDM_OK);
        for (int h = 0; h < NH; h++) {
            float s[NA + NB], mu = -INFINITY, den = 0.0f, acc[D];
            for (int e = 0; e < NA + NB; e++) {
                const float *k = e < NA ? ka + e * D : kb + (e - NA) * D;
                s[e] = kern_dot_cpu(q + h * D, k, D) * 0.125f;
                mu = s[e] > mu ? s[e] : mu;
            }
            float lanes[16] = {0.0f}; /* the denominator in the 16-lane order, then the tree */
            for (int e = 0; e < NA + NB; e++) {
                s[e] = kern_exp(s[e] - mu);
                lanes[e % 16] += s[e];
            }
            for (int st = 8; st >= 1; st /= 2) {
                for (int j = 0; j < st; j++) {
                    lanes[j] = lanes[j] + lanes[j + st];
                }
            }
            den = lanes[0] + kern_exp(sink[h] - mu);
            for (int c = 0; c < D; c++) {
                acc[c] = 0.0f;
            }
            for (int e = 0; e < NA + NB; e++) {
                const float *k = e < NA ? ka + e * D : kb + (e - NA) * D;
                float p = s[e] / den;
                for (int c = 0; c < D; c++) {
                    acc[c] += p * k[c];
                }
            }
            for (int c = 0; c < D; c++) {
                want[h * D + c] = kern_bf16_round(acc[c]);
            }
        }
        assert_bits_equal(o, want, NH * D, "attention");
    }
}

/* The 16-lane order of kernels/norm.h written out with libm's fmaf (exact): lane j fuses
 * a[i] * b[i] for i = j, j + 16, ... below n - n % 16, the tree lane j += lane j + s for
 * s = 8, 4, 2, 1, then the tail one fma at a time. */
static float ref_dot16(const float *a, const float *b, int64_t n)
{
    float lane[16] = {0.0f};
    int64_t n16 = n - n % 16;
    for (int64_t i = 0; i < n16; i++) {
        lane[i % 16] = fmaf(a[i], b[i], lane[i % 16]);
    }
    for (int s = 8; s >= 1; s /= 2) {
        for (int j = 0; j < s; j++) {
            lane[j] = lane[j] + lane[j + s];
        }
    }
    float sum = lane[0];
    for (int64_t i = n16; i < n; i++) {
        sum = fmaf(a[i], b[i], sum);
    }
    return sum;
}

/* kern_sum_sq_cpu and kern_rms_scale_cpu are the 16-lane definition (with tails of every
 * length), kern_dot_cpu(x, x) at multiples of 16; the Engram gate follows its documented formula
 * (the gate's dot in the same order, sigmoid through kern_exp), on this instruction set. */
static void test_sum_sq_and_engram_gate_are_the_16_lane_order(void **state)
{
    enum { N = 5200, M = 4, H = 101 }; /* H: a tail past the last 16 */
    static float x[N];
    (void)state;
    for (int i = 0; i < N; i++) {
        x[i] = frand(3.0f);
    }
    for (int64_t n = 0; n <= 100; n++) {
        float got = kern_sum_sq_cpu(x + 3, n), want = ref_dot16(x + 3, x + 3, n);
        assert_memory_equal(&got, &want, sizeof(float));
        if (n > 0) {
            float rs = kern_rms_scale_cpu(x + 3, n, 1e-6f);
            float rs_want = 1.0f / sqrtf(want / (float)n + 1e-6f);
            assert_memory_equal(&rs, &rs_want, sizeof(float));
        }
    }
    for (int64_t n = 16; n <= N; n += 16 * 13) {
        float got = kern_sum_sq_cpu(x, n), dot = kern_dot_cpu(x, x, n);
        assert_memory_equal(&got, &dot, sizeof(float));
    }
    {
        static float X[M * H], Xw[M * H], kv[(M + 1) * H], qw[M * H], kw[M * H];
        for (int i = 0; i < M * H; i++) {
            X[i] = frand(1.0f);
            qw[i] = 1.0f + frand(0.1f);
            kw[i] = 1.0f + frand(0.1f);
        }
        for (int i = 0; i < (M + 1) * H; i++) {
            kv[i] = frand(1.0f);
        }
        memcpy(Xw, X, sizeof(X));
        assert_int_equal(kern_engram_gate_cpu(NULL, Xw, kv, qw, kw, 1, M, H, 1e-6f), TDM_OK);
        for (int i = 0; i < M; i++) {
            float t[H];
            for (int c = 0; c < H; c++) {
                t[c] = (X[i * H + c] * qw[i * H + c]) * kw[i * H + c];
            }
            float dot = ref_dot16(t, kv + i * H, H);
            float rs_x = 1.0f / sqrtf(ref_dot16(X + i * H, X + i * H, H) / (float)H + 1e-6f);
            float rs_k = 1.0f / sqrtf(ref_dot16(kv + i * H, kv + i * H, H) / (float)H + 1e-6f);
            float gam = ((dot * rs_x) * rs_k) / (float)sqrt((double)H);
            float mag = fabsf(gam) > 1e-6f ? fabsf(gam) : 1e-6f;
            float z = (gam >= 0.0f ? 1.0f : -1.0f) * sqrtf(mag);
            float g = 1.0f / (1.0f + kern_exp(-z));
            for (int c = 0; c < H; c++) {
                volatile float gv = g * kv[M * H + c]; /* no fused multiply-add here */
                float want = kern_bf16_round(X[i * H + c] + gv);
                assert_memory_equal(&Xw[i * H + c], &want, sizeof(float));
            }
        }
    }
}

/* kern_log1p (kernels/attention.h): within 2 ulp of log1p (double) on 2^20 + 1 evenly spaced
 * points of [0, 1] (1.95 at worst when written), 0 at 0, NaN for NaN, t for tiny t. */
static void test_log1p_within_two_ulp(void **state)
{
    double worst = 0.0;
    float worst_t = 0.0f;
    (void)state;
    for (int i = 0; i <= (1 << 20); i++) {
        float t = (float)i / (float)(1 << 20);
        double want = log1p((double)t);
        float got = kern_log1p(t);
        if (want == 0.0) {
            assert_true(got == 0.0f);
            continue;
        }
        int e;
        (void)frexp(want, &e);
        double u = fabs((double)got - want) / ldexp(1.0, e - 24);
        if (u > worst) {
            worst = u;
            worst_t = t;
        }
    }
    print_message("kern_log1p: worst %.3f ulp at %a\n", worst, (double)worst_t);
    if (worst >= 2.0) {
        fail_msg("kern_log1p: %.3f ulp at %a", worst, (double)worst_t);
    }
    assert_true(isnan(kern_log1p(NAN)));
    assert_true(kern_log1p(0x1p-100f) == 0x1p-100f); /* log1p(t) = t for tiny t */
}

/* Distance of kern_exp's y from e^x (double) in units of y's last place (the ulp of e^x's binade;
 * below FP32's normal range the subnormal spacing 2^-149). */
static double exp_ulps(float x, float y)
{
    double t = exp((double)x);
    int e;
    if (t < 0x1p-126) {
        return fabs((double)y - t) / 0x1p-149;
    }
    if (t > 0x1.fffffep127) { /* rounds to +inf in FP32 */
        return isinf(y) && y > 0.0f ? 0.0 : INFINITY;
    }
    (void)frexp(t, &e);
    return fabs((double)y - t) / ldexp(1.0, e - 24);
}

/* kern_exp (kernels/attention.h): within 1 ulp of e^x on every 61st float of [-110, 90], exact
 * at the edges; the vector path of this instruction set (cpu_vec_ops()->exp_n, the one the
 * attention softmax uses) equals it bit for bit on every 257th bit pattern (NaNs, infinities,
 * subnormals included) and on tails of every length. */
static void test_exp_within_one_ulp_and_lanes_equal(void **state)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    double worst = 0.0;
    float worst_x = 0.0f;
    (void)state;
    for (float x = -110.0f; x <= 90.0f;) {
        uint32_t b;
        double u = exp_ulps(x, kern_exp(x));
        if (u > worst) {
            worst = u;
            worst_x = x;
        }
        memcpy(&b, &x, sizeof(b));
        b = x < 0.0f ? (b > 61u + 0x80000000u ? b - 61u : 0u) : b + 61u;
        x = from_bits(b);
    }
    if (worst >= 1.0) {
        fail_msg("kern_exp: %.3f ulp at %a", worst, (double)worst_x);
    }
    assert_true(kern_exp(0.0f) == 1.0f && kern_exp(-0.0f) == 1.0f);
    assert_true(kern_exp(-INFINITY) == 0.0f && kern_exp(-104.0f) == 0.0f);
    assert_true(isinf(kern_exp(INFINITY)) && isinf(kern_exp(89.0f)));
    assert_true(isfinite(kern_exp(88.72f)) && kern_exp(88.72f) > 0x1.fp127f);
    assert_true(kern_exp(-103.0f) > 0.0f && kern_exp(-103.0f) < 0x1p-126f);
    {
        float nan_in = from_bits(0x7FC01234u), nan_out = kern_exp(nan_in);
        assert_memory_equal(&nan_in, &nan_out, sizeof(float));
    }
    if (vec == NULL) {
        return; /* the scalar set: kern_exp is its definition */
    }
    enum { CHUNK = 4096 };
    static float x[CHUNK], y[CHUNK], want[CHUNK];
    uint64_t b = 0;
    while (b < 0x100000000ull) {
        int n = 0;
        for (; n < CHUNK && b < 0x100000000ull; n++, b += 257u) {
            x[n] = from_bits((uint32_t)b);
            want[n] = kern_exp(x[n]);
        }
        vec->exp_n(x, n, y);
        assert_bits_equal(y, want, n, "exp_n");
    }
    { /* the inputs where a fused xc * LOG2E + ROUND would change k (found exhaustively) */
        static const uint32_t k_ties[19] = {0x41e61ff7u, 0x41fc4e3au, 0x42145560u, 0x423b2655u,
                                            0x426fd435u, 0x428b5295u, 0x428cb579u, 0xc0d2b77cu,
                                            0xc0ff1402u, 0xc14214cau, 0xc158430du, 0xc16e7150u,
                                            0xc2490340u, 0xc25f3183u, 0xc283013cu, 0xc28cb579u,
                                            0xc2a180d8u, 0xc2a2e3bcu, 0xc2a70c69u};
        for (int i = 0; i < 19; i++) {
            x[i] = from_bits(k_ties[i]);
            want[i] = kern_exp(x[i]);
        }
        vec->exp_n(x, 19, y);
        assert_bits_equal(y, want, 19, "exp_n at k's rounding ties");
    }
    for (int n = 0; n <= 40; n++) { /* whole vectors and tails; in place */
        for (int i = 0; i < n; i++) {
            x[i] = frand(20.0f);
            want[i] = kern_exp(x[i]);
        }
        vec->exp_n(x, n, x);
        assert_bits_equal(x, want, n, "exp_n in place");
    }
}

/* Q_act8, Q_ckv and Q_mx4 codes and scales against kernels/codec_bits.h composed per group. */
static void test_quantizers_match_scalar_codec(void **state)
{
    enum { N = 1024 };
    float x[N];
    uint8_t codes[N], want_codes[N], scales[N / 16], want_scales[N / 16];
    (void)state;
    for (int rep = 0; rep < 300; rep++) {
        for (int i = 0; i < N; i++) {
            x[i] = qdq_input(rep % 5, i % 32);
        }
        if (rep % 7 == 6) {
            x[rnd32() % N] = 0.0f; /* groups of one value, zeros and -0 */
            x[rnd32() % N] = -0.0f;
        }
        /* Q_act8 */
        for (int g = 0; g < N; g += 32) {
            float amax = 0.0f;
            float s;
            for (int i = g; i < g + 32; i++) {
                amax = codec_amax_merge(amax, codec_amax_term(x[i]));
            }
            want_scales[g / 32] = codec_act8_scale(amax);
            s = codec_ue8m0_to_f32(want_scales[g / 32]);
            for (int i = g; i < g + 32; i++) {
                want_codes[i] = codec_e4m3_from_f32(codec_div_rn(x[i], s));
            }
        }
        assert_int_equal(kern_quant_act8_cpu(NULL, x, N / 128, 128, codes, scales), TDM_OK);
        assert_memory_equal(codes, want_codes, N);
        assert_memory_equal(scales, want_scales, N / 32);
        /* Q_ckv (group 16, E4M3 scales) and Q_mx4 (group 32, UE8M0 scales) */
        for (int kind = 0; kind < 2; kind++) {
            int group = kind == 0 ? 16 : 32;
            for (int g = 0; g < N; g += group) {
                float amax = 0.0f;
                float s;
                for (int i = g; i < g + group; i++) {
                    amax = codec_amax_merge(amax, codec_amax_term(x[i]));
                }
                want_scales[g / group] = kind == 0 ? codec_ckv_scale(amax) : codec_mx4_scale(amax);
                s = kind == 0 ? codec_e4m3_to_f32(want_scales[g / group])
                              : codec_ue8m0_to_f32(want_scales[g / group]);
                for (int i = g; i < g + group; i += 2) {
                    uint8_t lo = codec_e2m1_from_f32(codec_div_rn(x[i], s));
                    uint8_t hi = codec_e2m1_from_f32(codec_div_rn(x[i + 1], s));
                    want_codes[i / 2] = (uint8_t)(lo | (hi << 4));
                }
            }
            if (kind == 0) {
                assert_int_equal(kern_quant_ckv_cpu(NULL, x, N / 64, 64, codes, scales), TDM_OK);
            } else {
                assert_int_equal(kern_quant_mx4_cpu(NULL, x, N / 64, 64, codes, scales), TDM_OK);
            }
            assert_memory_equal(codes, want_codes, N / 2);
            assert_memory_equal(scales, want_scales, N / group);
        }
    }
}

/* Runs under kern_cpu_isa() and under the scalar set (the plain loops, the definition). */
static kern_cpu_isa_t g_test_isa;

static void use_scalar(void)
{
    assert_int_equal(kern_cpu_isa_set(KERN_ISA_SCALAR), TDM_OK);
}

static void use_test_isa(void)
{
    assert_int_equal(kern_cpu_isa_set(g_test_isa), TDM_OK);
}

/* Index scores, RMSNorm, RoPE, the Engram gate, mHC and attention at sizes with tails (heads not
 * a multiple of 4, H and dim not multiples of 16, d not a multiple of 64), against the scalar
 * set's plain loops, bit for bit. */
static void test_other_kernels_match_scalar_set(void **state)
{
    enum { NH = 7, DI = 48, NK = 37, DIM = 101, ROWS = 3, M = 4, H = 40, D = 80, NA = 9, NB = 4 };
    static float q[NH * DI], w[NH], keys[NK * DI], sc[NK], sc_ref[NK];
    static float x[ROWS * DIM], gamma[DIM], y[ROWS * DIM], y_ref[ROWS * DIM];
    static float rx[ROWS * 2 * 64], rx_ref[ROWS * 2 * 64], freqs[32];
    static float X[M * H], X_ref[M * H], Xt[M * H], kv[(M + 1) * H], qw[M * H], kw[M * H];
    static float yc[H], yc_ref[H];
    static float pre[M], post[M], Mx[M * M], F[H], o[2 * D], o_ref[2 * D];
    static float aq[2 * D], ka[NA * D], kb[NB * D], sink[2], scratch[2 * (NA + NB)];
    int64_t pos[ROWS] = {0, 17, 4099};
    (void)state;
    g_test_isa = kern_cpu_isa();
    assert_int_equal(kern_rope_freqs(32, 10000.0, NULL, freqs), TDM_OK);
    for (int rep = 0; rep < 40; rep++) {
        for (int i = 0; i < NH * DI; i++) {
            q[i] = frand(1.0f);
        }
        for (int i = 0; i < NH; i++) {
            w[i] = frand(1.0f);
        }
        for (int i = 0; i < NK * DI; i++) {
            keys[i] = frand(1.0f);
        }
        for (int i = 0; i < ROWS * DIM; i++) {
            x[i] = frand(8.0f);
        }
        for (int i = 0; i < DIM; i++) {
            gamma[i] = frand(2.0f);
        }
        for (int i = 0; i < ROWS * 2 * 64; i++) {
            rx[i] = i % 61 == 0 ? from_bits(rnd32() | 0x7F800001u) : frand(4.0f); /* NaNs too */
        }
        for (int i = 0; i < M * H; i++) {
            X[i] = kern_bf16_round(frand(3.0f));
            qw[i] = frand(1.0f);
            kw[i] = frand(1.0f);
        }
        for (int i = 0; i < (M + 1) * H; i++) {
            kv[i] = frand(2.0f);
        }
        for (int i = 0; i < M; i++) {
            pre[i] = frand(1.0f);
            post[i] = frand(2.0f);
        }
        for (int i = 0; i < M * M; i++) {
            Mx[i] = frand(1.0f);
        }
        for (int i = 0; i < H; i++) {
            F[i] = frand(4.0f);
        }
        for (int i = 0; i < 2 * D; i++) {
            aq[i] = frand(1.0f);
        }
        for (int i = 0; i < NA * D; i++) {
            ka[i] = frand(1.0f);
        }
        for (int i = 0; i < NB * D; i++) {
            kb[i] = frand(1.0f);
        }
        sink[0] = frand(2.0f);
        sink[1] = frand(2.0f);

        use_scalar();
        assert_int_equal(kern_index_scores_cpu(NULL, q, w, NH, DI, keys, NK, sc_ref), TDM_OK);
        assert_int_equal(kern_rmsnorm_cpu(NULL, x, DIM, ROWS, DIM, gamma, 1e-6f, y_ref, DIM),
                         TDM_OK);
        memcpy(rx_ref, rx, sizeof(rx));
        assert_int_equal(
            kern_rope_cpu(NULL, rx_ref, ROWS, 2, 64, 32, pos, freqs, (kern_rope_dir_t)(rep % 2)),
            TDM_OK);
        memcpy(X_ref, X, sizeof(X));
        assert_int_equal(kern_engram_gate_cpu(NULL, X_ref, kv, qw, kw, 1, M, H, 1e-6f), TDM_OK);
        assert_int_equal(kern_mhc_update_cpu(NULL, post, F, Mx, 1, M, H, X_ref), TDM_OK);
        assert_int_equal(kern_mhc_collapse_cpu(NULL, pre, X_ref, 1, M, H, yc_ref), TDM_OK);
        assert_int_equal(
            kern_attention_cpu(NULL, aq, ka, NA, kb, NB, sink, 2, D, 0.1f, scratch, o_ref), TDM_OK);
        use_test_isa();

        assert_int_equal(kern_index_scores_cpu(NULL, q, w, NH, DI, keys, NK, sc), TDM_OK);
        assert_bits_equal(sc, sc_ref, NK, "index_scores");
        assert_int_equal(kern_rmsnorm_cpu(NULL, x, DIM, ROWS, DIM, gamma, 1e-6f, y, DIM), TDM_OK);
        assert_bits_equal(y, y_ref, ROWS * DIM, "rmsnorm");
        assert_int_equal(
            kern_rope_cpu(NULL, rx, ROWS, 2, 64, 32, pos, freqs, (kern_rope_dir_t)(rep % 2)),
            TDM_OK);
        assert_bits_equal(rx, rx_ref, ROWS * 2 * 64, "rope");
        memcpy(Xt, X, sizeof(X));
        assert_int_equal(kern_engram_gate_cpu(NULL, Xt, kv, qw, kw, 1, M, H, 1e-6f), TDM_OK);
        assert_int_equal(kern_mhc_update_cpu(NULL, post, F, Mx, 1, M, H, Xt), TDM_OK);
        assert_bits_equal(Xt, X_ref, M * H, "engram gate + mhc_update");
        assert_int_equal(kern_mhc_collapse_cpu(NULL, pre, Xt, 1, M, H, yc), TDM_OK);
        assert_bits_equal(yc, yc_ref, H, "mhc_collapse");
        assert_int_equal(kern_attention_cpu(NULL, aq, ka, NA, kb, NB, sink, 2, D, 0.1f, scratch, o),
                         TDM_OK);
        assert_bits_equal(o, o_ref, 2 * D, "attention d=80");
    }
}

/* The kernels that work on several rows at once (RMS sums side by side, the Sinkhorn loop with a
 * row per lane, SwiGLU's vector tail, BF16 rounding) give, on this set, the bits of the scalar
 * set and of one row per call, at row counts with tails; NaN, infinities and clamped values
 * included. */
static void test_row_blocked_kernels_match_row_at_a_time(void **state)
{
    enum { M = 4, H = 24, MH = M * H, NR = 37, I = 100, NB = 1000 };
    static float x[NR * MH], raw[NR * (2 + M) * M], base[(2 + M) * M], scale[3];
    static float pre[NR * M], post[NR * M], Mx[NR * M * M], pre1[M], post1[M], M1[M * M];
    static float pre_s[NR * M], post_s[NR * M], M_s[NR * M * M];
    static float sc[NR], gu[NR * 2 * I], wr[NR], h[NR * I], h_ref[NR * I];
    static float a[NB], b[NB], y[NB], y_ref[NB], gamma[MH], yn[NR * MH], yn1[MH];
    (void)state;
    g_test_isa = kern_cpu_isa();
    for (int rep = 0; rep < 8; rep++) {
        for (int i = 0; i < NR * MH; i++) {
            x[i] = frand(rep % 2 == 0 ? 3.0f : 1e-19f);
        }
        for (int i = 0; i < NR * (2 + M) * M; i++) {
            raw[i] = frand(4.0f);
        }
        for (int i = 0; i < (2 + M) * M; i++) {
            base[i] = frand(1.0f);
        }
        for (int i = 0; i < 3; i++) {
            scale[i] = frand(1.0f);
        }
        for (int i = 0; i < MH; i++) {
            gamma[i] = frand(2.0f);
        }
        /* RMS scales of every row count 0..NR (blocks and tails), stride > n */
        for (int n = 0; n <= NR; n += 6) {
            kern_rms_scales_cpu(x, MH, n, MH - 5, 1e-20f, sc);
            for (int r = 0; r < n; r++) {
                float want = kern_rms_scale_cpu(x + r * MH, MH - 5, 1e-20f);
                assert_memory_equal(&sc[r], &want, sizeof(float));
            }
        }
        /* RMSNorm over NR rows = in place = one row per call */
        assert_int_equal(kern_rmsnorm_cpu(NULL, x, MH, NR, MH, gamma, 1e-20f, yn, MH), TDM_OK);
        memcpy(h, x, sizeof(x));
        assert_int_equal(kern_rmsnorm_cpu(NULL, h, MH, NR, MH, gamma, 1e-20f, h, MH), TDM_OK);
        assert_bits_equal(h, yn, NR * MH, "rmsnorm in place");
        for (int r = 0; r < NR; r++) {
            assert_int_equal(kern_rmsnorm_cpu(NULL, x + r * MH, MH, 1, MH, gamma, 1e-20f, yn1, MH),
                             TDM_OK);
            assert_bits_equal(yn + r * MH, yn1, MH, "rmsnorm rows");
        }
        /* mHC coefficients: NR rows (vector Sinkhorn, 16 rows a pass) = one row per call (the
         * row loop) = the scalar set */
        kern_mhc_params_t p = {base, scale, M, 20, 1e-20f, 1e-6f};
        assert_int_equal(kern_mhc_coeffs_cpu(NULL, &p, x, NR, H, raw, pre, post, Mx), TDM_OK);
        for (int r = 0; r < NR; r++) {
            assert_int_equal(kern_mhc_coeffs_cpu(NULL, &p, x + r * MH, 1, H, raw + r * (2 + M) * M,
                                                 pre1, post1, M1),
                             TDM_OK);
            assert_bits_equal(pre + r * M, pre1, M, "mhc pre");
            assert_bits_equal(post + r * M, post1, M, "mhc post");
            assert_bits_equal(Mx + r * M * M, M1, M * M, "mhc M");
        }
        use_scalar();
        assert_int_equal(kern_mhc_coeffs_cpu(NULL, &p, x, NR, H, raw, pre_s, post_s, M_s), TDM_OK);
        use_test_isa();
        assert_bits_equal(Mx, M_s, NR * M * M, "mhc M vs scalar set");
        /* SwiGLU (I = 100: six vector chunks and a tail), clamps, NaN and infinities */
        for (int i = 0; i < NR * 2 * I; i++) {
            gu[i] = i % 53 == 0   ? from_bits(0x7FC00001u + rnd32() % 7u)
                    : i % 59 == 0 ? (rnd32() % 2 ? INFINITY : -INFINITY)
                                  : frand(rep % 2 == 0 ? 14.0f : 3.0f);
        }
        for (int r = 0; r < NR; r++) {
            wr[r] = frand(1.5f);
        }
        use_scalar();
        assert_int_equal(kern_swiglu_cpu(NULL, gu, rep % 2 ? wr : NULL, NR, I, 10.0f, h_ref),
                         TDM_OK);
        use_test_isa();
        assert_int_equal(kern_swiglu_cpu(NULL, gu, rep % 2 ? wr : NULL, NR, I, 10.0f, h), TDM_OK);
        assert_bits_equal(h, h_ref, NR * I, "swiglu");
        /* RoPE with a vector part and a pair tail (d_r 20) and an odd unrotated part, both
         * directions, NaNs and infinities among the values */
        {
            float fr[10], rx[NR * 2 * 30], rx_ref[NR * 2 * 30];
            int64_t rpos[NR];
            assert_int_equal(kern_rope_freqs(20, 10000.0, NULL, fr), TDM_OK);
            for (int i = 0; i < NR * 2 * 30; i++) {
                rx[i] = i % 41 == 0 ? from_bits(rnd32() | 0x7F800000u) : frand(5.0f);
            }
            for (int r = 0; r < NR; r++) {
                rpos[r] = (int64_t)(rnd32() % 70000u);
            }
            memcpy(rx_ref, rx, sizeof(rx));
            use_scalar();
            assert_int_equal(
                kern_rope_cpu(NULL, rx_ref, NR, 2, 30, 20, rpos, fr, (kern_rope_dir_t)(rep % 2)),
                TDM_OK);
            use_test_isa();
            assert_int_equal(
                kern_rope_cpu(NULL, rx, NR, 2, 30, 20, rpos, fr, (kern_rope_dir_t)(rep % 2)),
                TDM_OK);
            assert_bits_equal(rx, rx_ref, NR * 2 * 30, "rope d_r 20");
        }
        /* BF16 rounding and the BF16 residual sum, n with a tail, NaN payloads and overflow */
        for (int i = 0; i < NB; i++) {
            a[i] = i % 31 == 0 ? from_bits(rnd32() | 0x7F800001u) : from_bits(rnd32());
            b[i] = frand(100.0f);
        }
        use_scalar();
        assert_int_equal(kern_add_bf16_cpu(NULL, a, b, NB - 3, y_ref), TDM_OK);
        use_test_isa();
        assert_int_equal(kern_add_bf16_cpu(NULL, a, b, NB - 3, y), TDM_OK);
        assert_bits_equal(y, y_ref, NB - 3, "add_bf16");
        use_scalar();
        assert_int_equal(kern_bf16_round_cpu(NULL, a, NB - 3, y_ref), TDM_OK);
        use_test_isa();
        assert_int_equal(kern_bf16_round_cpu(NULL, a, NB - 3, y), TDM_OK);
        assert_bits_equal(y, y_ref, NB - 3, "bf16_round");
    }
}

/* Attention of every head in one pass (the vector sets' multi-head blocks), and with the selected
 * rows in place (kern_attention_sel_cpu), against the scalar set's one-head-at-a-time loops over
 * the gathered rows, bit for bit: head counts around the register blocks (1-9),
 * key counts 0-29 split between the window and the selected part, d with and without a 64-column
 * tail; logits with ties, zero maxima of either sign, -inf, +inf and NaN among them. */
static void test_attention_heads_match_scalar_set(void **state)
{
    enum { NHM = 9, DM = 128, NAM = 20, NBM = 9 };
    static float q[NHM * DM], ka[NAM * DM], kb[NBM * DM], sink[NHM];
    static float o[NHM * DM], o_ref[NHM * DM], scratch[NHM * (NAM + NBM)];
    static float rows[2 * NBM * DM];
    int32_t sel[NBM];
    static const int64_t ds[3] = {16, 80, 128};
    (void)state;
    g_test_isa = kern_cpu_isa();
    for (int rep = 0; rep < 300; rep++) {
        int64_t nh = 1 + (int64_t)(rnd32() % NHM), d = ds[rep % 3];
        int64_t na = (int64_t)(rnd32() % (NAM + 1)), nb = (int64_t)(rnd32() % (NBM + 1));
        int special = rep % 5;
        for (int64_t i = 0; i < nh * d; i++) {
            q[i] = special == 1 ? 0.0f : frand(1.0f);
        }
        for (int64_t i = 0; i < na * d; i++) {
            ka[i] = frand(1.0f);
        }
        for (int64_t i = 0; i < 2 * NBM * d; i++) {
            rows[i] = frand(1.0f);
        }
        for (int64_t i = 0; i < nb; i++) { /* the selected part: rows of a matrix, gathered */
            sel[i] = (int32_t)(rnd32() % (2 * NBM));
            memcpy(kb + i * d, rows + sel[i] * d, (size_t)d * sizeof(float));
        }
        if (special == 1 && nh > 1) {
            q[d] = -0.0f; /* head 1: every logit -0 or +0 (sign by key) */
        }
        if (special == 2 && na > 2) { /* ties: a repeated key; head 0 sees -inf and +inf */
            memcpy(ka + 2 * d, ka, (size_t)d * sizeof(float));
            ka[d] = INFINITY;
            q[0] = 1.0f;
        }
        if (special == 3 && na > 0) { /* a NaN logit */
            ka[0] = NAN;
        }
        if (special == 4 && na > 1) {
            ka[d] = -INFINITY;
            q[0] = 1.0f;
        }
        for (int64_t h = 0; h < nh; h++) {
            sink[h] = frand(2.0f);
        }
        use_scalar();
        assert_int_equal(kern_attention_cpu(NULL, q, ka, na, nb > 0 ? kb : NULL, nb, sink, nh, d,
                                            0.125f, scratch, o_ref),
                         TDM_OK);
        use_test_isa();
        memset(o, 0x5A, sizeof(o));
        assert_int_equal(kern_attention_cpu(NULL, q, ka, na, nb > 0 ? kb : NULL, nb, sink, nh, d,
                                            0.125f, scratch, o),
                         TDM_OK);
        assert_bits_equal(o, o_ref, nh * d, "attention heads");
        memset(o, 0x5A, sizeof(o)); /* the same keys, the selected part in place */
        assert_int_equal(kern_attention_sel_cpu(NULL, q, ka, na, rows, sel, nb, sink, nh, d,
                                                0.125f, scratch, o),
                         TDM_OK);
        assert_bits_equal(o, o_ref, nh * d, "attention with selected rows in place");
    }
    sel[0] = -1; /* a negative row, rows or sel missing */
    assert_int_equal(kern_attention_sel_cpu(NULL, q, ka, 1, rows, sel, 1, sink, 1, 16, 0.125f,
                                            scratch, o),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_attention_sel_cpu(NULL, q, ka, 1, rows, NULL, 1, sink, 1, 16, 0.125f,
                                            scratch, o),
                     TDM_ERR_INVALID_ARG);
}

/* kern_attention_rows_cpu: rows of different key counts (none, window only, selected only, both;
 * two rows sharing their keys) equal kern_attention_cpu row by row, bit for bit; a bad row
 * (too many keys, a missing key pointer) is refused before any output is written. */
static void test_attention_rows_equal_rows_one_by_one(void **state)
{
    enum { R = 6, NH = 5, D = 48, NA = 40, NB = 30 };
    static float q[R * NH * D], ka[NA * D], kb[NB * D], sink[NH], scratch[NH * (NA + NB)];
    static float o[R * NH * D], o_ref[R * NH * D];
    static const int64_t n_a[R] = {0, 7, 0, 40, 13, 13}, n_b[R] = {0, 0, 9, 30, 5, 5};
    kern_attn_row_t rows[R];
    (void)state;
    for (int i = 0; i < R * NH * D; i++) {
        q[i] = frand(1.0f);
    }
    for (int i = 0; i < NA * D; i++) {
        ka[i] = frand(1.0f);
    }
    for (int i = 0; i < NB * D; i++) {
        kb[i] = frand(1.0f);
    }
    for (int h = 0; h < NH; h++) {
        sink[h] = frand(2.0f);
    }
    for (int i = 0; i < R; i++) {
        rows[i] = (kern_attn_row_t){q + i * NH * D,
                                    n_a[i] > 0 ? ka + (i % 2) * D : NULL,
                                    n_b[i] > 0 ? kb : NULL,
                                    o + i * NH * D,
                                    n_a[i],
                                    n_b[i]};
        if (n_a[i] > 0 && i % 2 != 0) {
            rows[i].n_a = n_a[i] < NA - 1 ? n_a[i] : NA - 1; /* stays inside ka */
        }
        assert_int_equal(kern_attention_cpu(NULL, rows[i].q, rows[i].keys_a, rows[i].n_a,
                                            rows[i].keys_b, rows[i].n_b, sink, NH, D, 0.144f,
                                            scratch, o_ref + i * NH * D),
                         TDM_OK);
    }
    memset(o, 0x5A, sizeof(o));
    assert_int_equal(kern_attention_rows_cpu(NULL, rows, R, sink, NH, D, 0.144f, scratch), TDM_OK);
    assert_bits_equal(o, o_ref, R * NH * D, "attention_rows");
    assert_int_equal(kern_attention_rows_cpu(NULL, rows, 0, NULL, NH, D, 0.144f, NULL), TDM_OK);
    memset(o, 0x5A, sizeof(o));
    memcpy(o_ref, o, sizeof(o));
    rows[4].n_b = KERN_ATTENTION_ROWS_MAX_KEYS; /* too many keys */
    assert_int_equal(kern_attention_rows_cpu(NULL, rows, R, sink, NH, D, 0.144f, scratch),
                     TDM_ERR_INVALID_ARG);
    rows[4].n_b = n_b[4];
    rows[5].keys_b = NULL; /* n_b > 0 without keys */
    assert_int_equal(kern_attention_rows_cpu(NULL, rows, R, sink, NH, D, 0.144f, scratch),
                     TDM_ERR_INVALID_ARG);
    assert_bits_equal(o, o_ref, R * NH * D, "attention_rows refused: outputs untouched");
    assert_int_equal(kern_attention_rows_cpu(NULL, NULL, 2, sink, NH, D, 0.144f, scratch),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_attention_rows_cpu(NULL, rows, 2, sink, NH, 40, 0.144f, scratch),
                     TDM_ERR_INVALID_ARG); /* d not a multiple of 16 */
}

/* Indexer scores with head counts around the register blocks (1-17: whole blocks of 4 and 8
 * heads and tails), key counts 0-39 (pairs, blocks of 16 and a tail) and key widths of both
 * presets (64, 128: AVX-512's constant-width 16-key blocks) and others, against the scalar set,
 * bit for bit; negative dots (the max(0, .)) and negative weights included. */
static void test_index_scores_blocks_match_scalar_set(void **state)
{
    enum { NHX = 17, DX = 128, NKX = 39 };
    static float q[NHX * DX], w[NHX], keys[NKX * DX], sc[NKX], sc_ref[NKX];
    static const int64_t ds[4] = {16, 48, 64, 128};
    (void)state;
    g_test_isa = kern_cpu_isa();
    for (int rep = 0; rep < 200; rep++) {
        int64_t nh = 1 + (int64_t)(rnd32() % NHX), d = ds[rep % 4];
        int64_t nk = (int64_t)(rnd32() % (NKX + 1));
        for (int64_t i = 0; i < nh * d; i++) {
            q[i] = frand(1.0f);
        }
        for (int64_t i = 0; i < nh; i++) {
            w[i] = frand(1.0f);
        }
        for (int64_t i = 0; i < nk * d; i++) {
            keys[i] = frand(1.0f);
        }
        use_scalar();
        assert_int_equal(kern_index_scores_cpu(NULL, q, w, nh, d, keys, nk, sc_ref), TDM_OK);
        use_test_isa();
        assert_int_equal(kern_index_scores_cpu(NULL, q, w, nh, d, keys, nk, sc), TDM_OK);
        assert_bits_equal(sc, sc_ref, nk, "index_scores blocks");
    }
}

/* TANDEM_TEST_EXPECT_WIDEST (scripts/avx2-check sets avx2, scripts/neon-check neon): the widest
 * set this CPU runs, and the kernels' default choice where TANDEM_CPU_ISA is unset, must be that
 * one. A check on an emulated CPU then fails where the emulator did not give the CPU it was asked
 * for, instead of passing on the scalar set alone. Returns 1 when it holds or is not asked. */
static int widest_is_expected(void)
{
    const char *want = getenv("TANDEM_TEST_EXPECT_WIDEST");
    const char *cap = getenv("TANDEM_CPU_ISA");
    kern_cpu_isa_t expected;
    kern_cpu_isa_t widest = KERN_ISA_SCALAR;
    if (want == NULL || want[0] == '\0') {
        return 1;
    }
    if (kern_cpu_isa_parse(want, &expected) != TDM_OK) {
        printf("TANDEM_TEST_EXPECT_WIDEST=%s: expected scalar, avx2, avx512 or neon\n", want);
        return 0;
    }
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        if (kern_cpu_isa_supported((kern_cpu_isa_t)isa)) {
            widest = (kern_cpu_isa_t)isa; /* avx2/avx512 and neon never both */
        }
    }
    if (widest != expected) {
        printf("TANDEM_TEST_EXPECT_WIDEST=%s: this CPU's widest set is %s\n", want,
               kern_cpu_isa_name(widest));
        return 0;
    }
    if ((cap == NULL || cap[0] == '\0') && kern_cpu_isa() != expected) {
        printf("TANDEM_TEST_EXPECT_WIDEST=%s: the kernels chose %s by default\n", want,
               kern_cpu_isa_name(kern_cpu_isa()));
        return 0;
    }
    printf("[ OK       ] widest set %s, as TANDEM_TEST_EXPECT_WIDEST asks\n", want);
    return 1;
}

/* The whole group once per instruction set this CPU runs (kernels/cpu_isa.h): each must give
 * the scalar definitions' bits. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_every_code_and_scale),
        cmocka_unit_test(test_qdq_act8_matches_scalar_composition),
        cmocka_unit_test(test_gemv_and_pooled_gemm_match_reference),
        cmocka_unit_test(test_quantized_gemm_matches_bf16_expansion),
        cmocka_unit_test(test_few_row_gemm_matches_reference),
        cmocka_unit_test(test_mxfp4_few_rows_every_scale),
        cmocka_unit_test(test_many_row_tiles_match_reference),
        cmocka_unit_test(test_many_row_bf16_rounding_matches_reference),
        cmocka_unit_test(test_quantized_checks),
        cmocka_unit_test(test_two_callers_share_the_pool),
        cmocka_unit_test(test_mhc_matches_scalar_loops),
        cmocka_unit_test(test_attention_matches_scalar_loops),
        cmocka_unit_test(test_exp_within_one_ulp_and_lanes_equal),
        cmocka_unit_test(test_log1p_within_two_ulp),
        cmocka_unit_test(test_sum_sq_and_engram_gate_are_the_16_lane_order),
        cmocka_unit_test(test_quantizers_match_scalar_codec),
        cmocka_unit_test(test_other_kernels_match_scalar_set),
        cmocka_unit_test(test_row_blocked_kernels_match_row_at_a_time),
        cmocka_unit_test(test_attention_heads_match_scalar_set),
        cmocka_unit_test(test_attention_rows_equal_rows_one_by_one),
        cmocka_unit_test(test_index_scores_blocks_match_scalar_set),
    };
    int failures = 0;
    int n_run = 0;
    if (!widest_is_expected()) {
        return 1;
    }
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        char name[64];
        if (!kern_cpu_isa_supported((kern_cpu_isa_t)isa)) {
            printf("[ SKIPPED  ] isa %s: this CPU or build lacks it\n",
                   kern_cpu_isa_name((kern_cpu_isa_t)isa));
            continue;
        }
        assert_int_equal(kern_cpu_isa_set((kern_cpu_isa_t)isa), TDM_OK);
        snprintf(name, sizeof(name), "kernels_simd[%s]", kern_cpu_isa_name((kern_cpu_isa_t)isa));
        failures +=
            _cmocka_run_group_tests(name, tests, sizeof(tests) / sizeof(tests[0]), NULL, NULL);
        n_run++;
    }
    return failures != 0 || n_run == 0;
}
