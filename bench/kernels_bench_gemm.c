/* kernels_bench_gemm.c - forward GEMM throughput, CPU vs CUDA (bench/kernels_bench.h).
 *
 * Shapes are weights of the small and full presets (MODEL.md 2, 9) in their checkpoint format:
 * FP8 attention projections and MXFP4 expert weights. Each runs at decode (1 row: weight
 * bandwidth, GB/s = weight bytes read per call / time) and prefill (prefill_rows rows:
 * TFLOP/s = 2 rows n_out n_in / time) on
 *   cpu       kern_gemm_cpu on the BF16 dequantized weight (the engine's CPU layout), n threads;
 *   cuda      kern_gemm_cuda on the same BF16 weight in device memory;
 *   cuda-q    kern_gemm_q_cuda on the FP8 / MXFP4 codes, dequantized on the fly;
 * and prints cuda-q/cpu = CPU time / CUDA time. Activations are Q_act8 operands. CUDA times come
 * from events around back-to-back calls on the default stream; with verify, both CUDA outputs
 * must equal the CPU's bits (the batch-invariant order of kernels/gemm.h).
 */
#include "bench/kernels_bench.h"

#include "common/clock.h"
#include "common/hash.h"
#include "common/status.h"
#include "kernels/codec.h"
#include "kernels/gemm.h"

#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MXFP4_GROUP 32

typedef enum { FMT_FP8 = 0, FMT_MXFP4 = 1 } wfmt_t;

typedef struct {
    const char *preset;
    const char *name;
    int64_t n_out;
    int64_t n_in;
    wfmt_t fmt;
} gemm_shape_t;

/* small: H 512, r_q 256, n_h d 1024, G r_o 512, I 96; full: H 5120, r_q 1280, n_h d 32768,
 * G r_o 8192, I 2304 (MODEL.md 2, 3, 9). */
static const gemm_shape_t shapes[] = {
    {"small", "attn.wq_a", 256, 512, FMT_FP8},  {"small", "attn.wq_b", 1024, 256, FMT_FP8},
    {"small", "attn.wo_b", 512, 512, FMT_FP8},  {"small", "expert.w1", 96, 512, FMT_MXFP4},
    {"full", "attn.wq_a", 1280, 5120, FMT_FP8}, {"full", "attn.wq_b", 32768, 1280, FMT_FP8},
    {"full", "attn.wo_b", 5120, 8192, FMT_FP8}, {"full", "expert.w1", 2304, 5120, FMT_MXFP4},
};
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static const char *const fmt_names[] = {"fp8", "mxfp4"};

/* Host copies of one weight: codes + scales (checkpoint format) and the BF16 layout. */
typedef struct {
    uint8_t *codes;
    uint8_t *scales;
    uint16_t *bf16;
    int64_t code_bytes;
    int64_t scale_bytes;
} host_weight_t;

static void free_host_weight(host_weight_t *w)
{
    free(w->bf16);
    free(w->scales);
    free(w->codes);
    memset(w, 0, sizeof(*w));
}

/* kernels_bench.h */
float bench_normal_at(uint64_t i, float scale)
{
    uint64_t a = tdm_hash_splitmix64(2 * i);
    uint64_t b = tdm_hash_splitmix64(2 * i + 1);
    double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2)) * scale;
}

/* Random N(0, 1/n_in) weight in its checkpoint format, plus the exact BF16 dequantization. */
static int make_weight(const gemm_shape_t *s, uint64_t seed, host_weight_t *w)
{
    const int64_t n = s->n_out * s->n_in;
    float *f = malloc(sizeof(float) * (size_t)n);
    int ok;

    memset(w, 0, sizeof(*w));
    w->code_bytes = s->fmt == FMT_FP8 ? n : n / 2;
    w->scale_bytes = s->fmt == FMT_FP8 ? ((s->n_out + 31) / 32) * ((s->n_in + 31) / 32)
                                       : s->n_out * (s->n_in / MXFP4_GROUP);
    w->codes = malloc((size_t)w->code_bytes);
    w->scales = malloc((size_t)w->scale_bytes);
    w->bf16 = malloc(sizeof(uint16_t) * (size_t)n);
    if (f == NULL || w->codes == NULL || w->scales == NULL || w->bf16 == NULL) {
        free(f);
        free_host_weight(w);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        f[i] = bench_normal_at(seed + (uint64_t)i, 1.0f / sqrtf((float)s->n_in));
    }
    if (s->fmt == FMT_FP8) {
        ok = kern_weight_fp8_quantize(f, s->n_out, s->n_in, w->codes, w->scales) == TDM_OK &&
             kern_mat_bf16_from_fp8(w->codes, w->scales, s->n_out, s->n_in, w->bf16) == TDM_OK;
    } else {
        ok = kern_weight_mxfp4_quantize(f, s->n_out, s->n_in, w->codes, w->scales) == TDM_OK &&
             kern_mat_bf16_from_mxfp4(w->codes, w->scales, s->n_out, s->n_in, w->bf16) == TDM_OK;
    }
    free(f);
    if (!ok) {
        free_host_weight(w);
    }
    return ok;
}

/* Seconds per call of the CPU GEMM (one warm-up call writes y), at least min_ms measured. */
static double time_cpu(kern_ctx_t *ctx, const kern_mat_t *w, const float *x, int64_t rows, float *y,
                       double min_ms)
{
    uint64_t t0;
    int64_t calls = 0;
    double elapsed_ms;

    if (kern_gemm_cpu(ctx, w, x, w->n_in, rows, KERN_GEMM_OUT_BF16, y, w->n_out) != TDM_OK) {
        return -1.0;
    }
    t0 = tdm_clock_now_ns();
    do {
        kern_gemm_cpu(ctx, w, x, w->n_in, rows, KERN_GEMM_OUT_BF16, y, w->n_out);
        calls++;
        elapsed_ms = tdm_clock_elapsed_ms(t0);
    } while (elapsed_ms < min_ms);
    return elapsed_ms / 1e3 / (double)calls;
}

#ifdef TANDEM_HAVE_CUDA
/* The device side of one shape. */
typedef struct {
    kern_mat_t bf16; /* data in device memory */
    kern_qmat_t q;   /* codes and scales in device memory */
    float *x;        /* [prefill_rows, n_in] */
    float *y;        /* [prefill_rows, n_out] */
} dev_case_t;

static tdm_status_t cuda_call(const kern_ops_t *cuda, const dev_case_t *d, int quantized,
                              int64_t rows)
{
    kern_ctx_t ctx = {.backend = KERN_BACKEND_CUDA};

    if (quantized) {
        return kern_gemm_q_cuda(&ctx, &d->q, d->x, d->q.n_in, rows, KERN_GEMM_OUT_BF16, d->y,
                                d->q.n_out);
    }
    return cuda->gemm(&ctx, &d->bf16, d->x, d->bf16.n_in, rows, KERN_GEMM_OUT_BF16, d->y,
                      d->bf16.n_out);
}

/* One GEMM call on the device (bench_time_cuda's work). */
typedef struct {
    const kern_ops_t *cuda;
    const dev_case_t *d;
    int quantized;
    int64_t rows;
} gemm_call_t;

static tdm_status_t call_gemm_cuda(const void *arg)
{
    const gemm_call_t *c = arg;

    return cuda_call(c->cuda, c->d, c->quantized, c->rows);
}

/* Seconds per call, negative on error. */
static double time_cuda(const kern_ops_t *cuda, const dev_case_t *d, int quantized, int64_t rows,
                        double min_ms)
{
    const gemm_call_t c = {cuda, d, quantized, rows};

    return bench_time_cuda(call_gemm_cuda, &c, min_ms, (int64_t)1 << 20);
}

static void free_dev_case(dev_case_t *d)
{
    cudaFree(d->y);
    cudaFree(d->x);
    cudaFree((void *)d->q.scales);
    cudaFree((void *)d->q.codes);
    cudaFree((void *)d->bf16.data);
    memset(d, 0, sizeof(*d));
}

static int upload(void **dev, const void *host, size_t bytes)
{
    return bench_cuda_ok(cudaMalloc(dev, bytes), "cudaMalloc") &&
           bench_cuda_ok(cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

static int make_dev_case(const gemm_shape_t *s, const host_weight_t *w, const float *x,
                         int64_t max_rows, dev_case_t *d)
{
    void *bf16 = NULL;
    void *codes = NULL;
    void *scales = NULL;
    void *xd = NULL;
    int ok;

    memset(d, 0, sizeof(*d));
    ok = upload(&bf16, w->bf16, sizeof(uint16_t) * (size_t)(s->n_out * s->n_in)) &&
         upload(&codes, w->codes, (size_t)w->code_bytes) &&
         upload(&scales, w->scales, (size_t)w->scale_bytes) &&
         upload(&xd, x, sizeof(float) * (size_t)(max_rows * s->n_in)) &&
         bench_cuda_ok(cudaMalloc((void **)&d->y, sizeof(float) * (size_t)(max_rows * s->n_out)),
                       "cudaMalloc");
    d->bf16 = (kern_mat_t){KERN_MAT_BF16, s->n_out, s->n_in, bf16, NULL, NULL};
    d->q = (kern_qmat_t){s->fmt == FMT_FP8 ? KERN_QMAT_FP8 : KERN_QMAT_MXFP4, s->n_out, s->n_in,
                         codes, scales};
    d->x = xd;
    if (!ok) {
        free_dev_case(d);
    }
    return ok;
}

/* 1 when the device output [rows, n_out] equals want bit for bit. */
static int same_bits(const float *dev_y, const float *want, int64_t n, float *scratch)
{
    return bench_cuda_ok(
               cudaMemcpy(scratch, dev_y, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
               "cudaMemcpy") &&
           memcmp(scratch, want, sizeof(float) * (size_t)n) == 0;
}
#endif

static int preset_selected(const char *presets, const char *preset)
{
    const char *p = presets;
    size_t len = strlen(preset);

    while ((p = strstr(p, preset)) != NULL) {
        if ((p == presets || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) {
            return 1;
        }
        p += len;
    }
    return 0;
}

/* GB/s of weight bytes at decode, TFLOP/s at prefill. */
static double rate_of(int64_t rows, double weight_bytes, double flops, double seconds)
{
    if (seconds <= 0.0) {
        return 0.0;
    }
    return rows == 1 ? weight_bytes / seconds / 1e9 : flops / seconds / 1e12;
}

int bench_gemm_run(const bench_gemm_params_t *params, const kern_ops_t *cuda,
                   bench_gemm_summary_t *summary_out)
{
    kern_ctx_t cpu_ctx = {.backend = KERN_BACKEND_CPU, .n_threads = params->n_threads};
    const int64_t row_counts[2] = {1, params->prefill_rows};
    int status = 0;

    memset(summary_out, 0, sizeof(*summary_out));
    if (params->n_threads > 1 && kern_pool_create(params->n_threads, &cpu_ctx.pool) != TDM_OK) {
        cpu_ctx.n_threads = 1; /* the caller alone (logged by kern_pool_create) */
    }
    printf("\ngemm: y = x W^T, BF16 out; cpu = kern_gemm_cpu on BF16 weights (%d threads); cuda = "
           "kern_gemm_cuda on the same BF16 weights; cuda-q = kern_gemm_q_cuda on the FP8/MXFP4 "
           "codes. rate: GB/s of weight bytes at 1 row, TFLOP/s at %lld rows\n",
           params->n_threads, (long long)params->prefill_rows);
    printf("%-5s %-9s %6s %6s %5s %5s | %10s %8s | %10s %8s | %10s %8s | %8s %s\n", "model",
           "weight", "n_out", "n_in", "fmt", "rows", "cpu_ms", "rate", "cuda_ms", "rate",
           "cuda-q_ms", "rate", "q/cpu", "verify");
    for (size_t i = 0; i < N_SHAPES && status == 0; i++) {
        const gemm_shape_t *s = &shapes[i];
        const int64_t max_rows = params->prefill_rows;
        host_weight_t w;

        if (!preset_selected(params->presets, s->preset)) {
            continue;
        }
        float *x = malloc(sizeof(float) * (size_t)(max_rows * s->n_in));
        float *y = malloc(sizeof(float) * (size_t)(max_rows * s->n_out));
        float *scratch = malloc(sizeof(float) * (size_t)(max_rows * s->n_out));
        if (x == NULL || y == NULL || scratch == NULL || !make_weight(s, 1000u * i, &w)) {
            fprintf(stderr, "tandem-bench-kernels: out of host memory for gemm %s %s\n", s->preset,
                    s->name);
            free(scratch);
            free(y);
            free(x);
            status = 1;
            break;
        }
        for (int64_t e = 0; e < max_rows * s->n_in; e++) {
            x[e] = bench_normal_at(((uint64_t)1 << 40) + (uint64_t)e, 1.0f);
        }
        kern_qdq_act8_rows_cpu(NULL, x, max_rows, s->n_in, x);
        const kern_mat_t host_mat = {KERN_MAT_BF16, s->n_out, s->n_in, w.bf16, NULL, NULL};
        const double q_bytes = (double)(w.code_bytes + w.scale_bytes);
        const double bf16_bytes = 2.0 * (double)(s->n_out * s->n_in);
#ifdef TANDEM_HAVE_CUDA
        dev_case_t d;
        int have_dev = cuda != NULL && make_dev_case(s, &w, x, max_rows, &d);
        if (cuda != NULL && !have_dev) {
            status = 1;
        }
#endif
        for (int ri = 0; ri < 2 && status == 0; ri++) {
            const int64_t rows = row_counts[ri];
            const double flops = 2.0 * (double)rows * (double)(s->n_out * s->n_in);
            double cpu_s = time_cpu(&cpu_ctx, &host_mat, x, rows, y, params->min_ms);
            double cuda_s = -1.0;
            double cuda_q_s = -1.0;
            const char *verdict = "-";

            if (cpu_s < 0.0) {
                fprintf(stderr, "tandem-bench-kernels: kern_gemm_cpu failed\n");
                status = 1;
                break;
            }
#ifdef TANDEM_HAVE_CUDA
            if (have_dev) {
                cuda_s = time_cuda(cuda, &d, 0, rows, params->min_ms);
                int same = cuda_s > 0.0 &&
                           (!params->verify || same_bits(d.y, y, rows * s->n_out, scratch));
                cuda_q_s = time_cuda(cuda, &d, 1, rows, params->min_ms);
                same = same && cuda_q_s > 0.0 &&
                       (!params->verify || same_bits(d.y, y, rows * s->n_out, scratch));
                if (cuda_s < 0.0 || cuda_q_s < 0.0) {
                    status = 1;
                }
                if (params->verify) {
                    verdict = same ? "equal" : "DIFFERENT";
                    summary_out->n_mismatch += same ? 0 : 1;
                }
            }
#endif
            summary_out->n_cases++;
            printf("%-5s %-9s %6lld %6lld %5s %5lld | %10.3f %8.3f |", s->preset, s->name,
                   (long long)s->n_out, (long long)s->n_in, fmt_names[s->fmt], (long long)rows,
                   cpu_s * 1e3, rate_of(rows, bf16_bytes, flops, cpu_s));
            if (cuda_q_s > 0.0 && cuda_s > 0.0) {
                double cuda_rate = rate_of(rows, bf16_bytes, flops, cuda_s);
                double q_rate = rate_of(rows, q_bytes, flops, cuda_q_s);
                double ratio = cpu_s / cuda_q_s;
                printf(" %10.4f %8.3f | %10.4f %8.3f | %7.1fx %s\n", cuda_s * 1e3, cuda_rate,
                       cuda_q_s * 1e3, q_rate, ratio, verdict);
                if (rows == 1) {
                    summary_out->best_decode_gbps = q_rate > summary_out->best_decode_gbps
                                                        ? q_rate
                                                        : summary_out->best_decode_gbps;
                } else {
                    double best = cuda_rate > q_rate ? cuda_rate : q_rate;
                    summary_out->best_prefill_tflops = best > summary_out->best_prefill_tflops
                                                           ? best
                                                           : summary_out->best_prefill_tflops;
                }
                summary_out->best_ratio =
                    ratio > summary_out->best_ratio ? ratio : summary_out->best_ratio;
            } else {
                printf(" %10s %8s | %10s %8s | %8s %s\n", "-", "-", "-", "-", "-", verdict);
            }
            fflush(stdout);
        }
#ifdef TANDEM_HAVE_CUDA
        if (have_dev) {
            free_dev_case(&d);
        }
#endif
        free_host_weight(&w);
        free(scratch);
        free(y);
        free(x);
    }
    kern_pool_destroy(cpu_ctx.pool);
    return status;
}
