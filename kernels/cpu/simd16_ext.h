/* simd16_ext.h - more lane operations on simd16.h's 16-lane vector (private to kernels/cpu): the
 * integer lanes, compares, selects, division and rounding that the codec, attention, mHC and
 * norm bodies (kernels/cpu/vec_body.inc) need. Include after simd16.h, in a file that defines
 * one of CPU_SIMD16_AVX512, _AVX2 or _NEON (the plain loops of the kernels are the scalar set).
 *
 * As in simd16.h, lane j of every operation is the IEEE-754 single-precision (or 32-bit integer)
 * operation on lane j alone, so every implementation gives the same bits:
 *   v16_div      correctly rounded quotient (divps / vdivq_f32; never a reciprocal estimate)
 *   v16_rint     round to an integral value, ties to even (roundps / vrndnq_f32), any exponent
 *   v16_swap_pairs  lanes (2i, 2i + 1) exchanged (a permutation: the values unchanged)
 *   v16_transpose16 r[i] lane j <- r[j] lane i for 16 vectors (moves only)
 *   v16_gt       a > b, ordered (false when either is NaN)
 *   v16i_gt      signed 32-bit a > b (callers compare magnitudes below 2^31)
 *   v16i_shl/shr logical shifts by a count 0..31
 *   v16_select / v16i_select (m, a, b): m ? a : b per lane
 *   v16i_load_u8 16 bytes -> 16 lanes 0..255; v16i_store_u8 the low byte of each lane -> 16 bytes
 *   v16_from_i   exact int -> float for |i| < 2^24; v16_to_i truncates toward zero
 *   v16_e2m1     8 packed bytes (element 2b in the low nibble) -> codec_e2m1_to_f32 of each
 *                nibble, exact, -0 included
 *   v16_bf16_round  cpu_bf16_round (kernels/cpu/cpu_simd.h) on each lane
 * Multiplications keep their operand order (the NaN a lane returns when both are NaN follows it
 * on every set only as far as the compiler keeps it; callers never rely on that).
 */
#ifndef TANDEM_KERNELS_CPU_SIMD16_EXT_H
#define TANDEM_KERNELS_CPU_SIMD16_EXT_H

#include <stdint.h>

#if defined(CPU_SIMD16_AVX512)

typedef __m512i v16i;
typedef __mmask16 v16m;

static inline v16 v16_sub(v16 a, v16 b)
{
    return _mm512_sub_ps(a, b);
}
static inline v16 v16_div(v16 a, v16 b)
{
    return _mm512_div_ps(a, b);
}
static inline v16 v16_swap_pairs(v16 a)
{
    return _mm512_permute_ps(a, 0xB1);
}
static inline void v16_transpose16(v16 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) { /* 2x2 blocks of elements */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* 4x4 blocks inside each 128-bit lane */
        u[i] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        u[i + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* u[4g + k], lane block q: rows 4g..4g+3 of column 4q + k; move 128-bit blocks */
    for (int k = 0; k < 4; k++) {
        __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88); /* blocks 0,2 | 0,2 */
        __m512 b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD); /* blocks 1,3 | 1,3 */
        __m512 c = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        __m512 d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column k: block 0 of each */
        r[8 + k] = _mm512_shuffle_f32x4(a, c, 0xDD);  /* column 8 + k */
        r[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + k */
        r[12 + k] = _mm512_shuffle_f32x4(b, d, 0xDD); /* column 12 + k */
    }
}
static inline v16 v16_rint(v16 a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline v16i v16_as_i(v16 a)
{
    return _mm512_castps_si512(a);
}
static inline v16 v16i_as_f(v16i a)
{
    return _mm512_castsi512_ps(a);
}
static inline v16 v16_from_i(v16i a)
{
    return _mm512_cvtepi32_ps(a);
}
static inline v16i v16_to_i(v16 a)
{
    return _mm512_cvttps_epi32(a);
}
static inline v16i v16i_set1(int32_t x)
{
    return _mm512_set1_epi32(x);
}
static inline v16i v16i_and(v16i a, v16i b)
{
    return _mm512_and_si512(a, b);
}
static inline v16i v16i_or(v16i a, v16i b)
{
    return _mm512_or_si512(a, b);
}
static inline v16i v16i_add(v16i a, v16i b)
{
    return _mm512_add_epi32(a, b);
}
static inline v16i v16i_sub(v16i a, v16i b)
{
    return _mm512_sub_epi32(a, b);
}
static inline v16i v16i_shl(v16i a, int n)
{
    return _mm512_sll_epi32(a, _mm_cvtsi32_si128(n));
}
static inline v16i v16i_shr(v16i a, int n)
{
    return _mm512_srl_epi32(a, _mm_cvtsi32_si128(n));
}
static inline v16m v16i_eq(v16i a, v16i b)
{
    return _mm512_cmpeq_epi32_mask(a, b);
}
static inline v16m v16i_gt(v16i a, v16i b)
{
    return _mm512_cmpgt_epi32_mask(a, b);
}
static inline v16m v16_gt(v16 a, v16 b)
{
    return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
}
static inline int v16m_any(v16m m)
{
    return m != 0;
}
static inline v16i v16i_select(v16m m, v16i a, v16i b)
{
    return _mm512_mask_blend_epi32(m, b, a);
}
static inline v16 v16_select(v16m m, v16 a, v16 b)
{
    return _mm512_mask_blend_ps(m, b, a);
}
static inline v16i v16i_load_u8(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline void v16i_store_u8(uint8_t *p, v16i a)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(a));
}
static inline v16 v16_e2m1(const uint8_t *p)
{
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f,
                                        -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m512i w = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    __m512i sh = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    return _mm512_permutexvar_ps(_mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(15)),
                                 table);
}

#elif defined(CPU_SIMD16_AVX2)

typedef struct {
    __m256i a, b;
} v16i;
typedef struct {
    __m256i a, b; /* all-ones / zero lanes */
} v16m;

static inline v16 v16_sub(v16 x, v16 y)
{
    return (v16){_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)};
}
static inline v16 v16_div(v16 x, v16 y)
{
    return (v16){_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)};
}
static inline v16 v16_swap_pairs(v16 x)
{
    return (v16){_mm256_permute_ps(x.a, 0xB1), _mm256_permute_ps(x.b, 0xB1)};
}
/* 8x8 transpose of p[0..7] (rows) in place. */
static inline void v8_transpose8(__m256 *p[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(*p[i], *p[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(*p[i], *p[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        *p[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        *p[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}
static inline void v16_transpose16(v16 r[16])
{
    __m256 *p[8];
    __m256 tmp;
    for (int i = 0; i < 8; i++) { /* rows 0-7, columns 0-7 */
        p[i] = &r[i].a;
    }
    v8_transpose8(p);
    for (int i = 0; i < 8; i++) { /* rows 8-15, columns 8-15 */
        p[i] = &r[8 + i].b;
    }
    v8_transpose8(p);
    for (int i = 0; i < 8; i++) { /* rows 0-7 columns 8-15 and rows 8-15 columns 0-7 */
        p[i] = &r[i].b;
    }
    v8_transpose8(p);
    for (int i = 0; i < 8; i++) {
        p[i] = &r[8 + i].a;
    }
    v8_transpose8(p);
    for (int i = 0; i < 8; i++) { /* the off-diagonal blocks trade places */
        tmp = r[i].b;
        r[i].b = r[8 + i].a;
        r[8 + i].a = tmp;
    }
}
static inline v16 v16_rint(v16 x)
{
    return (v16){_mm256_round_ps(x.a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                 _mm256_round_ps(x.b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
static inline v16i v16_as_i(v16 x)
{
    return (v16i){_mm256_castps_si256(x.a), _mm256_castps_si256(x.b)};
}
static inline v16 v16i_as_f(v16i x)
{
    return (v16){_mm256_castsi256_ps(x.a), _mm256_castsi256_ps(x.b)};
}
static inline v16 v16_from_i(v16i x)
{
    return (v16){_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)};
}
static inline v16i v16_to_i(v16 x)
{
    return (v16i){_mm256_cvttps_epi32(x.a), _mm256_cvttps_epi32(x.b)};
}
static inline v16i v16i_set1(int32_t v)
{
    __m256i s = _mm256_set1_epi32(v);
    return (v16i){s, s};
}
static inline v16i v16i_and(v16i x, v16i y)
{
    return (v16i){_mm256_and_si256(x.a, y.a), _mm256_and_si256(x.b, y.b)};
}
static inline v16i v16i_or(v16i x, v16i y)
{
    return (v16i){_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)};
}
static inline v16i v16i_add(v16i x, v16i y)
{
    return (v16i){_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)};
}
static inline v16i v16i_sub(v16i x, v16i y)
{
    return (v16i){_mm256_sub_epi32(x.a, y.a), _mm256_sub_epi32(x.b, y.b)};
}
static inline v16i v16i_shl(v16i x, int n)
{
    __m128i c = _mm_cvtsi32_si128(n);
    return (v16i){_mm256_sll_epi32(x.a, c), _mm256_sll_epi32(x.b, c)};
}
static inline v16i v16i_shr(v16i x, int n)
{
    __m128i c = _mm_cvtsi32_si128(n);
    return (v16i){_mm256_srl_epi32(x.a, c), _mm256_srl_epi32(x.b, c)};
}
static inline v16m v16i_eq(v16i x, v16i y)
{
    return (v16m){_mm256_cmpeq_epi32(x.a, y.a), _mm256_cmpeq_epi32(x.b, y.b)};
}
static inline v16m v16i_gt(v16i x, v16i y)
{
    return (v16m){_mm256_cmpgt_epi32(x.a, y.a), _mm256_cmpgt_epi32(x.b, y.b)};
}
static inline v16m v16_gt(v16 x, v16 y)
{
    return (v16m){_mm256_castps_si256(_mm256_cmp_ps(x.a, y.a, _CMP_GT_OQ)),
                  _mm256_castps_si256(_mm256_cmp_ps(x.b, y.b, _CMP_GT_OQ))};
}
static inline int v16m_any(v16m m)
{
    return !_mm256_testz_si256(_mm256_or_si256(m.a, m.b), _mm256_set1_epi32(-1));
}
static inline v16i v16i_select(v16m m, v16i x, v16i y)
{
    return (v16i){_mm256_blendv_epi8(y.a, x.a, m.a), _mm256_blendv_epi8(y.b, x.b, m.b)};
}
static inline v16 v16_select(v16m m, v16 x, v16 y)
{
    return (v16){_mm256_blendv_ps(y.a, x.a, _mm256_castsi256_ps(m.a)),
                 _mm256_blendv_ps(y.b, x.b, _mm256_castsi256_ps(m.b))};
}
static inline v16i v16i_load_u8(const uint8_t *p)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    return (v16i){_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))};
}
static inline void v16i_store_u8(uint8_t *p, v16i x)
{
    __m256i mask = _mm256_set1_epi32(0xFF);
    /* 16-bit lanes a0-3 b0-3 | a4-7 b4-7, reordered to a0-7 | b0-7, then packed to bytes */
    __m256i w = _mm256_packus_epi32(_mm256_and_si256(x.a, mask), _mm256_and_si256(x.b, mask));
    w = _mm256_permute4x64_epi64(w, 0xD8);
    _mm_storeu_si128((__m128i *)p,
                     _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}
static inline __m256 v8_e2m1(__m256i nib)
{
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(_mm256_permutevar8x32_ps(mag, nib), _mm256_castsi256_ps(sign));
}
static inline v16 v16_e2m1(const uint8_t *p)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m128i v = _mm_unpacklo_epi8(lo, hi);
    return (v16){v8_e2m1(_mm256_cvtepu8_epi32(v)),
                 v8_e2m1(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))};
}

#elif defined(CPU_SIMD16_NEON)

typedef struct {
    uint32x4_t q[4];
} v16i;
typedef struct {
    uint32x4_t q[4]; /* all-ones / zero lanes */
} v16m;

#define V16_EXT_MAP2(T, expr)                                                                      \
    T r;                                                                                           \
    for (int i = 0; i < 4; i++) {                                                                  \
        r.q[i] = expr;                                                                             \
    }                                                                                              \
    return r

static inline v16 v16_sub(v16 x, v16 y)
{
    V16_EXT_MAP2(v16, vsubq_f32(x.q[i], y.q[i]));
}
static inline v16 v16_div(v16 x, v16 y)
{
    V16_EXT_MAP2(v16, vdivq_f32(x.q[i], y.q[i]));
}
static inline v16 v16_swap_pairs(v16 x)
{
    V16_EXT_MAP2(v16, vrev64q_f32(x.q[i]));
}
static inline void v16_transpose16(v16 r[16])
{
    v16 o[16];
    for (int bi = 0; bi < 4; bi++) { /* 4x4 block (rows 4bi.., columns 4bj..) -> (4bj.., 4bi..) */
        for (int bj = 0; bj < 4; bj++) {
            float32x4x2_t p = vtrnq_f32(r[4 * bi].q[bj], r[4 * bi + 1].q[bj]);
            float32x4x2_t q = vtrnq_f32(r[4 * bi + 2].q[bj], r[4 * bi + 3].q[bj]);
            o[4 * bj].q[bi] = vcombine_f32(vget_low_f32(p.val[0]), vget_low_f32(q.val[0]));
            o[4 * bj + 1].q[bi] = vcombine_f32(vget_low_f32(p.val[1]), vget_low_f32(q.val[1]));
            o[4 * bj + 2].q[bi] = vcombine_f32(vget_high_f32(p.val[0]), vget_high_f32(q.val[0]));
            o[4 * bj + 3].q[bi] = vcombine_f32(vget_high_f32(p.val[1]), vget_high_f32(q.val[1]));
        }
    }
    for (int i = 0; i < 16; i++) {
        r[i] = o[i];
    }
}
static inline v16 v16_rint(v16 x)
{
    V16_EXT_MAP2(v16, vrndnq_f32(x.q[i]));
}
static inline v16i v16_as_i(v16 x)
{
    V16_EXT_MAP2(v16i, vreinterpretq_u32_f32(x.q[i]));
}
static inline v16 v16i_as_f(v16i x)
{
    V16_EXT_MAP2(v16, vreinterpretq_f32_u32(x.q[i]));
}
static inline v16 v16_from_i(v16i x)
{
    V16_EXT_MAP2(v16, vcvtq_f32_s32(vreinterpretq_s32_u32(x.q[i])));
}
static inline v16i v16_to_i(v16 x)
{
    V16_EXT_MAP2(v16i, vreinterpretq_u32_s32(vcvtq_s32_f32(x.q[i])));
}
static inline v16i v16i_set1(int32_t v)
{
    V16_EXT_MAP2(v16i, vdupq_n_u32((uint32_t)v));
}
static inline v16i v16i_and(v16i x, v16i y)
{
    V16_EXT_MAP2(v16i, vandq_u32(x.q[i], y.q[i]));
}
static inline v16i v16i_or(v16i x, v16i y)
{
    V16_EXT_MAP2(v16i, vorrq_u32(x.q[i], y.q[i]));
}
static inline v16i v16i_add(v16i x, v16i y)
{
    V16_EXT_MAP2(v16i, vaddq_u32(x.q[i], y.q[i]));
}
static inline v16i v16i_sub(v16i x, v16i y)
{
    V16_EXT_MAP2(v16i, vsubq_u32(x.q[i], y.q[i]));
}
static inline v16i v16i_shl(v16i x, int n)
{
    V16_EXT_MAP2(v16i, vshlq_u32(x.q[i], vdupq_n_s32(n)));
}
static inline v16i v16i_shr(v16i x, int n)
{
    V16_EXT_MAP2(v16i, vshlq_u32(x.q[i], vdupq_n_s32(-n)));
}
static inline v16m v16i_eq(v16i x, v16i y)
{
    V16_EXT_MAP2(v16m, vceqq_u32(x.q[i], y.q[i]));
}
static inline v16m v16i_gt(v16i x, v16i y)
{
    V16_EXT_MAP2(v16m, vcgtq_s32(vreinterpretq_s32_u32(x.q[i]), vreinterpretq_s32_u32(y.q[i])));
}
static inline v16m v16_gt(v16 x, v16 y)
{
    V16_EXT_MAP2(v16m, vcgtq_f32(x.q[i], y.q[i]));
}
static inline int v16m_any(v16m m)
{
    return vmaxvq_u32(vorrq_u32(vorrq_u32(m.q[0], m.q[1]), vorrq_u32(m.q[2], m.q[3]))) != 0;
}
static inline v16i v16i_select(v16m m, v16i x, v16i y)
{
    V16_EXT_MAP2(v16i, vbslq_u32(m.q[i], x.q[i], y.q[i]));
}
static inline v16 v16_select(v16m m, v16 x, v16 y)
{
    V16_EXT_MAP2(v16, vbslq_f32(m.q[i], x.q[i], y.q[i]));
}
static inline v16i v16i_load_u8(const uint8_t *p)
{
    uint8x16_t b = vld1q_u8(p);
    uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
    return (v16i){{vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                   vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))}};
}
static inline void v16i_store_u8(uint8_t *p, v16i x)
{
    uint16x8_t lo = vcombine_u16(vmovn_u32(x.q[0]), vmovn_u32(x.q[1]));
    uint16x8_t hi = vcombine_u16(vmovn_u32(x.q[2]), vmovn_u32(x.q[3]));
    vst1q_u8(p, vcombine_u8(vmovn_u16(lo), vmovn_u16(hi)));
}
static inline v16 v16_e2m1(const uint8_t *p)
{
    /* 2 * |e2m1| of codes 0-7 as bytes; halved in FP32 (exact), then the sign bit ORed in */
    static const uint8_t table_bytes[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12};
    uint8x8_t b = vld1_u8(p);
    uint8x8x2_t z = vzip_u8(vand_u8(b, vdup_n_u8(0x0F)), vshr_n_u8(b, 4));
    uint8x16_t nib = vcombine_u8(z.val[0], z.val[1]);
    uint8x16_t mag = vqtbl1q_u8(vld1q_u8(table_bytes), nib);
    uint16x8_t mlo = vmovl_u8(vget_low_u8(mag)), mhi = vmovl_u8(vget_high_u8(mag));
    uint16x8_t nlo = vmovl_u8(vget_low_u8(nib)), nhi = vmovl_u8(vget_high_u8(nib));
    uint32x4_t m4[4] = {vmovl_u16(vget_low_u16(mlo)), vmovl_u16(vget_high_u16(mlo)),
                        vmovl_u16(vget_low_u16(mhi)), vmovl_u16(vget_high_u16(mhi))};
    uint32x4_t n4[4] = {vmovl_u16(vget_low_u16(nlo)), vmovl_u16(vget_high_u16(nlo)),
                        vmovl_u16(vget_low_u16(nhi)), vmovl_u16(vget_high_u16(nhi))};
    v16 r;
    for (int i = 0; i < 4; i++) {
        float32x4_t f = vmulq_f32(vcvtq_f32_u32(m4[i]), vdupq_n_f32(0.5f));
        uint32x4_t sign = vshlq_n_u32(vandq_u32(n4[i], vdupq_n_u32(8)), 28);
        r.q[i] = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(f), sign));
    }
    return r;
}
#undef V16_EXT_MAP2

#else
#error "simd16_ext.h: define one of CPU_SIMD16_AVX512, _AVX2, _NEON (the plain loops are scalar)"
#endif

/* ---- built on the above, the same for every set ------------------------------------------ */

static inline v16 v16_f_set1i(uint32_t bits)
{
    return v16i_as_f(v16i_set1((int32_t)bits));
}

/* cpu_bf16_round on each lane: round to nearest even on the upper 16 bits, NaN quieted. */
static inline v16 v16_bf16_round(v16 x)
{
#if defined(CPU_SIMD16_AVX512)
    return v16_x86_bf16_rne512(x); /* simd16.h, shared with the GEMM epilogue */
#elif defined(CPU_SIMD16_AVX2)
    return (v16){v16_x86_bf16_rne256(x.a), v16_x86_bf16_rne256(x.b)};
#else
    v16i b = v16_as_i(x);
    v16i abs = v16i_and(b, v16i_set1(0x7FFFFFFF));
    v16m nan = v16i_gt(abs, v16i_set1(0x7F800000));
    v16i odd = v16i_and(v16i_shr(b, 16), v16i_set1(1));
    v16i r = v16i_add(b, v16i_add(v16i_set1(0x7FFF), odd));
    r = v16i_select(nan, v16i_or(b, v16i_set1(0x00400000)), r);
    return v16i_as_f(v16i_and(r, v16i_set1((int32_t)0xFFFF0000u)));
#endif
}

/* codec_amax_term on each lane: |x|, NaN as +0. */
static inline v16 v16_amax_term(v16 x)
{
    v16i a = v16i_and(v16_as_i(x), v16i_set1(0x7FFFFFFF));
    return v16i_as_f(v16i_select(v16i_gt(a, v16i_set1(0x7F800000)), v16i_set1(0), a));
}

/* codec_amax_merge on each lane: b > a ? b : a. */
static inline v16 v16_amax_merge(v16 a, v16 b)
{
    return v16_select(v16_gt(b, a), b, a);
}

/* The largest of 16 non-NaN, non-negative lanes (any order gives it: a tree of maxima in
 * registers where the set has the shuffles). */
static inline float v16_amax_lanes(v16 x)
{
#if defined(CPU_SIMD16_AVX512)
    return _mm512_reduce_max_ps(x);
#elif defined(CPU_SIMD16_AVX2)
    __m256 h = _mm256_max_ps(x.a, x.b);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
#else
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(x.q[0], x.q[1]), vmaxq_f32(x.q[2], x.q[3])));
#endif
}

#endif
