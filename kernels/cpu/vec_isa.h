/* vec_isa.h - the vector halves of the codec, attention, indexer, mHC and norm kernels (private to
 * kernels/cpu). One table per instruction set, all from kernels/cpu/vec_body.inc over simd16.h
 * and simd16_ext.h (vec_avx2.c, vec_avx512.c, vec_neon.c); the kernels' plain loops are the
 * scalar set and the definition. cpu_vec_ops() gives the table of kern_cpu_isa(), or NULL for
 * the scalar set (then the callers run their plain loops).
 *
 * Every entry gives the bits of the plain loop it replaces (each lane does that loop's IEEE
 * operations on one element, in its order; sums run in the loops' order, never reassociated).
 * Arguments are already checked by the callers; n, d, H need no particular multiple unless said.
 */
#ifndef TANDEM_KERNELS_CPU_VEC_ISA_H
#define TANDEM_KERNELS_CPU_VEC_ISA_H

#include <stdint.h>

typedef struct {
    /* kern_dequant_act8_cpu on n elements (n % 32 == 0) */
    void (*dequant_act8)(const uint8_t *codes, const uint8_t *scales, int64_t n, float *y);
    /* kern_dequant_ckv_cpu (group 16, E4M3 scales, e4m3_scales 1) or kern_dequant_mx4_cpu
     * (group 32, UE8M0 scales, e4m3_scales 0) on n elements (n % group == 0) */
    void (*dequant_e2m1)(const uint8_t *codes, const uint8_t *scales, int64_t n, int64_t group,
                         int e4m3_scales, float *y);
    /* kern_qdq_act8_cpu (n % 32 == 0; y may alias x) */
    void (*qdq_act8)(const float *x, int64_t n, float *y);
    /* kern_quant_act8_cpu on n elements (n % 32 == 0) */
    void (*quant_act8)(const float *x, int64_t n, uint8_t *codes, uint8_t *scales);
    /* kern_quant_ckv_cpu (e4m3_scales 1, group 16) or kern_quant_mx4_cpu (0, group 32) */
    void (*quant_e2m1)(const float *x, int64_t n, int64_t group, int e4m3_scales, uint8_t *codes,
                       uint8_t *scales);
    /* s[h * n_keys + e] = kern_dot_cpu(q_h, key_e, d) * scale for h < n_heads, e < n_keys
     * (q: [n_heads, d]), keys e < n_a in keys_a, the rest rows of keys_b: in order (sel NULL)
     * or rows sel[e - n_a]; d % 16 == 0 (kern_attention_cpu's logits of every head) */
    void (*attn_scores)(const float *q, int64_t n_heads, const float *keys_a, int64_t n_a,
                        const float *keys_b, const int32_t *sel, int64_t n_keys, int64_t d,
                        float scale, float *s);
    /* kern_attention_cpu's softmax of every head in place, s [n_heads, n] (n >= 1):
     * s[h n + e] = exp(s[h n + e] - mu_h) / den_h, den_h = sum over e ascending of those
     * exponentials, plus exp(sink[h] - mu_h); libm's expf */
    void (*attn_softmax)(float *s, int64_t n_heads, int64_t n, const float *sink);
    /* o[h * d + c] = bf16(sum over e ascending of p[h * n_keys + e] * key_e[c]) from 0.0f for
     * h < n_heads, keys as attn_scores'; d % 16 == 0 (kern_attention_cpu's weighted sums of
     * every head) */
    void (*attn_accum)(const float *p, int64_t n_heads, const float *keys_a, int64_t n_a,
                       const float *keys_b, const int32_t *sel, int64_t n_keys, int64_t d,
                       float *o);
    /* kern_index_scores_cpu's loop (d_I % 16 == 0) */
    void (*index_scores)(const float *q, const float *w, int64_t n_heads, int64_t d_I,
                         const float *keys, int64_t n_keys, float *scores);
    /* kern_mhc_collapse_cpu / kern_mhc_update_cpu on one row */
    void (*mhc_collapse)(const float *pre, const float *X, int m, int64_t H, float *y);
    void (*mhc_update)(const float *post, const float *F, const float *M, int m, int64_t H,
                       float *X);
    /* y[i] = bf16((x[i] * s) * gamma[i]) (kern_rmsnorm_cpu's second loop) */
    void (*scale_gamma_bf16)(const float *x, float s, const float *gamma, int64_t n, float *y);
    /* x[i] = bf16(x[i] + g * v[i]) (the Engram gate's update); v NULL: x[i] = bf16(x[i]) */
    void (*axpy_bf16)(float *x, float g, const float *v, int64_t n);
} cpu_vec_ops_t;

#if defined(__x86_64__)
extern const cpu_vec_ops_t cpu_vec_ops_avx2;
extern const cpu_vec_ops_t cpu_vec_ops_avx512;
#endif
#if defined(__aarch64__)
extern const cpu_vec_ops_t cpu_vec_ops_neon;
#endif

/* cpu_vec_ops - the table of kern_cpu_isa(); NULL for the scalar set. */
const cpu_vec_ops_t *cpu_vec_ops(void);

#endif
