/* test_gemm_fp8_clean.c - the FP8 clean map (kernels/gemm.h kern_mat_fp8_clean_fill) and the
 * GEMM's raw E4M3 decode that it lets the x86 sets use: the map marks exactly the blocks without
 * a subnormal code, a row view carries the right bits, and kern_gemm_cpu with the map gives the
 * bits of kern_gemm_ref_cpu (and of the BF16 expansion) under every set this CPU runs, for x
 * whose scaled copy is exact (the raw path), too large for it (the FP16 fold), and too large for
 * any fold (the plain order), at one row (the GEMV) and several (the few-row tile).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/cpu_isa.h"
#include "kernels/gemm.h"

enum { N_OUT = 37, N_IN = 96, N_ROWS_MAX = 5 }; /* 10 row groups (the last of 1 row), 3 columns */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static int is_subnormal(uint8_t code)
{
    return (code & 0x78) == 0 && (code & 0x07) != 0;
}

/* Random codes without NaN or subnormal codes, then subnormal codes planted in a few blocks
 * (rows, columns): (0, 0), (33, 10), (36, 95) (the 1-row last group) and (8, 64) twice. So the
 * first 32-row scale block has 6 of its 8 4-row groups clean throughout (the AVX2 few-row path
 * decodes those raw, groups 0 and 2 through FP16: gemm_body.inc gemv_rows_fp8s), the last block
 * none (all through FP16). */
static void make_codes(uint8_t *codes, uint8_t *scales)
{
    static const int planted[][2] = {{0, 0}, {33, 10}, {36, 95}, {8, 64}, {9, 70}};
    for (int i = 0; i < N_OUT * N_IN; i++) {
        uint8_t c = (uint8_t)rnd32();
        if ((c & 0x7F) == 0x7F || is_subnormal(c)) {
            c = (uint8_t)((c & 0x80) | 0x38); /* 1.0, signed as drawn */
        }
        codes[i] = c;
    }
    codes[3] = 0x00; /* zero codes are clean */
    codes[N_IN + 7] = 0x80;
    for (size_t p = 0; p < sizeof(planted) / sizeof(planted[0]); p++) {
        codes[planted[p][0] * N_IN + planted[p][1]] = p % 2 == 0 ? 0x03 : 0x85;
    }
    for (int i = 0; i < (N_OUT + 31) / 32 * (N_IN / 32); i++) {
        scales[i] = (uint8_t)(112 + rnd32() % 12);
    }
}

static int map_bit(const uint8_t *map, int64_t b)
{
    return (map[b / 8] >> (b % 8)) & 1;
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

static void test_map_marks_blocks_without_subnormal_codes(void **state)
{
    static uint8_t codes[N_OUT * N_IN], scales[16], map[8];
    kern_mat_t m = {KERN_MAT_FP8, N_OUT, N_IN, codes, scales, NULL};
    kern_mat_t mx = {KERN_MAT_MXFP4, N_OUT, N_IN, codes, scales, NULL};
    kern_mat_t view;
    int n_clean = 0;

    (void)state;
    make_codes(codes, scales);
    /* ceil(37 / 4) = 10 groups x 3 columns = 30 bits */
    assert_int_equal(kern_mat_fp8_clean_bytes(&m), 4);
    assert_int_equal(kern_mat_fp8_clean_bytes(&mx), 0);
    assert_int_equal(kern_mat_fp8_clean_bytes(NULL), 0);
    assert_int_equal(kern_mat_fp8_clean_fill(&mx, map), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_mat_fp8_clean_fill(&m, NULL), TDM_ERR_INVALID_ARG);
    memset(map, 0xAB, sizeof(map));
    assert_int_equal(kern_mat_fp8_clean_fill(&m, map), TDM_OK);
    for (int g = 0; g < 10; g++) {
        for (int c = 0; c < 3; c++) {
            int want = 1;
            for (int o = 4 * g; o < 4 * g + 4 && o < N_OUT; o++) {
                for (int i = 32 * c; i < 32 * c + 32; i++) {
                    want &= !is_subnormal(codes[o * N_IN + i]);
                }
            }
            assert_int_equal(map_bit(map, g * 3 + c), want);
            n_clean += want;
        }
    }
    assert_int_equal(n_clean, 30 - 4); /* (8, 64) and (9, 70) share a block */
    assert_int_equal(map[3] >> 6, 0);  /* bits past the map's end stay 0 */
    /* a view from row 32 starts at group 8: byte 8 * 3 / 8 = 3 */
    m.fp8_clean = map;
    assert_int_equal(kern_mat_rows(&m, 32, 5, &view), TDM_OK);
    assert_ptr_equal(view.fp8_clean, map + 3);
    m.fp8_clean = NULL;
    assert_int_equal(kern_mat_rows(&m, 32, 5, &view), TDM_OK);
    assert_null(view.fp8_clean);
}

/* y = kern_gemm_cpu with the map on rows [0, n_rows) of x, against the reference without it */
static void check_gemm(const kern_mat_t *m, const kern_mat_t *mb, const float *x, int n_rows,
                       uint32_t flags, const char *what)
{
    float y[N_ROWS_MAX * N_OUT], y_ref[N_ROWS_MAX * N_OUT];
    kern_mat_t plain = *m;

    plain.fp8_clean = NULL;
    assert_int_equal(kern_gemm_cpu(NULL, m, x, N_IN, n_rows, flags, y, N_OUT), TDM_OK);
    assert_int_equal(kern_gemm_ref_cpu(NULL, &plain, x, N_IN, n_rows, flags, y_ref, N_OUT), TDM_OK);
    assert_bits_equal(y, y_ref, n_rows * N_OUT, what);
    assert_int_equal(kern_gemm_ref_cpu(NULL, mb, x, N_IN, n_rows, flags, y_ref, N_OUT), TDM_OK);
    assert_bits_equal(y, y_ref, n_rows * N_OUT, what);
}

static void test_gemm_with_the_map_equals_the_reference_on_every_set(void **state)
{
    static uint8_t codes[N_OUT * N_IN], scales[16], map[8];
    static uint16_t bf16[N_OUT * N_IN];
    static float x[N_ROWS_MAX * N_IN];
    static const float magnitudes[] = {3.0f, 3e6f, 1e37f, 1e-37f};
    kern_mat_t m = {KERN_MAT_FP8, N_OUT, N_IN, codes, scales, map};
    kern_mat_t mb = {KERN_MAT_BF16, N_OUT, N_IN, bf16, NULL, NULL};
    kern_mat_t view, view_b;
    kern_cpu_isa_t was = kern_cpu_isa();
    int n_sets = 0;

    (void)state;
    make_codes(codes, scales);
    assert_int_equal(kern_mat_check_quantized(&m), 1);
    assert_int_equal(kern_mat_bf16_from_fp8(codes, scales, N_OUT, N_IN, bf16), TDM_OK);
    assert_int_equal(kern_mat_fp8_clean_fill(&m, map), TDM_OK);
    assert_int_equal(kern_mat_rows(&m, 32, 5, &view), TDM_OK);
    assert_int_equal(kern_mat_rows(&mb, 32, 5, &view_b), TDM_OK);
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        if (!kern_cpu_isa_supported((kern_cpu_isa_t)isa)) {
            continue;
        }
        assert_int_equal(kern_cpu_isa_set((kern_cpu_isa_t)isa), TDM_OK);
        n_sets++;
        /* 3: the raw decode where the map allows; 3e6 (x * 2^(S-7) overflows): the FP16 fold
         * only; 1e37 (x * 2^(S-119) overflows) and 1e-37 (denormal x): the plain order */
        for (size_t g = 0; g < sizeof(magnitudes) / sizeof(magnitudes[0]); g++) {
            for (int i = 0; i < N_ROWS_MAX * N_IN; i++) {
                x[i] = ((float)(rnd32() % 2001u) / 1000.0f - 1.0f) * magnitudes[g];
            }
            for (int n_rows = 1; n_rows <= N_ROWS_MAX; n_rows += 2) {
                check_gemm(&m, &mb, x, n_rows, 0, "fp8 with the clean map");
                check_gemm(&m, &mb, x, n_rows, KERN_GEMM_OUT_BF16, "fp8 with the map, bf16 out");
            }
            float y[N_OUT], y_ref[N_OUT];
            assert_int_equal(kern_gemm_cpu(NULL, &view, x, N_IN, 1, 0, y, 5), TDM_OK);
            assert_int_equal(kern_gemm_ref_cpu(NULL, &view_b, x, N_IN, 1, 0, y_ref, 5), TDM_OK);
            assert_bits_equal(y, y_ref, 5, "row view with the map");
        }
    }
    assert_true(n_sets >= 2); /* the scalar set and this CPU's vector set at least */
    assert_int_equal(kern_cpu_isa_set(was), TDM_OK);
}

enum { RANGE_ROWS_MAX = 9 };

/* n_rows rows through each set's range function over output ranges that start and end inside
 * 32-row scale blocks and 4-row clean groups (as the worker pool's chunks can): the FP8 paths scale
 * x once per block of the range (one row: gemm_gemv.inc gemv_fp8_xs; several: gemm_body.inc
 * gemv_rows_fp8s, in groups of rows; fold 2: the raw decode on x86 where the clean groups allow,
 * the FP16 decode in the others; fold 1: the FP16 decode everywhere), and only [o0, o1) of each
 * row is written. */
static void check_ranges_inside_blocks(int n_rows)
{
    static uint8_t codes[N_OUT * N_IN], scales[16], map[8];
    static uint16_t bf16[N_OUT * N_IN];
    static const int ranges[][2] = {{0, 37}, {1, 36}, {5, 33}, {30, 37}, {33, 34}, {2, 3}};
    static const struct {
        float magnitude;
        int fold;
    } xs[] = {{1.0f, 2}, {3e6f, 1}};
    static const struct {
        kern_cpu_isa_t isa;
        int (*range)(const kern_mat_t *, const float *, int64_t, int64_t, uint32_t, float *,
                     int64_t, int64_t, int64_t, int);
    } sets[] = {
        {KERN_ISA_SCALAR, cpu_gemm_range_scalar},
#if defined(__x86_64__)
        {KERN_ISA_AVX2, cpu_gemm_range_avx2},
        {KERN_ISA_AVX512, cpu_gemm_range_avx512},
#endif
#if defined(__aarch64__)
        {KERN_ISA_NEON, cpu_gemm_range_neon},
#endif
    };
    kern_mat_t m = {KERN_MAT_FP8, N_OUT, N_IN, codes, scales, map};
    kern_mat_t mb = {KERN_MAT_BF16, N_OUT, N_IN, bf16, NULL, NULL};
    float x[RANGE_ROWS_MAX * N_IN], y[RANGE_ROWS_MAX * N_OUT], y_ref[RANGE_ROWS_MAX * N_OUT];
    kern_cpu_isa_t was = kern_cpu_isa();
    int n_sets = 0;

    assert_true(n_rows >= 1 && n_rows <= RANGE_ROWS_MAX);
    make_codes(codes, scales);
    assert_int_equal(kern_mat_bf16_from_fp8(codes, scales, N_OUT, N_IN, bf16), TDM_OK);
    assert_int_equal(kern_mat_fp8_clean_fill(&m, map), TDM_OK);
    for (size_t g = 0; g < sizeof(xs) / sizeof(xs[0]); g++) {
        for (int i = 0; i < n_rows * N_IN; i++) {
            x[i] = ((float)(rnd32() % 2001u) / 1000.0f - 1.0f) * xs[g].magnitude;
        }
        assert_int_equal(cpu_gemm_fp8_fold(&m, x, N_IN, n_rows), xs[g].fold);
        assert_int_equal(kern_gemm_ref_cpu(NULL, &mb, x, N_IN, n_rows, 0, y_ref, N_OUT), TDM_OK);
        for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
            if (!kern_cpu_isa_supported(sets[s].isa)) {
                continue;
            }
            /* a call through kern_gemm_cpu hands the set out and so fills its tables first */
            assert_int_equal(kern_cpu_isa_set(sets[s].isa), TDM_OK);
            assert_int_equal(kern_gemm_cpu(NULL, &m, x, N_IN, n_rows, 0, y, N_OUT), TDM_OK);
            for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++) {
                int o0 = ranges[r][0], o1 = ranges[r][1];
                for (int i = 0; i < n_rows * N_OUT; i++) {
                    y[i] = -1.0f;
                }
                assert_int_equal(
                    sets[s].range(&m, x, N_IN, n_rows, 0, y, N_OUT, o0, o1, xs[g].fold), 1);
                for (int row = 0; row < n_rows; row++) {
                    for (int o = 0; o < N_OUT; o++) {
                        if (o < o0 || o >= o1) {
                            assert_true(y[row * N_OUT + o] == -1.0f);
                        }
                    }
                    assert_bits_equal(y + row * N_OUT + o0, y_ref + row * N_OUT + o0, o1 - o0,
                                      n_rows == 1 ? "one row, an output range"
                                                  : "several rows, an output range");
                }
            }
            n_sets++;
        }
    }
    assert_true(n_sets >= 4); /* the scalar set and this CPU's vector set at least, twice */
    assert_int_equal(kern_cpu_isa_set(was), TDM_OK);
}

static void test_one_row_ranges_inside_blocks(void **state)
{
    (void)state;
    check_ranges_inside_blocks(1);
}

/* 4 rows and 9 rows: on AVX2 and AVX-512 (FP8 tiles of 6 rows) one group, then two (4 + 5); on
 * NEON (3 rows) two groups, then three; on the scalar set (2 rows) two, then five */
static void test_few_row_ranges_inside_blocks(void **state)
{
    (void)state;
    check_ranges_inside_blocks(4);
    check_ranges_inside_blocks(9);
}

/* cpu_gemm_fp8_fold (kernels/cpu/gemm_isa.h), the answer the GEMV's order hangs on: zeros take no
 * part, a subnormal, infinite or NaN element or a product out of range refuses any fold, and
 * the raw decode's factor 2^(S - 7) narrows it further (scale bytes 127 and 130 here). */
static void test_fold_answers(void **state)
{
    static uint8_t codes[64 * 64], scales[4] = {127, 130, 127, 127};
    static float x[3 * 64];
    kern_mat_t m = {KERN_MAT_FP8, 64, 64, codes, scales, NULL};
    const float tiny = 1e-40f; /* subnormal */

    (void)state;
    memset(x, 0, sizeof(x));
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 2); /* all zeros */
    x[5] = -0.0f;
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 2);
    x[7] = 3.0f;
    x[63] = -0.25f;
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 2);
    x[9] = tiny;
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 0);
    x[9] = 0.0f;
    x[10] = 1e30f; /* 1e30 * 2^(130 - 7) overflows; * 2^(130 - 119) does not */
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 1);
    x[10] = 3e38f; /* overflows either way */
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 0);
    x[10] = 1e-36f; /* * 2^(127 - 119) is still a normal float: the fold stays */
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 2);
    x[10] = INFINITY;
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 0);
    x[10] = NAN;
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 0);
    /* several rows (the few-row path): the answer of the worst row, at stride ldx */
    x[10] = 1.0f;
    memset(x + 64, 0, sizeof(float) * 2 * 64);
    x[64 + 3] = 1e30f;      /* row 1: the FP16 fold only */
    x[2 * 64 + 60] = 3e38f; /* row 2: no fold */
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 1), 2);
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 2), 1);
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 64, 3), 0);
    assert_int_equal(cpu_gemm_fp8_fold(&m, x + 64, 128, 1), 1); /* row 1 alone */
    assert_int_equal(cpu_gemm_fp8_fold(&m, x, 128, 2), 0);      /* rows 0 and 2 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_marks_blocks_without_subnormal_codes),
        cmocka_unit_test(test_gemm_with_the_map_equals_the_reference_on_every_set),
        cmocka_unit_test(test_one_row_ranges_inside_blocks),
        cmocka_unit_test(test_few_row_ranges_inside_blocks),
        cmocka_unit_test(test_fold_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
