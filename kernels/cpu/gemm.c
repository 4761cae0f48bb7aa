/* gemm.c - kern_gemm_cpu (AVX-512 when the CPU has it, else the plain loop; a one-row GEMV
 * path for decode; large calls split by output quads over the worker pool of kernels/cpu/pool.h),
 * kern_gemm_ref_cpu, Q_act8 rows and the weight dequantizers of kernels/gemm.h.
 *
 * Every version computes every output in the same order (16 FMA lanes over ascending k, then the
 * tree 8, 4, 2, 1), so they give identical bits whatever the batch shape or thread split.
 */
#include "kernels/gemm.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_HAVE_X86 1
#else
#define GEMM_HAVE_X86 0
#endif

#define LANES 16     /* partial sums per output (the normative order of this module) */
#define TILE_OUT 4   /* outputs per register tile */
#define TILE_ROWS 4  /* activation rows per register tile */
#define ROW_BLOCK 32 /* activation rows kept hot while a weight tile streams past */
#define GEMV_OUT               8  /* outputs per tile of the one-row path */
#define GEMM_CHUNKS_PER_THREAD 8  /* work items per thread of a threaded GEMM */
#define GEMM_THREAD_MIN_MACS (4.0 * 1024 * 1024) /* below this one thread is faster */

/* The fixed reduction tree of the 16 lane sums. */
static float lane_reduce(float *acc)
{
    for (int s = LANES / 2; s >= 1; s /= 2) {
        for (int j = 0; j < s; j++) {
            acc[j] = acc[j] + acc[j + s];
        }
    }
    return acc[0];
}

static float weight_at(const kern_mat_t *w, int64_t o, int64_t k)
{
    if (w->dtype == KERN_MAT_F32) {
        return ((const float *)w->data)[o * w->n_in + k];
    }
    return kern_bf16_to_f32(((const uint16_t *)w->data)[o * w->n_in + k]);
}

static float finish(float v, uint32_t flags)
{
    return (flags & KERN_GEMM_OUT_BF16) != 0 ? cpu_bf16_round(v) : v;
}

static int gemm_args_ok(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows,
                        const float *y, int64_t ldy)
{
    if (w == NULL || w->data == NULL || x == NULL || y == NULL || n_rows < 0 || w->n_out <= 0 ||
        w->n_in <= 0 || w->n_in % KERN_GEMM_K_MULTIPLE != 0 || ldx < w->n_in || ldy < w->n_out) {
        return 0;
    }
    return w->dtype == KERN_MAT_BF16 || w->dtype == KERN_MAT_F32;
}

/* One output of the reference order. */
static float dot_ref(const kern_mat_t *w, int64_t o, const float *x)
{
    float acc[LANES];
    memset(acc, 0, sizeof(acc));
    for (int64_t k0 = 0; k0 < w->n_in; k0 += LANES) {
        for (int j = 0; j < LANES; j++) {
            acc[j] = fmaf(weight_at(w, o, k0 + j), x[k0 + j], acc[j]);
        }
    }
    return lane_reduce(acc);
}

tdm_status_t kern_gemm_ref_cpu(kern_ctx_t *ctx, const kern_mat_t *w, const float *x, int64_t ldx,
                               int64_t n_rows, uint32_t flags, float *y_out, int64_t ldy)
{
    (void)ctx;
    if (!gemm_args_ok(w, x, ldx, n_rows, y_out, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t o = 0; o < w->n_out; o++) {
            y_out[r * ldy + o] = finish(dot_ref(w, o, x + r * ldx), flags);
        }
    }
    return TDM_OK;
}

#if GEMM_HAVE_X86
__attribute__((target("avx512f"))) static inline __m512 load_w16(const kern_mat_t *w, int64_t o,
                                                                  int64_t k)
{
    if (w->dtype == KERN_MAT_F32) {
        return _mm512_loadu_ps((const float *)w->data + o * w->n_in + k);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w->data + o * w->n_in + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Outputs [o0, o0 + n_o) x rows [r0, r0 + n_r), n_o <= 4, n_r <= 4. */
__attribute__((target("avx512f"))) static void tile_avx512(const kern_mat_t *w, const float *x,
                                                           int64_t ldx, int64_t r0, int n_r,
                                                           int64_t o0, int n_o, uint32_t flags,
                                                           float *y, int64_t ldy)
{
    __m512 acc[TILE_ROWS][TILE_OUT];
    float lanes[LANES];

    for (int r = 0; r < TILE_ROWS; r++) {
        for (int o = 0; o < TILE_OUT; o++) {
            acc[r][o] = _mm512_setzero_ps();
        }
    }
    if (n_r == TILE_ROWS && n_o == TILE_OUT) {
        for (int64_t k = 0; k < w->n_in; k += LANES) {
            __m512 wv0 = load_w16(w, o0 + 0, k);
            __m512 wv1 = load_w16(w, o0 + 1, k);
            __m512 wv2 = load_w16(w, o0 + 2, k);
            __m512 wv3 = load_w16(w, o0 + 3, k);
            for (int r = 0; r < TILE_ROWS; r++) {
                __m512 xv = _mm512_loadu_ps(x + (r0 + r) * ldx + k);
                acc[r][0] = _mm512_fmadd_ps(wv0, xv, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(wv1, xv, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(wv2, xv, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(wv3, xv, acc[r][3]);
            }
        }
    } else {
        for (int64_t k = 0; k < w->n_in; k += LANES) {
            __m512 wv[TILE_OUT];
            for (int o = 0; o < n_o; o++) {
                wv[o] = load_w16(w, o0 + o, k);
            }
            for (int r = 0; r < n_r; r++) {
                __m512 xv = _mm512_loadu_ps(x + (r0 + r) * ldx + k);
                for (int o = 0; o < n_o; o++) {
                    acc[r][o] = _mm512_fmadd_ps(wv[o], xv, acc[r][o]);
                }
            }
        }
    }
    for (int r = 0; r < n_r; r++) {
        for (int o = 0; o < n_o; o++) {
            _mm512_storeu_ps(lanes, acc[r][o]);
            y[(r0 + r) * ldy + o0 + o] = finish(lane_reduce(lanes), flags);
        }
    }
}

/*
 * One activation row against outputs [o0, o1) (decode at batch 1): eight weight rows stream
 * side by side; each output keeps the module's order (16 FMA lanes over ascending k, then the
 * fixed tree), so the bits equal tile_avx512's. f32: FP32 weights, else BF16 (a constant in
 * each caller, so the branch folds away).
 */
__attribute__((target("avx512f"), always_inline)) static inline void
gemv_avx512(const kern_mat_t *w, const float *x, int64_t o0, int64_t o1, uint32_t flags, float *y,
            int f32)
{
    int64_t K = w->n_in;
    int64_t o = o0;
    float lanes[LANES];

    for (; o + GEMV_OUT <= o1; o += GEMV_OUT) {
        __m512 acc[GEMV_OUT];
        for (int j = 0; j < GEMV_OUT; j++) {
            acc[j] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < K; k += LANES) {
            __m512 xv = _mm512_loadu_ps(x + k);
            for (int j = 0; j < GEMV_OUT; j++) {
                __m512 wv;
                if (f32) {
                    wv = _mm512_loadu_ps((const float *)w->data + (o + j) * K + k);
                } else {
                    __m256i h = _mm256_loadu_si256(
                        (const __m256i *)((const uint16_t *)w->data + (o + j) * K + k));
                    wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                }
                acc[j] = _mm512_fmadd_ps(wv, xv, acc[j]);
            }
        }
        for (int j = 0; j < GEMV_OUT; j++) {
            _mm512_storeu_ps(lanes, acc[j]);
            y[o + j] = finish(lane_reduce(lanes), flags);
        }
    }
    for (; o < o1; o += TILE_OUT) {
        int n_o = (int)(o1 - o < TILE_OUT ? o1 - o : TILE_OUT);
        tile_avx512(w, x, 0, 0, 1, o, n_o, flags, y, 0);
    }
}

__attribute__((target("avx512f"))) static void gemv_bf16_avx512(const kern_mat_t *w, const float *x,
                                                                int64_t o0, int64_t o1,
                                                                uint32_t flags, float *y)
{
    gemv_avx512(w, x, o0, o1, flags, y, 0);
}

__attribute__((target("avx512f"))) static void gemv_f32_avx512(const kern_mat_t *w, const float *x,
                                                               int64_t o0, int64_t o1,
                                                               uint32_t flags, float *y)
{
    gemv_avx512(w, x, o0, o1, flags, y, 1);
}

static int have_avx512(void)
{
    return __builtin_cpu_supports("avx512f");
}

__attribute__((target("avx512f"))) static float dot_avx512(const float *a, const float *b,
                                                           int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    float lanes[LANES];
    for (int64_t k = 0; k < n; k += LANES) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
    }
    _mm512_storeu_ps(lanes, acc);
    return lane_reduce(lanes);
}
#endif

float kern_dot_cpu(const float *a, const float *b, int64_t n)
{
    float acc[LANES];
#if GEMM_HAVE_X86
    if (have_avx512()) {
        return dot_avx512(a, b, n);
    }
#endif
    memset(acc, 0, sizeof(acc));
    for (int64_t k0 = 0; k0 < n; k0 += LANES) {
        for (int j = 0; j < LANES; j++) {
            acc[j] = fmaf(a[k0 + j], b[k0 + j], acc[j]);
        }
    }
    return lane_reduce(acc);
}

/* Plain tile with the same order (CPUs without AVX-512). */
static void tile_plain(const kern_mat_t *w, const float *x, int64_t ldx, int64_t r0, int n_r,
                       int64_t o0, int n_o, uint32_t flags, float *y, int64_t ldy)
{
    for (int r = 0; r < n_r; r++) {
        for (int o = 0; o < n_o; o++) {
            y[(r0 + r) * ldy + o0 + o] = finish(dot_ref(w, o0 + o, x + (r0 + r) * ldx), flags);
        }
    }
}

/* Every row of the batch against weight quads [q0, q1). */
static void gemm_quads(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows,
                       uint32_t flags, float *y_out, int64_t ldy, int64_t q0, int64_t q1,
                       int use_avx)
{
#if GEMM_HAVE_X86
    if (use_avx && n_rows == 1) {
        int64_t o1 = q1 * TILE_OUT < w->n_out ? q1 * TILE_OUT : w->n_out;
        if (w->dtype == KERN_MAT_F32) {
            gemv_f32_avx512(w, x, q0 * TILE_OUT, o1, flags, y_out);
        } else {
            gemv_bf16_avx512(w, x, q0 * TILE_OUT, o1, flags, y_out);
        }
        return;
    }
#endif
    for (int64_t rb = 0; rb < n_rows; rb += ROW_BLOCK) {
        int64_t r_end = rb + ROW_BLOCK < n_rows ? rb + ROW_BLOCK : n_rows;
        for (int64_t q = q0; q < q1; q++) {
            int64_t o0 = q * TILE_OUT;
            int n_o = (int)(w->n_out - o0 < TILE_OUT ? w->n_out - o0 : TILE_OUT);
            for (int64_t r0 = rb; r0 < r_end; r0 += TILE_ROWS) {
                int n_r = (int)(r_end - r0 < TILE_ROWS ? r_end - r0 : TILE_ROWS);
#if GEMM_HAVE_X86
                if (use_avx) {
                    tile_avx512(w, x, ldx, r0, n_r, o0, n_o, flags, y_out, ldy);
                    continue;
                }
#endif
                tile_plain(w, x, ldx, r0, n_r, o0, n_o, flags, y_out, ldy);
            }
        }
    }
}

/* One threaded GEMM call: chunk c covers quads [n_quads c / n_chunks, n_quads (c+1) / n_chunks). */
typedef struct {
    const kern_mat_t *w;
    const float *x;
    int64_t ldx;
    int64_t n_rows;
    uint32_t flags;
    float *y_out;
    int64_t ldy;
    int64_t n_quads;
    int64_t n_chunks;
    int use_avx;
} gemm_job_t;

static void gemm_chunk(void *arg, int64_t c)
{
    const gemm_job_t *j = arg;
    gemm_quads(j->w, j->x, j->ldx, j->n_rows, j->flags, j->y_out, j->ldy,
               j->n_quads * c / j->n_chunks, j->n_quads * (c + 1) / j->n_chunks, j->use_avx);
}

tdm_status_t kern_gemm_cpu(kern_ctx_t *ctx, const kern_mat_t *w, const float *x, int64_t ldx,
                           int64_t n_rows, uint32_t flags, float *y_out, int64_t ldy)
{
    int n_threads = (ctx != NULL && ctx->n_threads > 1) ? ctx->n_threads : 1;
    int64_t n_quads;
    int use_avx = 0;

    if (!gemm_args_ok(w, x, ldx, n_rows, y_out, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
#if GEMM_HAVE_X86
    use_avx = have_avx512();
#endif
    n_quads = (w->n_out + TILE_OUT - 1) / TILE_OUT;
    if ((double)n_rows * (double)w->n_out * (double)w->n_in < GEMM_THREAD_MIN_MACS ||
        n_quads < 2 * n_threads) {
        n_threads = 1; /* too little work to pay for waking a worker */
    }
    if (n_threads == 1) {
        gemm_quads(w, x, ldx, n_rows, flags, y_out, ldy, 0, n_quads, use_avx);
        return TDM_OK;
    }
    /* Chunks of quads on the kernels' worker pool (kernels/cpu/pool.h): on a shared,
     * oversubscribed box a worker that is scheduled late finds the work done instead of holding
     * the call up for a fixed share, and idle workers sleep rather than spin. Outputs are
     * independent, so the bits do not change. */
    gemm_job_t job = {w, x, ldx, n_rows, flags, y_out, ldy, n_quads, 0, use_avx};
    job.n_chunks = (int64_t)n_threads * GEMM_CHUNKS_PER_THREAD;
    if (job.n_chunks > n_quads) {
        job.n_chunks = n_quads;
    }
    cpu_pool_run(n_threads, job.n_chunks, gemm_chunk, &job);
    return TDM_OK;
}

tdm_status_t kern_qdq_act8_rows_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int64_t dim,
                                    float *y_out)
{
    (void)ctx;
    if (x == NULL || y_out == NULL || n_rows < 0 || dim <= 0 || dim % KERN_ACT8_GROUP != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        tdm_status_t status = kern_qdq_act8_cpu(x + r * dim, dim, y_out + r * dim);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

tdm_status_t kern_mat_bf16_from_fp8(const uint8_t *codes, const uint8_t *scales, int64_t n_out,
                                    int64_t n_in, uint16_t *bf16_out)
{
    int64_t n_sc = (n_in + KERN_WEIGHT_FP8_BLOCK - 1) / KERN_WEIGHT_FP8_BLOCK;
    float lut[256];

    if (codes == NULL || scales == NULL || bf16_out == NULL || n_out <= 0 || n_in <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int c = 0; c < 256; c++) {
        lut[c] = kern_e4m3_to_f32((uint8_t)c);
    }
    for (int64_t o = 0; o < n_out; o++) {
        const uint8_t *srow = scales + (o / KERN_WEIGHT_FP8_BLOCK) * n_sc;
        for (int64_t i = 0; i < n_in; i++) {
            float v = lut[codes[o * n_in + i]] * kern_ue8m0_to_f32(srow[i / KERN_WEIGHT_FP8_BLOCK]);
            bf16_out[o * n_in + i] = kern_bf16_from_f32(v);
        }
    }
    return TDM_OK;
}

tdm_status_t kern_mat_bf16_from_mxfp4(const uint8_t *packed, const uint8_t *scales,
                                      int64_t n_out, int64_t n_in, uint16_t *bf16_out)
{
    if (packed == NULL || scales == NULL || bf16_out == NULL || n_out <= 0 || n_in <= 0 ||
        n_in % KERN_WEIGHT_MX4_GROUP != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) {
            uint8_t byte = packed[o * (n_in / 2) + i / 2];
            uint8_t nib = (i % 2 == 0) ? (uint8_t)(byte & 0xF) : (uint8_t)(byte >> 4);
            float s = kern_ue8m0_to_f32(scales[o * (n_in / KERN_WEIGHT_MX4_GROUP) +
                                               i / KERN_WEIGHT_MX4_GROUP]);
            bf16_out[o * n_in + i] = kern_bf16_from_f32(kern_e2m1_to_f32(nib) * s);
        }
    }
    return TDM_OK;
}
