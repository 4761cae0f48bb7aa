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
     * s[h n + e] = exp(s[h n + e] - mu_h) / den_h, den_h = the sum of those exponentials in the
     * 16-lane order (kernels/attention.h), plus exp(sink[h] - mu_h); exp = kern_exp */
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
    /* the Sinkhorn loop of kern_mhc_coeffs_cpu on 16 rows at once, lane r = row r: M [m*m][16]
     * (element k of row r at M[k * 16 + r]), in place */
    void (*mhc_sinkhorn)(float *M, int m, int iters, float eh);
    /* kern_swiglu_cpu's loop on one row of n elements (n % 16 == 0) with e[i] =
     * kern_exp(-min(g[i], lambda)) computed by the caller (exp_n) */
    void (*swiglu)(const float *g, const float *u, const float *e, int64_t n, float lambda,
                   float wr, float *h);
    /* kern_rope_cpu on one row x [n_heads, dim] (every head's first dim - d_r elements rounded
     * to BF16, its last d_r rotated), given cs2[2i] = cs2[2i + 1] = cos_i and sn2 likewise
     * (d_r elements each); inverse: KERN_ROPE_INVERSE */
    void (*rope_heads)(float *x, int64_t n_heads, int64_t dim, int d_r, const float *cs2,
                       const float *sn2, int inverse);
    /* y[i] = bf16((x[i] * s) * gamma[i]) (kern_rmsnorm_cpu's second loop) */
    void (*scale_gamma_bf16)(const float *x, float s, const float *gamma, int64_t n, float *y);
    /* x[i] = bf16(x[i] + g * v[i]) (the Engram gate's update); v NULL: x[i] = bf16(x[i]) */
    void (*axpy_bf16)(float *x, float g, const float *v, int64_t n);
    /* y[i] = bf16(a[i] + b[i]) (kern_add_bf16_cpu); b NULL: y[i] = bf16(a[i])
     * (kern_bf16_round_cpu); y may alias a or b */
    void (*add_bf16)(const float *a, const float *b, int64_t n, float *y);
    /* y[i] = kern_exp(x[i]) (kernels/attention.h) for i < n, any n; y may be x */
    void (*exp_n)(const float *x, int64_t n, float *y);
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

/* cpu_row_ops - cpu_vec_ops(), or for the scalar set a table of the codec's plain row loops
 * (kernels/cpu/codec.c; only the dequant_*, qdq_act8 and quant_* members): never NULL. */
const cpu_vec_ops_t *cpu_row_ops(void);

#endif
