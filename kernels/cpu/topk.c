/* topk.c - indexer scores and the tie-ordered top-k (kernels/topk.h). */
#include "kernels/topk.h"

#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stddef.h>

tdm_status_t kern_index_scores_cpu(kern_ctx_t *ctx, const float *q, const float *w,
                                   int64_t n_heads, int64_t d_I, const float *keys,
                                   int64_t n_keys, float *scores_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (q == NULL || w == NULL || (keys == NULL && n_keys > 0) || scores_out == NULL ||
        d_I % KERN_GEMM_K_MULTIPLE != 0 || n_heads <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (vec != NULL) { /* the same dots and sums, four heads per pass over a key */
        vec->index_scores(q, w, n_heads, d_I, keys, n_keys, scores_out);
        return TDM_OK;
    }
    for (int64_t j = 0; j < n_keys; j++) {
        float s = 0.0f;
        for (int64_t h = 0; h < n_heads; h++) {
            float dot = kern_dot_cpu(q + h * d_I, keys + j * d_I, d_I);
            s += w[h] * (dot > 0.0f ? dot : 0.0f);
        }
        scores_out[j] = s;
    }
    return TDM_OK;
}

/* a before b in tie order: larger value first, then smaller index. */
static int better(const float *vals, int32_t a, int32_t b)
{
    return vals[a] > vals[b] || (vals[a] == vals[b] && a < b);
}

/* Sift down in a min-heap ordered by "worst first" (the root is the worst kept). */
static void sift_down(const float *vals, int32_t *heap, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1;
        int64_t r = l + 1;
        int64_t worst = i;
        if (l < n && better(vals, heap[worst], heap[l])) {
            worst = l;
        }
        if (r < n && better(vals, heap[worst], heap[r])) {
            worst = r;
        }
        if (worst == i) {
            return;
        }
        int32_t t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

tdm_status_t kern_topk_cpu(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                           int32_t *scratch, int32_t *idx_out, int64_t *n_out)
{
    int64_t n_heap = 0;

    (void)ctx;
    if (vals == NULL || n_out == NULL || k < 0 || n < 0 || (k > 0 && idx_out == NULL) ||
        (n > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n; i++) {
        if (isnan(vals[i])) {
            return TDM_ERR_INTERNAL;
        }
    }
    if (k == 0) {
        *n_out = 0;
        return TDM_OK;
    }
    /* heap of the best k seen so far, root = worst of them */
    for (int64_t i = 0; i < n; i++) {
        if (n_heap == k && (i & 15) == 0 && i + 16 <= n) {
            /* A later index never wins a tie, so a run of 16 none of which beats the root's
             * value changes nothing: skip it (most of a long run, once the heap is full). */
            float root = vals[scratch[0]];
            int any = 0;
            for (int j = 0; j < 16; j++) {
                any |= vals[i + j] > root;
            }
            if (!any) {
                i += 15;
                continue;
            }
        }
        if (vals[i] == -INFINITY) {
            continue;
        }
        if (n_heap < k) {
            int64_t c = n_heap++;
            scratch[c] = (int32_t)i;
            while (c > 0) { /* sift up: a worse child moves toward the root */
                int64_t p = (c - 1) / 2;
                if (!better(vals, scratch[p], scratch[c])) {
                    break;
                }
                int32_t t = scratch[p];
                scratch[p] = scratch[c];
                scratch[c] = t;
                c = p;
            }
        } else if (better(vals, (int32_t)i, scratch[0])) {
            scratch[0] = (int32_t)i;
            sift_down(vals, scratch, n_heap, 0);
        }
    }
    /* pop worst-first into the tail of idx_out */
    *n_out = n_heap;
    for (int64_t m = n_heap; m > 0; m--) {
        idx_out[m - 1] = scratch[0];
        scratch[0] = scratch[m - 1];
        sift_down(vals, scratch, m - 1, 0);
    }
    return TDM_OK;
}
