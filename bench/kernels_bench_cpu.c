/* kernels_bench_cpu.c - kern_gemm_cpu on the weights as the engine holds them
 * (bench/kernels_bench.h).
 *
 * The small preset's decode-step GEMMs in their resident formats (FP8 and MXFP4 used in place,
 * the BF16 LM head, an F32 mHC mix), each at every row count of --gemm-cpu-rows (decode batches:
 * the few-row paths of kernels/cpu/gemm_body.inc). One line per (shape, rows):
 *
 *   cpu-gemm <weight> <fmt> <n_out> <n_in> <rows> <ms> <GFLOP/s> <% FMA peak> <GB/s> <check>
 *
 * ms is the fastest of several timed batches of calls (each about min_ms / 8; a shared box's
 * load varies, the fastest batch is the least disturbed), timed on the thread's CPU clock with
 * one GEMM thread (time other processes hold the CPU does not count) and on the wall clock with
 * more; GFLOP/s = 2 rows n_out n_in / time,
 * GB/s = resident weight bytes (codes + scales) / time, % FMA peak against kern_fma_peak_cpu
 * measured at the start of the run (wall clock: on a loaded box it reads low). With cold, each
 * call uses the next of enough copies of the weight to outgrow the last-level cache
 * (BENCH_GEMM_CPU_COLD_BYTES), so the weights come from DRAM as in an engine step, whose layers
 * together do not fit in the cache; else the one weight stays cached. The weights lie in 2 MiB
 * pages where the kernel grants them, as the engine's loader puts them on the CPU backend. check:
 * "same" when every row's outputs equal, bit for bit, the same row computed alone (rows = 1: batch
 * invariance, kernels/gemm.h), else "DIFFERENT" (counted in the summary). Activations are Q_act8
 * operands (FP8 / MXFP4 weights) or N(0, 1).
 */
#include "bench/kernels_bench.h"

#include "common/clock.h"
#include "common/hash.h"
#include "kernels/codec.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    const char *name;
    kern_mat_dtype_t dtype;
    int64_t n_out;
    int64_t n_in;
} cpu_shape_t;

/* small preset (MODEL.md 9): H 512, r_q 256, n_h d 1024, I 96, V 32768; mHC mixes are F32. */
static const cpu_shape_t cpu_shapes[] = {
    {"attn.wq_a", KERN_MAT_FP8, 256, 512},  {"attn.wq_b", KERN_MAT_FP8, 1024, 256},
    {"attn.wo_b", KERN_MAT_FP8, 512, 512},  {"expert.w1", KERN_MAT_MXFP4, 96, 512},
    {"expert.w2", KERN_MAT_MXFP4, 512, 96}, {"mhc.fn", KERN_MAT_F32, 24, 2048},
    {"head", KERN_MAT_BF16, 32768, 512},
};
#define N_CPU_SHAPES (sizeof(cpu_shapes) / sizeof(cpu_shapes[0]))

static const char *const dtype_names[] = {"bf16", "f32", "fp8", "mxfp4"};

/* The weights' memory: as the engine's loader holds them on the CPU backend, one run of
 * anonymous memory advised for 2 MiB pages (engine_st_file_copy_resident), every copy of a
 * shape's weight adjacent in it; taken in order, given back all at once between shapes.
 * Outside it (no arena, or full) plain malloc. */
typedef struct {
    uint8_t *base;
    size_t cap;
    size_t used;
} cpu_arena_t;

static cpu_arena_t g_arena;

#define CPU_ARENA_PAGE ((size_t)2 << 20)

static void arena_open(size_t cap)
{
    cap = (cap + CPU_ARENA_PAGE - 1) / CPU_ARENA_PAGE * CPU_ARENA_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, CPU_ARENA_PAGE, cap) != 0) {
        return; /* malloc then */
    }
    (void)madvise(p, cap, MADV_HUGEPAGE); /* advice: 4 KiB pages where refused */
    g_arena = (cpu_arena_t){p, cap, 0};
}

static void *mat_alloc(size_t n)
{
    size_t rounded = (n + 63) / 64 * 64;
    if (g_arena.base != NULL && g_arena.used + rounded <= g_arena.cap) {
        void *p = g_arena.base + g_arena.used;
        g_arena.used += rounded;
        return p;
    }
    return malloc(n);
}

static void mat_free(void *p)
{
    if (g_arena.base == NULL || (uint8_t *)p < g_arena.base ||
        (uint8_t *)p >= g_arena.base + g_arena.cap) {
        free(p);
    }
}

/* The weight of one shape in its resident format (FP8 with its clean map after the scales, as
 * the engine loads it); data and scales from mat_alloc into *data_out, *scales_out. Returns 1, or 0
 * (nothing allocated) when out of memory or a quantizer fails. */
static int make_mat(const cpu_shape_t *s, uint64_t seed, kern_mat_t *w, void **data_out,
                    uint8_t **scales_out)
{
    const int64_t n = s->n_out * s->n_in;
    float *f = malloc(sizeof(float) * (size_t)n);
    void *data = NULL;
    uint8_t *scales = NULL;
    const uint8_t *clean = NULL;
    int ok = f != NULL;

    for (int64_t i = 0; ok && i < n; i++) {
        f[i] = bench_normal_at(seed + (uint64_t)i, 1.0f / sqrtf((float)s->n_in));
    }
    if (ok && s->dtype == KERN_MAT_FP8) {
        /* the scales, then the clean map the engine's loader makes (kernels/gemm.h) */
        const int64_t scale_bytes = ((s->n_out + 31) / 32) * (s->n_in / 32);
        kern_mat_t shape = {KERN_MAT_FP8, s->n_out, s->n_in, NULL, NULL, NULL};
        data = mat_alloc((size_t)n);
        scales = mat_alloc((size_t)(scale_bytes + kern_mat_fp8_clean_bytes(&shape)));
        ok = data != NULL && scales != NULL &&
             kern_weight_fp8_quantize(f, s->n_out, s->n_in, data, scales) == TDM_OK;
        shape.data = data;
        ok = ok && kern_mat_fp8_clean_fill(&shape, scales + scale_bytes) == TDM_OK;
        clean = ok ? scales + scale_bytes : NULL;
    } else if (ok && s->dtype == KERN_MAT_MXFP4) {
        data = mat_alloc((size_t)(n / 2));
        scales = mat_alloc((size_t)(s->n_out * (s->n_in / 32)));
        ok = data != NULL && scales != NULL &&
             kern_weight_mxfp4_quantize(f, s->n_out, s->n_in, data, scales) == TDM_OK;
    } else if (ok && s->dtype == KERN_MAT_BF16) {
        uint16_t *h = mat_alloc(sizeof(uint16_t) * (size_t)n);
        for (int64_t i = 0; h != NULL && i < n; i++) {
            h[i] = kern_bf16_from_f32(f[i]);
        }
        data = h;
        ok = h != NULL;
    } else if (ok) {
        data = mat_alloc(sizeof(float) * (size_t)n);
        ok = data != NULL;
        if (ok) {
            memcpy(data, f, sizeof(float) * (size_t)n);
        }
    }
    free(f);
    if (!ok) {
        mat_free(scales);
        mat_free(data);
        return 0;
    }
    *w = (kern_mat_t){s->dtype, s->n_out, s->n_in, data, scales, clean};
    *data_out = data;
    *scales_out = scales;
    return 1;
}

/* kernels_bench.h */
double bench_clock_ms(int n_threads)
{
    struct timespec ts;
    if (n_threads > 1 || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return (double)tdm_clock_now_ns() / 1e6;
    }
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* kernels_bench.h */
double bench_time_cpu(bench_cpu_call_fn *call, void *arg, int n_threads, double min_ms)
{
    double best = -1.0;
    if (call(arg) != TDM_OK) {
        return -1.0;
    }
    for (int b = 0; b < BENCH_CPU_BATCHES; b++) {
        double t0 = bench_clock_ms(n_threads);
        int64_t calls = 0;
        double ms;
        do {
            (void)call(arg);
            calls++;
            ms = bench_clock_ms(n_threads) - t0;
        } while (ms < min_ms / BENCH_CPU_BATCHES);
        double per_call = ms / 1e3 / (double)calls;
        best = best < 0.0 || per_call < best ? per_call : best;
    }
    return best;
}

/* One GEMM of time_gemm: the next of n_copies copies of the weight in turn (ws[0] first). */
typedef struct {
    kern_ctx_t *ctx;
    const kern_mat_t *ws;
    int n_copies, next;
    const float *x;
    int64_t rows;
    float *y;
} gemm_call_t;

static tdm_status_t gemm_call(void *arg)
{
    gemm_call_t *g = arg;
    const kern_mat_t *w = &g->ws[g->next];
    g->next = g->next + 1 < g->n_copies ? g->next + 1 : 0;
    return kern_gemm_cpu(g->ctx, w, g->x, w->n_in, g->rows, KERN_GEMM_OUT_BF16, g->y, w->n_out);
}

/* Seconds per call of kern_gemm_cpu on the copies in turn (bench_time_cpu); negative when the
 * GEMM fails. */
static double time_gemm(kern_ctx_t *ctx, const kern_mat_t *ws, int n_copies, const float *x,
                        int64_t rows, float *y, double min_ms)
{
    gemm_call_t g = {ctx, ws, n_copies, 0, x, rows, y};
    return bench_time_cpu(gemm_call, &g, ctx->n_threads, min_ms);
}

/* kernels_bench.h */
int bench_parse_counts(const char *list, int64_t *values, int max_n, int64_t max_value)
{
    int n = 0;
    const char *p = list;
    while (p != NULL && *p != '\0') {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > max_value || n == max_n || (*end != ',' && *end != '\0')) {
            return 0;
        }
        values[n++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

int bench_gemm_cpu_run(const bench_gemm_cpu_params_t *params, bench_gemm_cpu_summary_t *summary_out)
{
    kern_ctx_t ctx = {.backend = KERN_BACKEND_CPU, .n_threads = params->n_threads};
    int64_t rows[BENCH_GEMM_CPU_MAX_ROWS];
    int n_rows = bench_parse_counts(params->rows, rows, BENCH_GEMM_CPU_MAX_ROWS, 65536);
    int64_t max_rows = 1;
    int status = 0;

    memset(summary_out, 0, sizeof(*summary_out));
    if (n_rows == 0) {
        fprintf(stderr,
                "tandem-bench-kernels: --gemm-cpu-rows: want a list like 1,4,16 (%d at "
                "most, each 1..65536), got '%s'\n",
                BENCH_GEMM_CPU_MAX_ROWS, params->rows);
        return 1;
    }
    for (int i = 0; i < n_rows; i++) {
        max_rows = rows[i] > max_rows ? rows[i] : max_rows;
    }
    if (params->n_threads > 1 && kern_pool_create(params->n_threads, &ctx.pool) != TDM_OK) {
        ctx.n_threads = 1;
    }
    /* every copy of the largest weight (the head, 32 MiB) plus one, and its scales */
    arena_open((size_t)BENCH_GEMM_CPU_COLD_BYTES + ((size_t)80 << 20));
    double peak = kern_fma_peak_cpu(50.0);
    printf("\ncpu-gemm: kern_gemm_cpu on resident formats (%d threads), BF16 out, %s weights; FMA "
           "peak %.1f GFLOP/s; ms = fastest of %d batches (%s time); check = rows equal to each "
           "row alone\n",
           ctx.n_threads, params->cold ? "cold" : "cached", peak / 1e9, BENCH_CPU_BATCHES,
           ctx.n_threads > 1 ? "wall" : "thread CPU");
    printf("%-8s %-9s %5s %6s %5s %5s %9s %8s %6s %7s %s\n", "cpu-gemm", "weight", "fmt", "n_out",
           "n_in", "rows", "ms", "GFLOP/s", "%peak", "GB/s", "check");
    for (size_t i = 0; i < N_CPU_SHAPES && status == 0; i++) {
        const cpu_shape_t *s = &cpu_shapes[i];
        kern_mat_t w;
        void *data = NULL;
        uint8_t *scales = NULL;
        void *copy_data[BENCH_GEMM_CPU_MAX_COPIES];
        uint8_t *copy_scales[BENCH_GEMM_CPU_MAX_COPIES];
        /* x 64-byte aligned, as the engine's activations are (its arenas): an x off a 32-byte
         * boundary splits every other vector load across cache lines, which cost the AVX2 LM head
         * at 16 rows 1.5x (10.7 against 7.1 ms) and made this benchmark read it low */
        float *x = aligned_alloc(64, (sizeof(float) * (size_t)(max_rows * s->n_in) + 63) / 64 * 64);
        float *y = malloc(sizeof(float) * (size_t)(max_rows * s->n_out));
        float *y1 = malloc(sizeof(float) * (size_t)(max_rows * s->n_out));
        if (x == NULL || y == NULL || y1 == NULL ||
            !make_mat(s, 7000u * (i + 1), &w, &data, &scales)) {
            fprintf(stderr, "tandem-bench-kernels: out of host memory for cpu-gemm %s\n", s->name);
            free(y1);
            free(y);
            free(x);
            status = 1;
            break;
        }
        for (int64_t e = 0; e < max_rows * s->n_in; e++) {
            x[e] = bench_normal_at(((uint64_t)1 << 41) + (uint64_t)e, 1.0f);
        }
        if (s->dtype == KERN_MAT_FP8 || s->dtype == KERN_MAT_MXFP4) {
            kern_qdq_act8_rows_cpu(NULL, x, max_rows, s->n_in, x);
        }
        for (int64_t r = 0; r < max_rows && status == 0; r++) {
            if (kern_gemm_cpu(&ctx, &w, x + r * s->n_in, s->n_in, 1, KERN_GEMM_OUT_BF16,
                              y1 + r * s->n_out, s->n_out) != TDM_OK) {
                status = 1;
            }
        }
        const double bytes = (double)kern_mat_bytes(&w);
        /* cold: copies of the weight, used in turn, that together outgrow the last-level cache */
        int n_copies = 1;
        kern_mat_t copies[BENCH_GEMM_CPU_MAX_COPIES];
        copies[0] = w;
        if (params->cold) {
            int want = (int)(BENCH_GEMM_CPU_COLD_BYTES / bytes) + 1;
            want = want < BENCH_GEMM_CPU_MAX_COPIES ? want : BENCH_GEMM_CPU_MAX_COPIES;
            for (; n_copies < want; n_copies++) {
                if (!make_mat(s, 7000u * (i + 1), &copies[n_copies], &copy_data[n_copies],
                              &copy_scales[n_copies])) {
                    break;
                }
            }
        }
        for (int ri = 0; ri < n_rows && status == 0; ri++) {
            const double flops = 2.0 * (double)rows[ri] * (double)(s->n_out * s->n_in);
            double sec = time_gemm(&ctx, copies, n_copies, x, rows[ri], y, params->min_ms);
            if (sec <= 0.0) {
                fprintf(stderr, "tandem-bench-kernels: kern_gemm_cpu failed\n");
                status = 1;
                break;
            }
            int same = memcmp(y, y1, sizeof(float) * (size_t)(rows[ri] * s->n_out)) == 0;
            summary_out->n_cases++;
            summary_out->n_mismatch += same ? 0 : 1;
            printf("%-8s %-9s %5s %6lld %5lld %5lld %9.4f %8.2f %6.1f %7.2f %s\n", "cpu-gemm",
                   s->name, dtype_names[s->dtype], (long long)s->n_out, (long long)s->n_in,
                   (long long)rows[ri], sec * 1e3, flops / sec / 1e9,
                   peak > 0.0 ? 100.0 * flops / sec / peak : 0.0, bytes / sec / 1e9,
                   same ? "same" : "DIFFERENT");
            fflush(stdout);
        }
        for (int c = 1; c < n_copies; c++) {
            mat_free(copy_scales[c]);
            mat_free(copy_data[c]);
        }
        mat_free(scales);
        mat_free(data);
        g_arena.used = 0;
        free(y1);
        free(y);
        free(x);
    }
    kern_pool_destroy(ctx.pool);
    free(g_arena.base);
    g_arena = (cpu_arena_t){0};
    return status;
}
