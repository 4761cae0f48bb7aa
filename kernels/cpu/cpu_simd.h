/* cpu_simd.h - private helpers of the CPU kernels (the kernels/cpu sources): the AVX-512 check
 * and BF16 rounding (kern_bf16_round, kernels/codec.h) inline, scalar and on 16 lanes. Both give
 * the bits of kern_bf16_round: round to nearest even on the upper 16 bits, NaN quieted with its
 * sign and top payload kept. Not a public header.
 */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CPU_HAVE_X86 1
#else
#define CPU_HAVE_X86 0
#endif

/* cpu_bf16_round - kern_bf16_round(x), inlined (FP32 in, the BF16 value as FP32 out). */
static inline float cpu_bf16_round(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        bits |= 0x00400000u; /* quiet NaN */
    } else {
        bits += 0x7FFFu + ((bits >> 16) & 1u);
    }
    bits &= 0xFFFF0000u;
    memcpy(&x, &bits, sizeof(x));
    return x;
}

#if CPU_HAVE_X86
/* cpu_have_avx512 - 1 when the CPU runs AVX-512F (the vector paths' requirement). */
static inline int cpu_have_avx512(void)
{
    return __builtin_cpu_supports("avx512f");
}

/* cpu_bf16_round16 - cpu_bf16_round on each of 16 lanes. */
__attribute__((target("avx512f"))) static inline __m512 cpu_bf16_round16(__m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(b, _mm512_set1_epi32(0x00400000)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}
#endif

#endif
