/* codec.c - CPU reference of the number formats and quantizers in kernels/codec.h. Plain loops
 * over the shared scalar codec (kernels/codec_bits.h); the CUDA kernels must match these bytes.
 */
#include "kernels/codec.h"

#include "common/log.h"
#include "kernels/codec_bits.h"

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* fl(a/b) on the host is C's `/`: only correct if float arithmetic is done in float. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "kernels/cpu/codec.c needs FLT_EVAL_METHOD == 0 (SSE float arithmetic, no x87)"
#endif

#define CODEC_LOG "kernels"

/* ---- scalar conversions ------------------------------------------------------------------ */

uint16_t kern_bf16_from_f32(float x)
{
    uint32_t bits = codec_f32_bits(x);

    if ((bits & CODEC_F32_ABS_MASK) > CODEC_F32_INF_BITS) {
        return (uint16_t)((bits >> 16) | 0x0040u); /* quiet NaN, sign and payload top kept */
    }
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

float kern_bf16_to_f32(uint16_t b)
{
    return codec_f32_from_bits((uint32_t)b << 16);
}

float kern_bf16_round(float x)
{
    return kern_bf16_to_f32(kern_bf16_from_f32(x));
}

uint8_t kern_e4m3_from_f32(float x)
{
    return codec_e4m3_from_f32(x);
}

float kern_e4m3_to_f32(uint8_t c)
{
    return codec_e4m3_to_f32(c);
}

uint8_t kern_e2m1_from_f32(float x)
{
    return codec_e2m1_from_f32(x);
}

float kern_e2m1_to_f32(uint8_t code)
{
    return codec_e2m1_to_f32(code);
}

int kern_ceil2(float r)
{
    return codec_ceil2(r);
}

uint8_t kern_ue8m0_from_exp(int e)
{
    if (e < CODEC_CEIL2_MIN) {
        e = CODEC_CEIL2_MIN;
    }
    if (e > CODEC_CEIL2_MAX) {
        e = CODEC_CEIL2_MAX;
    }
    return (uint8_t)(e + CODEC_UE8M0_BIAS);
}

float kern_ue8m0_to_f32(uint8_t u)
{
    return codec_ue8m0_to_f32(u);
}

/* ---- argument checks --------------------------------------------------------------------- */

tdm_status_t kern_codec_check_rows(const char *op, const void *in_a, const void *in_b,
                                   const void *out_a, const void *out_b, int64_t n_rows,
                                   int64_t dim, int64_t group)
{
    if (in_a == NULL || in_b == NULL || out_a == NULL || out_b == NULL) {
        tdm_log(TDM_LOG_WARN, CODEC_LOG, "%s rejected: NULL pointer", op);
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0 || dim <= 0 || dim % group != 0 || n_rows > INT64_MAX / dim ||
        (uint64_t)(n_rows * dim) > (uint64_t)(SIZE_MAX / sizeof(float))) {
        tdm_log(TDM_LOG_WARN, CODEC_LOG,
                "%s rejected: n_rows=%lld dim=%lld (need n_rows>0, dim>0, dim%%%lld==0)", op,
                (long long)n_rows, (long long)dim, (long long)group);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

/* ---- row quantizers ---------------------------------------------------------------------- */

static float group_amax(const float *x, int64_t n)
{
    float amax = 0.0f;

    for (int64_t i = 0; i < n; i++) {
        amax = codec_amax_merge(amax, codec_amax_term(x[i]));
    }
    return amax;
}

/* Packs E2M1 codes of x[0..n) / s (n even) two per byte, even element in the low nibble. */
static void pack_e2m1(const float *x, int64_t n, float s, uint8_t *packed_out)
{
    for (int64_t i = 0; i < n; i += 2) {
        uint8_t lo = codec_e2m1_from_f32(codec_div_rn(x[i], s));
        uint8_t hi = codec_e2m1_from_f32(codec_div_rn(x[i + 1], s));
        packed_out[i / 2] = (uint8_t)(lo | (hi << 4));
    }
}

tdm_status_t kern_quant_act8_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                 uint8_t *codes_out, uint8_t *scales_out)
{
    tdm_status_t status;
    int64_t n_groups;

    (void)ctx;
    status = kern_codec_check_rows("quant_act8", x, x, codes_out, scales_out, n_rows, dim,
                                   KERN_ACT8_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n_groups = n_rows * dim / KERN_ACT8_GROUP;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *xg = x + g * KERN_ACT8_GROUP;
        uint8_t scale = codec_act8_scale(group_amax(xg, KERN_ACT8_GROUP));
        float s = codec_ue8m0_to_f32(scale);

        for (int64_t i = 0; i < KERN_ACT8_GROUP; i++) {
            codes_out[g * KERN_ACT8_GROUP + i] = codec_e4m3_from_f32(codec_div_rn(xg[i], s));
        }
        scales_out[g] = scale;
    }
    return TDM_OK;
}

tdm_status_t kern_quant_ckv_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                uint8_t *codes_out, uint8_t *scales_out)
{
    tdm_status_t status;
    int64_t n_groups;

    (void)ctx;
    status = kern_codec_check_rows("quant_ckv", x, x, codes_out, scales_out, n_rows, dim,
                                   KERN_CKV_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n_groups = n_rows * dim / KERN_CKV_GROUP;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *xg = x + g * KERN_CKV_GROUP;
        uint8_t scale = codec_ckv_scale(group_amax(xg, KERN_CKV_GROUP));

        pack_e2m1(xg, KERN_CKV_GROUP, codec_e4m3_to_f32(scale),
                  codes_out + g * (KERN_CKV_GROUP / 2));
        scales_out[g] = scale;
    }
    return TDM_OK;
}

tdm_status_t kern_quant_mx4_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                uint8_t *codes_out, uint8_t *scales_out)
{
    tdm_status_t status;
    int64_t n_groups;

    (void)ctx;
    status = kern_codec_check_rows("quant_mx4", x, x, codes_out, scales_out, n_rows, dim,
                                   KERN_MX4_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n_groups = n_rows * dim / KERN_MX4_GROUP;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *xg = x + g * KERN_MX4_GROUP;
        uint8_t scale = codec_mx4_scale(group_amax(xg, KERN_MX4_GROUP));

        pack_e2m1(xg, KERN_MX4_GROUP, codec_ue8m0_to_f32(scale),
                  codes_out + g * (KERN_MX4_GROUP / 2));
        scales_out[g] = scale;
    }
    return TDM_OK;
}

/* ---- row dequantizers -------------------------------------------------------------------- */

/*
 * AVX-512 versions of the three row dequantizers (decode reads every window-ring entry, index
 * key and selected compressed row through them each step). Each lane computes exactly the
 * scalar expression: the code's FP32 value (bit-built like codec_e4m3_to_f32, or the E2M1
 * table of codec_e2m1_to_f32) times the group's scale, one IEEE multiply, so the bytes equal
 * the plain loops'. The plain loops stay for CPUs without AVX-512.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#define CODEC_HAVE_X86 1

static int codec_have_avx512(void)
{
    return __builtin_cpu_supports("avx512f");
}

/* codec_e4m3_to_f32 on 16 codes (one per 32-bit lane). */
__attribute__((target("avx512f"))) static inline __m512 e4m3x16_to_f32(__m512i c)
{
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    __m512i e = _mm512_and_si512(_mm512_srli_epi32(c, 3), _mm512_set1_epi32(0xF));
    __m512i m = _mm512_and_si512(c, _mm512_set1_epi32(0x7));
    __m512i norm =
        _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(120)), 23),
                        _mm512_slli_epi32(m, 20));
    __m512i sub = _mm512_castps_si512(
        _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(0x1p-9f))); /* exact */
    __mmask16 is_sub = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
    __mmask16 is_nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(c, _mm512_set1_epi32(0x7F)),
                                               _mm512_set1_epi32(0x7F));
    __m512i mag = _mm512_mask_blend_epi32(is_sub, norm, sub);
    mag = _mm512_mask_blend_epi32(is_nan, mag, _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
}

/* 16 nibbles (even element in the low nibble) of 8 packed bytes, one per 32-bit lane. */
__attribute__((target("avx512f"))) static inline __m512i nibbles16(const uint8_t *packed)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)packed);
    __m512i w = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    __m512i sh = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    return _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(0xF));
}

__attribute__((target("avx512f"))) static void
dequant_act8_avx512(const uint8_t *codes, const uint8_t *scales, int64_t n, float *y)
{
    for (int64_t g = 0; g < n; g += KERN_ACT8_GROUP) {
        __m512 s = _mm512_set1_ps(codec_ue8m0_to_f32(scales[g / KERN_ACT8_GROUP]));
        for (int64_t i = g; i < g + KERN_ACT8_GROUP; i += 16) {
            __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i)));
            _mm512_storeu_ps(y + i, _mm512_mul_ps(e4m3x16_to_f32(c), s));
        }
    }
}

/* E2M1 codes x per-group scale; group 16 (Q_ckv, E4M3 scales) or 32 (Q_mx4, UE8M0 scales). */
__attribute__((target("avx512f"))) static void dequant_e2m1_avx512(const uint8_t *codes,
                                                                   const uint8_t *scales, int64_t n,
                                                                   int64_t group, int e4m3_scales,
                                                                   float *y)
{
    float table[16];
    __m512 t;
    for (int k = 0; k < 16; k++) {
        table[k] = codec_e2m1_to_f32((uint8_t)k);
    }
    t = _mm512_loadu_ps(table);
    for (int64_t g = 0; g < n; g += group) {
        uint8_t sc = scales[g / group];
        __m512 s = _mm512_set1_ps(e4m3_scales ? codec_e4m3_to_f32(sc) : codec_ue8m0_to_f32(sc));
        for (int64_t i = g; i < g + group; i += 16) {
            __m512 v = _mm512_permutexvar_ps(nibbles16(codes + i / 2), t);
            _mm512_storeu_ps(y + i, _mm512_mul_ps(v, s));
        }
    }
}

/* |x| with NaN as 0 (codec_amax_term) on 16 lanes. */
__attribute__((target("avx512f"))) static inline __m512 amax_term16(__m512 x)
{
    __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(_mm512_maskz_mov_epi32((__mmask16)~nan, a));
}

/*
 * codec_e4m3_to_f32(codec_e4m3_from_f32(v)) on 16 lanes, in FP32: |v| >= 448 (infinities and
 * NaN included) saturates to 448; from 2^-6 up the mantissa is rounded to 3 bits, nearest-even
 * on the bits (a carry moves to the next binade, as codec_round_magnitude's); below, to the
 * subnormal step 2^-9 (v * 2^9 rounded to an integer, ties even, times 2^-9: all exact). The
 * sign is always v's.
 */
__attribute__((target("avx512f"))) static inline __m512 e4m3_round16(__m512 v)
{
    __m512i b = _mm512_castps_si512(v);
    __m512i sign = _mm512_and_si512(b, _mm512_set1_epi32((int)0x80000000u));
    __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
    __m512i norm =
        _mm512_and_si512(_mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF), lsb)),
                         _mm512_set1_epi32((int)0xFFF00000u));
    __m512 av = _mm512_castsi512_ps(a);
    __m512 sub = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(av, _mm512_set1_ps(0x1p9f)),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                               _mm512_set1_ps(0x1p-9f));
    __mmask16 is_norm = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x3C800000)); /* 2^-6 */
    __mmask16 is_sat = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x43E00000));  /* 448 */
    __m512i mag = _mm512_mask_blend_epi32(is_norm, _mm512_castps_si512(sub), norm);
    mag = _mm512_mask_blend_epi32(is_sat, mag, _mm512_set1_epi32(0x43E00000));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
}

/* kern_qdq_act8_cpu's loop (n % 32 == 0); y may alias x (a group is read before it is written). */
__attribute__((target("avx512f"))) static void qdq_act8_avx512(const float *x, int64_t n, float *y)
{
    for (int64_t g = 0; g < n; g += KERN_ACT8_GROUP) {
        __m512 x0 = _mm512_loadu_ps(x + g);
        __m512 x1 = _mm512_loadu_ps(x + g + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(amax_term16(x0), amax_term16(x1)));
        float s = codec_ue8m0_to_f32(codec_act8_scale(amax));
        __m512 sv = _mm512_set1_ps(s);
        _mm512_storeu_ps(y + g, _mm512_mul_ps(e4m3_round16(_mm512_div_ps(x0, sv)), sv));
        _mm512_storeu_ps(y + g + 16, _mm512_mul_ps(e4m3_round16(_mm512_div_ps(x1, sv)), sv));
    }
}
#else
#define CODEC_HAVE_X86 0
#endif

tdm_status_t kern_dequant_act8_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                   int64_t n_rows, int64_t dim, float *y_out)
{
    tdm_status_t status;
    int64_t n;

    (void)ctx;
    status = kern_codec_check_rows("dequant_act8", codes, scales, y_out, y_out, n_rows, dim,
                                   KERN_ACT8_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n = n_rows * dim;
#if CODEC_HAVE_X86
    if (codec_have_avx512()) {
        dequant_act8_avx512(codes, scales, n, y_out);
        return TDM_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        y_out[i] = codec_e4m3_to_f32(codes[i]) * codec_ue8m0_to_f32(scales[i / KERN_ACT8_GROUP]);
    }
    return TDM_OK;
}

tdm_status_t kern_dequant_ckv_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                  int64_t n_rows, int64_t dim, float *y_out)
{
    tdm_status_t status;
    int64_t n;

    (void)ctx;
    status = kern_codec_check_rows("dequant_ckv", codes, scales, y_out, y_out, n_rows, dim,
                                   KERN_CKV_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n = n_rows * dim;
#if CODEC_HAVE_X86
    if (codec_have_avx512()) {
        dequant_e2m1_avx512(codes, scales, n, KERN_CKV_GROUP, 1, y_out);
        return TDM_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        uint8_t nibble = (uint8_t)(codes[i / 2] >> (4 * (i % 2)));
        y_out[i] = codec_e2m1_to_f32(nibble) * codec_e4m3_to_f32(scales[i / KERN_CKV_GROUP]);
    }
    return TDM_OK;
}

tdm_status_t kern_dequant_mx4_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                  int64_t n_rows, int64_t dim, float *y_out)
{
    tdm_status_t status;
    int64_t n;

    (void)ctx;
    status = kern_codec_check_rows("dequant_mx4", codes, scales, y_out, y_out, n_rows, dim,
                                   KERN_MX4_GROUP);
    if (status != TDM_OK) {
        return status;
    }
    n = n_rows * dim;
#if CODEC_HAVE_X86
    if (codec_have_avx512()) {
        dequant_e2m1_avx512(codes, scales, n, KERN_MX4_GROUP, 0, y_out);
        return TDM_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        uint8_t nibble = (uint8_t)(codes[i / 2] >> (4 * (i % 2)));
        y_out[i] = codec_e2m1_to_f32(nibble) * codec_ue8m0_to_f32(scales[i / KERN_MX4_GROUP]);
    }
    return TDM_OK;
}

tdm_status_t kern_qdq_act8_cpu(const float *x, int64_t n, float *y_out)
{
    tdm_status_t status;

    status = kern_codec_check_rows("qdq_act8", x, x, y_out, y_out, 1, n, KERN_ACT8_GROUP);
    if (status != TDM_OK) {
        return status;
    }
#if CODEC_HAVE_X86
    if (codec_have_avx512()) {
        qdq_act8_avx512(x, n, y_out);
        return TDM_OK;
    }
#endif
    for (int64_t g = 0; g < n; g += KERN_ACT8_GROUP) {
        float s = codec_ue8m0_to_f32(codec_act8_scale(group_amax(x + g, KERN_ACT8_GROUP)));

        /* element i is read before y[i] is written, so y may alias x */
        for (int64_t i = g; i < g + KERN_ACT8_GROUP; i++) {
            y_out[i] = codec_e4m3_to_f32(codec_e4m3_from_f32(codec_div_rn(x[i], s))) * s;
        }
    }
    return TDM_OK;
}

/* ---- weight storage quantizers ----------------------------------------------------------- */

static tdm_status_t check_weight(const char *op, const void *in_a, const void *in_b,
                                 const void *out_a, const void *out_b, int64_t n_out, int64_t n_in)
{
    if (in_a == NULL || in_b == NULL || out_a == NULL || out_b == NULL) {
        tdm_log(TDM_LOG_WARN, CODEC_LOG, "%s rejected: NULL pointer", op);
        return TDM_ERR_INVALID_ARG;
    }
    if (n_out <= 0 || n_in <= 0 || n_out > INT64_MAX / n_in ||
        (uint64_t)(n_out * n_in) > (uint64_t)(SIZE_MAX / sizeof(float))) {
        tdm_log(TDM_LOG_WARN, CODEC_LOG, "%s rejected: n_out=%lld n_in=%lld", op, (long long)n_out,
                (long long)n_in);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

tdm_status_t kern_weight_fp8_quantize(const float *w, int64_t n_out, int64_t n_in,
                                      uint8_t *codes_out, uint8_t *scales_out)
{
    tdm_status_t status;
    int64_t n_block_cols;

    status = check_weight("weight_fp8_quantize", w, w, codes_out, scales_out, n_out, n_in);
    if (status != TDM_OK) {
        return status;
    }
    n_block_cols = ceil_div(n_in, KERN_WEIGHT_FP8_BLOCK);
    for (int64_t bo = 0; bo < n_out; bo += KERN_WEIGHT_FP8_BLOCK) {
        int64_t o_end = bo + KERN_WEIGHT_FP8_BLOCK < n_out ? bo + KERN_WEIGHT_FP8_BLOCK : n_out;

        for (int64_t bi = 0; bi < n_in; bi += KERN_WEIGHT_FP8_BLOCK) {
            int64_t i_end = bi + KERN_WEIGHT_FP8_BLOCK < n_in ? bi + KERN_WEIGHT_FP8_BLOCK : n_in;
            float amax = 0.0f;
            uint8_t scale;
            float s;

            for (int64_t o = bo; o < o_end; o++) {
                amax = codec_amax_merge(amax, group_amax(w + o * n_in + bi, i_end - bi));
            }
            scale = codec_act8_scale(amax);
            s = codec_ue8m0_to_f32(scale);
            for (int64_t o = bo; o < o_end; o++) {
                for (int64_t i = bi; i < i_end; i++) {
                    codes_out[o * n_in + i] = codec_e4m3_from_f32(codec_div_rn(w[o * n_in + i], s));
                }
            }
            scales_out[(bo / KERN_WEIGHT_FP8_BLOCK) * n_block_cols + bi / KERN_WEIGHT_FP8_BLOCK] =
                scale;
        }
    }
    return TDM_OK;
}

tdm_status_t kern_weight_fp8_dequantize(const uint8_t *codes, const uint8_t *scales, int64_t n_out,
                                        int64_t n_in, float *w_out)
{
    tdm_status_t status;
    int64_t n_block_cols;

    status = check_weight("weight_fp8_dequantize", codes, scales, w_out, w_out, n_out, n_in);
    if (status != TDM_OK) {
        return status;
    }
    n_block_cols = ceil_div(n_in, KERN_WEIGHT_FP8_BLOCK);
    for (int64_t o = 0; o < n_out; o++) {
        const uint8_t *scale_row = scales + (o / KERN_WEIGHT_FP8_BLOCK) * n_block_cols;

        for (int64_t i = 0; i < n_in; i++) {
            w_out[o * n_in + i] = codec_e4m3_to_f32(codes[o * n_in + i]) *
                                  codec_ue8m0_to_f32(scale_row[i / KERN_WEIGHT_FP8_BLOCK]);
        }
    }
    return TDM_OK;
}

tdm_status_t kern_weight_mxfp4_quantize(const float *w, int64_t n_out, int64_t n_in,
                                        uint8_t *packed_out, uint8_t *scales_out)
{
    /* MODEL.md 3 and 12.7: the MXFP4 storage layout is exactly Q_mx4 on the rows of w. */
    return kern_quant_mx4_cpu(NULL, w, n_out, n_in, packed_out, scales_out);
}

tdm_status_t kern_weight_mxfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
                                          int64_t n_out, int64_t n_in, float *w_out)
{
    return kern_dequant_mx4_cpu(NULL, packed, scales, n_out, n_in, w_out);
}
