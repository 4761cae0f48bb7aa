/* kernels_bench.h - the GEMM part of tandem-bench-kernels (internal to bench/).
 *
 * kernels_bench.c owns the flags, the quantizer benchmark and the summary line;
 * kernels_bench_gemm.c times the forward GEMM (kernels/gemm.h) on the CPU and the CUDA backend
 * at decode (1 row) and prefill shapes of the small and full presets (MODEL.md 9). Both time
 * CUDA calls with bench_time_cuda and report CUDA errors with bench_cuda_ok.
 * kernels_bench_cpu.c times kern_gemm_cpu alone on the small preset's weights in their resident
 * formats (FP8, MXFP4, the BF16 head, F32 mHC) at decode batch row counts; kernels_bench_index.c
 * the indexer's scores and top-k over long contexts.
 */
#ifndef TANDEM_BENCH_KERNELS_BENCH_H
#define TANDEM_BENCH_KERNELS_BENCH_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/ops.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

/* bench_cuda_ok - 1 when err is cudaSuccess; else prints "tandem-bench-kernels: <what> failed:
 * <CUDA's reason>" to stderr and returns 0. */
int bench_cuda_ok(cudaError_t err, const char *what);

/* One call of the timed work on the default stream; arg is the caller's. */
typedef tdm_status_t bench_cuda_call_fn(const void *arg);

/*
 * bench_time_cuda - seconds per call of call(arg) on the device: one warm-up call, then batches
 * of back-to-back calls between two events, the batch doubling until it takes min_ms or holds
 * max_batch calls. Returns a negative value when the warm-up call fails or on a CUDA error
 * (printed by bench_cuda_ok).
 */
double bench_time_cuda(bench_cuda_call_fn *call, const void *arg, double min_ms, int64_t max_batch);

#endif

/* What to run. */
typedef struct {
    double min_ms;        /* minimum measured milliseconds per case and backend */
    int verify;           /* compare CUDA outputs with the CPU bits */
    int n_threads;        /* CPU threads of kern_gemm_cpu */
    int64_t prefill_rows; /* rows of the prefill shape */
    const char *presets;  /* "small", "full" or "small,full" */
} bench_gemm_params_t;

/* What it found, for the summary line. */
typedef struct {
    int n_cases;                /* (shape, rows) pairs timed */
    int n_mismatch;             /* CUDA outputs that differ from the CPU bits */
    double best_decode_gbps;    /* best CUDA weight bandwidth at 1 row */
    double best_prefill_tflops; /* best CUDA rate at the prefill shape */
    double best_ratio;          /* best CPU time / CUDA time (same weights) */
} bench_gemm_summary_t;

/*
 * bench_gemm_run - time every GEMM case and print one line each (CPU BF16; CUDA BF16; CUDA on
 * the checkpoint format, FP8 or MXFP4, dequantized on the fly). cuda is the CUDA table or NULL
 * (CPU only). Returns 0, or 1 after printing the reason (out of memory, a CUDA error, a kernel
 * error); summary_out is filled either way.
 */
int bench_gemm_run(const bench_gemm_params_t *params, const kern_ops_t *cuda,
                   bench_gemm_summary_t *summary_out);

/* What bench_gemm_cpu_run runs. */
#define BENCH_GEMM_CPU_MAX_ROWS   16                   /* row counts in one list */
#define BENCH_GEMM_CPU_COLD_BYTES (96.0 * 1024 * 1024) /* cold: copies of a weight in turn */
#define BENCH_GEMM_CPU_MAX_COPIES 512
typedef struct {
    double min_ms;    /* minimum measured milliseconds per case */
    int n_threads;    /* CPU threads of kern_gemm_cpu */
    const char *rows; /* comma-separated row counts, e.g. "1,4,16" */
    int cold;         /* weights from DRAM (copies used in turn), else one cached copy */
} bench_gemm_cpu_params_t;

/* What it found, for the summary line. */
typedef struct {
    int n_cases;    /* (shape, rows) pairs timed */
    int n_mismatch; /* cases whose rows differ from each row computed alone */
} bench_gemm_cpu_summary_t;

/*
 * bench_gemm_cpu_run - time kern_gemm_cpu on every resident-format shape of the small preset at
 * every row count of params->rows; one "cpu-gemm" line each (kernels_bench_cpu.c gives the
 * columns). Returns 0, or 1 after printing the reason (bad row list, out of memory, a kernel
 * error); summary_out is filled either way.
 */
int bench_gemm_cpu_run(const bench_gemm_cpu_params_t *params,
                       bench_gemm_cpu_summary_t *summary_out);

/* bench_clock_ms - milliseconds on the CPU benches' clock: the calling thread's CPU time with
 * one kernel thread (a shared box's other processes then do not count), else wall time. */
double bench_clock_ms(int n_threads);

/* bench_parse_counts - "1,4,16" into values [max_n] (each 1..max_value). Returns the count, 0
 * when the list is empty or malformed. */
int bench_parse_counts(const char *list, int64_t *values, int max_n, int64_t max_value);

/* One call of the work bench_time_cpu times; arg is the caller's. TDM_OK or the kernel's error. */
typedef tdm_status_t bench_cpu_call_fn(void *arg);

/* Timed batches per CPU case; the fastest is printed (a shared box's load varies, the fastest
 * batch is the least disturbed). */
#define BENCH_CPU_BATCHES 8

/*
 * bench_time_cpu - seconds per call of call(arg): one call whose status is checked, then
 * BENCH_CPU_BATCHES batches of back-to-back calls, each at least min_ms / BENCH_CPU_BATCHES on
 * bench_clock_ms(n_threads); returns the fastest batch's time per call, or a negative value when
 * the checked call fails (the timed calls' statuses are not looked at).
 */
double bench_time_cpu(bench_cpu_call_fn *call, void *arg, int n_threads, double min_ms);

/* bench_normal_at - element i of a fixed N(0, scale^2) sequence (Box-Muller on two SplitMix64
 * draws of i): the benches' weights and activations, the same on every run and machine. */
float bench_normal_at(uint64_t i, float scale);

/* What bench_index_run runs: the indexer's kernels (kernels/topk.h) on one CPU thread. */
#define BENCH_INDEX_MAX_NS 16 /* key counts in one list */
typedef struct {
    double min_ms;    /* minimum measured milliseconds per case */
    const char *keys; /* comma-separated key counts (visible compressed entries), e.g. "8192" */
} bench_index_params_t;

/*
 * bench_index_run - kern_index_scores_cpu and kern_topk_cpu at the small and full presets'
 * indexer shapes (MODEL.md 9: H_I x d_I, k_I) for every key count of params->keys, on one
 * thread; one "index" line each (kernels_bench_index.c gives the columns). Returns 0, or 1 after
 * printing the reason (bad list, out of memory, a kernel error); *n_cases_out counts the lines.
 */
int bench_index_run(const bench_index_params_t *params, int *n_cases_out);

#endif
