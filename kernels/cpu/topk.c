/* topk.c - indexer scores and the tie-ordered top-k (kernels/topk.h). */
#include "kernels/topk.h"

#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Inputs from this size (and k from this count up to TOPK_SORT_MAX) take the histogram
 * selection; the others the heap (no histograms to clear). Both give the same indices in the
 * same order. */
enum { TOPK_RADIX_MIN_N = 128, TOPK_RADIX_MIN_K = 8, TOPK_SORT_MAX = 1024 };

tdm_status_t kern_index_scores_cpu(kern_ctx_t *ctx, const float *q, const float *w, int64_t n_heads,
                                   int64_t d_I, const float *keys, int64_t n_keys,
                                   float *scores_out)
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

/*
 * The order key of a value: an unsigned integer that compares as the values do (-0 and +0 equal:
 * both map to +0's key), 0 for -inf (below every other value's key, never selected).
 */
static inline uint32_t order_key(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    u = (u & 0x7FFFFFFFu) == 0 ? 0 : u;                /* -0 as +0 */
    u = (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u; /* monotone in the value */
    return u == 0x007FFFFFu ? 0 : u;                   /* -inf */
}

/* The heap selection of the k best (small inputs: no histogram to clear). */
static void topk_heap(const float *vals, int64_t n, int64_t k, int32_t *scratch, int32_t *idx_out,
                      int64_t *n_out)
{
    int64_t n_heap = 0;

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
}

/*
 * The m (<= TOPK_SORT_MAX) selected indices a (ascending) in the tie order, best first: a stable
 * least-significant-digit-first radix sort (four 8-bit digits) of ~(order key), so equal values
 * keep the index order. Each entry carries its index in the low 32 bits.
 */
static void sort_selected(const float *vals, int32_t *a, int64_t m)
{
    uint64_t buf[2][TOPK_SORT_MAX];
    uint64_t *src = buf[0], *dst = buf[1];
    for (int64_t i = 0; i < m; i++) {
        src[i] = (uint64_t)~order_key(vals[a[i]]) << 32 | (uint32_t)a[i];
    }
    for (int shift = 32; shift < 64; shift += 8) {
        uint32_t pos[256] = {0};
        uint32_t sum = 0;
        for (int64_t i = 0; i < m; i++) {
            pos[(src[i] >> shift) & 255]++;
        }
        if (pos[(src[0] >> shift) & 255] == (uint32_t)m) {
            continue; /* one digit value: the pass would not move anything */
        }
        for (int d = 0; d < 256; d++) {
            uint32_t c = pos[d];
            pos[d] = sum;
            sum += c;
        }
        for (int64_t i = 0; i < m; i++) {
            dst[pos[(src[i] >> shift) & 255]++] = src[i];
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    for (int64_t i = 0; i < m; i++) {
        a[i] = (int32_t)(uint32_t)src[i];
    }
}

/* The first digit of an order key (12 bits: sign, exponent, 3 mantissa bits), the second (10),
 * the last (10). */
#define TOPK_D1(u) ((u) >> 20)
#define TOPK_D2(u) (((u) >> 10) & 1023u)
#define TOPK_D3(u) ((u)&1023u)

/* The bin of hist [top + 1] (bins above top empty) holding the need-th largest count from the
 * top; *need becomes the rank within that bin. */
static uint32_t pick_bin(const uint32_t *hist, uint32_t top, int64_t *need)
{
    uint32_t b = top;
    for (; b > 0 && hist[b] < *need; b--) {
        *need -= hist[b];
    }
    return b;
}

tdm_status_t kern_topk_cpu(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                           int32_t *scratch, int32_t *idx_out, int64_t *n_out)
{
    int64_t n_fin = 0, n_cand = 0;
    uint32_t hist[4096], hist_lo[1024];

    if (vals == NULL || n_out == NULL || k < 0 || n < 0 || (k > 0 && idx_out == NULL) ||
        (n > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n; i++) {
        if (isnan(vals[i]) && ctx != NULL && ctx->status_word != NULL) {
            *n_out = 0; /* deferred status: an empty selection, the word's bit */
            *ctx->status_word |= KERN_STATUS_TOPK_NAN;
            return TDM_OK;
        }
        if (isnan(vals[i])) {
            return TDM_ERR_INTERNAL;
        }
    }
    if (k == 0) {
        *n_out = 0;
        return TDM_OK;
    }
    if (n < TOPK_RADIX_MIN_N || k < TOPK_RADIX_MIN_K || k > TOPK_SORT_MAX) {
        topk_heap(vals, n, k, scratch, idx_out, n_out);
        return TDM_OK;
    }
    /* The k-th best order key T, digit by digit from the top (histograms; after the first
     * digit only the candidates sharing it, listed in scratch, are looked at). Every key above
     * T is kept, and of the keys equal to T the first `need` in index order (the tie order). */
    uint32_t top = 0;
    memset(hist, 0, sizeof(hist));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = order_key(vals[i]);
        hist[TOPK_D1(u)]++;
        n_fin += u != 0;
        top = u > top ? u : top;
    }
    int64_t m = k < n_fin ? k : n_fin;
    int64_t need = m;
    if (m == 0) {
        *n_out = 0;
        return TDM_OK;
    }
    uint32_t b1 = pick_bin(hist, TOPK_D1(top), &need);
    for (int64_t i = 0; i < n; i++) {
        if (TOPK_D1(order_key(vals[i])) == b1) {
            scratch[n_cand++] = (int32_t)i;
        }
    }
    memset(hist_lo, 0, sizeof(hist_lo));
    top = 0;
    for (int64_t j = 0; j < n_cand; j++) {
        uint32_t d2 = TOPK_D2(order_key(vals[scratch[j]]));
        hist_lo[d2]++;
        top = d2 > top ? d2 : top;
    }
    uint32_t b2 = pick_bin(hist_lo, top, &need);
    memset(hist_lo, 0, sizeof(hist_lo));
    top = 0;
    for (int64_t j = 0; j < n_cand; j++) {
        uint32_t u = order_key(vals[scratch[j]]);
        if (TOPK_D2(u) == b2) {
            hist_lo[TOPK_D3(u)]++;
            top = TOPK_D3(u) > top ? TOPK_D3(u) : top;
        }
    }
    uint32_t b3 = pick_bin(hist_lo, top, &need);
    uint32_t T = b1 << 20 | b2 << 10 | b3; /* nonzero: at least m finite keys */
    for (int64_t i = 0, o = 0; o < m; i++) {
        uint32_t u = order_key(vals[i]);
        if (u > T || (u == T && need-- > 0)) {
            idx_out[o++] = (int32_t)i;
        }
    }
    sort_selected(vals, idx_out, m);
    *n_out = m;
    return TDM_OK;
}
