/* kernels_bench.c - tandem-bench-kernels: throughput of the row quantizers and dequantizers
 * (kernels/codec.h) and of the forward GEMM (kernels/gemm.h, bench/kernels_bench_gemm.c) on the
 * CPU and CUDA backends.
 *
 * For each quantizer op and shape, prints GB/s counted as bytes read plus bytes written (f32
 * input or output, codes, scales), and the CUDA/CPU ratio. CUDA times come from CUDA events
 * around back-to-back launches on the default stream (device memory already resident; no
 * copies). With --verify (default) the CUDA outputs of every case are compared with the CPU
 * bytes. With --gemm (default) the GEMM cases follow (decode and prefill shapes of the small and
 * full presets), then the cpu-gemm cases (bench/kernels_bench_cpu.c: kern_gemm_cpu alone on the
 * small preset's resident formats at the --gemm-cpu-rows decode batches; --quant=false and
 * --gemm-presets select only those, e.g. --quant=false --gemm-presets none). The summary line's
 * cpu_gemm_batch_mismatches counts cases whose rows differ from the same rows computed alone.
 */
#include "bench/kernels_bench.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/hash.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/codec.h"
#include "kernels/ops.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_DIM 4096
#define N_OPS     6

typedef struct {
    double min_ms;             /* minimum measured time per case and backend */
    int require_cuda;          /* fail when no CUDA device */
    int verify;                /* compare CUDA outputs with CPU bytes */
    uint64_t max_rows;         /* largest shape's rows (dim 4096) */
    int gemm;                  /* also time the forward GEMM */
    uint64_t gemm_rows;        /* rows of the GEMM prefill shape */
    const char *gemm_presets;  /* "small", "full" or "small,full" */
    uint32_t gemm_threads;     /* CPU threads of the GEMM (0: every online CPU) */
    const char *gemm_cpu_rows; /* row counts of the resident-format CPU GEMM cases ("": none) */
    int gemm_cpu_cold;         /* cpu-gemm weights from DRAM, not cache */
    int quant;                 /* time the quantizers */
    const char *index_keys;    /* key counts of the indexer cases ("": none) */
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"min-ms", TDM_FLAG_F64, "200", offsetof(bench_cfg_t, min_ms),
     "minimum measured milliseconds per case and backend", 1, 60000, 0},
    {"require-cuda", TDM_FLAG_BOOL, "false", offsetof(bench_cfg_t, require_cuda),
     "exit 1 when the CUDA backend or a device is missing", 0, 0, 0},
    {"verify", TDM_FLAG_BOOL, "true", offsetof(bench_cfg_t, verify),
     "check that CUDA outputs equal the CPU bytes", 0, 0, 0},
    {"max-rows", TDM_FLAG_U64, "4096", offsetof(bench_cfg_t, max_rows),
     "rows of the largest shape (dim 4096); shapes are 1, 64 and this", 64, 65536, 0},
    {"gemm", TDM_FLAG_BOOL, "true", offsetof(bench_cfg_t, gemm),
     "also time the forward GEMM at decode and prefill shapes", 0, 0, 0},
    {"gemm-rows", TDM_FLAG_U64, "256", offsetof(bench_cfg_t, gemm_rows),
     "rows of the GEMM prefill shape", 2, 4096, 0},
    {"gemm-presets", TDM_FLAG_STRING, "small,full", offsetof(bench_cfg_t, gemm_presets),
     "GEMM shapes of these presets: small, full or small,full", 0, 0, 0},
    {"gemm-threads", TDM_FLAG_U32, "0", offsetof(bench_cfg_t, gemm_threads),
     "CPU threads of the GEMM (0: every online CPU)", 0, 1024, 0},
    {"gemm-cpu-rows", TDM_FLAG_STRING, "1,4,16", offsetof(bench_cfg_t, gemm_cpu_rows),
     "row counts of the cpu-gemm cases (kern_gemm_cpu on the small preset's resident formats, "
     "decode batches; empty: skip them)",
     0, 0, 0},
    {"gemm-cpu-cold", TDM_FLAG_BOOL, "true", offsetof(bench_cfg_t, gemm_cpu_cold),
     "cpu-gemm weights cold (copies used in turn, 96 MiB in all: from DRAM, as in an engine "
     "step); false: one cached copy",
     0, 0, 0},
    {"index-keys", TDM_FLAG_STRING, "2048,8192,32768,131072", offsetof(bench_cfg_t, index_keys),
     "key counts (visible compressed entries) of the indexer cases: kern_index_scores_cpu and "
     "kern_topk_cpu at the small and full presets' H_I, d_I, k_I (empty: skip them)",
     0, 0, 0},
    {"quant", TDM_FLAG_BOOL, "true", offsetof(bench_cfg_t, quant),
     "time the quantizer and dequantizer ops", 0, 0, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

typedef enum {
    OP_QUANT_ACT8,
    OP_QUANT_CKV,
    OP_QUANT_MX4,
    OP_DEQ_ACT8,
    OP_DEQ_CKV,
    OP_DEQ_MX4
} op_t;

static const char *const op_names[N_OPS] = {"quant_act8",   "quant_ckv",   "quant_mx4",
                                            "dequant_act8", "dequant_ckv", "dequant_mx4"};

/* Buffers of one backend for one shape: x (f32), codes, scales, y (f32). */
typedef struct {
    float *x;
    uint8_t *codes;
    uint8_t *scales;
    float *y;
} bufs_t;

static int64_t group_of(op_t op)
{
    return op == OP_QUANT_CKV || op == OP_DEQ_CKV ? KERN_CKV_GROUP : KERN_ACT8_GROUP;
}

static int64_t code_bytes_of(op_t op, int64_t n)
{
    return op == OP_QUANT_ACT8 || op == OP_DEQ_ACT8 ? n : n / 2;
}

/* Bytes moved by one call: f32 side + codes + scales. */
static double bytes_of(op_t op, int64_t n)
{
    return (double)(4 * n + code_bytes_of(op, n) + n / group_of(op));
}

static tdm_status_t run_op(const kern_ops_t *ops, kern_ctx_t *ctx, op_t op, bufs_t *b,
                           int64_t n_rows)
{
    switch (op) {
    case OP_QUANT_ACT8:
        return ops->quant_act8(ctx, b->x, n_rows, BENCH_DIM, b->codes, b->scales);
    case OP_QUANT_CKV:
        return ops->quant_ckv(ctx, b->x, n_rows, BENCH_DIM, b->codes, b->scales);
    case OP_QUANT_MX4:
        return ops->quant_mx4(ctx, b->x, n_rows, BENCH_DIM, b->codes, b->scales);
    case OP_DEQ_ACT8:
        return ops->dequant_act8(ctx, b->codes, b->scales, n_rows, BENCH_DIM, b->y);
    case OP_DEQ_CKV:
        return ops->dequant_ckv(ctx, b->codes, b->scales, n_rows, BENCH_DIM, b->y);
    default:
        return ops->dequant_mx4(ctx, b->codes, b->scales, n_rows, BENCH_DIM, b->y);
    }
}

/* Dequantizers need codes of their own format: quantize first (untimed). */
static op_t producer_of(op_t op)
{
    return op == OP_DEQ_ACT8 ? OP_QUANT_ACT8 : (op == OP_DEQ_CKV ? OP_QUANT_CKV : OP_QUANT_MX4);
}

/* Seconds per call on the CPU, repeating until min_ms has passed. */
static double time_cpu(op_t op, bufs_t *b, int64_t n_rows, double min_ms)
{
    kern_ctx_t ctx = {0};
    uint64_t t0;
    int64_t calls = 0;
    double elapsed_ms;

    run_op(kern_ops_cpu(), &ctx, op, b, n_rows); /* warm-up */
    t0 = tdm_clock_now_ns();
    do {
        run_op(kern_ops_cpu(), &ctx, op, b, n_rows);
        calls++;
        elapsed_ms = tdm_clock_elapsed_ms(t0);
    } while (elapsed_ms < min_ms);
    return elapsed_ms / 1e3 / (double)calls;
}

#ifdef TANDEM_HAVE_CUDA
int bench_cuda_ok(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "tandem-bench-kernels: %s failed: %s\n", what, cudaGetErrorString(err));
        return 0;
    }
    return 1;
}

double bench_time_cuda(bench_cuda_call_fn *call, const void *arg, double min_ms, int64_t max_batch)
{
    cudaEvent_t start;
    cudaEvent_t stop;
    float batch_ms = 0.0f;
    int64_t batch = 1;
    double result = -1.0;

    if (!bench_cuda_ok(cudaEventCreate(&start), "cudaEventCreate")) {
        return -1.0;
    }
    if (!bench_cuda_ok(cudaEventCreate(&stop), "cudaEventCreate")) {
        cudaEventDestroy(start);
        return -1.0;
    }
    if (call(arg) != TDM_OK || !bench_cuda_ok(cudaDeviceSynchronize(), "warm-up")) {
        goto out;
    }
    for (;;) {
        cudaEventRecord(start, NULL);
        for (int64_t i = 0; i < batch; i++) {
            call(arg);
        }
        cudaEventRecord(stop, NULL);
        if (!bench_cuda_ok(cudaEventSynchronize(stop), "timed batch")) {
            goto out;
        }
        cudaEventElapsedTime(&batch_ms, start, stop);
        if (batch_ms >= min_ms || batch >= max_batch) {
            break;
        }
        batch *= 2;
    }
    result = (double)batch_ms / 1e3 / (double)batch;
out:
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
    return result;
}

/* One quantizer call on the CUDA backend (bench_time_cuda's work). */
typedef struct {
    const kern_ops_t *ops;
    op_t op;
    bufs_t *b;
    int64_t n_rows;
} op_call_t;

static tdm_status_t call_op_cuda(const void *arg)
{
    const op_call_t *c = arg;
    kern_ctx_t ctx = {.backend = KERN_BACKEND_CUDA};

    return run_op(c->ops, &ctx, c->op, c->b, c->n_rows);
}

/* Seconds per call on the device, or a negative value on a CUDA error. */
static double time_cuda(const kern_ops_t *ops, op_t op, bufs_t *b, int64_t n_rows, double min_ms)
{
    const op_call_t c = {ops, op, b, n_rows};

    return bench_time_cuda(call_op_cuda, &c, min_ms, (int64_t)1 << 24);
}

static int cuda_alloc(bufs_t *dev, int64_t n)
{
    memset(dev, 0, sizeof(*dev));
    return bench_cuda_ok(cudaMalloc((void **)&dev->x, sizeof(float) * (size_t)n), "cudaMalloc") &&
           bench_cuda_ok(cudaMalloc((void **)&dev->codes, (size_t)n), "cudaMalloc") &&
           bench_cuda_ok(cudaMalloc((void **)&dev->scales, (size_t)n / KERN_CKV_GROUP),
                         "cudaMalloc") &&
           bench_cuda_ok(cudaMalloc((void **)&dev->y, sizeof(float) * (size_t)n), "cudaMalloc");
}

static void cuda_free(bufs_t *dev)
{
    cudaFree(dev->y);
    cudaFree(dev->scales);
    cudaFree(dev->codes);
    cudaFree(dev->x);
}

/* 1 when the device outputs of `op` equal the host ones. */
static int cuda_matches(op_t op, const bufs_t *host, const bufs_t *dev, int64_t n, uint8_t *scratch)
{
    int is_quant = op == OP_QUANT_ACT8 || op == OP_QUANT_CKV || op == OP_QUANT_MX4;

    if (is_quant) {
        size_t n_codes = (size_t)code_bytes_of(op, n);
        size_t n_scales = (size_t)(n / group_of(op));
        if (!bench_cuda_ok(cudaMemcpy(scratch, dev->codes, n_codes, cudaMemcpyDeviceToHost),
                           "cudaMemcpy") ||
            memcmp(scratch, host->codes, n_codes) != 0) {
            return 0;
        }
        return bench_cuda_ok(cudaMemcpy(scratch, dev->scales, n_scales, cudaMemcpyDeviceToHost),
                             "cudaMemcpy") &&
               memcmp(scratch, host->scales, n_scales) == 0;
    }
    return bench_cuda_ok(
               cudaMemcpy(scratch, dev->y, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
               "cudaMemcpy") &&
           memcmp(scratch, host->y, sizeof(float) * (size_t)n) == 0;
}
#endif

static void fill_input(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = tdm_hash_splitmix64((uint64_t)i);
        /* roughly activation-like: +-[0, 8) with a spread of magnitudes */
        float v = (float)(r >> 40) / 16777216.0f * 8.0f;
        x[i] = (r & 1u) != 0 ? -v / (float)(1u + ((r >> 8) & 15u)) : v;
    }
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    const char *reason = "built without CUDA";
    const kern_ops_t *cuda_ops = NULL;
    int64_t shapes[3] = {1, 64, 0};
    bufs_t host;
    int n_cases = 0;
    int n_mismatch = 0;
    int status = 0;
    double best_ratio = 0.0;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-kernels",
                        "quantizer/dequantizer throughput, CPU vs CUDA", &cfg, NULL, NULL,
                        &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    shapes[2] = (int64_t)cfg.max_rows;
    if (kern_cuda_available(&reason) != 0) {
        cuda_ops = kern_ops_cuda();
    }
    printf("tandem-bench-kernels: cpu=1 thread, cuda=%s, min_ms=%.0f\n",
           cuda_ops != NULL ? "yes" : reason, cfg.min_ms);
    if (cuda_ops == NULL && cfg.require_cuda) {
        fprintf(stderr, "tandem-bench-kernels: CUDA required but unavailable: %s\n", reason);
        return 1;
    }

    const int64_t n_max = shapes[2] * BENCH_DIM;
    host.x = malloc(sizeof(float) * (size_t)n_max);
    host.codes = malloc((size_t)n_max);
    host.scales = malloc((size_t)n_max / KERN_CKV_GROUP);
    host.y = malloc(sizeof(float) * (size_t)n_max);
    uint8_t *scratch = malloc(sizeof(float) * (size_t)n_max);
    if (host.x == NULL || host.codes == NULL || host.scales == NULL || host.y == NULL ||
        scratch == NULL) {
        fprintf(stderr, "tandem-bench-kernels: out of host memory for %lld elements\n",
                (long long)n_max);
        status = 1;
        goto out_free_host;
    }
    fill_input(host.x, n_max);

#ifdef TANDEM_HAVE_CUDA
    bufs_t dev;
    if (cuda_ops != NULL) {
        if (!cuda_alloc(&dev, n_max) ||
            !bench_cuda_ok(
                cudaMemcpy(dev.x, host.x, sizeof(float) * (size_t)n_max, cudaMemcpyHostToDevice),
                "cudaMemcpy")) {
            status = 1;
            goto out_free_dev;
        }
    }
#endif

    printf("%-13s %6s %6s %12s %10s %10s %9s %s\n", "op", "rows", "dim", "bytes/call", "cpu_GB/s",
           "cuda_GB/s", "cuda/cpu", "verify");
    for (int s = 0; s < 3 && cfg.quant; s++) {
        const int64_t n_rows = shapes[s];
        const int64_t n = n_rows * BENCH_DIM;
        for (int o = 0; o < N_OPS; o++) {
            op_t op = (op_t)o;
            kern_ctx_t ctx = {0};
            double bytes = bytes_of(op, n);
            double cpu_s;
            double cuda_s = -1.0;
            const char *verdict = "-";

            if (op >= OP_DEQ_ACT8) {
                run_op(kern_ops_cpu(), &ctx, producer_of(op), &host, n_rows);
            }
            cpu_s = time_cpu(op, &host, n_rows, cfg.min_ms);
#ifdef TANDEM_HAVE_CUDA
            if (cuda_ops != NULL) {
                kern_ctx_t dctx = {.backend = KERN_BACKEND_CUDA};
                if (op >= OP_DEQ_ACT8) {
                    run_op(cuda_ops, &dctx, producer_of(op), &dev, n_rows);
                }
                cuda_s = time_cuda(cuda_ops, op, &dev, n_rows, cfg.min_ms);
                if (cuda_s < 0.0) {
                    status = 1;
                    goto out_free_dev;
                }
                if (cfg.verify) {
                    int same = cuda_matches(op, &host, &dev, n, scratch);
                    verdict = same ? "equal" : "DIFFERENT";
                    n_mismatch += same ? 0 : 1;
                }
            }
#endif
            n_cases++;
            if (cuda_s > 0.0) {
                double ratio = cpu_s / cuda_s;
                best_ratio = ratio > best_ratio ? ratio : best_ratio;
                printf("%-13s %6lld %6d %12.0f %10.2f %10.2f %8.1fx %s\n", op_names[o],
                       (long long)n_rows, BENCH_DIM, bytes, bytes / cpu_s / 1e9,
                       bytes / cuda_s / 1e9, ratio, verdict);
            } else {
                printf("%-13s %6lld %6d %12.0f %10.2f %10s %9s %s\n", op_names[o],
                       (long long)n_rows, BENCH_DIM, bytes, bytes / cpu_s / 1e9, "-", "-", verdict);
            }
            fflush(stdout);
        }
    }
    bench_gemm_summary_t gemm_summary;
    memset(&gemm_summary, 0, sizeof(gemm_summary));
    if (cfg.gemm) {
        long n_online = sysconf(_SC_NPROCESSORS_ONLN);
        bench_gemm_params_t gp = {
            .min_ms = cfg.min_ms,
            .verify = cfg.verify,
            .n_threads =
                cfg.gemm_threads > 0 ? (int)cfg.gemm_threads : (int)(n_online > 0 ? n_online : 1),
            .prefill_rows = (int64_t)cfg.gemm_rows,
            .presets = cfg.gemm_presets,
        };
        if (bench_gemm_run(&gp, cuda_ops, &gemm_summary) != 0) {
            status = 1;
        }
    }
    bench_gemm_cpu_summary_t cpu_summary;
    memset(&cpu_summary, 0, sizeof(cpu_summary));
    if (cfg.gemm && cfg.gemm_cpu_rows != NULL && cfg.gemm_cpu_rows[0] != '\0' && status == 0) {
        long n_online = sysconf(_SC_NPROCESSORS_ONLN);
        bench_gemm_cpu_params_t cp = {
            .min_ms = cfg.min_ms,
            .n_threads =
                cfg.gemm_threads > 0 ? (int)cfg.gemm_threads : (int)(n_online > 0 ? n_online : 1),
            .rows = cfg.gemm_cpu_rows,
            .cold = cfg.gemm_cpu_cold,
        };
        if (bench_gemm_cpu_run(&cp, &cpu_summary) != 0) {
            status = 1;
        }
    }
    int n_index = 0;
    if (cfg.index_keys != NULL && cfg.index_keys[0] != '\0') {
        bench_index_params_t ip = {.min_ms = cfg.min_ms, .keys = cfg.index_keys};
        if (status != 0) {
            printf("index: skipped (an earlier case failed)\n");
        } else if (bench_index_run(&ip, &n_index) != 0) {
            status = 1;
        }
    }
    printf("summary: cases=%d cuda=%s best_cuda_over_cpu=%.1fx cuda_vs_cpu_mismatches=%d "
           "gemm_cases=%d gemm_decode_best_GBps=%.1f gemm_prefill_best_TFLOPs=%.2f "
           "gemm_best_cuda_over_cpu=%.1fx gemm_cuda_vs_cpu_mismatches=%d cpu_gemm_cases=%d "
           "cpu_gemm_batch_mismatches=%d index_cases=%d\n",
           n_cases, cuda_ops != NULL ? "yes" : "no", best_ratio, n_mismatch, gemm_summary.n_cases,
           gemm_summary.best_decode_gbps, gemm_summary.best_prefill_tflops, gemm_summary.best_ratio,
           gemm_summary.n_mismatch, cpu_summary.n_cases, cpu_summary.n_mismatch, n_index);
    if (n_mismatch != 0 || gemm_summary.n_mismatch != 0 || cpu_summary.n_mismatch != 0) {
        status = 1;
    }

#ifdef TANDEM_HAVE_CUDA
out_free_dev:
    if (cuda_ops != NULL) {
        cuda_free(&dev);
    }
#endif
out_free_host:
    free(scratch);
    free(host.y);
    free(host.scales);
    free(host.codes);
    free(host.x);
    return status;
}
