/* attention.c - sink attention of one query (its heads, or several rows of a layer, split over
 * the kernel context's worker pool) and ratio-2 pooling (kernels/attention.h). */
#include "kernels/attention.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/* Key e of the concatenated set: keys_a's rows, then keys_b's in order (sel NULL) or its rows
 * sel[0], sel[1], ... */
static const float *key_at(const float *keys_a, int64_t n_a, const float *keys_b,
                           const int32_t *sel, int64_t e, int64_t d)
{
    return e < n_a ? keys_a + e * d : keys_b + (sel != NULL ? sel[e - n_a] : e - n_a) * d;
}

CPU_FMA_CLONES float kern_exp(float x)
{
    return cpu_exp(x);
}

CPU_FMA_CLONES float kern_log1p(float t)
{
    return cpu_log1p(t);
}

/* The softmax denominator's sum of x [n] (kern_attention_fn): lane j of 16 adds x[e] for
 * e = j, j + 16, ... ascending from 0.0f, then the fixed tree of kernels/gemm.h (lane j +=
 * lane j + 8, + 4, + 2, + 1), the order of kern_dot_cpu's partial sums. */
static float sum16(const float *x, int64_t n)
{
    float l[16] = {0.0f};
    for (int64_t e = 0; e < n; e++) {
        l[e % 16] += x[e];
    }
    return cpu_lane_tree16(l);
}

/* kern_attention_cpu and kern_attention_sel_cpu (arguments checked by them). */
CPU_FMA_CLONES static void attention(const float *q, const float *keys_a, int64_t n_a,
                                     const float *keys_b, const int32_t *sel, int64_t n_b,
                                     const float *sink, int64_t n_heads, int64_t d, float scale,
                                     float *scratch, float *o_out)
{
    int64_t n_keys = n_a + n_b;
    const cpu_vec_ops_t *vec = cpu_vec_ops();
    if (vec != NULL && n_keys > 0) {
        /* the same dots, softmax and sums: every head's logits in one pass over the keys
         * (scratch [n_heads, n_keys]), then every head's weighted sums in one pass */
        vec->attn_scores(q, n_heads, keys_a, n_a, keys_b, sel, n_keys, d, scale, scratch);
        vec->attn_softmax(scratch, n_heads, n_keys, sink);
        vec->attn_accum(scratch, n_heads, keys_a, n_a, keys_b, sel, n_keys, d, o_out);
        return;
    }
    for (int64_t h = 0; h < n_heads; h++) {
        const float *qh = q + h * d;
        float *oh = o_out + h * d;
        float mu = -INFINITY;
        float den;
        for (int64_t c = 0; c < d; c++) {
            oh[c] = 0.0f;
        }
        if (n_keys == 0) {
            continue;
        }
        for (int64_t e = 0; e < n_keys; e++) {
            scratch[e] = kern_dot_cpu(qh, key_at(keys_a, n_a, keys_b, sel, e, d), d) * scale;
            mu = scratch[e] > mu ? scratch[e] : mu;
        }
        for (int64_t e = 0; e < n_keys; e++) {
            scratch[e] = cpu_exp(scratch[e] - mu);
        }
        den = sum16(scratch, n_keys) + cpu_exp(sink[h] - mu);
        for (int64_t e = 0; e < n_keys; e++) {
            float p = scratch[e] / den;
            const float *k = key_at(keys_a, n_a, keys_b, sel, e, d);
            for (int64_t c = 0; c < d; c++) {
                oh[c] += p * k[c];
            }
        }
        for (int64_t c = 0; c < d; c++) {
            oh[c] = cpu_bf16_round(oh[c]);
        }
    }
}

/* One query's heads in chunks (attention_split): chunk c runs heads [n_heads c / n_chunks,
 * n_heads (c + 1) / n_chunks) on its own rows of the caller's scratch [n_heads, n_keys]. */
typedef struct {
    const float *q, *keys_a, *keys_b;
    const int32_t *sel;
    int64_t n_a, n_b;
    const float *sink;
    int64_t n_heads, d;
    float scale;
    float *scratch, *o_out;
    int64_t n_chunks;
} attn_heads_job_t;

static void attn_heads_chunk(void *arg, int64_t c)
{
    const attn_heads_job_t *j = arg;
    int64_t h0 = j->n_heads * c / j->n_chunks, h1 = j->n_heads * (c + 1) / j->n_chunks;
    /* scratch may be NULL when there are no keys (no pointer arithmetic on it then) */
    float *scr = j->scratch != NULL ? j->scratch + h0 * (j->n_a + j->n_b) : NULL;
    attention(j->q + h0 * j->d, j->keys_a, j->n_a, j->keys_b, j->sel, j->n_b, j->sink + h0, h1 - h0,
              j->d, j->scale, scr, j->o_out + h0 * j->d);
}

/* Multiply-adds (logits and weighted sums) from which one query's heads are split over the
 * pool: a decode step at batch 1 has one query per layer, so without the split its attention
 * ran on one thread while the others waited (docs/BENCHMARKS.md 2026-12-05). */
#define ATTN_SPLIT_MIN_MACS (64 * 1024)

/* attention() of one query, its heads split over ctx's pool when there is work enough: every
 * head's operations are those of attention() on all heads at once (a head's logits, softmax and
 * sums never read another head's), so the same bits. */
static void attention_split(kern_ctx_t *ctx, const float *q, const float *keys_a, int64_t n_a,
                            const float *keys_b, const int32_t *sel, int64_t n_b, const float *sink,
                            int64_t n_heads, int64_t d, float scale, float *scratch, float *o_out)
{
    attn_heads_job_t job = {q,       keys_a, keys_b, sel,     n_a,   n_b, sink,
                            n_heads, d,      scale,  scratch, o_out, 1};
    int n_threads = cpu_pool_threads(ctx);
    if (n_threads > 1 && n_heads > 1 && 2 * n_heads * (n_a + n_b) * d >= ATTN_SPLIT_MIN_MACS) {
        job.n_chunks = n_heads < n_threads ? n_heads : n_threads;
        cpu_pool_run(ctx->pool, n_threads, job.n_chunks, attn_heads_chunk, &job);
        return;
    }
    attn_heads_chunk(&job, 0);
}

tdm_status_t kern_attention_cpu(kern_ctx_t *ctx, const float *q, const float *keys_a, int64_t n_a,
                                const float *keys_b, int64_t n_b, const float *sink,
                                int64_t n_heads, int64_t d, float scale, float *scratch,
                                float *o_out)
{
    int64_t n_keys = n_a + n_b;

    if (q == NULL || sink == NULL || o_out == NULL || n_a < 0 || n_b < 0 || n_heads <= 0 ||
        d % KERN_GEMM_K_MULTIPLE != 0 || (n_a > 0 && keys_a == NULL) ||
        (n_b > 0 && keys_b == NULL) || (n_keys > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    attention_split(ctx, q, keys_a, n_a, keys_b, NULL, n_b, sink, n_heads, d, scale, scratch,
                    o_out);
    return TDM_OK;
}

/* kern_attention_rows_cpu's rows in n_chunks chunks: chunk c runs rows [n_rows c / n_chunks,
 * n_rows (c + 1) / n_chunks) with scratch (c = 0) or more + (c - 1) chunk_floats. */
typedef struct {
    const kern_attn_row_t *rows;
    int64_t n_rows;
    const float *sink;
    int64_t n_heads, d;
    float scale;
    float *scratch;
    float *more;
    int64_t chunk_floats;
    int64_t n_chunks;
} attn_rows_job_t;

static void attn_rows_chunk(void *arg, int64_t c)
{
    const attn_rows_job_t *j = arg;
    float *scr = c == 0 ? j->scratch : j->more + (c - 1) * j->chunk_floats;
    for (int64_t i = j->n_rows * c / j->n_chunks; i < j->n_rows * (c + 1) / j->n_chunks; i++) {
        const kern_attn_row_t *r = &j->rows[i];
        attention(r->q, r->keys_a, r->n_a, r->keys_b, NULL, r->n_b, j->sink, j->n_heads, j->d,
                  j->scale, scr, r->o);
    }
}

tdm_status_t kern_attention_rows_cpu(kern_ctx_t *ctx, const kern_attn_row_t *rows, int64_t n_rows,
                                     const float *sink, int64_t n_heads, int64_t d, float scale,
                                     float *scratch)
{
    if (n_rows < 0 || (n_rows > 0 && (rows == NULL || sink == NULL || scratch == NULL)) ||
        n_heads <= 0 || d % KERN_GEMM_K_MULTIPLE != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    /* every row checked before any output is written */
    for (int64_t i = 0; i < n_rows; i++) {
        const kern_attn_row_t *r = &rows[i];
        if (r->q == NULL || r->o == NULL || r->n_a < 0 || r->n_b < 0 ||
            r->n_a + r->n_b > KERN_ATTENTION_ROWS_MAX_KEYS || (r->n_a > 0 && r->keys_a == NULL) ||
            (r->n_b > 0 && r->keys_b == NULL)) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    int n_threads = cpu_pool_threads(ctx);
    attn_rows_job_t job = {rows, n_rows, sink, n_heads, d, scale, scratch, NULL, 0, 1};
    if (n_threads > 1 && n_rows > 1) {
        /* rows in chunks on the kernels' pool, each chunk with scratch of its own (chunk 0 the
         * caller's): every row's operations are those of the one-thread loop */
        int64_t most = 0;
        for (int64_t i = 0; i < n_rows; i++) {
            most = rows[i].n_a + rows[i].n_b > most ? rows[i].n_a + rows[i].n_b : most;
        }
        job.n_chunks = n_rows < 2 * (int64_t)n_threads ? n_rows : 2 * (int64_t)n_threads;
        job.chunk_floats = n_heads * most;
        job.more = malloc(sizeof(float) * (size_t)((job.n_chunks - 1) * job.chunk_floats + 1));
        if (job.more != NULL) {
            cpu_pool_run(ctx->pool, n_threads, job.n_chunks, attn_rows_chunk, &job);
            free(job.more);
            return TDM_OK;
        }
        job.n_chunks = 1; /* no memory for more scratch: the caller alone */
    }
    attn_rows_chunk(&job, 0);
    return TDM_OK;
}

tdm_status_t kern_attention_sel_cpu(kern_ctx_t *ctx, const float *q, const float *keys_a,
                                    int64_t n_a, const float *rows, const int32_t *sel, int64_t n_b,
                                    const float *sink, int64_t n_heads, int64_t d, float scale,
                                    float *scratch, float *o_out)
{
    int64_t n_keys = n_a + n_b;

    if (q == NULL || sink == NULL || o_out == NULL || n_a < 0 || n_b < 0 || n_heads <= 0 ||
        d % KERN_GEMM_K_MULTIPLE != 0 || (n_a > 0 && keys_a == NULL) ||
        (n_b > 0 && (rows == NULL || sel == NULL)) || (n_keys > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n_b; i++) {
        if (sel[i] < 0) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    attention_split(ctx, q, keys_a, n_a, rows, sel, n_b, sink, n_heads, d, scale, scratch, o_out);
    return TDM_OK;
}

CPU_FMA_CLONES tdm_status_t kern_compress_pool_cpu(kern_ctx_t *ctx, const float *a, const float *b,
                                                   int r, int64_t d, float *v_out)
{
    (void)ctx;
    if (a == NULL || b == NULL || v_out == NULL || r < 1 || d <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t c = 0; c < d; c++) {
        float mx = -INFINITY;
        float den = 0.0f;
        float acc = 0.0f;
        for (int p = 0; p < r; p++) {
            mx = b[p * d + c] > mx ? b[p * d + c] : mx;
        }
        for (int p = 0; p < r; p++) {
            den += cpu_exp(b[p * d + c] - mx);
        }
        for (int p = 0; p < r; p++) {
            acc += (cpu_exp(b[p * d + c] - mx) / den) * a[p * d + c];
        }
        v_out[c] = cpu_bf16_round(acc);
    }
    return TDM_OK;
}
