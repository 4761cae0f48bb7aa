/* test_codec.c - number formats, row quantizers, weight quantizers and kern_ops_t
 * (kernels/codec.h, kernels/ops.h) against hand-worked values and a naive double-precision
 * reference written here; CUDA against CPU byte for byte when a device exists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>

#include <cmocka.h>

#include "common/hash.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/codec.h"
#include "kernels/ops.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define SENTINEL_BYTE   0xABu
#define N_RANDOM_GROUPS 4000

/* ---- helpers ----------------------------------------------------------------------------- */

static float f32_from_bits(uint32_t bits)
{
    float x;
    memcpy(&x, &bits, sizeof(x));
    return x;
}

static uint32_t f32_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    return bits;
}

typedef struct {
    uint64_t counter;
} rng_t;

static uint64_t rng_u64(rng_t *rng)
{
    return tdm_hash_splitmix64(rng->counter++);
}

/* uniform in [0, 1) with 24 random bits */
static double rng_unit(rng_t *rng)
{
    return (double)(rng_u64(rng) >> 40) / 16777216.0;
}

static int rng_int(rng_t *rng, int lo, int hi)
{
    return lo + (int)(rng_u64(rng) % (uint64_t)(hi - lo + 1));
}

/* A value of the kind activations have: sign, a few significant bits or full precision,
 * magnitude spread around 2^group_exp; sometimes exact zero. */
static float random_value(rng_t *rng, int group_exp)
{
    int kind = rng_int(rng, 0, 19);
    double v;

    if (kind == 0) {
        return 0.0f;
    }
    v = ldexp(rng_unit(rng) + 0.001, group_exp + rng_int(rng, -12, 0));
    if (kind == 1) {
        v = ldexp(floor(rng_unit(rng) * 16.0), group_exp - 4); /* few bits: exact grid points */
    }
    return (float)((rng_u64(rng) & 1u) != 0 ? -v : v);
}

/* ---- naive double-precision reference (MODEL.md section 4, written independently) -------- */

static double ref_e4m3_value(unsigned code)
{
    unsigned e = (code >> 3) & 0xF;
    unsigned m = code & 7;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, (int)e - 7);
    return (code & 0x80) != 0 ? -v : v;
}

static double ref_e2m1_value(unsigned code)
{
    static const double mags[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (code & 8) != 0 ? -mags[code & 7] : mags[code & 7];
}

/* Nearest of codes 0..n_codes-1 (non-negative values ascending), ties to the even code;
 * beyond the last value saturates; NaN saturates (docs/NUMERICS.md); sign from the input. */
static unsigned ref_round(double x, double (*value)(unsigned), unsigned n_codes, unsigned sign)
{
    double a = fabs(x);
    unsigned best = 0;

    if (isnan(x) || a >= value(n_codes - 1)) {
        best = n_codes - 1;
    } else {
        for (unsigned c = 1; c < n_codes; c++) {
            double d_best = fabs(a - value(best));
            double d = fabs(a - value(c));
            if (d < d_best || (d == d_best && (c % 2) == 0)) {
                best = c;
            }
        }
    }
    return (signbit(x) ? sign : 0u) | best;
}

static uint8_t ref_e4m3(double x)
{
    return (uint8_t)ref_round(x, ref_e4m3_value, 0x7F, 0x80);
}

static uint8_t ref_e2m1(double x)
{
    return (uint8_t)ref_round(x, ref_e2m1_value, 8, 8);
}

static int ref_ceil2(double r)
{
    int k = -127;

    while (k < 127 && ldexp(1.0, k) < r) {
        k++;
    }
    return k;
}

/* amax in double, NaN ignored */
static double ref_amax(const float *x, int n)
{
    double amax = 0.0;

    for (int i = 0; i < n; i++) {
        if (!isnan(x[i]) && fabs((double)x[i]) > amax) {
            amax = fabs((double)x[i]);
        }
    }
    return amax;
}

/* fl(a/b) through double: double rounding is innocuous for division (53 >= 2*24 + 2). */
static float ref_fdiv(double a, double b)
{
    return (float)(a / b);
}

static void ref_act8_group(const float *x, uint8_t *codes, uint8_t *scale)
{
    double amax = ref_amax(x, 32);
    int k = ref_ceil2(ref_fdiv(amax < 1e-4f ? (double)1e-4f : amax, 448.0));

    *scale = (uint8_t)(k + 127);
    for (int i = 0; i < 32; i++) {
        codes[i] = ref_e4m3((double)ref_fdiv(x[i], ldexp(1.0, k)));
    }
}

static void ref_ckv_group(const float *x, uint8_t *packed, uint8_t *scale)
{
    double t = ref_fdiv(ref_amax(x, 16), 6.0);
    double s;

    t = t < ldexp(1.0, -9) ? ldexp(1.0, -9) : (t > 448.0 ? 448.0 : t);
    *scale = ref_e4m3(t);
    s = ref_e4m3_value(*scale);
    for (int i = 0; i < 16; i += 2) {
        packed[i / 2] =
            (uint8_t)(ref_e2m1(ref_fdiv(x[i], s)) | (ref_e2m1(ref_fdiv(x[i + 1], s)) << 4));
    }
}

static void ref_mx4_group(const float *x, uint8_t *packed, uint8_t *scale)
{
    double amax = ref_amax(x, 32);
    double floor_amax = ldexp(6.0, -126);
    int k = ref_ceil2(ref_fdiv(amax < floor_amax ? floor_amax : amax, 6.0));

    *scale = (uint8_t)(k + 127);
    for (int i = 0; i < 32; i += 2) {
        packed[i / 2] = (uint8_t)(ref_e2m1(ref_fdiv(x[i], ldexp(1.0, k))) |
                                  (ref_e2m1(ref_fdiv(x[i + 1], ldexp(1.0, k))) << 4));
    }
}

/* ---- scalar formats ---------------------------------------------------------------------- */

static void test_e2m1_ties_round_to_even_mantissa_and_keep_sign(void **state)
{
    /* input -> code; the grid is 0, .5, 1, 1.5, 2, 3, 4, 6 = codes 0..7 */
    static const struct {
        float x;
        uint8_t code;
    } cases[] =
        {
            {0.0f, 0x0},  {0.25f, 0x0}, /* tie 0 | 0.5: code 0 even */
            {0.5f, 0x1},  {0.75f, 0x2}, /* tie 0.5 | 1: code 2 (1.0) even */
            {1.25f, 0x2},               /* tie 1 | 1.5 -> 1 */
            {1.75f, 0x4},               /* tie 1.5 | 2 -> 2 */
            {2.5f, 0x4},                /* tie 2 | 3 -> 2 */
            {3.5f, 0x6},                /* tie 3 | 4 -> 4 */
            {5.0f, 0x6},                /* tie 4 | 6 -> 4 */
            {5.01f, 0x7}, {6.0f, 0x7},       {7.0f, 0x7},
            {1e30f, 0x7}, {0.2500001f, 0x1}, /* just above the tie: up */
            {-0.1f, 0x8},                    /* negative rounding to zero keeps the sign */
            {-0.0f, 0x8}, {-0.25f, 0x8},     {-5.0f, 0xE},
            {-6.5f, 0xF}, {1e-45f, 0x0},     {-1e-45f, 0x8},
        };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(kern_e2m1_from_f32(cases[i].x), cases[i].code);
    }
    assert_int_equal(kern_e2m1_from_f32(INFINITY), 0x7);
    assert_int_equal(kern_e2m1_from_f32(-INFINITY), 0xF);
    assert_int_equal(kern_e2m1_from_f32(NAN), 0x7);
    assert_int_equal(kern_e2m1_from_f32(-NAN), 0xF);
}

static void test_e2m1_every_code_round_trips(void **state)
{
    (void)state;
    for (unsigned c = 0; c < 16; c++) {
        float v = kern_e2m1_to_f32((uint8_t)c);
        assert_true(v == (float)ref_e2m1_value(c));
        assert_int_equal(signbit(v) != 0, (c & 8) != 0);
        assert_int_equal(kern_e2m1_from_f32(v), c);
        /* the high nibble is ignored */
        assert_true(f32_bits(kern_e2m1_to_f32((uint8_t)(c | 0xA0))) == f32_bits(v));
    }
}

static void test_e4m3_every_finite_code_round_trips(void **state)
{
    unsigned n_finite = 0;
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        float v = kern_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            assert_true(isnan(v));
            continue;
        }
        n_finite++;
        assert_true(v == (float)ref_e4m3_value(c));
        assert_int_equal(signbit(v) != 0, (c & 0x80) != 0);
        assert_int_equal(kern_e4m3_from_f32(v), c);
    }
    assert_int_equal(n_finite, 254);
}

static void test_e4m3_subnormals_ties_and_saturation(void **state)
{
    static const struct {
        float x;
        uint8_t code;
    } cases[] = {
        {0x1p-9f, 0x01},         /* smallest subnormal 1 * 2^-9 */
        {0x1p-10f, 0x00},        /* tie 0 | 2^-9: code 0 even */
        {0x1.000002p-10f, 0x01}, /* just above that tie */
        {0x3p-10f, 0x02},        /* 1.5 * 2^-9: tie 1 | 2: code 2 even */
        {0x5p-10f, 0x02},        /* 2.5 * 2^-9: tie 2 | 3 -> 2 */
        {0xFp-10f, 0x08},        /* 7.5 * 2^-9: tie 7 | 8 (= 2^-6, first normal) -> 8 */
        {0x1p-6f, 0x08},         /* smallest normal: exponent field 1, mantissa 0 */
        {-0x1p-10f, 0x80},       /* negative rounding to zero keeps the sign */
        {-0.0f, 0x80},           {1e-30f, 0x00},  {1.0f, 0x38}, /* exponent 0 -> field 7 */
        {1.0625f, 0x38}, /* tie 1 | 1.125 -> 1 (mantissa 0 even) */
        {1.1875f, 0x3A}, /* tie 1.125 | 1.25 -> 1.25 */
        {416.0f, 0x7D},  /* 1.625 * 2^8 */
        {432.0f, 0x7E},  /* tie 416 | 448 -> 448 (mantissa 6 even) */
        {448.0f, 0x7E},  /* max */
        {449.0f, 0x7E},  /* clamped before rounding */
        {464.0f, 0x7E},  /* would round to the NaN slot 480 without the clamp */
        {500.0f, 0x7E},          {-500.0f, 0xFE}, {-1e30f, 0xFE}, {FLT_MAX, 0x7E},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(kern_e4m3_from_f32(cases[i].x), cases[i].code);
    }
    assert_int_equal(kern_e4m3_from_f32(INFINITY), 0x7E);
    assert_int_equal(kern_e4m3_from_f32(-INFINITY), 0xFE);
    /* NaN saturates by its sign bit (docs/NUMERICS.md): never 0x7F / 0xFF */
    assert_int_equal(kern_e4m3_from_f32(NAN), 0x7E);
    assert_int_equal(kern_e4m3_from_f32(-NAN), 0xFE);
    assert_int_equal(kern_e4m3_from_f32(f32_from_bits(0x7F800001u)), 0x7E); /* signalling */
}

/* Sweep ~1M FP32 bit patterns (every sign, exponent, many mantissas) plus the neighbours of
 * every E4M3 and E2M1 grid point and midpoint; compare with the reference; never a NaN code. */
static void test_e4m3_e2m1_sweep_matches_reference_and_never_emits_nan(void **state)
{
    (void)state;
    for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 4093) {
        float x = f32_from_bits((uint32_t)b);
        uint8_t c8 = kern_e4m3_from_f32(x);
        uint8_t c4 = kern_e2m1_from_f32(x);

        assert_true((c8 & 0x7F) != 0x7F);
        assert_true(c4 <= 0xF);
        if (c8 != ref_e4m3((double)x) || c4 != ref_e2m1((double)x)) {
            fail_msg("bits=0x%08x e4m3=0x%02x ref=0x%02x e2m1=0x%x ref=0x%x", (unsigned)b, c8,
                     ref_e4m3((double)x), c4, ref_e2m1((double)x));
        }
    }
    for (unsigned c = 0; c < 0x7E; c++) {
        float mid = (float)((ref_e4m3_value(c) + ref_e4m3_value(c + 1)) / 2.0);
        float probes[] = {
            mid,  nextafterf(mid, 0.0f),     nextafterf(mid, INFINITY), (float)ref_e4m3_value(c),
            -mid, -nextafterf(mid, INFINITY)};
        for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
            assert_int_equal(kern_e4m3_from_f32(probes[i]), ref_e4m3((double)probes[i]));
        }
    }
    for (unsigned c = 0; c < 7; c++) {
        float mid = (float)((ref_e2m1_value(c) + ref_e2m1_value(c + 1)) / 2.0);
        float probes[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), -mid};
        for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
            assert_int_equal(kern_e2m1_from_f32(probes[i]), ref_e2m1((double)probes[i]));
        }
    }
}

static void test_ceil2_exact_around_powers_of_two(void **state)
{
    rng_t rng = {1};
    (void)state;
    for (int k = -149; k <= 127; k++) {
        float p = ldexpf(1.0f, k);
        int want = k < -127 ? -127 : k;

        assert_int_equal(kern_ceil2(p), want);
        /* just above 2^k needs 2^(k+1) (clamped at 127) */
        assert_int_equal(kern_ceil2(nextafterf(p, INFINITY)),
                         k + 1 < -127 ? -127 : (k + 1 > 127 ? 127 : k + 1));
        /* just below 2^k still fits 2^k */
        if (k > -149) {
            assert_int_equal(kern_ceil2(nextafterf(p, 0.0f)), want);
        }
    }
    /* subnormal r: 2^-127 = 0x00400000; one ulp above needs 2^-126 */
    assert_int_equal(kern_ceil2(f32_from_bits(0x00400000u)), -127);
    assert_int_equal(kern_ceil2(f32_from_bits(0x00400001u)), -126);
    assert_int_equal(kern_ceil2(f32_from_bits(0x007FFFFFu)), -126);
    assert_int_equal(kern_ceil2(f32_from_bits(0x00000003u)), -127); /* 3 * 2^-149: clamp */
    assert_int_equal(kern_ceil2(0x1.8p-1f), 0);                     /* 0.75 -> 2^0 */
    assert_int_equal(kern_ceil2(3.0f), 2);
    assert_int_equal(kern_ceil2(FLT_MAX), 127); /* 2^128 clamped */
    assert_int_equal(kern_ceil2(0.0f), -127);
    assert_int_equal(kern_ceil2(INFINITY), 127);
    for (int i = 0; i < 20000; i++) {
        float r = f32_from_bits((uint32_t)(rng_u64(&rng) & 0x7F7FFFFFu)); /* finite, >= 0 */
        if (r > 0.0f) {
            assert_int_equal(kern_ceil2(r), ref_ceil2((double)r));
        }
    }
}

static void test_ue8m0_bytes_and_values(void **state)
{
    (void)state;
    assert_int_equal(kern_ue8m0_from_exp(-127), 0);
    assert_int_equal(kern_ue8m0_from_exp(0), 127);
    assert_int_equal(kern_ue8m0_from_exp(127), 254);
    assert_int_equal(kern_ue8m0_from_exp(200), 254); /* clamped: 255 is never written */
    assert_int_equal(kern_ue8m0_from_exp(-300), 0);
    assert_int_equal(f32_bits(kern_ue8m0_to_f32(0)), 0x00400000u); /* 2^-127, subnormal */
    assert_true(kern_ue8m0_to_f32(127) == 1.0f);
    assert_true(isnan(kern_ue8m0_to_f32(255)));
    for (int u = 0; u < 255; u++) {
        assert_true((double)kern_ue8m0_to_f32((uint8_t)u) == ldexp(1.0, u - 127));
    }
}

static void test_bf16_round_to_nearest_even_and_nan(void **state)
{
    uint16_t b;
    (void)state;
    /* 1 + 2^-8 is halfway between BF16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): even -> 0x3F80 */
    assert_int_equal(kern_bf16_from_f32(f32_from_bits(0x3F808000u)), 0x3F80);
    /* halfway between 0x3F81 and 0x3F82: even -> 0x3F82 */
    assert_int_equal(kern_bf16_from_f32(f32_from_bits(0x3F818000u)), 0x3F82);
    assert_int_equal(kern_bf16_from_f32(f32_from_bits(0x3F808001u)), 0x3F81); /* above tie */
    assert_int_equal(kern_bf16_from_f32(f32_from_bits(0x3F807FFFu)), 0x3F80); /* below tie */
    assert_int_equal(kern_bf16_from_f32(-1.0f), 0xBF80);
    assert_int_equal(kern_bf16_from_f32(INFINITY), 0x7F80);
    assert_int_equal(kern_bf16_from_f32(FLT_MAX), 0x7F80); /* RNE overflows to infinity */
    assert_int_equal(kern_bf16_from_f32(-0.0f), 0x8000);
    /* a signalling NaN whose payload lives only in the low bits must not become infinity */
    b = kern_bf16_from_f32(f32_from_bits(0x7F800001u));
    assert_int_equal(b & 0x7F80, 0x7F80);
    assert_true((b & 0x007F) != 0);
    assert_true(isnan(kern_bf16_to_f32(kern_bf16_from_f32(-NAN))));
    assert_true(signbit(kern_bf16_to_f32(kern_bf16_from_f32(-NAN))));
    assert_true(kern_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(kern_bf16_round(f32_from_bits(0x3F808000u)) == 1.0f);
    assert_true(kern_bf16_round(f32_from_bits(0x3F818000u)) == f32_from_bits(0x3F820000u));
}

/* ---- row quantizers: hand-worked values -------------------------------------------------- */

static void test_act8_floor_scale_for_zero_and_tiny_groups(void **state)
{
    float x[32] = {0};
    uint8_t codes[32];
    uint8_t scale;
    (void)state;

    /* all zero: amax floored to 1e-4; 1e-4/448 = 2.23e-7 lies in (2^-23, 2^-22] -> s = 2^-22,
     * byte -22 + 127 = 105; codes 0 */
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 105);
    for (int i = 0; i < 32; i++) {
        assert_int_equal(codes[i], 0x00);
    }
    /* tiny: 1e-6 / 2^-22 = 4.194... -> E4M3 4.0 = 0x48 (field 9, mantissa 0); -0.0 -> 0x80 */
    x[0] = 1e-6f;
    x[1] = -0.0f;
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 105);
    assert_int_equal(codes[0], 0x48);
    assert_int_equal(codes[1], 0x80);
    /* amax 448 * 2^3 = 3584: fl(3584/448) = 8 = 2^3 exactly -> byte 130, x = 3584 -> 0x7E;
     * one ulp more needs 2^4 */
    x[0] = 3584.0f;
    x[2] = -1.0f; /* -1/8 = -2^-3: field 4 -> 0xA0 */
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 130);
    assert_int_equal(codes[0], 0x7E);
    assert_int_equal(codes[2], 0xA0);
    x[0] = nextafterf(3584.0f, INFINITY);
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 131);
}

static void test_ckv_scale_clamp_and_codes(void **state)
{
    float x[16] = {0};
    uint8_t packed[8];
    uint8_t scale;
    (void)state;

    /* all zero: fl(0/6) = 0 clamps to 2^-9 = E4M3 0x01; codes 0 */
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 16, packed, &scale), TDM_OK);
    assert_int_equal(scale, 0x01);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(packed[i], 0x00);
    }
    /* amax 3: fl(3/6) = 0.5 = E4M3 0x30 (field 6); 3/0.5 = 6 -> 0x7; -1/0.5 = -2 -> 0xC;
     * 0.3/0.5 = 0.6 -> 0.5 = 0x1; 0.25/0.5 = 0.5 -> 0x1 */
    x[0] = 3.0f;
    x[1] = -1.0f;
    x[2] = 0.3f;
    x[3] = 0.25f;
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 16, packed, &scale), TDM_OK);
    assert_int_equal(scale, 0x30);
    assert_int_equal(packed[0], 0xC7); /* low nibble = element 0 */
    assert_int_equal(packed[1], 0x11);
    /* amax 1e-3: fl(1e-3/6) = 1.67e-4 < 2^-9 -> 0x01; 1e-3 / 2^-9 = 0.512 -> 0.5 = 0x1 */
    memset(x, 0, sizeof(x));
    x[15] = 1e-3f;
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 16, packed, &scale), TDM_OK);
    assert_int_equal(scale, 0x01);
    assert_int_equal(packed[7], 0x10);
    /* amax 1e4: 1666.7 clamps to 448 = 0x7E; 1e4/448 = 22.3 saturates at 6 = 0x7 */
    x[15] = -1e4f;
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 16, packed, &scale), TDM_OK);
    assert_int_equal(scale, 0x7E);
    assert_int_equal(packed[7], 0xF0);
    /* a non-power-of-two scale: amax 1.3 -> fl(1.3/6) = 0.21667 -> E4M3 0.21875 (0x26:
     * 1.75 * 2^-3 = field 4, mantissa 6; 0.216667 lies between 0.203125 and 0.21875, nearer
     * the latter); 1.3 / 0.21875 = 5.94 -> 6 = 0x7; 0.55 / 0.21875 = 2.514 -> 3 = 0x5 */
    memset(x, 0, sizeof(x));
    x[0] = 1.3f;
    x[1] = 0.55f;
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 16, packed, &scale), TDM_OK);
    assert_int_equal(scale, 0x26);
    assert_int_equal(packed[0], 0x57);
}

static void test_mx4_floor_and_power_of_two_boundary(void **state)
{
    float x[32] = {0};
    uint8_t packed[16];
    uint8_t scale;
    (void)state;

    /* all zero: amax floored to 6 * 2^-126; fl(/6) = 2^-126 -> byte 1; codes 0 */
    assert_int_equal(kern_quant_mx4_cpu(NULL, x, 1, 32, packed, &scale), TDM_OK);
    assert_int_equal(scale, 1);
    for (int i = 0; i < 16; i++) {
        assert_int_equal(packed[i], 0x00);
    }
    /* amax 6: fl(6/6) = 1 = 2^0 -> byte 127; 6 -> 0x7, 5 -> tie 4 | 6 -> 4 = 0x6 */
    x[0] = 6.0f;
    x[1] = 5.0f;
    x[2] = -0.1f; /* rounds to zero, keeps the sign: 0x8 */
    assert_int_equal(kern_quant_mx4_cpu(NULL, x, 1, 32, packed, &scale), TDM_OK);
    assert_int_equal(scale, 127);
    assert_int_equal(packed[0], 0x67);
    assert_int_equal(packed[1], 0x08);
    /* one ulp above 6: fl(x/6) > 1 -> 2^1, byte 128; x/2 = 3.0000002 -> 3 = 0x5 */
    x[0] = nextafterf(6.0f, INFINITY);
    assert_int_equal(kern_quant_mx4_cpu(NULL, x, 1, 32, packed, &scale), TDM_OK);
    assert_int_equal(scale, 128);
    assert_int_equal(packed[0] & 0xF, 0x5);
}

/* Specials: NaN is ignored by amax and saturates by its sign; an infinity drives the scale
 * to the clamp 2^127 (docs/NUMERICS.md). */
static void test_quantizers_nan_and_infinity_are_deterministic(void **state)
{
    float x[32] = {0};
    uint8_t codes[32];
    uint8_t scales[2];
    uint8_t scale;
    (void)state;

    x[0] = NAN;
    x[1] = -NAN;
    x[2] = 448.0f;
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 127); /* amax 448 (NaN ignored) -> 2^0 */
    assert_int_equal(codes[0], 0x7E);
    assert_int_equal(codes[1], 0xFE);
    assert_int_equal(codes[2], 0x7E);
    x[3] = -INFINITY;
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 254);
    assert_int_equal(codes[2], 0x00); /* 448 / 2^127 underflows to code 0 */
    assert_int_equal(codes[3], 0xFE);
    assert_int_equal(kern_quant_mx4_cpu(NULL, x, 1, 32, codes, &scale), TDM_OK);
    assert_int_equal(scale, 254);
    assert_int_equal(codes[0], 0xF7); /* NaN -> 0x7, -NaN -> 0xF */
    assert_int_equal(codes[1], 0xF0); /* 448 / 2^127 -> 0; -inf -> 0xF */
    /* ckv group 0: amax inf -> fl(inf/6) clamps to 448 = 0x7E; NaN -> 0x7, -NaN -> 0xF;
     * 448/448 = 1 -> 0x2; -inf -> 0xF */
    assert_int_equal(kern_quant_ckv_cpu(NULL, x, 1, 32, codes, scales), TDM_OK);
    assert_int_equal(scales[0], 0x7E);
    assert_int_equal(scales[1], 0x01);
    assert_int_equal(codes[0], 0xF7);
    assert_int_equal(codes[1], 0xF2);
}

/* ---- row quantizers against the double reference ----------------------------------------- */

static void fill_random_groups(rng_t *rng, float *x, int64_t n, int group)
{
    for (int64_t g = 0; g < n; g += group) {
        int group_exp = rng_int(rng, -40, 40);
        for (int64_t i = g; i < g + group; i++) {
            x[i] = random_value(rng, group_exp);
        }
        if (rng_int(rng, 0, 15) == 0) {
            memset(x + g, 0, sizeof(float) * (size_t)group); /* all-zero group */
        }
    }
}

static void test_quantizers_match_double_reference(void **state)
{
    const int64_t dim = 256;
    const int64_t n_rows = N_RANDOM_GROUPS * 32 / dim;
    const int64_t n = n_rows * dim;
    float *x = malloc(sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)n);
    uint8_t *codes = malloc((size_t)n);
    uint8_t *scales = malloc((size_t)n / 16);
    uint8_t ref_codes[32];
    uint8_t ref_scale;
    rng_t rng = {42};
    (void)state;

    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(codes);
    assert_non_null(scales);
    fill_random_groups(&rng, x, n, 32);

    assert_int_equal(kern_quant_act8_cpu(NULL, x, n_rows, dim, codes, scales), TDM_OK);
    assert_int_equal(kern_dequant_act8_cpu(NULL, codes, scales, n_rows, dim, y), TDM_OK);
    for (int64_t g = 0; g < n / 32; g++) {
        ref_act8_group(x + g * 32, ref_codes, &ref_scale);
        assert_int_equal(scales[g], ref_scale);
        assert_memory_equal(codes + g * 32, ref_codes, 32);
        for (int i = 0; i < 32; i++) {
            double want = ref_e4m3_value(ref_codes[i]) * ldexp(1.0, ref_scale - 127);
            assert_true((double)y[g * 32 + i] == want);
        }
    }

    assert_int_equal(kern_quant_ckv_cpu(NULL, x, n_rows, dim, codes, scales), TDM_OK);
    assert_int_equal(kern_dequant_ckv_cpu(NULL, codes, scales, n_rows, dim, y), TDM_OK);
    for (int64_t g = 0; g < n / 16; g++) {
        ref_ckv_group(x + g * 16, ref_codes, &ref_scale);
        assert_int_equal(scales[g], ref_scale);
        assert_memory_equal(codes + g * 8, ref_codes, 8);
        for (int i = 0; i < 16; i++) {
            double want = ref_e2m1_value((ref_codes[i / 2] >> (4 * (i % 2))) & 0xF) *
                          ref_e4m3_value(ref_scale);
            assert_true((double)y[g * 16 + i] == want);
        }
    }

    assert_int_equal(kern_quant_mx4_cpu(NULL, x, n_rows, dim, codes, scales), TDM_OK);
    assert_int_equal(kern_dequant_mx4_cpu(NULL, codes, scales, n_rows, dim, y), TDM_OK);
    for (int64_t g = 0; g < n / 32; g++) {
        ref_mx4_group(x + g * 32, ref_codes, &ref_scale);
        assert_int_equal(scales[g], ref_scale);
        assert_memory_equal(codes + g * 16, ref_codes, 16);
        for (int i = 0; i < 32; i++) {
            double want = ref_e2m1_value((ref_codes[i / 2] >> (4 * (i % 2))) & 0xF) *
                          ldexp(1.0, ref_scale - 127);
            assert_true((double)y[g * 32 + i] == want);
        }
    }
    free(scales);
    free(codes);
    free(y);
    free(x);
}

static void test_qdq_act8_equals_dequant_of_quant_and_may_alias(void **state)
{
    enum { N = 512 };
    float x[N];
    float y[N];
    float z[N];
    uint8_t codes[N];
    uint8_t scales[N / 32];
    rng_t rng = {7};
    (void)state;

    fill_random_groups(&rng, x, N, 32);
    assert_int_equal(kern_quant_act8_cpu(NULL, x, 1, N, codes, scales), TDM_OK);
    assert_int_equal(kern_dequant_act8_cpu(NULL, codes, scales, 1, N, y), TDM_OK);
    assert_int_equal(kern_qdq_act8_cpu(x, N, z), TDM_OK);
    assert_memory_equal(y, z, sizeof(y));
    assert_int_equal(kern_qdq_act8_cpu(x, N, x), TDM_OK); /* in place */
    assert_memory_equal(y, x, sizeof(y));
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_bad_arguments_return_invalid_arg_and_leave_outputs_untouched(void **state)
{
    float x[64] = {1.0f};
    float y[64];
    uint8_t codes[64];
    uint8_t scales[8];
    uint8_t want_codes[64];
    uint8_t want_scales[8];
    float want_y[64];
    const kern_ops_t *ops = kern_ops_cpu();
    (void)state;

    memset(codes, SENTINEL_BYTE, sizeof(codes));
    memset(scales, SENTINEL_BYTE, sizeof(scales));
    memset(y, SENTINEL_BYTE, sizeof(y));
    memcpy(want_codes, codes, sizeof(codes));
    memcpy(want_scales, scales, sizeof(scales));
    memcpy(want_y, y, sizeof(y));

    /* dim not a multiple of the group */
    assert_int_equal(ops->quant_act8(NULL, x, 1, 48, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_ckv(NULL, x, 1, 24, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_mx4(NULL, x, 1, 16, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_act8(NULL, codes, scales, 1, 33, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_ckv(NULL, codes, scales, 1, 8, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_mx4(NULL, codes, scales, 1, 48, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_qdq_act8_cpu(x, 40, y), TDM_ERR_INVALID_ARG);
    /* n_rows / dim <= 0 */
    assert_int_equal(ops->quant_act8(NULL, x, 0, 32, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_ckv(NULL, x, -1, 16, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_mx4(NULL, x, 1, 0, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_act8(NULL, codes, scales, 1, -32, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_qdq_act8_cpu(x, 0, y), TDM_ERR_INVALID_ARG);
    /* NULL pointers */
    assert_int_equal(ops->quant_act8(NULL, NULL, 1, 32, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_ckv(NULL, x, 1, 16, NULL, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->quant_mx4(NULL, x, 1, 32, codes, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_ckv(NULL, NULL, scales, 1, 16, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(ops->dequant_mx4(NULL, codes, scales, 1, 32, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_qdq_act8_cpu(NULL, 32, y), TDM_ERR_INVALID_ARG);
    /* weights */
    assert_int_equal(kern_weight_fp8_quantize(x, 0, 8, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_weight_fp8_quantize(x, 2, 8, NULL, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_weight_fp8_dequantize(codes, scales, 2, -8, y), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_weight_mxfp4_quantize(x, 1, 48, codes, scales), TDM_ERR_INVALID_ARG);
    assert_int_equal(kern_weight_mxfp4_dequantize(codes, scales, 1, 16, y), TDM_ERR_INVALID_ARG);

    assert_memory_equal(codes, want_codes, sizeof(codes));
    assert_memory_equal(scales, want_scales, sizeof(scales));
    assert_memory_equal(y, want_y, sizeof(y));
}

/* ---- weights ----------------------------------------------------------------------------- */

static void test_weight_fp8_blocks_with_partial_edges(void **state)
{
    enum { N_OUT = 40, N_IN = 70, N_BR = 2, N_BC = 3 }; /* ceil(40/32), ceil(70/32) */
    static float w[N_OUT * N_IN];
    static float w_back[N_OUT * N_IN];
    uint8_t codes[N_OUT * N_IN];
    uint8_t scales[N_BR * N_BC];
    rng_t rng = {99};
    (void)state;

    for (int o = 0; o < N_OUT; o++) {
        for (int i = 0; i < N_IN; i++) {
            w[o * N_IN + i] = (float)((rng_unit(&rng) - 0.5) * 0.02);
        }
    }
    /* block (1, 2) = rows 32..39, cols 64..69: all zero -> floor scale 105 */
    for (int o = 32; o < N_OUT; o++) {
        for (int i = 64; i < N_IN; i++) {
            w[o * N_IN + i] = 0.0f;
        }
    }
    w[5 * N_IN + 40] = 3.0f; /* block (0, 1): amax 3 -> fl(3/448) in (2^-8, 2^-7] -> 120 */
    assert_int_equal(kern_weight_fp8_quantize(w, N_OUT, N_IN, codes, scales), TDM_OK);
    assert_int_equal(scales[0 * N_BC + 1], 120);
    assert_int_equal(scales[1 * N_BC + 2], 105);
    for (int bo = 0; bo < N_BR; bo++) {
        for (int bi = 0; bi < N_BC; bi++) {
            double amax = 0.0;
            int k;
            for (int o = bo * 32; o < bo * 32 + 32 && o < N_OUT; o++) {
                for (int i = bi * 32; i < bi * 32 + 32 && i < N_IN; i++) {
                    amax = fmax(amax, fabs((double)w[o * N_IN + i]));
                }
            }
            k = ref_ceil2(ref_fdiv(amax < 1e-4f ? (double)1e-4f : amax, 448.0));
            assert_int_equal(scales[bo * N_BC + bi], k + 127);
            for (int o = bo * 32; o < bo * 32 + 32 && o < N_OUT; o++) {
                for (int i = bi * 32; i < bi * 32 + 32 && i < N_IN; i++) {
                    assert_int_equal(codes[o * N_IN + i],
                                     ref_e4m3((double)w[o * N_IN + i] / ldexp(1.0, k)));
                }
            }
        }
    }
    assert_int_equal(kern_weight_fp8_dequantize(codes, scales, N_OUT, N_IN, w_back), TDM_OK);
    for (int o = 0; o < N_OUT; o++) {
        for (int i = 0; i < N_IN; i++) {
            double want = ref_e4m3_value(codes[o * N_IN + i]) *
                          ldexp(1.0, scales[(o / 32) * N_BC + i / 32] - 127);
            assert_true((double)w_back[o * N_IN + i] == want);
            /* dequantized weights are exact in BF16 (MODEL.md 3) */
            assert_true(kern_bf16_round(w_back[o * N_IN + i]) == w_back[o * N_IN + i]);
        }
    }
}

static void test_weight_mxfp4_is_mx4_on_rows(void **state)
{
    enum { N_OUT = 8, N_IN = 96 };
    float w[N_OUT * N_IN];
    float w_back[N_OUT * N_IN];
    float y[N_OUT * N_IN];
    uint8_t packed[N_OUT * N_IN / 2];
    uint8_t scales[N_OUT * N_IN / 32];
    uint8_t packed_mx4[N_OUT * N_IN / 2];
    uint8_t scales_mx4[N_OUT * N_IN / 32];
    rng_t rng = {5};
    (void)state;

    fill_random_groups(&rng, w, N_OUT * N_IN, 32);
    assert_int_equal(kern_weight_mxfp4_quantize(w, N_OUT, N_IN, packed, scales), TDM_OK);
    assert_int_equal(kern_quant_mx4_cpu(NULL, w, N_OUT, N_IN, packed_mx4, scales_mx4), TDM_OK);
    assert_memory_equal(packed, packed_mx4, sizeof(packed));
    assert_memory_equal(scales, scales_mx4, sizeof(scales));
    assert_int_equal(kern_weight_mxfp4_dequantize(packed, scales, N_OUT, N_IN, w_back), TDM_OK);
    assert_int_equal(kern_dequant_mx4_cpu(NULL, packed, scales, N_OUT, N_IN, y), TDM_OK);
    assert_memory_equal(w_back, y, sizeof(y));
}

/* ---- backends ---------------------------------------------------------------------------- */

static void test_ops_tables(void **state)
{
    const kern_ops_t *cpu = kern_ops_cpu();
    const char *reason = NULL;
    (void)state;

    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    assert_ptr_equal(cpu->quant_act8, kern_quant_act8_cpu);
    assert_ptr_equal(cpu->quant_ckv, kern_quant_ckv_cpu);
    assert_ptr_equal(cpu->quant_mx4, kern_quant_mx4_cpu);
    assert_ptr_equal(cpu->dequant_act8, kern_dequant_act8_cpu);
    assert_ptr_equal(cpu->dequant_ckv, kern_dequant_ckv_cpu);
    assert_ptr_equal(cpu->dequant_mx4, kern_dequant_mx4_cpu);
    if (kern_cuda_available(&reason) != 0) {
        assert_non_null(kern_ops_cuda());
        assert_string_equal(kern_ops_cuda()->name, "cuda");
    } else {
        assert_null(kern_ops_cuda());
    }
}

#ifdef TANDEM_HAVE_CUDA
/* Runs `ops` quantizer `which` (0 act8, 1 ckv, 2 mx4) and its dequantizer on host x; results
 * copied back to host. */
static void run_backend(const kern_ops_t *ops, int on_device, int which, const float *x,
                        int64_t n_rows, int64_t dim, uint8_t *codes, uint8_t *scales, float *y)
{
    static const int64_t group[3] = {32, 16, 32};
    const int64_t n = n_rows * dim;
    const size_t n_codes = (size_t)(which == 0 ? n : n / 2);
    const size_t n_scales = (size_t)(n / group[which]);
    const float *x_arg = x;
    uint8_t *codes_arg = codes;
    uint8_t *scales_arg = scales;
    float *y_arg = y;
    void *x_dev = NULL;
    void *codes_dev = NULL;
    void *scales_dev = NULL;
    void *y_dev = NULL;
    kern_ctx_t ctx = {0};

    if (on_device) {
        ctx.backend = KERN_BACKEND_CUDA;
        assert_int_equal(cudaMalloc(&x_dev, sizeof(float) * (size_t)n), cudaSuccess);
        assert_int_equal(cudaMalloc(&codes_dev, n_codes), cudaSuccess);
        assert_int_equal(cudaMalloc(&scales_dev, n_scales), cudaSuccess);
        assert_int_equal(cudaMalloc(&y_dev, sizeof(float) * (size_t)n), cudaSuccess);
        assert_int_equal(cudaMemcpy(x_dev, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice),
                         cudaSuccess);
        x_arg = x_dev;
        codes_arg = codes_dev;
        scales_arg = scales_dev;
        y_arg = y_dev;
    }
    if (which == 0) {
        assert_int_equal(ops->quant_act8(&ctx, x_arg, n_rows, dim, codes_arg, scales_arg), TDM_OK);
        assert_int_equal(ops->dequant_act8(&ctx, codes_arg, scales_arg, n_rows, dim, y_arg),
                         TDM_OK);
    } else if (which == 1) {
        assert_int_equal(ops->quant_ckv(&ctx, x_arg, n_rows, dim, codes_arg, scales_arg), TDM_OK);
        assert_int_equal(ops->dequant_ckv(&ctx, codes_arg, scales_arg, n_rows, dim, y_arg), TDM_OK);
    } else {
        assert_int_equal(ops->quant_mx4(&ctx, x_arg, n_rows, dim, codes_arg, scales_arg), TDM_OK);
        assert_int_equal(ops->dequant_mx4(&ctx, codes_arg, scales_arg, n_rows, dim, y_arg), TDM_OK);
    }
    if (on_device) {
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(codes, codes_dev, n_codes, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_int_equal(cudaMemcpy(scales, scales_dev, n_scales, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_int_equal(cudaMemcpy(y, y_dev, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        cudaFree(y_dev);
        cudaFree(scales_dev);
        cudaFree(codes_dev);
        cudaFree(x_dev);
    }
}

/* Random groups plus groups built to hit every rounding edge: exact grid midpoints under
 * power-of-two scales, NaN, infinities, signed zeros, FP32 subnormals, FLT_MAX. */
static void fill_cuda_inputs(float *x, int64_t n)
{
    static const float specials[] = {0.0f,      -0.0f,  1e-45f, -1e-45f, 1e-40f, FLT_MAX, -FLT_MAX,
                                     0x1p-126f, 448.0f, 6.0f,   5.0f,    0.25f,  -0.75f};
    rng_t rng = {2024};

    fill_random_groups(&rng, x, n, 32);
    for (int64_t g = 0; g < n; g += 32) {
        int kind = rng_int(&rng, 0, 7);
        int k = rng_int(&rng, -20, 20);
        if (kind == 0) { /* E4M3 midpoints with amax 448 * 2^k -> s = 2^k */
            for (int i = 0; i < 32; i++) {
                unsigned c = (unsigned)rng_int(&rng, 0, 0x7D);
                x[g + i] = (float)ldexp((ref_e4m3_value(c) + ref_e4m3_value(c + 1)) / 2, k);
            }
            x[g + 31] = ldexpf(448.0f, k);
        } else if (kind == 1) { /* E2M1 midpoints with amax 6 * 2^k -> s = 2^k */
            for (int i = 0; i < 32; i++) {
                unsigned c = (unsigned)rng_int(&rng, 0, 6);
                x[g + i] = (float)ldexp((ref_e2m1_value(c) + ref_e2m1_value(c + 1)) / 2, k);
                x[g + i] = (rng_u64(&rng) & 1u) != 0 ? -x[g + i] : x[g + i];
            }
            x[g + 31] = ldexpf(6.0f, k);
        } else if (kind == 2) { /* specials sprinkled in */
            for (int i = 0; i < 4; i++) {
                int j = rng_int(&rng, 0, 31);
                int s = rng_int(&rng, 0, (int)(sizeof(specials) / sizeof(specials[0])) + 3);
                int n_specials = (int)(sizeof(specials) / sizeof(specials[0]));
                x[g + j] = s < n_specials ? specials[s]
                                          : (s == n_specials       ? NAN
                                             : s == n_specials + 1 ? -NAN
                                             : s == n_specials + 2 ? INFINITY
                                                                   : -INFINITY);
            }
        } else if (kind == 3) { /* FP32 subnormal and tiny groups */
            for (int i = 0; i < 32; i++) {
                x[g + i] = f32_from_bits((uint32_t)(rng_u64(&rng) & 0x807FFFFFu));
            }
        }
    }
}

static void test_cuda_quantizers_bit_identical_to_cpu(void **state)
{
    static const struct {
        int64_t n_rows;
        int64_t dim;
    } shapes[] = {{1, 32}, {3, 512}, {391, 256}, {4200, 4096}};
    const char *reason = NULL;
    const kern_ops_t *cuda;
    (void)state;

    if (kern_cuda_available(&reason) == 0) {
        print_message("no CUDA device: skipping (%s)\n", reason);
        skip();
    }
    cuda = kern_ops_cuda();
    assert_non_null(cuda);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const int64_t n = shapes[s].n_rows * shapes[s].dim;
        float *x = malloc(sizeof(float) * (size_t)n);
        float *y_cpu = malloc(sizeof(float) * (size_t)n);
        float *y_gpu = malloc(sizeof(float) * (size_t)n);
        uint8_t *codes_cpu = malloc((size_t)n);
        uint8_t *codes_gpu = malloc((size_t)n);
        uint8_t *scales_cpu = malloc((size_t)n / 16);
        uint8_t *scales_gpu = malloc((size_t)n / 16);

        assert_true(x != NULL && y_cpu != NULL && y_gpu != NULL && codes_cpu != NULL &&
                    codes_gpu != NULL && scales_cpu != NULL && scales_gpu != NULL);
        fill_cuda_inputs(x, n);
        for (int which = 0; which < 3; which++) {
            size_t n_codes = (size_t)(which == 0 ? n : n / 2);
            size_t n_scales = (size_t)(n / (which == 1 ? 16 : 32));

            run_backend(kern_ops_cpu(), 0, which, x, shapes[s].n_rows, shapes[s].dim, codes_cpu,
                        scales_cpu, y_cpu);
            run_backend(cuda, 1, which, x, shapes[s].n_rows, shapes[s].dim, codes_gpu, scales_gpu,
                        y_gpu);
            assert_memory_equal(codes_cpu, codes_gpu, n_codes);
            assert_memory_equal(scales_cpu, scales_gpu, n_scales);
            assert_memory_equal(y_cpu, y_gpu, sizeof(float) * (size_t)n);
        }
        print_message("cuda == cpu: n_rows=%lld dim=%lld (act8, ckv, mx4)\n",
                      (long long)shapes[s].n_rows, (long long)shapes[s].dim);
        free(scales_gpu);
        free(scales_cpu);
        free(codes_gpu);
        free(codes_cpu);
        free(y_gpu);
        free(y_cpu);
        free(x);
    }
}

static void test_cuda_bad_arguments_return_invalid_arg(void **state)
{
    const char *reason = NULL;
    const kern_ops_t *cuda;
    uint8_t codes[4];
    (void)state;

    if (kern_cuda_available(&reason) == 0) {
        print_message("no CUDA device: skipping (%s)\n", reason);
        skip();
    }
    cuda = kern_ops_cuda();
    assert_int_equal(cuda->quant_act8(NULL, NULL, 1, 32, codes, codes), TDM_ERR_INVALID_ARG);
    assert_int_equal(cuda->quant_ckv(NULL, (const float *)codes, 1, 8, codes, codes),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(cuda->dequant_mx4(NULL, codes, codes, 0, 32, (float *)codes),
                     TDM_ERR_INVALID_ARG);
}
#else
static void test_cuda_quantizers_bit_identical_to_cpu(void **state)
{
    const char *reason = NULL;
    (void)state;
    assert_int_equal(kern_cuda_available(&reason), 0);
    print_message("no CUDA backend: skipping (%s)\n", reason);
    skip();
}

static void test_cuda_bad_arguments_return_invalid_arg(void **state)
{
    test_cuda_quantizers_bit_identical_to_cpu(state);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2m1_ties_round_to_even_mantissa_and_keep_sign),
        cmocka_unit_test(test_e2m1_every_code_round_trips),
        cmocka_unit_test(test_e4m3_every_finite_code_round_trips),
        cmocka_unit_test(test_e4m3_subnormals_ties_and_saturation),
        cmocka_unit_test(test_e4m3_e2m1_sweep_matches_reference_and_never_emits_nan),
        cmocka_unit_test(test_ceil2_exact_around_powers_of_two),
        cmocka_unit_test(test_ue8m0_bytes_and_values),
        cmocka_unit_test(test_bf16_round_to_nearest_even_and_nan),
        cmocka_unit_test(test_act8_floor_scale_for_zero_and_tiny_groups),
        cmocka_unit_test(test_ckv_scale_clamp_and_codes),
        cmocka_unit_test(test_mx4_floor_and_power_of_two_boundary),
        cmocka_unit_test(test_quantizers_nan_and_infinity_are_deterministic),
        cmocka_unit_test(test_quantizers_match_double_reference),
        cmocka_unit_test(test_qdq_act8_equals_dequant_of_quant_and_may_alias),
        cmocka_unit_test(test_bad_arguments_return_invalid_arg_and_leave_outputs_untouched),
        cmocka_unit_test(test_weight_fp8_blocks_with_partial_edges),
        cmocka_unit_test(test_weight_mxfp4_is_mx4_on_rows),
        cmocka_unit_test(test_ops_tables),
        cmocka_unit_test(test_cuda_quantizers_bit_identical_to_cpu),
        cmocka_unit_test(test_cuda_bad_arguments_return_invalid_arg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
