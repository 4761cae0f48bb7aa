/* gemm.c - kern_gemm_cpu (argument checks, the instruction set of kern_cpu_isa(), large calls
 * split by output quads over the worker pool of kernels/cpu/pool.h; the work itself is in
 * gemm_<isa>.c), kern_gemm_ref_cpu (the plain loop), Q_act8 rows, the weight dequantizers and
 * the resident-format checks of kernels/gemm.h.
 *
 * Every version computes every output in the same order (16 FMA lanes over ascending k, then the
 * tree 8, 4, 2, 1), so they give identical bits whatever the batch shape, thread split or
 * instruction set.
 */
#include "kernels/gemm.h"

#include "common/clock.h"
#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu_isa.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>

#define LANES 16     /* partial sums per output (the normative order of this module) */
#define TILE_OUT 4   /* outputs per unit of the thread split */
/* The thread split (measured on a 2-core Zen 4 EPYC, small preset, decode batches 1 and 4, with
 * the pool's polling workers, docs/BENCHMARKS.md 2026-12-04 late): GEMMs from GEMM_THREAD_MIN_MACS
 * multiply-adds up are split (a decode step's FP8 projections, MXFP4 experts and mHC mixes, not
 * only the LM head: 1.1-1.2x the steps/s of splitting from 4 M up); below GEMM_SMALL_MACS in
 * GEMM_CHUNKS_SMALL chunks per thread (each chunk costs a claim and a cold start of its weight
 * stream: 8 per thread measured 0.9x there), above in GEMM_CHUNKS_PER_THREAD (a late worker's
 * share stays small). */
#define GEMM_CHUNKS_PER_THREAD 8
#define GEMM_CHUNKS_SMALL      2
#define GEMM_THREAD_MIN_MACS   (32.0 * 1024)
#define GEMM_SMALL_MACS        (4.0 * 1024 * 1024)

/* W[o, k] as FP32, exactly (MODEL.md 3), one element at a time. */
static float weight_at(const kern_mat_t *w, int64_t o, int64_t k)
{
    int64_t K = w->n_in;
    switch (w->dtype) {
    case KERN_MAT_F32:
        return ((const float *)w->data)[o * K + k];
    case KERN_MAT_FP8:
        return kern_e4m3_to_f32(((const uint8_t *)w->data)[o * K + k]) *
               kern_ue8m0_to_f32(w->scales[(o / 32) * (K / 32) + k / 32]);
    case KERN_MAT_MXFP4: {
        uint8_t byte = ((const uint8_t *)w->data)[o * (K / 2) + k / 2];
        return kern_e2m1_to_f32(k % 2 == 0 ? (uint8_t)(byte & 0xF) : (uint8_t)(byte >> 4)) *
               kern_ue8m0_to_f32(w->scales[o * (K / 32) + k / 32]);
    }
    default:
        return kern_bf16_to_f32(((const uint16_t *)w->data)[o * K + k]);
    }
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
    if (w->dtype == KERN_MAT_FP8 || w->dtype == KERN_MAT_MXFP4) {
        return w->scales != NULL && w->n_in % 32 == 0;
    }
    return w->dtype == KERN_MAT_BF16 || w->dtype == KERN_MAT_F32;
}

tdm_status_t kern_mat_rows(const kern_mat_t *w, int64_t row0, int64_t n_rows, kern_mat_t *out)
{
    kern_mat_t v;
    if (w == NULL || out == NULL || row0 < 0 || n_rows <= 0 || row0 + n_rows > w->n_out ||
        (w->dtype == KERN_MAT_FP8 && row0 % 32 != 0)) {
        return TDM_ERR_INVALID_ARG;
    }
    v = *w;
    v.n_out = n_rows;
    switch (w->dtype) {
    case KERN_MAT_F32:
        v.data = (const float *)w->data + row0 * w->n_in;
        break;
    case KERN_MAT_FP8:
        v.data = (const uint8_t *)w->data + row0 * w->n_in;
        v.scales = w->scales + row0 / 32 * (w->n_in / 32);
        /* row0 / 4 groups of n_in / 32 bits: row0 is a multiple of 32, so whole bytes */
        v.fp8_clean = w->fp8_clean == NULL ? NULL : w->fp8_clean + row0 / 32 * (w->n_in / 32);
        break;
    case KERN_MAT_MXFP4:
        v.data = (const uint8_t *)w->data + row0 * (w->n_in / 2);
        v.scales = w->scales + row0 * (w->n_in / 32);
        break;
    default:
        v.data = (const uint16_t *)w->data + row0 * w->n_in;
        break;
    }
    *out = v;
    return TDM_OK;
}

int64_t kern_mat_bytes(const kern_mat_t *w)
{
    if (w == NULL) {
        return 0;
    }
    switch (w->dtype) {
    case KERN_MAT_F32:
        return w->n_out * w->n_in * 4;
    case KERN_MAT_FP8:
        return w->n_out * w->n_in + (w->n_out + 31) / 32 * (w->n_in / 32);
    case KERN_MAT_MXFP4:
        return w->n_out * w->n_in / 2 + w->n_out * (w->n_in / 32);
    default:
        return w->n_out * w->n_in * 2;
    }
}

int64_t kern_mat_fp8_clean_bytes(const kern_mat_t *w)
{
    if (w == NULL || w->dtype != KERN_MAT_FP8 || w->n_out <= 0 || w->n_in <= 0 ||
        w->n_in % 32 != 0) {
        return 0;
    }
    int64_t bits =
        (w->n_out + KERN_MAT_FP8_CLEAN_ROWS - 1) / KERN_MAT_FP8_CLEAN_ROWS * (w->n_in / 32);
    return (bits + 7) / 8;
}

tdm_status_t kern_mat_fp8_clean_fill(const kern_mat_t *w, uint8_t *map_out)
{
    int64_t n_bytes = kern_mat_fp8_clean_bytes(w);
    int64_t n_cols = w != NULL ? w->n_in / 32 : 0;
    if (n_bytes == 0 || w->data == NULL || map_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(map_out, 0, (size_t)n_bytes);
    for (int64_t g = 0; g * KERN_MAT_FP8_CLEAN_ROWS < w->n_out; g++) {
        for (int64_t c = 0; c < n_cols; c++) {
            int clean = 1;
            for (int64_t o = g * KERN_MAT_FP8_CLEAN_ROWS;
                 clean && o < w->n_out && o < (g + 1) * KERN_MAT_FP8_CLEAN_ROWS; o++) {
                const uint8_t *p = (const uint8_t *)w->data + o * w->n_in + 32 * c;
                for (int i = 0; i < 32; i++) {
                    clean &= (p[i] & 0x78) != 0 || (p[i] & 0x07) == 0;
                }
            }
            int64_t b = g * n_cols + c;
            map_out[b / 8] |= (uint8_t)(clean << (b % 8));
        }
    }
    return TDM_OK;
}

int kern_mat_check_quantized(const kern_mat_t *w)
{
    int64_t n_scales;
    if (w == NULL || w->data == NULL || w->n_out <= 0 || w->n_in <= 0) {
        return 0;
    }
    if (w->dtype != KERN_MAT_FP8 && w->dtype != KERN_MAT_MXFP4) {
        return w->dtype == KERN_MAT_BF16 || w->dtype == KERN_MAT_F32;
    }
    if (w->scales == NULL || w->n_in % 32 != 0) {
        return 0;
    }
    if (w->dtype == KERN_MAT_MXFP4) {
        n_scales = w->n_out * (w->n_in / 32);
        return memchr(w->scales, 255, (size_t)n_scales) == NULL;
    }
    n_scales = (w->n_out + 31) / 32 * (w->n_in / 32);
    for (int64_t i = 0; i < n_scales; i++) {
        if (w->scales[i] < 3 || w->scales[i] > 134) {
            return 0;
        }
    }
    const uint8_t *codes = w->data;
    for (int64_t i = 0; i < w->n_out * w->n_in; i++) {
        if ((codes[i] & 0x7F) == 0x7F) {
            return 0;
        }
    }
    return 1;
}

/* One output of the reference order. On x86-64 compiled twice (target_clones): with FMA where
 * the CPU has it, so fmaf is one instruction rather than a libm call; the bits are the same. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("fma", "default")))
#endif
static float dot_ref(const kern_mat_t *w, int64_t o, const float *x)
{
    float acc[LANES];
    memset(acc, 0, sizeof(acc));
    for (int64_t k0 = 0; k0 < w->n_in; k0 += LANES) {
        for (int j = 0; j < LANES; j++) {
            acc[j] = fmaf(weight_at(w, o, k0 + j), x[k0 + j], acc[j]);
        }
    }
    return cpu_lane_tree16(acc);
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

/* gemm_isa.h. Both scans are branch-free min/max loops, so the compiler vectorizes them; on
 * x86-64 GCC they are compiled for AVX-512 and AVX2 too (target_clones, chosen by the CPU, not
 * by TANDEM_CPU_ISA's cap: integer minima and maxima, the same answer on every set): a decode
 * step calls this once per FP8 matrix, and as scalar loops with a branch it took about 1.4 % of
 * a batch-1 step (perf, one thread, Zen 4), 0.3 % now. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
int cpu_gemm_fp8_fold(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows)
{
    int64_t K = w->n_in;
    int64_t n_sc = (w->n_out + 31) / 32 * (K / 32);
    uint8_t sc_min = 255, sc_max = 0;
    uint32_t ex_min = 255, ex_max = 0;
    for (int64_t i = 0; i < n_sc; i++) {
        uint8_t sc = w->scales[i];
        sc_min = sc < sc_min ? sc : sc_min;
        sc_max = sc > sc_max ? sc : sc_max;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * ldx;
        for (int64_t k = 0; k < K; k++) {
            uint32_t bits;
            memcpy(&bits, &xr[k], sizeof(bits));
            uint32_t mag = bits & 0x7FFFFFFFu;
            uint32_t e = mag >> 23;
            /* a zero (e = 0) takes no part in the minimum; its e = 0 never raises the maximum */
            uint32_t e_lo = mag == 0 ? 255u : e;
            ex_min = e_lo < ex_min ? e_lo : ex_min;
            ex_max = e > ex_max ? e : ex_max;
        }
    }
    int s_min = sc_min, s_max = sc_max, e_min = (int)ex_min, e_max = (int)ex_max;
    if (e_max == 0 && e_min == 255) {
        return 2; /* x is all zeros */
    }
    /* biased exponents: x in [2^(e_min-127), 2^(e_max-126)), scale 2^(S-119) (FP16 decode) or
     * 2^(S-7) (raw decode) */
    if (e_min < 1 || e_max > 254 || e_min - 127 + s_min - 119 < -125 ||
        e_max - 126 + s_max - 119 > 126) {
        return 0;
    }
    return e_max - 126 + s_max - 7 <= 126 ? 2 : 1;
}

/* The instruction set's range function (gemm_isa.h). */
typedef int gemm_range_fn(const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows,
                          uint32_t flags, float *y, int64_t ldy, int64_t o0, int64_t o1,
                          int fp8_fold);

/* One instruction set's halves of this module (gemm_isa.h). */
typedef struct {
    gemm_range_fn *range;
    float (*dot)(const float *a, const float *b, int64_t n);
    double (*fma_flops)(int64_t n_iters);
} gemm_isa_t;

#if defined(__x86_64__)
static pthread_once_t g_avx2_once = PTHREAD_ONCE_INIT;   /* cpu_gemm_init_avx2 */
static pthread_once_t g_avx512_once = PTHREAD_ONCE_INIT; /* cpu_gemm_init_avx512 */
#endif

/* The halves of kern_cpu_isa()'s set (scalar for a set this build lacks), the x86 sets' tables
 * filled before a set is first handed out. */
static const gemm_isa_t *gemm_isa(void)
{
    static const gemm_isa_t scalar = {cpu_gemm_range_scalar, cpu_dot_scalar,
                                      cpu_fma_flops_scalar};
#if defined(__x86_64__)
    static const gemm_isa_t avx2 = {cpu_gemm_range_avx2, cpu_dot_avx2, cpu_fma_flops_avx2};
    static const gemm_isa_t avx512 = {cpu_gemm_range_avx512, cpu_dot_avx512,
                                      cpu_fma_flops_avx512};
#endif
#if defined(__aarch64__)
    static const gemm_isa_t neon = {cpu_gemm_range_neon, cpu_dot_neon, cpu_fma_flops_neon};
#endif
    switch (kern_cpu_isa()) {
#if defined(__x86_64__)
    case KERN_ISA_AVX512:
        pthread_once(&g_avx512_once, cpu_gemm_init_avx512);
        return &avx512;
    case KERN_ISA_AVX2:
        pthread_once(&g_avx2_once, cpu_gemm_init_avx2);
        return &avx2;
#endif
#if defined(__aarch64__)
    case KERN_ISA_NEON:
        return &neon;
#endif
    default:
        return &scalar;
    }
}

float kern_dot_cpu(const float *a, const float *b, int64_t n)
{
    return gemm_isa()->dot(a, b, n);
}

static double now_s(void)
{
    return (double)tdm_clock_now_ns() / (double)TDM_NS_PER_S;
}

double kern_fma_peak_cpu(double min_ms)
{
    double (*fn)(int64_t) = gemm_isa()->fma_flops;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        int64_t iters = 1 << 16;
        double t0 = now_s(), flops = 0.0, t = 0.0;
        while (t * 1e3 < min_ms) {
            flops += fn(iters);
            t = now_s() - t0;
            iters *= 2;
        }
        best = flops / t > best ? flops / t : best;
    }
    return best;
}

/* kern_read_bandwidth_cpu's start gate: held by the caller while it starts the readers; a reader
 * passes it and then leaves at once when `failed` is set (a later reader could not start). */
typedef struct {
    pthread_mutex_t mu;
    int failed;
} read_gate_t;

/* One reader of kern_read_bandwidth_cpu: its slice of the buffer, read once per pass between
 * two barrier waits (the caller times from the first to the second). */
typedef struct {
    const float *a;
    int64_t n;
    int reps;
    pthread_barrier_t *bar;
    read_gate_t *gate;
    float sink;
} read_slice_t;

static void *read_slice_main(void *arg)
{
    read_slice_t *r = arg;
    pthread_mutex_lock(&r->gate->mu);
    int failed = r->gate->failed;
    pthread_mutex_unlock(&r->gate->mu);
    for (int rep = 0; rep < r->reps && !failed; rep++) {
        pthread_barrier_wait(r->bar);
        r->sink += kern_dot_cpu(r->a, r->a, r->n);
        pthread_barrier_wait(r->bar);
    }
    return NULL;
}

double kern_read_bandwidth_cpu(size_t n_bytes, int reps, int n_threads)
{
    int64_t n = (int64_t)(n_bytes / sizeof(float)) / 16 * 16;
    float *a = NULL;
    double best = 0.0;
    volatile float sink = 0.0f;
    pthread_barrier_t bar;
    read_gate_t gate = {PTHREAD_MUTEX_INITIALIZER, 0};
    pthread_t th[KERN_POOL_MAX_THREADS];
    read_slice_t sl[KERN_POOL_MAX_THREADS];
    int started = 0;

    if (n_threads < 1 || n_threads > KERN_POOL_MAX_THREADS || reps < 1 || n <= 0) {
        return 0.0;
    }
    a = malloc((size_t)n * sizeof(float));
    if (a == NULL || pthread_barrier_init(&bar, NULL, (unsigned)n_threads) != 0) {
        free(a);
        return 0.0;
    }
    for (int64_t i = 0; i < n; i++) {
        a[i] = 1.0f;
    }
    for (int t = 0; t < n_threads; t++) { /* slices of whole 16-float groups */
        int64_t g0 = n / 16 * t / n_threads, g1 = n / 16 * (t + 1) / n_threads;
        sl[t] = (read_slice_t){a + 16 * g0, 16 * (g1 - g0), reps, &bar, &gate, 0.0f};
    }
    pthread_mutex_lock(&gate.mu);
    for (; started < n_threads - 1; started++) {
        if (pthread_create(&th[started], NULL, read_slice_main, &sl[started + 1]) != 0) {
            gate.failed = 1; /* the started readers leave without reading: no figure */
            break;
        }
    }
    pthread_mutex_unlock(&gate.mu);
    if (!gate.failed) {
        for (int rep = 0; rep < reps; rep++) {
            pthread_barrier_wait(&bar);
            double t0 = now_s();
            sl[0].sink += kern_dot_cpu(sl[0].a, sl[0].a, sl[0].n);
            pthread_barrier_wait(&bar);
            double t = now_s() - t0;
            best = (double)n * sizeof(float) / t > best ? (double)n * sizeof(float) / t : best;
        }
    }
    for (int t = 0; t < started; t++) {
        pthread_join(th[t], NULL);
        sink = sink + sl[t + 1].sink;
    }
    sink = sink + sl[0].sink;
    pthread_barrier_destroy(&bar);
    free(a);
    return best;
}

/* One threaded GEMM call: chunk c covers quads [n_quads c / n_chunks, n_quads (c+1) / n_chunks).
 * failed: set (under no lock: any writer stores 1) when a chunk could not get its panel. */
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
    gemm_range_fn *fn;
    int fp8_fold; /* cpu_gemm_fp8_fold's answer (an FP8 matrix, few rows), else 0 */
    _Atomic int failed;
} gemm_job_t;

static void gemm_chunk(void *arg, int64_t c)
{
    gemm_job_t *j = arg;
    int64_t o0 = j->n_quads * c / j->n_chunks * TILE_OUT;
    int64_t o1 = j->n_quads * (c + 1) / j->n_chunks * TILE_OUT;
    if (o1 > j->w->n_out) {
        o1 = j->w->n_out;
    }
    if (!j->fn(j->w, j->x, j->ldx, j->n_rows, j->flags, j->y_out, j->ldy, o0, o1, j->fp8_fold)) {
        j->failed = 1;
    }
}

tdm_status_t kern_gemm_cpu(kern_ctx_t *ctx, const kern_mat_t *w, const float *x, int64_t ldx,
                           int64_t n_rows, uint32_t flags, float *y_out, int64_t ldy)
{
    int n_threads = cpu_pool_threads(ctx);
    int64_t n_quads;
    gemm_range_fn *fn;
    int fold;

    if (!gemm_args_ok(w, x, ldx, n_rows, y_out, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    fn = gemm_isa()->range;
    fold = n_rows <= CPU_GEMM_FEW_ROWS_MAX && w->dtype == KERN_MAT_FP8
               ? cpu_gemm_fp8_fold(w, x, ldx, n_rows)
               : 0;
    n_quads = (w->n_out + TILE_OUT - 1) / TILE_OUT;
    double macs = (double)n_rows * (double)w->n_out * (double)w->n_in;
    if (macs < GEMM_THREAD_MIN_MACS || n_quads < 2 * n_threads) {
        n_threads = 1; /* too little work to pay for waking a worker */
    }
    if (n_threads == 1) {
        return fn(w, x, ldx, n_rows, flags, y_out, ldy, 0, w->n_out, fold) ? TDM_OK
                                                                           : TDM_ERR_NO_MEMORY;
    }
    /* Chunks of quads on the kernels' worker pool (kernels/cpu/pool.h): on a shared,
     * oversubscribed box a worker that is scheduled late finds the work done instead of holding
     * the call up for a fixed share. Outputs are independent, so the bits do not change. */
    gemm_job_t job = {w, x, ldx, n_rows, flags, y_out, ldy, n_quads, 0, fn, fold, 0};
    job.n_chunks =
        (int64_t)n_threads * (macs < GEMM_SMALL_MACS ? GEMM_CHUNKS_SMALL : GEMM_CHUNKS_PER_THREAD);
    if (job.n_chunks > n_quads) {
        job.n_chunks = n_quads;
    }
    cpu_pool_run(ctx->pool, n_threads, job.n_chunks, gemm_chunk, &job);
    return job.failed ? TDM_ERR_NO_MEMORY : TDM_OK;
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
