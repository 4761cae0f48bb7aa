/* kernels_bench_index.c - the indexer's kernels over long contexts (bench/kernels_bench.h).
 *
 * A decode step's indexer scores every visible compressed entry of a layer's KV source
 * (kern_index_scores_cpu: H_I dots of d_I per key, MODEL.md 5.4) and keeps the k_I best
 * (kern_topk_cpu); both grow with the context, so at 32 K tokens they are most of a small-preset
 * decode step on one thread. One line per (preset shape, key count), one thread:
 *
 *   index <preset> <H_I> <d_I> <k_I> <keys> <scores_us> <GFLOP/s> <% FMA peak> <topk_us>
 *         <ns/score> <x read> <rising_us> <rising x read> <check>
 *
 * scores: kern_index_scores_cpu on N(0, 1) queries and keys and weights of either sign
 * (GFLOP/s = 2 H_I d_I keys / time; % of kern_fma_peak_cpu measured at the start of the run).
 * topk: kern_topk_cpu (k_I) on those scores; "x read" is its time over the time of one read pass
 * over the same scores (an XOR of their bits, the least any selection reads), measured in the
 * same run. rising: kern_topk_cpu on rising scores (every index beats the ones kept so far: the
 * worst input for its rising-threshold filter). Times are the fastest of 8 batches of calls on
 * the thread's CPU clock. check: "same" when both selections equal a full sort in the tie order
 * (value descending, index ascending), else "DIFFERENT" (the run then fails).
 */
#include "bench/kernels_bench.h"

#include "kernels/cpu_isa.h"
#include "kernels/gemm.h"
#include "kernels/topk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_INDEX_MAX_KEYS (1 << 18) /* a 1 M-token context at ratio 4 */

/* An indexer shape of a preset (MODEL.md 9). */
typedef struct {
    const char *preset;
    int64_t n_heads, d_i, k_i;
} index_shape_t;

static const index_shape_t index_shapes[] = {{"small", 8, 64, 128}, {"full", 32, 128, 512}};
#define N_INDEX_SHAPES (sizeof(index_shapes) / sizeof(index_shapes[0]))

/* What one timed call does. */
typedef enum { CALL_SCORES, CALL_TOPK, CALL_READ } call_kind_t;

typedef struct {
    call_kind_t kind;
    const index_shape_t *shape;
    const float *q, *w, *keys, *vals;
    int64_t n;
    float *scores;
    int32_t *scratch, *idx;
    uint32_t sink; /* the read pass's result, kept */
} index_call_t;

/* One call of the case's work (a bench_cpu_call_fn; arg: the index_call_t). */
static tdm_status_t do_call(void *arg)
{
    index_call_t *c = arg;
    int64_t n_out;
    switch (c->kind) {
    case CALL_SCORES:
        return kern_index_scores_cpu(NULL, c->q, c->w, c->shape->n_heads, c->shape->d_i, c->keys,
                                     c->n, c->scores);
    case CALL_TOPK:
        return kern_topk_cpu(NULL, c->vals, c->n, c->shape->k_i, c->scratch, c->idx, &n_out);
    default: {
        uint32_t x = 0;
        for (int64_t i = 0; i < c->n; i++) {
            uint32_t b;
            memcpy(&b, &c->vals[i], sizeof(b));
            x ^= b;
        }
        c->sink ^= x;
        return TDM_OK;
    }
    }
}

/* Seconds per call (bench_time_cpu, one thread); negative when a call fails. */
static double time_call(index_call_t *c, double min_ms)
{
    return bench_time_cpu(do_call, c, 1, min_ms);
}

/* The tie order for qsort (values through a file-scope pointer: qsort has no context). */
static const float *g_vals;

static int tie_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (g_vals[a] != g_vals[b]) {
        return g_vals[a] > g_vals[b] ? -1 : 1;
    }
    return (a > b) - (a < b);
}

/* 1 when kern_topk_cpu's k best of vals [n] equal a full sort's first k (all values finite). */
static int topk_matches_sort(const float *vals, int64_t n, int64_t k, int32_t *scratch,
                             int32_t *idx, int32_t *order)
{
    int64_t n_out = -1;
    for (int64_t i = 0; i < n; i++) {
        order[i] = (int32_t)i;
    }
    g_vals = vals;
    qsort(order, (size_t)n, sizeof(int32_t), tie_cmp);
    if (kern_topk_cpu(NULL, vals, n, k, scratch, idx, &n_out) != TDM_OK) {
        return 0;
    }
    return n_out == (k < n ? k : n) && memcmp(idx, order, (size_t)n_out * sizeof(int32_t)) == 0;
}

int bench_index_run(const bench_index_params_t *params, int *n_cases_out)
{
    int64_t ns[BENCH_INDEX_MAX_NS];
    int n_ns = bench_parse_counts(params->keys, ns, BENCH_INDEX_MAX_NS, BENCH_INDEX_MAX_KEYS);
    int64_t n_max = 0, hd_max = 0, h_max = 0, d_max = 0;
    int status = 0;

    *n_cases_out = 0;
    if (n_ns == 0) {
        fprintf(stderr,
                "tandem-bench-kernels: --index-keys: want a list like 8192,32768 (%d at most, "
                "each 1..%d), got '%s'\n",
                BENCH_INDEX_MAX_NS, BENCH_INDEX_MAX_KEYS, params->keys);
        return 1;
    }
    for (int i = 0; i < n_ns; i++) {
        n_max = ns[i] > n_max ? ns[i] : n_max;
    }
    for (size_t s = 0; s < N_INDEX_SHAPES; s++) {
        int64_t hd = index_shapes[s].n_heads * index_shapes[s].d_i;
        hd_max = hd > hd_max ? hd : hd_max;
        h_max = index_shapes[s].n_heads > h_max ? index_shapes[s].n_heads : h_max;
        d_max = index_shapes[s].d_i > d_max ? index_shapes[s].d_i : d_max;
    }
    float *q = malloc(sizeof(float) * (size_t)hd_max);
    float *w = malloc(sizeof(float) * (size_t)h_max);
    float *keys = malloc(sizeof(float) * (size_t)(n_max * d_max));
    float *scores = malloc(sizeof(float) * (size_t)n_max);
    float *rising = malloc(sizeof(float) * (size_t)n_max);
    int32_t *scratch = malloc(sizeof(int32_t) * (size_t)n_max);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)n_max);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n_max);
    if (q == NULL || w == NULL || keys == NULL || scores == NULL || rising == NULL ||
        scratch == NULL || idx == NULL || order == NULL) {
        fprintf(stderr, "tandem-bench-kernels: out of memory for %lld index keys\n",
                (long long)n_max);
        status = 1;
        goto out;
    }
    for (int64_t i = 0; i < hd_max; i++) {
        q[i] = bench_normal_at((uint64_t)i, 1.0f);
    }
    for (int64_t i = 0; i < h_max; i++) {
        w[i] = bench_normal_at((uint64_t)(1 << 20) + (uint64_t)i, 1.0f);
    }
    for (int64_t i = 0; i < n_max * d_max; i++) {
        keys[i] = bench_normal_at((uint64_t)(1 << 21) + (uint64_t)i, 1.0f);
    }
    for (int64_t i = 0; i < n_max; i++) {
        rising[i] = (float)i * 0.25f;
    }
    double peak = kern_fma_peak_cpu(100.0);
    printf("\nindex: kern_index_scores_cpu and kern_topk_cpu (1 thread, %s kernels), FMA peak "
           "%.1f GFLOP/s; us = fastest of %d batches (thread CPU time); x read = time over one "
           "read pass of the scores\n",
           kern_cpu_isa_name(kern_cpu_isa()), peak / 1e9, BENCH_CPU_BATCHES);
    printf("%-5s %-6s %4s %4s %4s %8s | %10s %8s %6s | %9s %9s %7s | %9s %7s | %s\n", "index",
           "preset", "H_I", "d_I", "k_I", "keys", "scores_us", "GFLOP/s", "%peak", "topk_us",
           "ns/score", "x read", "rising_us", "x read", "check");
    for (size_t s = 0; s < N_INDEX_SHAPES && status == 0; s++) {
        const index_shape_t *sh = &index_shapes[s];
        for (int i = 0; i < n_ns && status == 0; i++) {
            int64_t n = ns[i];
            index_call_t c = {CALL_SCORES, sh, q, w, keys, scores, n, scores, scratch, idx, 0};
            double t_scores = time_call(&c, params->min_ms);
            c.kind = CALL_TOPK;
            double t_topk = time_call(&c, params->min_ms);
            c.kind = CALL_READ;
            double t_read = time_call(&c, params->min_ms);
            c.kind = CALL_TOPK;
            c.vals = rising;
            double t_rising = time_call(&c, params->min_ms);
            c.kind = CALL_READ;
            double t_read_rising = time_call(&c, params->min_ms);
            if (t_scores < 0.0 || t_topk < 0.0 || t_rising < 0.0) {
                fprintf(stderr, "tandem-bench-kernels: index %s keys %lld: a kernel failed\n",
                        sh->preset, (long long)n);
                status = 1;
                break;
            }
            int same = topk_matches_sort(scores, n, sh->k_i, scratch, idx, order) &&
                       topk_matches_sort(rising, n, sh->k_i, scratch, idx, order);
            double flops = 2.0 * (double)(sh->n_heads * sh->d_i) * (double)n;
            printf("%-5s %-6s %4lld %4lld %4lld %8lld | %10.1f %8.1f %6.1f | %9.1f %9.2f %7.1f | "
                   "%9.1f %7.1f | %s\n",
                   "index", sh->preset, (long long)sh->n_heads, (long long)sh->d_i,
                   (long long)sh->k_i, (long long)n, t_scores * 1e6, flops / t_scores / 1e9,
                   100.0 * flops / t_scores / peak, t_topk * 1e6, t_topk * 1e9 / (double)n,
                   t_topk / t_read, t_rising * 1e6, t_rising / t_read_rising,
                   same ? "same" : "DIFFERENT");
            fflush(stdout);
            (*n_cases_out)++;
            if (!same) {
                status = 1;
            }
        }
    }
out:
    free(order);
    free(idx);
    free(scratch);
    free(rising);
    free(scores);
    free(keys);
    free(w);
    free(q);
    return status;
}
