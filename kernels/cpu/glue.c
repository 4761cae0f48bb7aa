/* glue.c - the CPU glue ops of kernels/glue.h: the loops the engine ran itself before they were
 * ops, with the same arithmetic in the same order (so the same bits). */
#include "kernels/glue.h"

#include "kernels/codec.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/vec_isa.h"
#include "kernels/kv_page.h"
#include "kernels/ops.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

tdm_status_t kern_embed_cpu(kern_ctx_t *ctx, const uint16_t *table, int64_t n_vocab,
                            const int32_t *ids, int64_t n, int64_t H, int m, float *x_out,
                            float *pre_out)
{
    (void)ctx;
    if (n < 0 || m < 1 || H < 1 || n_vocab < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n > 0 && (table == NULL || ids == NULL || x_out == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= n_vocab) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *e = table + (int64_t)ids[r] * H;
        for (int64_t k = 0; k < m; k++) {
            float *x = x_out + (r * m + k) * H;
            for (int64_t col = 0; col < H; col++) {
                uint32_t bits = (uint32_t)e[col] << 16; /* kern_bf16_to_f32, inline */
                memcpy(&x[col], &bits, sizeof(bits));
            }
            if (pre_out != NULL) {
                pre_out[r * m + k] = k == 0 ? 1.0f : 0.0f;
            }
        }
    }
    return TDM_OK;
}

tdm_status_t kern_stream_mean_cpu(kern_ctx_t *ctx, const float *x, int64_t n_rows, int m, int64_t H,
                                  float *y_out, int64_t ldy)
{
    (void)ctx;
    if (n_rows < 0 || m < 1 || H < 1 || ldy < H) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows > 0 && (x == NULL || y_out == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        float *y = y_out + r * ldy;
        for (int64_t c = 0; c < H; c++) {
            float sum = 0.0f;
            for (int64_t i = 0; i < m; i++) {
                sum += x[(r * m + i) * H + c];
            }
            y[c] = sum / (float)m;
        }
    }
    return TDM_OK;
}

tdm_status_t kern_bf16_round_cpu(kern_ctx_t *ctx, const float *x, int64_t n, float *y_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (n < 0 || (n > 0 && (x == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (vec != NULL) {
        vec->add_bf16(x, NULL, n, y_out);
        return TDM_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        y_out[i] = cpu_bf16_round(x[i]);
    }
    return TDM_OK;
}

tdm_status_t kern_add_bf16_cpu(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                               float *y_out)
{
    const cpu_vec_ops_t *vec = cpu_vec_ops();

    (void)ctx;
    if (n < 0 || (n > 0 && (a == NULL || b == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (vec != NULL) {
        vec->add_bf16(a, b, n, y_out);
        return TDM_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        y_out[i] = cpu_bf16_round(a[i] + b[i]);
    }
    return TDM_OK;
}

tdm_status_t kern_add_cpu(kern_ctx_t *ctx, const float *a, const float *b, int64_t n, float *y_out)
{
    (void)ctx;
    if (n < 0 || (n > 0 && (a == NULL || b == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n; i++) {
        y_out[i] = a[i] + b[i];
    }
    return TDM_OK;
}

tdm_status_t kern_scale2_cpu(kern_ctx_t *ctx, float *x, int64_t n, float s0, float s1)
{
    (void)ctx;
    if (n < 0 || (n > 0 && x == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = (x[i] * s0) * s1;
    }
    return TDM_OK;
}

/* The checks kern_rows_gather_fn and kern_rows_scatter_add_fn share. */
static int rows_args_ok(const float *a, int64_t lda, const int64_t *idx, int64_t n_idx,
                        int64_t n_cols, const float *b, int64_t ldb)
{
    if (n_idx < 0 || n_cols < 1 || lda < n_cols || ldb < n_cols) {
        return 0;
    }
    if (n_idx > 0 && (a == NULL || idx == NULL || b == NULL)) {
        return 0;
    }
    for (int64_t k = 0; k < n_idx; k++) {
        if (idx[k] < 0) {
            return 0;
        }
    }
    return 1;
}

tdm_status_t kern_rows_gather_cpu(kern_ctx_t *ctx, const float *x, int64_t ldx, const int64_t *idx,
                                  int64_t n_idx, int64_t n_cols, float *y_out, int64_t ldy)
{
    (void)ctx;
    if (!rows_args_ok(x, ldx, idx, n_idx, n_cols, y_out, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t k = 0; k < n_idx; k++) {
        memcpy(y_out + k * ldy, x + idx[k] * ldx, (size_t)n_cols * sizeof(float));
    }
    return TDM_OK;
}

tdm_status_t kern_rows_scatter_add_cpu(kern_ctx_t *ctx, const float *y, int64_t ldy,
                                       const int64_t *idx, int64_t n_idx, int64_t n_cols,
                                       float *acc, int64_t ld_acc)
{
    (void)ctx;
    if (!rows_args_ok(y, ldy, idx, n_idx, n_cols, acc, ld_acc)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t k = 0; k < n_idx; k++) {
        float *a = acc + idx[k] * ld_acc;
        const float *yk = y + k * ldy;
        for (int64_t c = 0; c < n_cols; c++) {
            a[c] += yk[c];
        }
    }
    return TDM_OK;
}

tdm_status_t kern_cand_blocks_cpu(kern_ctx_t *ctx, const float *scores, int64_t n, int64_t block,
                                  float *beta_out)
{
    int64_t nb;

    (void)ctx;
    if (scores == NULL || beta_out == NULL || n < 1 || block < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    nb = (n + block - 1) / block;
    for (int64_t blk = 0; blk < nb; blk++) {
        float mx = -INFINITY;
        for (int64_t j = blk * block; j < (blk + 1) * block && j < n; j++) {
            mx = scores[j] > mx ? scores[j] : mx;
        }
        beta_out[blk] = mx;
    }
    beta_out[(n - 1) / block] = INFINITY;
    return TDM_OK;
}

tdm_status_t kern_cand_mask_cpu(kern_ctx_t *ctx, float *scores, int64_t n, int64_t block,
                                const int32_t *pool, int64_t n_pool)
{
    int64_t nb;

    (void)ctx;
    if (n < 0 || n_pool < 0 || block < 1 || (n > 0 && scores == NULL) ||
        (n_pool > 0 && pool == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    nb = (n + block - 1) / block;
    for (int64_t blk = 0; blk < nb; blk++) {
        int keep = 0;
        for (int64_t k = 0; k < n_pool && !keep; k++) {
            keep = pool[k] == blk;
        }
        if (keep) {
            continue;
        }
        for (int64_t j = blk * block; j < (blk + 1) * block && j < n; j++) {
            scores[j] = -INFINITY;
        }
    }
    return TDM_OK;
}

tdm_status_t kern_expert_rows_cpu(kern_ctx_t *ctx, const int32_t *experts, const float *wts,
                                  int64_t N, int K, int64_t E, int64_t *offsets_out,
                                  int64_t *rows_out, float *wts_out)
{
    (void)ctx;
    if (N < 0 || K < 1 || E < 1 || offsets_out == NULL ||
        (N > 0 && (experts == NULL || wts == NULL || rows_out == NULL || wts_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t i = 0; i < N * K; i++) {
        if (experts[i] < 0 || experts[i] >= E) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    /* counting sort: counts, exclusive prefix sums, then a stable fill in (r, k) order */
    memset(offsets_out, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N * K; i++) {
        offsets_out[experts[i] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) {
        offsets_out[e + 1] += offsets_out[e];
    }
    for (int64_t r = 0; r < N; r++) {
        for (int k = 0; k < K; k++) {
            int32_t e = experts[r * K + k];
            /* offsets_out[e] is the next free place of expert e during the fill */
            rows_out[offsets_out[e]] = r;
            wts_out[offsets_out[e]] = wts[r * K + k];
            offsets_out[e]++;
        }
    }
    /* each offsets_out[e] now holds the start of e + 1: shift back by one */
    for (int64_t e = E; e > 0; e--) {
        offsets_out[e] = offsets_out[e - 1];
    }
    offsets_out[0] = 0;
    return TDM_OK;
}

/* Elements (n_rows x dim) from which kern_dequant_rows_cpu splits its rows over the pool (a
 * decode batch's selected KV rows; a few rows cost less than a worker's claim). */
#define DEQUANT_ROWS_THREAD_MIN (32 * 1024)

/* kern_dequant_rows_cpu's rows in n_chunks chunks: chunk c dequantizes rows
 * [n_rows c / n_chunks, n_rows (c + 1) / n_chunks). */
typedef struct {
    const cpu_vec_ops_t *row;
    kern_rows_format_t format;
    const uint8_t *const *codes;
    const uint8_t *const *scales;
    int64_t n_rows, dim, group;
    float *y_out;
    int64_t n_chunks;
} dequant_rows_job_t;

/* Rows whose lines dequant_rows_chunk has requested ahead of the one it dequantizes (a decode
 * step's groups select up to 128 rows per query row; 3 lines a row stay within an L1). */
#define DEQUANT_ROWS_AHEAD 128

/* Prefetch the lines of row r: its codes' first and last byte and its scales. */
static void dequant_row_prefetch(const dequant_rows_job_t *j, int64_t r)
{
    const char *pc = (const char *)j->codes[r];
    int64_t code_bytes = j->format == KERN_ROWS_ACT8 ? j->dim : j->dim / 2;
    __builtin_prefetch(pc, 0, 3);
    __builtin_prefetch(pc + code_bytes - 1, 0, 3);
    __builtin_prefetch(j->scales[r], 0, 3);
}

static void dequant_rows_chunk(void *arg, int64_t c)
{
    const dequant_rows_job_t *j = arg;
    int64_t r0 = j->n_rows * c / j->n_chunks, r1 = j->n_rows * (c + 1) / j->n_chunks;
    /* the rows lie scattered over KV pages that the step's weight stream has evicted: the lines
     * of the first DEQUANT_ROWS_AHEAD rows are requested before any is dequantized, then each
     * row's that many rows ahead, so the misses overlap instead of coming one row at a time (a
     * batch-4 decode step 1.02x; this function's loads were most of its time) */
    for (int64_t r = r0; r < r1 && r < r0 + DEQUANT_ROWS_AHEAD; r++) {
        dequant_row_prefetch(j, r);
    }
    for (int64_t r = r0; r < r1; r++) {
        if (r + DEQUANT_ROWS_AHEAD < r1) {
            dequant_row_prefetch(j, r + DEQUANT_ROWS_AHEAD);
        }
        if (j->format == KERN_ROWS_ACT8) {
            j->row->dequant_act8(j->codes[r], j->scales[r], j->dim, j->y_out + r * j->dim);
        } else {
            j->row->dequant_e2m1(j->codes[r], j->scales[r], j->dim, j->group,
                                 j->format == KERN_ROWS_CKV, j->y_out + r * j->dim);
        }
    }
}

tdm_status_t kern_dequant_rows_cpu(kern_ctx_t *ctx, kern_rows_format_t format,
                                   const uint8_t *const *codes, const uint8_t *const *scales,
                                   int64_t n_rows, int64_t dim, float *y_out)
{
    const cpu_vec_ops_t *row = cpu_row_ops();
    int64_t group;

    switch (format) {
    case KERN_ROWS_ACT8:
        group = KERN_ACT8_GROUP;
        break;
    case KERN_ROWS_CKV:
        group = KERN_CKV_GROUP;
        break;
    case KERN_ROWS_MX4:
        group = KERN_MX4_GROUP;
        break;
    default:
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows < 0 || dim <= 0 || dim % group != 0 ||
        (n_rows > 0 && (codes == NULL || scales == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        if (codes[r] == NULL || scales[r] == NULL) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    /* each row as kern_dequant_act8_cpu / _ckv_cpu / _mx4_cpu on one row of dim (their row
     * operation, called directly: the checks above cover every row); many rows in chunks on
     * the context's worker pool (rows are independent: the same bytes) */
    dequant_rows_job_t job = {row, format, codes, scales, n_rows, dim, group, y_out, 1};
    int n_threads = cpu_pool_threads(ctx);
    if (n_threads > 1 && n_rows > 1 && n_rows * dim >= DEQUANT_ROWS_THREAD_MIN) {
        job.n_chunks = n_rows < 2 * (int64_t)n_threads ? n_rows : 2 * (int64_t)n_threads;
        cpu_pool_run(ctx->pool, n_threads, job.n_chunks, dequant_rows_chunk, &job);
    } else {
        dequant_rows_chunk(&job, 0);
    }
    return TDM_OK;
}

/* The CPU has no side queue: the gather runs now and the ticket only records that it did. */
tdm_status_t kern_rows_ahead_cpu(kern_ctx_t *ctx, kern_rows_format_t format,
                                 const uint8_t *const *codes, const uint8_t *const *scales,
                                 int64_t n_rows, int64_t dim, float *y_out, kern_ahead_t *ticket)
{
    tdm_status_t st;

    if (ticket == NULL || ticket->pending) {
        return TDM_ERR_INVALID_ARG;
    }
    st = kern_dequant_rows_cpu(ctx, format, codes, scales, n_rows, dim, y_out);
    if (st == TDM_OK) {
        ticket->pending = 1;
    }
    return st;
}

tdm_status_t kern_ahead_wait_cpu(kern_ctx_t *ctx, kern_ahead_t *ticket)
{
    (void)ctx;
    if (ticket == NULL || !ticket->pending) {
        return TDM_ERR_INVALID_ARG;
    }
    ticket->pending = 0;
    return TDM_OK;
}

void kern_ahead_free_cpu(kern_ctx_t *ctx, kern_ahead_t *ticket)
{
    (void)ctx;
    if (ticket != NULL) {
        memset(ticket, 0, sizeof(*ticket));
    }
}

tdm_status_t kern_page_mark_cpu(kern_ctx_t *ctx, void *page, uint32_t slot_end)
{
    (void)ctx;
    return kern_kv_page_mark_rows(page, slot_end); /* its checks, its logged refusals */
}
