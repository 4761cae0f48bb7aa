/* codec.c - CPU reference of the number formats and quantizers in kernels/codec.h. Plain loops
 * over the shared scalar codec (kernels/codec_bits.h) are the definition; the CUDA kernels must
 * match these bytes. The row quantizers and dequantizers run the vector version of
 * kern_cpu_isa() when there is one (kernels/cpu/vec_isa.h), with the same bytes.
 */
#include "kernels/codec.h"

#include "common/log.h"
#include "kernels/codec_bits.h"
#include "kernels/cpu/vec_isa.h"

#include <float.h>
#include <stddef.h>
#include <stdint.h>

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

/* The scalar definitions of the row operations, with the signatures of cpu_vec_ops_t: a vector
 * version, when kern_cpu_isa() has one, gives the same bytes. */

static void quant_act8_scalar(const float *x, int64_t n, uint8_t *codes_out, uint8_t *scales_out)
{
    for (int64_t g = 0; g < n / KERN_ACT8_GROUP; g++) {
        const float *xg = x + g * KERN_ACT8_GROUP;
        uint8_t scale = codec_act8_scale(group_amax(xg, KERN_ACT8_GROUP));
        float s = codec_ue8m0_to_f32(scale);

        for (int64_t i = 0; i < KERN_ACT8_GROUP; i++) {
            codes_out[g * KERN_ACT8_GROUP + i] = codec_e4m3_from_f32(codec_div_rn(xg[i], s));
        }
        scales_out[g] = scale;
    }
}

/* Q_ckv (e4m3_scales: E4M3 scale per 16) or Q_mx4 (UE8M0 scale per 32) codes of n elements. */
static void quant_e2m1_scalar(const float *x, int64_t n, int64_t group, int e4m3_scales,
                              uint8_t *codes_out, uint8_t *scales_out)
{
    for (int64_t g = 0; g < n / group; g++) {
        const float *xg = x + g * group;
        float amax = group_amax(xg, group);
        uint8_t scale = e4m3_scales ? codec_ckv_scale(amax) : codec_mx4_scale(amax);

        pack_e2m1(xg, group, e4m3_scales ? codec_e4m3_to_f32(scale) : codec_ue8m0_to_f32(scale),
                  codes_out + g * (group / 2));
        scales_out[g] = scale;
    }
}

static void dequant_act8_scalar(const uint8_t *codes, const uint8_t *scales, int64_t n,
                                float *y_out)
{
    /* A NaN code (0x7F/0xFF, never written) gives its own NaN whatever the scale: C leaves
     * which NaN a product of two NaNs returns to the compiler's operand order. */
    for (int64_t i = 0; i < n; i++) {
        float v = codec_e4m3_to_f32(codes[i]);
        y_out[i] =
            (codes[i] & 0x7Fu) == 0x7Fu ? v : v * codec_ue8m0_to_f32(scales[i / KERN_ACT8_GROUP]);
    }
}

/* codes * scale of Q_ckv (e4m3_scales: E4M3 scale per 16) or Q_mx4 (UE8M0 per 32) elements. */
static void dequant_e2m1_scalar(const uint8_t *codes, const uint8_t *scales, int64_t n,
                                int64_t group, int e4m3_scales, float *y_out)
{
    for (int64_t i = 0; i < n; i++) {
        uint8_t nibble = (uint8_t)(codes[i / 2] >> (4 * (i % 2)));
        uint8_t sc = scales[i / group];
        y_out[i] = codec_e2m1_to_f32(nibble) *
                   (e4m3_scales ? codec_e4m3_to_f32(sc) : codec_ue8m0_to_f32(sc));
    }
}

static void qdq_act8_scalar(const float *x, int64_t n, float *y_out)
{
    for (int64_t g = 0; g < n; g += KERN_ACT8_GROUP) {
        float s = codec_ue8m0_to_f32(codec_act8_scale(group_amax(x + g, KERN_ACT8_GROUP)));

        /* element i is read before y[i] is written, so y may alias x */
        for (int64_t i = g; i < g + KERN_ACT8_GROUP; i++) {
            y_out[i] = codec_e4m3_to_f32(codec_e4m3_from_f32(codec_div_rn(x[i], s))) * s;
        }
    }
}

/* The row operations of this CPU's vector version (kernels/cpu/vec_isa.h), or the scalar ones
 * (a table with only the row operations). */
const cpu_vec_ops_t *cpu_row_ops(void)
{
    static const cpu_vec_ops_t scalar = {
        .dequant_act8 = dequant_act8_scalar,
        .dequant_e2m1 = dequant_e2m1_scalar,
        .qdq_act8 = qdq_act8_scalar,
        .quant_act8 = quant_act8_scalar,
        .quant_e2m1 = quant_e2m1_scalar,
    };
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    return vec != NULL ? vec : &scalar;
}

tdm_status_t kern_quant_act8_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                 uint8_t *codes_out, uint8_t *scales_out)
{
    tdm_status_t status = kern_codec_check_rows("quant_act8", x, x, codes_out, scales_out, n_rows,
                                                dim, KERN_ACT8_GROUP);

    (void)ctx;
    if (status == TDM_OK) {
        cpu_row_ops()->quant_act8(x, n_rows * dim, codes_out, scales_out);
    }
    return status;
}

/* Q_ckv (e4m3_scales: E4M3 scale per 16) or Q_mx4 (UE8M0 scale per 32) codes of rows. */
static tdm_status_t quant_e2m1_rows(const char *what, const float *x, int64_t n_rows, int64_t dim,
                                    int e4m3_scales, uint8_t *codes_out, uint8_t *scales_out)
{
    int64_t group = e4m3_scales ? KERN_CKV_GROUP : KERN_MX4_GROUP;
    tdm_status_t status =
        kern_codec_check_rows(what, x, x, codes_out, scales_out, n_rows, dim, group);

    if (status == TDM_OK) {
        cpu_row_ops()->quant_e2m1(x, n_rows * dim, group, e4m3_scales, codes_out, scales_out);
    }
    return status;
}

tdm_status_t kern_quant_ckv_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                uint8_t *codes_out, uint8_t *scales_out)
{
    (void)ctx;
    return quant_e2m1_rows("quant_ckv", x, n_rows, dim, 1, codes_out, scales_out);
}

tdm_status_t kern_quant_mx4_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                uint8_t *codes_out, uint8_t *scales_out)
{
    (void)ctx;
    return quant_e2m1_rows("quant_mx4", x, n_rows, dim, 0, codes_out, scales_out);
}

/* ---- row dequantizers -------------------------------------------------------------------- */

tdm_status_t kern_dequant_act8_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                   int64_t n_rows, int64_t dim, float *y_out)
{
    tdm_status_t status = kern_codec_check_rows("dequant_act8", codes, scales, y_out, y_out, n_rows,
                                                dim, KERN_ACT8_GROUP);

    (void)ctx;
    if (status == TDM_OK) {
        cpu_row_ops()->dequant_act8(codes, scales, n_rows * dim, y_out);
    }
    return status;
}

/* codes * scale of Q_ckv (e4m3_scales: E4M3 scale per 16) or Q_mx4 (UE8M0 per 32) rows. */
static tdm_status_t dequant_e2m1_rows(const char *what, const uint8_t *codes, const uint8_t *scales,
                                      int64_t n_rows, int64_t dim, int e4m3_scales, float *y_out)
{
    int64_t group = e4m3_scales ? KERN_CKV_GROUP : KERN_MX4_GROUP;
    tdm_status_t status =
        kern_codec_check_rows(what, codes, scales, y_out, y_out, n_rows, dim, group);

    if (status == TDM_OK) {
        cpu_row_ops()->dequant_e2m1(codes, scales, n_rows * dim, group, e4m3_scales, y_out);
    }
    return status;
}

tdm_status_t kern_dequant_ckv_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                  int64_t n_rows, int64_t dim, float *y_out)
{
    (void)ctx;
    return dequant_e2m1_rows("dequant_ckv", codes, scales, n_rows, dim, 1, y_out);
}

tdm_status_t kern_dequant_mx4_cpu(kern_ctx_t *ctx, const uint8_t *codes, const uint8_t *scales,
                                  int64_t n_rows, int64_t dim, float *y_out)
{
    (void)ctx;
    return dequant_e2m1_rows("dequant_mx4", codes, scales, n_rows, dim, 0, y_out);
}

tdm_status_t kern_qdq_act8_cpu(const float *x, int64_t n, float *y_out)
{
    tdm_status_t status =
        kern_codec_check_rows("qdq_act8", x, x, y_out, y_out, 1, n, KERN_ACT8_GROUP);

    if (status == TDM_OK) {
        cpu_row_ops()->qdq_act8(x, n, y_out);
    }
    return status;
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
