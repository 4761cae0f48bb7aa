/* codec_bits.h - the bit-exact scalar codec shared by kernels/cpu/codec.c and
 * kernels/cuda/codec.cu (internal; callers use kernels/codec.h).
 *
 * One source for every rounding decision of MODEL.md section 4, compiled once as plain C and
 * once as CUDA __host__ __device__ code, so both backends produce the same bytes. Integer bit
 * manipulation only; the one floating-point division (fl(a/b)) is `/` on the host (IEEE,
 * FLT_EVAL_METHOD 0) and __fdiv_rn on the device. Owns no state; knows nothing of rows or
 * pages.
 */
#ifndef TANDEM_KERNELS_CODEC_BITS_H
#define TANDEM_KERNELS_CODEC_BITS_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/status.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define CODEC_HD __host__ __device__
#else
#define CODEC_HD
#endif

#define CODEC_F32_ABS_MASK  0x7FFFFFFFu
#define CODEC_F32_SIGN_MASK 0x80000000u
#define CODEC_F32_INF_BITS  0x7F800000u
#define CODEC_E4M3_MAX_BITS 0x43E00000u /* 448.0f */
#define CODEC_E2M1_MAX_BITS 0x40C00000u /* 6.0f */
#define CODEC_E4M3_MAX_CODE 0x7Eu       /* 448 */
#define CODEC_E2M1_MAX_CODE 0x7u        /* 6 */
#define CODEC_E4M3_SIGN     0x80u
#define CODEC_E2M1_SIGN     0x8u
#define CODEC_CEIL2_MIN     (-127)
#define CODEC_CEIL2_MAX     127
#define CODEC_UE8M0_BIAS    127

/* FP32 <-> raw bits without aliasing UB. */
CODEC_HD static inline uint32_t codec_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    return bits;
#endif
}

CODEC_HD static inline float codec_f32_from_bits(uint32_t bits)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float x;
    memcpy(&x, &bits, sizeof(x));
    return x;
#endif
}

/*
 * fl(a/b): the correctly rounded FP32 quotient (MODEL.md section 4). A NaN dividend is
 * returned as is: GPUs return a canonical NaN (sign cleared) from arithmetic while x86 keeps
 * the operand's, and the code of a NaN depends on its sign bit.
 */
CODEC_HD static inline float codec_div_rn(float a, float b)
{
    if ((codec_f32_bits(a) & CODEC_F32_ABS_MASK) > CODEC_F32_INF_BITS) {
        return a;
    }
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/*
 * Round the magnitude |x| (abs_bits: FP32 bits with the sign cleared, finite, below the
 * format's saturation threshold) to nearest-even on the grid of a minifloat with `bias` and
 * `mant_bits` mantissa bits (subnormals m * 2^(1-bias-mant_bits) included). Returns the
 * magnitude code (exponent field << mant_bits | mantissa); a carry out of the mantissa rounds
 * up into the next binade, as RNE requires.
 */
CODEC_HD static inline uint32_t codec_round_magnitude(uint32_t abs_bits, uint32_t mant_bits,
                                                      uint32_t bias)
{
    uint32_t exp_field = abs_bits >> 23;
    uint32_t mant = abs_bits & 0x7FFFFFu;
    uint32_t min_normal_exp = 127u + 1u - bias; /* FP32 exponent field of 2^(1-bias) */
    uint32_t value;
    uint32_t rem;
    uint32_t half;
    uint32_t shift;
    uint32_t sig;

    if (exp_field >= min_normal_exp) {
        shift = 23u - mant_bits;
        value = ((exp_field - (127u - bias)) << mant_bits) | (mant >> shift);
        rem = mant & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (value & 1u) != 0u)) {
            value += 1u;
        }
        return value;
    }
    if (exp_field == 0u) {
        return 0u; /* FP32 zero or subnormal: below half the smallest subnormal code */
    }
    /* |x| = sig * 2^(exp_field - 150); in units of the subnormal step 2^(1-bias-mant_bits)
     * that is sig >> shift with shift = 150 + 1 - bias - mant_bits - exp_field (>= 21 here). */
    sig = mant | 0x800000u;
    shift = 151u - bias - mant_bits - exp_field;
    if (shift >= 25u) {
        return 0u; /* sig < 2^24, so the quotient is below one half */
    }
    value = sig >> shift;
    rem = sig & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (value & 1u) != 0u)) {
        value += 1u;
    }
    return value;
}

/* FP32 -> a small float code: sign_code when x's sign bit is set, then max_code when |x| has
 * FP32 bits >= max_bits (NaN and infinities included), else the RNE magnitude of
 * codec_round_magnitude(mant_bits, bias). */
CODEC_HD static inline uint8_t codec_small_float_from_f32(float x, uint32_t sign_code,
                                                          uint32_t max_bits, uint32_t max_code,
                                                          uint32_t mant_bits, uint32_t bias)
{
    uint32_t bits = codec_f32_bits(x);
    uint32_t sign = (bits & CODEC_F32_SIGN_MASK) != 0u ? sign_code : 0u;
    uint32_t abs_bits = bits & CODEC_F32_ABS_MASK;

    if (abs_bits >= max_bits) {
        return (uint8_t)(sign | max_code);
    }
    return (uint8_t)(sign | codec_round_magnitude(abs_bits, mant_bits, bias));
}

/* FP32 -> E4M3FN: clamp to +-448 (NaN and infinities included, keeping their sign bit), then
 * RNE with subnormals; the sign bit is always the input's. Never returns 0x7F or 0xFF. */
CODEC_HD static inline uint8_t codec_e4m3_from_f32(float x)
{
    return codec_small_float_from_f32(x, CODEC_E4M3_SIGN, CODEC_E4M3_MAX_BITS, CODEC_E4M3_MAX_CODE,
                                      3u, 7u);
}

/* E4M3FN -> FP32, exact; 0x7F/0xFF decode to NaN. */
CODEC_HD static inline float codec_e4m3_to_f32(uint8_t code)
{
    uint32_t sign = (code & CODEC_E4M3_SIGN) != 0u ? CODEC_F32_SIGN_MASK : 0u;
    uint32_t exp_field = (code >> 3) & 0xFu;
    uint32_t mant = code & 0x7u;

    if (exp_field == 0xFu && mant == 0x7u) {
        return codec_f32_from_bits(sign | 0x7FC00000u);
    }
    if (exp_field == 0u) {
        /* m * 2^-9: exact in FP32; the product keeps the sign of zero. */
        float magnitude = (float)mant * 0x1p-9f;
        return codec_f32_from_bits(sign | codec_f32_bits(magnitude));
    }
    return codec_f32_from_bits(sign | ((exp_field + 120u) << 23) | (mant << 20));
}

/* FP32 -> E2M1 (low nibble): saturate at +-6 (NaN and infinities included, keeping their sign
 * bit), else RNE, ties to even mantissa; the sign bit is always the input's. */
CODEC_HD static inline uint8_t codec_e2m1_from_f32(float x)
{
    return codec_small_float_from_f32(x, CODEC_E2M1_SIGN, CODEC_E2M1_MAX_BITS, CODEC_E2M1_MAX_CODE,
                                      1u, 1u);
}

/* E2M1 (low nibble; the high nibble is ignored) -> FP32, exact. */
CODEC_HD static inline float codec_e2m1_to_f32(uint8_t code)
{
    /* Magnitudes of codes 0..7 as FP32 bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
    uint32_t magnitude_bits;
    switch (code & 0x7u) {
    case 0u:
        magnitude_bits = 0x00000000u;
        break;
    case 1u:
        magnitude_bits = 0x3F000000u;
        break;
    case 2u:
        magnitude_bits = 0x3F800000u;
        break;
    case 3u:
        magnitude_bits = 0x3FC00000u;
        break;
    case 4u:
        magnitude_bits = 0x40000000u;
        break;
    case 5u:
        magnitude_bits = 0x40400000u;
        break;
    case 6u:
        magnitude_bits = 0x40800000u;
        break;
    default:
        magnitude_bits = 0x40C00000u;
        break;
    }
    return codec_f32_from_bits(((code & CODEC_E2M1_SIGN) != 0u ? CODEC_F32_SIGN_MASK : 0u) |
                               magnitude_bits);
}

/*
 * ceil2(r): exponent of the smallest power of two >= |r|, read from the bits, clamped to
 * [-127, 127]. |r| = 0 gives -127 (the clamp of -inf); infinities and NaN give 127.
 */
CODEC_HD static inline int codec_ceil2(float r)
{
    uint32_t abs_bits = codec_f32_bits(r) & CODEC_F32_ABS_MASK;
    uint32_t exp_field = abs_bits >> 23;
    uint32_t mant = abs_bits & 0x7FFFFFu;
    int e;

    if (exp_field == 0xFFu) {
        return CODEC_CEIL2_MAX;
    }
    if (exp_field == 0u) {
        /* zero or subnormal: |r| = mant * 2^-149 < 2^-126 */
        if (mant == 0u) {
            return CODEC_CEIL2_MIN;
        }
        /* exactly a power of two: 2^(bit - 149); else the next one up */
        e = -149;
        while ((mant >> 1) != 0u) {
            e++;
            mant >>= 1;
        }
        if ((abs_bits & (abs_bits - 1u)) != 0u) {
            e++;
        }
    } else {
        e = (int)exp_field - 127 + (mant != 0u ? 1 : 0);
    }
    if (e < CODEC_CEIL2_MIN) {
        return CODEC_CEIL2_MIN;
    }
    if (e > CODEC_CEIL2_MAX) {
        return CODEC_CEIL2_MAX;
    }
    return e;
}

/* UE8M0 byte u -> 2^(u-127), exact; u = 0 is the FP32 subnormal 2^-127, u = 255 is NaN. */
CODEC_HD static inline float codec_ue8m0_to_f32(uint8_t u)
{
    if (u == 0u) {
        return codec_f32_from_bits(0x00400000u);
    }
    if (u == 0xFFu) {
        return codec_f32_from_bits(0x7FC00000u);
    }
    return codec_f32_from_bits((uint32_t)u << 23);
}

/* |x| for a group's amax; NaN counts as 0 so that the max is order-independent. */
CODEC_HD static inline float codec_amax_term(float x)
{
    uint32_t abs_bits = codec_f32_bits(x) & CODEC_F32_ABS_MASK;

    return abs_bits > CODEC_F32_INF_BITS ? 0.0f : codec_f32_from_bits(abs_bits);
}

/* max(a, b) for non-NaN, non-negative a, b (commutative and associative on those). */
CODEC_HD static inline float codec_amax_merge(float a, float b)
{
    return b > a ? b : a;
}

/* Q_act8 / Q_swa / FP8 weight scale: UE8M0 of 2^ceil2(fl(max(amax, 1e-4) / 448)). */
CODEC_HD static inline uint8_t codec_act8_scale(float amax)
{
    float floored = amax < 1e-4f ? 1e-4f : amax;

    return (uint8_t)(codec_ceil2(codec_div_rn(floored, 448.0f)) + CODEC_UE8M0_BIAS);
}

/* Q_mx4 / MXFP4 weight scale: UE8M0 of 2^ceil2(fl(max(amax, 6*2^-126) / 6)). */
CODEC_HD static inline uint8_t codec_mx4_scale(float amax)
{
    float floored = amax < 0x1.8p-124f ? 0x1.8p-124f : amax;

    return (uint8_t)(codec_ceil2(codec_div_rn(floored, 6.0f)) + CODEC_UE8M0_BIAS);
}

/* Q_ckv scale: E4M3 of clamp(fl(amax / 6), 2^-9, 448). */
CODEC_HD static inline uint8_t codec_ckv_scale(float amax)
{
    float ratio = codec_div_rn(amax, 6.0f);

    if (!(ratio >= 0x1p-9f)) {
        ratio = 0x1p-9f;
    }
    if (ratio > 448.0f) {
        ratio = 448.0f;
    }
    return codec_e4m3_from_f32(ratio);
}

/*
 * kern_codec_check_rows - validate the arguments of a row (de)quantizer shared by both
 * backends (defined in kernels/cpu/codec.c): non-NULL pointers, n_rows and dim > 0, dim a
 * multiple of `group`, n_rows * dim within int64. Returns TDM_OK or TDM_ERR_INVALID_ARG with
 * one warn line naming `op` and the offending value.
 */
#ifdef __cplusplus
extern "C" {
#endif
tdm_status_t kern_codec_check_rows(const char *op, const void *in_a, const void *in_b,
                                   const void *out_a, const void *out_b, int64_t n_rows,
                                   int64_t dim, int64_t group);
#ifdef __cplusplus
}
#endif

#endif
