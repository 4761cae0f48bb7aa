/* cpu_simd.h - private helpers of the CPU kernels (the kernels/cpu sources): BF16 rounding
 * (kern_bf16_round, kernels/codec.h) inline: round to nearest even on the upper 16 bits, NaN
 * quieted with its sign and top payload kept. The vector paths are kernels/cpu/vec_isa.h (its
 * 16-lane version is v16_bf16_round in simd16_ext.h). Not a public header.
 */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

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

#endif
