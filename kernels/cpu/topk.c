/* topk.c - indexer scores and the tie-ordered top-k (kernels/topk.h). */
#include "kernels/topk.h"

#include "kernels/cpu/vec_isa.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Inputs from this size (and k from this count up to TOPK_SORT_MAX) take the histogram
 * selection; the others the heap (no histograms to clear). Of those, inputs from
 * TOPK_FILTER_MIN_N (and at least 8k) first pass a rising threshold (topk_filter: the indexer's
 * top-k over a long context, 2-30x fewer cycles at 8-128 K scores than histograms of the whole
 * input, tandem-bench-kernels' index lines). All give the same indices in the same order. */
enum { TOPK_RADIX_MIN_N = 128, TOPK_RADIX_MIN_K = 8, TOPK_SORT_MAX = 1024 };
enum { TOPK_FILTER_MIN_N = 2048 };

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
    if (vec != NULL) { /* the same dots and sums in register blocks (vec_body.inc) */
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

/* Four lanes of GCC's (and clang's) generic vectors: SSE2, NEON or scalar code as the target
 * has, for the two whole-input scans below (the compiler leaves their plain loops scalar). */
typedef float topk_f4 __attribute__((vector_size(16)));
typedef int32_t topk_i4 __attribute__((vector_size(16)));

/* 1 when one of v [16] is above t (no NaN in v). */
static inline int run_above(const float *v, float t)
{
    topk_f4 tv = {t, t, t, t};
    topk_i4 acc = {0, 0, 0, 0};
    for (int j = 0; j < 16; j += 4) {
        topk_f4 x;
        memcpy(&x, v + j, sizeof(x));
        acc |= x > tv;
    }
    return (acc[0] | acc[1] | acc[2] | acc[3]) != 0;
}

/* 1 when one of v [n] is NaN. */
static int any_nan(const float *v, int64_t n)
{
    topk_i4 acc = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        topk_f4 x;
        memcpy(&x, v + i, sizeof(x));
        acc |= x != x;
    }
    int nan = (acc[0] | acc[1] | acc[2] | acc[3]) != 0;
    for (; i < n; i++) {
        nan |= isnan(v[i]) != 0;
    }
    return nan;
}

/* The value whose order key is u (u != 0; -0 comes back as +0, which compares equal). */
static inline float key_value(uint32_t u)
{
    uint32_t bits = (u & 0x80000000u) != 0 ? u & 0x7FFFFFFFu : ~u;
    float v;
    memcpy(&v, &bits, sizeof(v));
    return v;
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
    if (m < 2) {
        return; /* nothing to order (and no src[0] to look at when m = 0) */
    }
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

/* Entry j of a list of indices (NULL: the identity, 0 .. n-1). */
static inline int64_t list_at(const int32_t *list, int64_t j)
{
    return list != NULL ? list[j] : j;
}

/*
 * The m best (m = min(k, the nonzero keys), k >= 1) of the entries of list [n] (ascending
 * indices; NULL: 0 .. n-1): *m_out = m and, when m > 0, the order key T of the m-th best, digit
 * by digit from the top (histograms; after the first digit only the entries sharing it, listed
 * in work [n], are looked at). The m best are then every key above T and, of the keys equal to
 * T, the first *need_out in index order (the tie order). Returns T (0 when m = 0).
 */
static uint32_t radix_threshold(const float *vals, const int32_t *list, int64_t n, int64_t k,
                                int32_t *work, int64_t *m_out, int64_t *need_out)
{
    uint32_t hist[4096], hist_lo[1024];
    int64_t n_cand = 0, n_zero = 0;
    uint32_t top = 0;

    memset(hist, 0, sizeof(hist));
    for (int64_t j = 0; j < n; j++) {
        uint32_t u = order_key(vals[list_at(list, j)]);
        hist[TOPK_D1(u)]++;
        n_zero += u == 0;
        top = u > top ? u : top;
    }
    int64_t m = k < n - n_zero ? k : n - n_zero, need = m;
    *m_out = m;
    if (m == 0) {
        *need_out = 0;
        return 0;
    }
    uint32_t b1 = pick_bin(hist, TOPK_D1(top), &need);
    for (int64_t j = 0; j < n; j++) {
        int64_t i = list_at(list, j);
        if (TOPK_D1(order_key(vals[i])) == b1) {
            work[n_cand++] = (int32_t)i;
        }
    }
    memset(hist_lo, 0, sizeof(hist_lo));
    top = 0;
    for (int64_t j = 0; j < n_cand; j++) {
        uint32_t d2 = TOPK_D2(order_key(vals[work[j]]));
        hist_lo[d2]++;
        top = d2 > top ? d2 : top;
    }
    uint32_t b2 = pick_bin(hist_lo, top, &need);
    memset(hist_lo, 0, sizeof(hist_lo));
    top = 0;
    for (int64_t j = 0; j < n_cand; j++) {
        uint32_t u = order_key(vals[work[j]]);
        if (TOPK_D2(u) == b2) {
            hist_lo[TOPK_D3(u)]++;
            top = TOPK_D3(u) > top ? TOPK_D3(u) : top;
        }
    }
    uint32_t b3 = pick_bin(hist_lo, top, &need);
    *need_out = need;
    return b1 << 20 | b2 << 10 | b3; /* nonzero: at least m nonzero keys */
}

/* The m best of list [n] (radix_threshold's T and need) in list order into out [m]; out may be
 * list itself (each entry is written at or before the place it is read from). */
static void keep_best(const float *vals, const int32_t *list, int64_t m, uint32_t T, int64_t need,
                      int32_t *out)
{
    for (int64_t j = 0, o = 0; o < m; j++) {
        int64_t i = list_at(list, j);
        uint32_t u = order_key(vals[i]);
        if (u > T || (u == T && need-- > 0)) {
            out[o++] = (int32_t)i;
        }
    }
}

/*
 * The k best of a long input by a rising threshold (n >= 8k, so scratch [n] holds the candidate
 * list [4k] and radix_threshold's work [4k]): an index joins the candidates when its value is
 * above t, the value of the k-th best candidate so far (-inf at first: every value but -inf);
 * when the list is full it is cut to its k best and t rises to their worst key. A key equal to t
 * that comes later loses the tie to every kept one, so no index of the k best is ever dropped:
 * the same selection as radix_threshold on the whole input. The filter loop has no branch on the
 * data; on scores in no particular order t rises within a few cuts and the list stays short, and
 * on rising input (every index a candidate) a cut of 4k keeps k, as much work per index as the
 * whole-input histograms. So the filter gives up (returns -1, idx_out untouched) at a cut where
 * the cuts so far have admitted more than 4k + i / 4 indices (i: the input read, about a quarter
 * of it past the first 4k): then the caller's whole-input histograms, with the cost of the cuts
 * so far on top (measured on rising input, the worst case: tandem-bench-kernels' index lines,
 * "rising"). Else returns the count (min(k, the nonzero keys)), the indices in index order in
 * idx_out. The value compares (here and in run_above) agree with the order keys under IEEE
 * subnormals, as the heap path's do; nothing in the project sets flush-to-zero.
 */
static int64_t topk_filter(const float *vals, int64_t n, int64_t k, int32_t *scratch,
                           int32_t *idx_out)
{
    int64_t cap = 4 * k, c = 0, m, need, admitted = 0;
    int32_t *cand = scratch, *work = scratch + cap;
    float t = -INFINITY; /* the value of key t: "key above t" is "value above t" (no NaN here) */

    for (int64_t i = 0; i < n; i++) {
        if ((i & 15) == 0 && i + 16 <= n) {
            /* a run of 16 none of which is above t adds nothing: skipped after one test of all
             * 16 (a vector compare), as most runs are once t has risen */
            if (!run_above(vals + i, t)) {
                i += 15;
                continue;
            }
        }
        cand[c] = (int32_t)i;
        c += vals[i] > t;
        if (c == cap) {
            admitted += cap - k;
            if (admitted > 4 * k + i / 4) {
                return -1; /* rising input: each cut costs more than it saves */
            }
            uint32_t T = radix_threshold(vals, cand, c, k, work, &m, &need); /* m = k */
            keep_best(vals, cand, k, T, need, cand);
            t = key_value(T);
            c = k;
        }
    }
    uint32_t T = radix_threshold(vals, cand, c, k, work, &m, &need);
    keep_best(vals, cand, m, T, need, idx_out);
    return m;
}

tdm_status_t kern_topk_cpu(kern_ctx_t *ctx, const float *vals, int64_t n, int64_t k,
                           int32_t *scratch, int32_t *idx_out, int64_t *n_out)
{
    int64_t m, need;

    if (vals == NULL || n_out == NULL || k < 0 || n < 0 || (k > 0 && idx_out == NULL) ||
        (n > 0 && scratch == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n > 0 && any_nan(vals, n)) {
        if (ctx != NULL && ctx->status_word != NULL) {
            *n_out = 0; /* deferred status: an empty selection, the word's bit */
            *ctx->status_word |= KERN_STATUS_TOPK_NAN;
            return TDM_OK;
        }
        return TDM_ERR_INTERNAL;
    }
    if (k == 0) {
        *n_out = 0;
        return TDM_OK;
    }
    if (n < TOPK_RADIX_MIN_N || k < TOPK_RADIX_MIN_K || k > TOPK_SORT_MAX) {
        topk_heap(vals, n, k, scratch, idx_out, n_out);
        return TDM_OK;
    }
    if (n >= TOPK_FILTER_MIN_N && n >= 8 * k) {
        int64_t m = topk_filter(vals, n, k, scratch, idx_out);
        if (m >= 0) {
            sort_selected(vals, idx_out, m);
            *n_out = m;
            return TDM_OK;
        }
    }
    /* Every key above the k-th best T is kept, and of the keys equal to T the first `need` in
     * index order (the tie order). */
    uint32_t T = radix_threshold(vals, NULL, n, k, scratch, &m, &need);
    keep_best(vals, NULL, m, T, need, idx_out);
    sort_selected(vals, idx_out, m);
    *n_out = m;
    return TDM_OK;
}
