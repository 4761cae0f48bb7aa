/* simd16.h - the CPU kernels' 16-lane FP32 vector, one implementation per instruction set
 * (private to kernels/cpu; kernels/cpu_isa.h says why they give identical bits).
 *
 * A kernel written once against these inline functions (a *_body.inc file) is compiled once per
 * set by a small file that defines exactly one of
 *   CPU_SIMD16_AVX512  one __m512                (file compiled with -mavx512f -mfma)
 *   CPU_SIMD16_AVX2    two __m256, lanes 0-7 / 8-15 (file compiled with -mavx2 -mfma)
 *   CPU_SIMD16_NEON    four float32x4_t          (aarch64)
 *   CPU_SIMD16_SCALAR  sixteen floats, plain C   (the reference order, fmaf per lane)
 * and CPU_SIMD16_SUFFIX (the name suffix of the functions it defines: avx512, avx2, ...), then
 * includes this header. Lane j of every operation is the IEEE-754 single-precision operation on
 * lane j alone (v16_fma is one fused multiply-add, never split, never contracted elsewhere: the
 * files are built with -ffp-contract=off), so every implementation gives the same bits.
 *
 * Weight decoders return exact values (MODEL.md 3, 4):
 *   v16_e4m3_raw(p): 16 E4M3 codes -> e4m3(code) * 2^-120, exact (the code's 7 magnitude bits
 *     placed at FP32 bits 20-26: normals and subnormals alike, a subnormal code as an FP32
 *     denormal, so the GEMM uses it only in blocks kern_mat_t.fp8_clean marks free of them).
 *     Multiply by 2^(s - 7) for the UE8M0 scale s (exact while 3 <= s <= 134; callers check).
 *     NaN codes (0x7F/0xFF, never written) give 480 * 2^-120 here: callers refuse them.
 *   v16_e4m3_h(p): 16 E4M3 codes -> e4m3(code) * 2^-8, exact, through FP16 (the code's bits
 *     placed in an FP16 whose exponent bias is 15 instead of 7, widened by the hardware's
 *     FP16->FP32 conversion): every result is an FP32 normal, so no denormal operand ever
 *     reaches a multiply (x86 cores slow those down). Multiply by 2^(s - 119) for the UE8M0
 *     scale s (exact while 3 <= s <= 134). NaN codes are refused by callers as above.
 *   v16_e2m1x2(p): 8 packed bytes (element 2b low nibble, 2b+1 high) -> 2 * e2m1(nibble), exact;
 *     negative zero comes back as +0 (harmless inside a dot product: an FP32 sum that starts at
 *     +0 never becomes -0, so +-0 products add nothing either way). Multiply by 2^(s - 128).
 *   v16_e2m1x2_32(p, lo, hi): 16 packed bytes -> elements 0-15 in *lo, 16-31 in *hi (the same
 *     values as two v16_e2m1x2 calls, one nibble split for both).
 */
#ifndef TANDEM_KERNELS_CPU_SIMD16_H
#define TANDEM_KERNELS_CPU_SIMD16_H

#include "kernels/cpu/cpu_simd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define V16_LANES 16

/* Every function here is forced inline: the GEMM tiles call them with constant counts and their
 * accumulators in registers, and an out-of-line copy (GCC made ones of the reductions once the
 * AVX2 GEMM grew) takes those through memory with a loop over any count (with a spilled loop
 * bound, gemm_body.inc GB_ROWS_TYPE, the LM head at 4 rows ran 0.76x on the AVX2 set in a loop
 * test; forcing these inline alone brought it to 0.87x). */
#define V16_FN static inline __attribute__((always_inline))

/* 2 * e2m1(code) for codes 0-15 (code | 8 negative; -0 as 0). */
#define V16_E2M1X2_TABLE 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

#if defined(CPU_SIMD16_AVX512) || defined(CPU_SIMD16_AVX2)
#include <immintrin.h>

/* x86: 2 * e2m1 of the nibbles of the bytes of b as int8 in element order (v0: bytes 0-7,
 * v1: bytes 8-15; see V16_E2M1X2_TABLE). */
V16_FN void v16_x86_e2m1x2_i8(__m128i b, __m128i *v0, __m128i *v1)
{
    const __m128i table = _mm_setr_epi8(V16_E2M1X2_TABLE);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    *v0 = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
    *v1 = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));
}

/* x86: 16 E4M3 codes as the FP16 bits of e4m3(code) * 2^-8 (v16_e4m3_h). */
V16_FN __m256i v16_x86_e4m3_f16(const uint8_t *p)
{
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBFFF));
}
#endif

#if defined(CPU_SIMD16_AVX512)
#include <immintrin.h>

typedef __m512 v16;

V16_FN v16 v16_zero(void)
{
    return _mm512_setzero_ps();
}
V16_FN v16 v16_set1(float a)
{
    return _mm512_set1_ps(a);
}
V16_FN v16 v16_load(const float *p)
{
    return _mm512_loadu_ps(p);
}
V16_FN void v16_store(float *p, v16 a)
{
    _mm512_storeu_ps(p, a);
}
V16_FN v16 v16_fma(v16 a, v16 b, v16 c)
{
    return _mm512_fmadd_ps(a, b, c);
}
V16_FN v16 v16_mul(v16 a, v16 b)
{
    return _mm512_mul_ps(a, b);
}
V16_FN v16 v16_add(v16 a, v16 b)
{
    return _mm512_add_ps(a, b);
}
/* Two 256-bit widenings joined, not one 512-bit vpmovzxwd: on a Zen 4 EPYC the 512-bit widening
 * (a lane-crossing shuffle there) held the BF16 LM-head GEMV [32768, 512] to 20-24 GB/s of
 * weights, this form reads 26-31 (1.2-1.35x; 4 rows 1.17x), the same bits
 * (docs/BENCHMARKS.md 2026-12-05). On Intel cores it costs two more shuffle uops per 16 weights,
 * a memory-bound GEMV does not feel them. */
V16_FN v16 v16_bf16(const uint16_t *p)
{
    __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8)));
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
V16_FN v16 v16_e4m3_raw(const uint8_t *p)
{
    __m512i i = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    i = _mm512_and_si512(_mm512_slli_epi32(i, 20), _mm512_set1_epi32((int)0x87F00000u));
    return _mm512_castsi512_ps(i);
}
V16_FN v16 v16_e2m1x2(const uint8_t *p)
{
    __m128i v, unused;
    v16_x86_e2m1x2_i8(_mm_loadl_epi64((const __m128i *)p), &v, &unused);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}
V16_FN v16 v16_e4m3_h(const uint8_t *p)
{
    return _mm512_cvtph_ps(v16_x86_e4m3_f16(p));
}
V16_FN void v16_e2m1x2_32(const uint8_t *p, v16 *lo_out, v16 *hi_out)
{
    __m128i v0, v1;
    v16_x86_e2m1x2_i8(_mm_loadu_si128((const __m128i *)p), &v0, &v1);
    *lo_out = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v0));
    *hi_out = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v1));
}

#elif defined(CPU_SIMD16_AVX2)
#include <immintrin.h>

typedef struct {
    __m256 a, b;
} v16;

V16_FN v16 v16_zero(void)
{
    return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
V16_FN v16 v16_set1(float x)
{
    return (v16){_mm256_set1_ps(x), _mm256_set1_ps(x)};
}
V16_FN v16 v16_load(const float *p)
{
    return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
V16_FN void v16_store(float *p, v16 x)
{
    _mm256_storeu_ps(p, x.a);
    _mm256_storeu_ps(p + 8, x.b);
}
V16_FN v16 v16_fma(v16 x, v16 y, v16 z)
{
    return (v16){_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)};
}
V16_FN v16 v16_mul(v16 x, v16 y)
{
    return (v16){_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)};
}
V16_FN v16 v16_add(v16 x, v16 y)
{
    return (v16){_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)};
}
V16_FN __m256 v8_bf16(const uint16_t *p)
{
    __m256i i = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 16));
}
V16_FN v16 v16_bf16(const uint16_t *p)
{
    return (v16){v8_bf16(p), v8_bf16(p + 8)};
}
V16_FN __m256 v8_e4m3_raw(const uint8_t *p)
{
    __m256i i = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    i = _mm256_and_si256(_mm256_slli_epi32(i, 20), _mm256_set1_epi32((int)0x87F00000u));
    return _mm256_castsi256_ps(i);
}
V16_FN v16 v16_e4m3_raw(const uint8_t *p)
{
    return (v16){v8_e4m3_raw(p), v8_e4m3_raw(p + 8)};
}
V16_FN v16 v16_e2m1x2(const uint8_t *p)
{
    __m128i v, unused;
    v16_x86_e2m1x2_i8(_mm_loadl_epi64((const __m128i *)p), &v, &unused);
    return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))};
}
V16_FN v16 v16_e4m3_h(const uint8_t *p)
{
    __m256i w = v16_x86_e4m3_f16(p);
    return (v16){_mm256_cvtph_ps(_mm256_castsi256_si128(w)),
                 _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1))};
}
V16_FN void v16_e2m1x2_32(const uint8_t *p, v16 *lo_out, v16 *hi_out)
{
    __m128i v0, v1;
    v16_x86_e2m1x2_i8(_mm_loadu_si128((const __m128i *)p), &v0, &v1);
    *lo_out = (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8)))};
    *hi_out = (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8)))};
}

#elif defined(CPU_SIMD16_NEON)
#include <arm_neon.h>

typedef struct {
    float32x4_t q[4];
} v16;

V16_FN v16 v16_zero(void)
{
    float32x4_t z = vdupq_n_f32(0.0f);
    return (v16){{z, z, z, z}};
}
V16_FN v16 v16_set1(float x)
{
    float32x4_t s = vdupq_n_f32(x);
    return (v16){{s, s, s, s}};
}
V16_FN v16 v16_load(const float *p)
{
    return (v16){{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}};
}
V16_FN void v16_store(float *p, v16 x)
{
    for (int i = 0; i < 4; i++) {
        vst1q_f32(p + 4 * i, x.q[i]);
    }
}
V16_FN v16 v16_fma(v16 x, v16 y, v16 z)
{
    v16 r;
    for (int i = 0; i < 4; i++) {
        r.q[i] = vfmaq_f32(z.q[i], x.q[i], y.q[i]); /* z + x * y, fused */
    }
    return r;
}
V16_FN v16 v16_mul(v16 x, v16 y)
{
    v16 r;
    for (int i = 0; i < 4; i++) {
        r.q[i] = vmulq_f32(x.q[i], y.q[i]);
    }
    return r;
}
V16_FN v16 v16_add(v16 x, v16 y)
{
    v16 r;
    for (int i = 0; i < 4; i++) {
        r.q[i] = vaddq_f32(x.q[i], y.q[i]);
    }
    return r;
}
V16_FN v16 v16_bf16(const uint16_t *p)
{
    uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
    return (v16){{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)),
                  vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(a), 16)),
                  vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)),
                  vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(b), 16))}};
}
/* Sign-extended codes -> bits 20-26 plus the sign (see the header comment). */
V16_FN float32x4_t v4_e4m3_bits(int16x4_t h)
{
    int32x4_t i = vshlq_n_s32(vmovl_s16(h), 20);
    return vreinterpretq_f32_s32(vandq_s32(i, vdupq_n_s32((int32_t)0x87F00000u)));
}
V16_FN v16 v16_e4m3_raw(const uint8_t *p)
{
    int8x16_t c = vreinterpretq_s8_u8(vld1q_u8(p));
    int16x8_t lo = vmovl_s8(vget_low_s8(c)), hi = vmovl_s8(vget_high_s8(c));
    return (v16){{v4_e4m3_bits(vget_low_s16(lo)), v4_e4m3_bits(vget_high_s16(lo)),
                  v4_e4m3_bits(vget_low_s16(hi)), v4_e4m3_bits(vget_high_s16(hi))}};
}
V16_FN v16 v16_e2m1x2(const uint8_t *p)
{
    static const int8_t table_bytes[16] = {V16_E2M1X2_TABLE};
    int8x16_t table = vld1q_s8(table_bytes);
    uint8x8_t b = vld1_u8(p);
    uint8x8x2_t z = vzip_u8(vand_u8(b, vdup_n_u8(0x0F)), vshr_n_u8(b, 4));
    int8x16_t v = vqtbl1q_s8(table, vcombine_u8(z.val[0], z.val[1]));
    int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
    return (v16){
        {vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
         vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))}};
}
/* Sign-extended codes -> FP16 bits (see the header comment), widened. */
V16_FN float16x8_t v8_e4m3_f16(int8x8_t c)
{
    int16x8_t w = vshlq_n_s16(vmovl_s8(c), 7);
    return vreinterpretq_f16_s16(vandq_s16(w, vdupq_n_s16((int16_t)0xBFFF)));
}
V16_FN v16 v16_e4m3_h(const uint8_t *p)
{
    int8x16_t c = vreinterpretq_s8_u8(vld1q_u8(p));
    float16x8_t a = v8_e4m3_f16(vget_low_s8(c)), b = v8_e4m3_f16(vget_high_s8(c));
    return (v16){{vcvt_f32_f16(vget_low_f16(a)), vcvt_high_f32_f16(a),
                  vcvt_f32_f16(vget_low_f16(b)), vcvt_high_f32_f16(b)}};
}
V16_FN void v16_e2m1x2_32(const uint8_t *p, v16 *lo_out, v16 *hi_out)
{
    *lo_out = v16_e2m1x2(p);
    *hi_out = v16_e2m1x2(p + 8);
}

#elif defined(CPU_SIMD16_SCALAR)

typedef struct {
    float f[V16_LANES];
} v16;

V16_FN v16 v16_zero(void)
{
    v16 r;
    memset(&r, 0, sizeof(r));
    return r;
}
V16_FN v16 v16_set1(float x)
{
    v16 r;
    for (int j = 0; j < V16_LANES; j++) {
        r.f[j] = x;
    }
    return r;
}
V16_FN v16 v16_load(const float *p)
{
    v16 r;
    memcpy(r.f, p, sizeof(r.f));
    return r;
}
V16_FN void v16_store(float *p, v16 x)
{
    memcpy(p, x.f, sizeof(x.f));
}
V16_FN v16 v16_fma(v16 x, v16 y, v16 z)
{
    for (int j = 0; j < V16_LANES; j++) {
        z.f[j] = fmaf(x.f[j], y.f[j], z.f[j]);
    }
    return z;
}
V16_FN v16 v16_mul(v16 x, v16 y)
{
    for (int j = 0; j < V16_LANES; j++) {
        x.f[j] = x.f[j] * y.f[j];
    }
    return x;
}
V16_FN v16 v16_add(v16 x, v16 y)
{
    for (int j = 0; j < V16_LANES; j++) {
        x.f[j] = x.f[j] + y.f[j];
    }
    return x;
}
V16_FN v16 v16_bf16(const uint16_t *p)
{
    v16 r;
    for (int j = 0; j < V16_LANES; j++) {
        uint32_t bits = (uint32_t)p[j] << 16;
        memcpy(&r.f[j], &bits, 4);
    }
    return r;
}
V16_FN v16 v16_e4m3_raw(const uint8_t *p)
{
    v16 r;
    for (int j = 0; j < V16_LANES; j++) {
        uint32_t bits = ((uint32_t)(p[j] & 0x80u) << 24) | ((uint32_t)(p[j] & 0x7Fu) << 20);
        memcpy(&r.f[j], &bits, 4);
    }
    return r;
}
V16_FN v16 v16_e2m1x2(const uint8_t *p)
{
    static const int8_t table[16] = {V16_E2M1X2_TABLE};
    v16 r;
    for (int b = 0; b < V16_LANES / 2; b++) {
        r.f[2 * b] = (float)table[p[b] & 0xF];
        r.f[2 * b + 1] = (float)table[p[b] >> 4];
    }
    return r;
}

V16_FN v16 v16_e4m3_h(const uint8_t *p)
{
    /* e4m3(code) * 2^-120 (exact), times 2^112 (exact): e4m3(code) * 2^-8 */
    v16 r = v16_e4m3_raw(p);
    for (int j = 0; j < V16_LANES; j++) {
        r.f[j] = r.f[j] * 0x1p112f;
    }
    return r;
}
V16_FN void v16_e2m1x2_32(const uint8_t *p, v16 *lo_out, v16 *hi_out)
{
    *lo_out = v16_e2m1x2(p);
    *hi_out = v16_e2m1x2(p + 8);
}

#else
#error "simd16.h: define one of CPU_SIMD16_AVX512, _AVX2, _NEON, _SCALAR"
#endif

/* v16_pow2 - 2^e as FP32, exact for -149 <= e <= 127 (subnormal below -126); the UE8M0 scale
 * factors of the weight decoders. */
V16_FN float v16_pow2(int e)
{
    uint32_t bits = e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149);
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/*
 * v16_e2m1x2_32_mul - *lo_out, *hi_out = elements 0-15 and 16-31 of the 16 packed bytes at p
 * (as v16_e2m1x2_32 gives them) times scale, each lane the product v16_mul(v16_e2m1x2(..),
 * v16_set1(scale)) gives, bit for bit (the same two operands, one rounding). AVX-512 looks the
 * 16 possible products up in one register (one multiply per 32 elements, two permutes and two
 * interleaves instead of the nibble split, four conversions and two multiplies); the other sets
 * decode and multiply as v16_e2m1x2_32 does.
 */
V16_FN void v16_e2m1x2_32_mul(const uint8_t *p, float scale, v16 *lo_out, v16 *hi_out)
{
#if defined(CPU_SIMD16_AVX512)
    static const float table_f[16] = {V16_E2M1X2_TABLE};
    const __m512 table = _mm512_loadu_ps(table_f);
    const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i odd =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(scale));
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512 lo = _mm512_permutexvar_ps(b, t); /* the index's low 4 bits: the low nibble */
    __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), t);
    *lo_out = _mm512_permutex2var_ps(lo, even, hi);
    *hi_out = _mm512_permutex2var_ps(lo, odd, hi);
#else
    v16 lo, hi;
    v16 sv = v16_set1(scale);
    v16_e2m1x2_32(p, &lo, &hi);
    *lo_out = v16_mul(lo, sv);
    *hi_out = v16_mul(hi, sv);
#endif
}

/* v16_e2m1x2_32_scaled - v16_e2m1x2_32_mul's two vectors stored to out[0..31]. */
V16_FN void v16_e2m1x2_32_scaled(const uint8_t *p, float scale, float *out)
{
    v16 lo, hi;
    v16_e2m1x2_32_mul(p, scale, &lo, &hi);
    v16_store(out, lo);
    v16_store(out + 16, hi);
}

/* v16_reduce - the fixed tree of kernels/gemm.h over the 16 lanes (lane j += lane j + 8, + 4,
 * + 2, + 1), as the scalar definition does it; each step adds the same pairs of lanes, in
 * registers where the set has the shuffles. */
V16_FN float v16_reduce(v16 x)
{
#if defined(CPU_SIMD16_AVX512)
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
#elif defined(CPU_SIMD16_AVX2)
    __m256 h = _mm256_add_ps(x.a, x.b);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
#elif defined(CPU_SIMD16_NEON)
    float32x4_t q = vaddq_f32(vaddq_f32(x.q[0], x.q[2]), vaddq_f32(x.q[1], x.q[3]));
    float32x2_t d = vadd_f32(vget_low_f32(q), vget_high_f32(q));
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);
#else
    float l[V16_LANES];
    v16_store(l, x);
    for (int s = V16_LANES / 2; s >= 1; s /= 2) {
        for (int j = 0; j < s; j++) {
            l[j] = l[j] + l[j + s];
        }
    }
    return l[0];
#endif
}

/*
 * v16_reduce_group - out[i] = v16_reduce(a[i]) for i < n (n <= V16_GROUP), to the bit: the same
 * tree on each vector (lane j += lane j + 8, + 4, + 2, + 1, lower lane first), but the vectors
 * are reduced together through a transposing network (each level pairs two vectors, so one
 * shuffle pair and one add serve two reductions) instead of one shuffle chain each: about 3
 * instructions per output instead of 8. Writes out[0 .. n - 1] only. Input slots >= n are never
 * read, so a[] may be a register tile (after inlining with a constant n every slot index is a
 * constant and nothing goes through memory). V16_GROUP: 16 (AVX-512), 8 (AVX2), 1 elsewhere
 * (plain v16_reduce per vector).
 *
 * v16_reduce_group_full - the same reductions, each rounded to BF16 as cpu_bf16_round does
 * (kernels/cpu/cpu_simd.h: nearest even, NaN quieted) when bf16 != 0, on the whole vector of
 * results; writes all V16_GROUP floats of out (slots n and up: +0), so out must have room.
 */
#if defined(CPU_SIMD16_AVX512)
#define V16_GROUP 16
/* cpu_bf16_round on each lane of a 512-bit vector (simd16_ext.h's v16_bf16_round uses it too). */
V16_FN __m512 v16_x86_bf16_rne512(__m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* Lane i of the result: v16_reduce(a[i]) for i < n, +0 for i >= n. */
V16_FN __m512 v16_reduce16(const v16 *a, int n)
{
    /* After the 4 levels, output lane 4k + t holds the input in slot k + 4t: the inputs are
     * taken in that (transposed) order so that lane i ends up holding a[i]. */
#define V16_IN(i) ((((i) % 4) * 4 + (i) / 4) < n ? a[((i) % 4) * 4 + (i) / 4] : _mm512_setzero_ps())
    v16 c[8], e[4], g[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* lanes 0-7: in[2i]'s j + (j + 8); lanes 8-15: in[2i + 1]'s */
        v16 p = V16_IN(2 * i), q = V16_IN(2 * i + 1);
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE));
    }
#undef V16_IN
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* 128-bit block b: one input's j + (j + 4) */
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) { /* j + (j + 2), two inputs per block */
        g[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
V16_FN void v16_reduce_group(const v16 *a, int n, float *out)
{
    __m512 r = v16_reduce16(a, n);
    if (n == 16) {
        _mm512_storeu_ps(out, r);
    } else {
        _mm512_mask_storeu_ps(out, (__mmask16)((1u << n) - 1u), r);
    }
}
V16_FN void v16_reduce_group_full(const v16 *a, int n, int bf16, float *out)
{
    __m512 r = v16_reduce16(a, n);
    _mm512_storeu_ps(out, bf16 ? v16_x86_bf16_rne512(r) : r);
}
#elif defined(CPU_SIMD16_AVX2)
#define V16_GROUP 8
/* cpu_bf16_round on each lane of a 256-bit vector (simd16_ext.h's v16_bf16_round uses it too). */
V16_FN __m256 v16_x86_bf16_rne256(__m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i rn = _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    __m256i qn = _mm256_or_si256(b, _mm256_set1_epi32(0x00400000));
    rn = _mm256_blendv_epi8(rn, qn, nan);
    return _mm256_castsi256_ps(_mm256_and_si256(rn, _mm256_set1_epi32((int)0xFFFF0000u)));
}
/* Lane i of the result: v16_reduce(a[i]) for i < n, +0 for i >= n. */
V16_FN __m256 v16_reduce8(const v16 *a, int n)
{
    /* Output lane 4k + t holds the input in slot k + 2t (k < 2, t < 4). */
#define V16_IN(i)                                                                                  \
    ((((i) % 2) * 4 + (i) / 2) < n                                                                 \
         ? _mm256_add_ps(a[((i) % 2) * 4 + (i) / 2].a, a[((i) % 2) * 4 + (i) / 2].b)               \
         : _mm256_setzero_ps()) /* lane j + (j + 8) */
    __m256 e[4], g[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* 128-bit half h: p[2i + h]'s j + (j + 4) */
        __m256 p = V16_IN(2 * i), q = V16_IN(2 * i + 1);
        e[i] =
            _mm256_add_ps(_mm256_permute2f128_ps(p, q, 0x20), _mm256_permute2f128_ps(p, q, 0x31));
    }
#undef V16_IN
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        g[i] = _mm256_add_ps(_mm256_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
V16_FN void v16_reduce_group(const v16 *a, int n, float *out)
{
    __m256 r = v16_reduce8(a, n);
    if (n == 8) {
        _mm256_storeu_ps(out, r);
    } else {
        float t[8];
        _mm256_storeu_ps(t, r);
        for (int i = 0; i < n; i++) {
            out[i] = t[i];
        }
    }
}
V16_FN void v16_reduce_group_full(const v16 *a, int n, int bf16, float *out)
{
    __m256 r = v16_reduce8(a, n);
    _mm256_storeu_ps(out, bf16 ? v16_x86_bf16_rne256(r) : r);
}
#else
#define V16_GROUP 1
V16_FN void v16_reduce_group(const v16 *a, int n, float *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = v16_reduce(a[i]);
    }
}
V16_FN void v16_reduce_group_full(const v16 *a, int n, int bf16, float *out)
{
    (void)n;
    float v = v16_reduce(a[0]);
    out[0] = bf16 ? cpu_bf16_round(v) : v;
}
#endif

/* v16_reduce_n - out[i] = v16_reduce(a[i]) for every i < n, V16_GROUP at a time. */
V16_FN void v16_reduce_n(const v16 *a, int n, float *out)
{
    for (int i = 0; i < n; i += V16_GROUP) {
        v16_reduce_group(a + i, n - i < V16_GROUP ? n - i : V16_GROUP, out + i);
    }
}

/* v16_reduce_n_bf16 - v16_reduce_n, each result BF16-rounded when bf16 != 0, through
 * v16_reduce_group_full: out has room for n rounded up to a multiple of V16_GROUP (the slots
 * past n are written with +0). */
V16_FN void v16_reduce_n_bf16(const v16 *a, int n, int bf16, float *out)
{
#pragma GCC unroll 8
    for (int i = 0; i < n; i += V16_GROUP) {
        v16_reduce_group_full(a + i, n - i < V16_GROUP ? n - i : V16_GROUP, bf16, out + i);
    }
}

#endif
