/* glue.cu - CUDA versions of the glue ops (kernels/glue.h). Each output element is computed by
 * one thread with the CPU loop's arithmetic in the same order (IEEE FP32, no contraction:
 * --fmad=false), so every op gives the CPU's bits. Asynchronous on ctx's stream; the range
 * checks that would need the data on the host (ids, idx) are not made here (kernels/glue.h). */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/codec.h"
#include "kernels/codec_bits.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kv_page.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GLUE_BLOCK 256 /* threads per block of the elementwise kernels */

/* Blocks for n elements of one thread each (grid-stride beyond the cap). */
static inline unsigned int glue_grid(int64_t n)
{
    return kc_grid(n, GLUE_BLOCK);
}

/* First element and stride of this thread in a grid-stride loop. */
__device__ __forceinline__ int64_t glue_first(void)
{
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t glue_stride(void)
{
    return (int64_t)gridDim.x * blockDim.x;
}

__global__ void embed_kernel(const uint16_t *table, int64_t n_vocab, const int32_t *ids, int64_t n,
                             int64_t H, int m, float *x, float *pre)
{
    for (int64_t e = glue_first(); e < n * m * H; e += glue_stride()) {
        int64_t r = e / ((int64_t)m * H);
        int64_t col = e % H;
        int32_t id = ids[r];
        x[e] = id >= 0 && id < n_vocab ? kc_bf16_to_f32(table[(int64_t)id * H + col]) : NAN;
    }
    for (int64_t e = glue_first(); pre != NULL && e < n * m; e += glue_stride()) {
        pre[e] = e % m == 0 ? 1.0f : 0.0f;
    }
}

extern "C" tdm_status_t kern_embed_cuda(kern_ctx_t *ctx, const uint16_t *table, int64_t n_vocab,
                                        const int32_t *ids, int64_t n, int64_t H, int m,
                                        float *x_out, float *pre_out)
{
    if (n < 0 || m < 1 || H < 1 || n_vocab < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n > 0 && (table == NULL || ids == NULL || x_out == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    embed_kernel<<<glue_grid(n * m * H), GLUE_BLOCK, 0, kc_stream(ctx)>>>(table, n_vocab, ids, n, H,
                                                                          m, x_out, pre_out);
    return kc_launch_status("embed_cuda", n, H);
}

__global__ void stream_mean_kernel(const float *x, int64_t n_rows, int m, int64_t H, float *y,
                                   int64_t ldy)
{
    for (int64_t e = glue_first(); e < n_rows * H; e += glue_stride()) {
        int64_t r = e / H;
        int64_t c = e % H;
        float sum = 0.0f;
        for (int64_t i = 0; i < m; i++) {
            sum = __fadd_rn(sum, x[(r * m + i) * H + c]);
        }
        y[r * ldy + c] = __fdiv_rn(sum, (float)m);
    }
}

extern "C" tdm_status_t kern_stream_mean_cuda(kern_ctx_t *ctx, const float *x, int64_t n_rows,
                                              int m, int64_t H, float *y_out, int64_t ldy)
{
    if (n_rows < 0 || m < 1 || H < 1 || ldy < H) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows > 0 && (x == NULL || y_out == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    stream_mean_kernel<<<glue_grid(n_rows * H), GLUE_BLOCK, 0, kc_stream(ctx)>>>(x, n_rows, m, H,
                                                                                 y_out, ldy);
    return kc_launch_status("stream_mean_cuda", n_rows, H);
}

__global__ void bf16_round_kernel(const float *x, int64_t n, float *y)
{
    for (int64_t i = glue_first(); i < n; i += glue_stride()) {
        y[i] = kc_bf16_round(x[i]);
    }
}

extern "C" tdm_status_t kern_bf16_round_cuda(kern_ctx_t *ctx, const float *x, int64_t n,
                                             float *y_out)
{
    if (n < 0 || (n > 0 && (x == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    bf16_round_kernel<<<glue_grid(n), GLUE_BLOCK, 0, kc_stream(ctx)>>>(x, n, y_out);
    return kc_launch_status("bf16_round_cuda", 1, n);
}

__global__ void add_bf16_kernel(const float *a, const float *b, int64_t n, float *y)
{
    for (int64_t i = glue_first(); i < n; i += glue_stride()) {
        y[i] = kc_bf16_round(__fadd_rn(a[i], b[i]));
    }
}

extern "C" tdm_status_t kern_add_bf16_cuda(kern_ctx_t *ctx, const float *a, const float *b,
                                           int64_t n, float *y_out)
{
    if (n < 0 || (n > 0 && (a == NULL || b == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    add_bf16_kernel<<<glue_grid(n), GLUE_BLOCK, 0, kc_stream(ctx)>>>(a, b, n, y_out);
    return kc_launch_status("add_bf16_cuda", 1, n);
}

__global__ void add_kernel(const float *a, const float *b, int64_t n, float *y)
{
    for (int64_t i = glue_first(); i < n; i += glue_stride()) {
        y[i] = __fadd_rn(a[i], b[i]);
    }
}

extern "C" tdm_status_t kern_add_cuda(kern_ctx_t *ctx, const float *a, const float *b, int64_t n,
                                      float *y_out)
{
    if (n < 0 || (n > 0 && (a == NULL || b == NULL || y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    add_kernel<<<glue_grid(n), GLUE_BLOCK, 0, kc_stream(ctx)>>>(a, b, n, y_out);
    return kc_launch_status("add_cuda", 1, n);
}

__global__ void scale2_kernel(float *x, int64_t n, float s0, float s1)
{
    for (int64_t i = glue_first(); i < n; i += glue_stride()) {
        x[i] = __fmul_rn(__fmul_rn(x[i], s0), s1);
    }
}

extern "C" tdm_status_t kern_scale2_cuda(kern_ctx_t *ctx, float *x, int64_t n, float s0, float s1)
{
    if (n < 0 || (n > 0 && x == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    scale2_kernel<<<glue_grid(n), GLUE_BLOCK, 0, kc_stream(ctx)>>>(x, n, s0, s1);
    return kc_launch_status("scale2_cuda", 1, n);
}

/* The host-side checks of the row ops (idx itself is device memory: not read here). */
static int rows_args_ok(const void *a, int64_t lda, const int64_t *idx, int64_t n_idx,
                        int64_t n_cols, const void *b, int64_t ldb)
{
    if (n_idx < 0 || n_cols < 1 || lda < n_cols || ldb < n_cols) {
        return 0;
    }
    return n_idx == 0 || (a != NULL && idx != NULL && b != NULL);
}

__global__ void rows_gather_kernel(const float *x, int64_t ldx, const int64_t *idx, int64_t n_idx,
                                   int64_t n_cols, float *y, int64_t ldy)
{
    for (int64_t e = glue_first(); e < n_idx * n_cols; e += glue_stride()) {
        int64_t k = e / n_cols;
        int64_t c = e % n_cols;
        y[k * ldy + c] = x[idx[k] * ldx + c];
    }
}

extern "C" tdm_status_t kern_rows_gather_cuda(kern_ctx_t *ctx, const float *x, int64_t ldx,
                                              const int64_t *idx, int64_t n_idx, int64_t n_cols,
                                              float *y_out, int64_t ldy)
{
    if (!rows_args_ok(x, ldx, idx, n_idx, n_cols, y_out, ldy)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_idx == 0) {
        return TDM_OK;
    }
    rows_gather_kernel<<<glue_grid(n_idx * n_cols), GLUE_BLOCK, 0, kc_stream(ctx)>>>(
        x, ldx, idx, n_idx, n_cols, y_out, ldy);
    return kc_launch_status("rows_gather_cuda", n_idx, n_cols);
}

/* One thread per column: the additions into a column run in k order, as on the CPU, whether or
 * not idx repeats a row. */
__global__ void rows_scatter_add_kernel(const float *y, int64_t ldy, const int64_t *idx,
                                        int64_t n_idx, int64_t n_cols, float *acc, int64_t ld_acc)
{
    for (int64_t c = glue_first(); c < n_cols; c += glue_stride()) {
        for (int64_t k = 0; k < n_idx; k++) {
            float *a = acc + idx[k] * ld_acc + c;
            *a = __fadd_rn(*a, y[k * ldy + c]);
        }
    }
}

extern "C" tdm_status_t kern_rows_scatter_add_cuda(kern_ctx_t *ctx, const float *y, int64_t ldy,
                                                   const int64_t *idx, int64_t n_idx,
                                                   int64_t n_cols, float *acc, int64_t ld_acc)
{
    if (!rows_args_ok(y, ldy, idx, n_idx, n_cols, acc, ld_acc)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_idx == 0) {
        return TDM_OK;
    }
    rows_scatter_add_kernel<<<glue_grid(n_cols), GLUE_BLOCK, 0, kc_stream(ctx)>>>(
        y, ldy, idx, n_idx, n_cols, acc, ld_acc);
    return kc_launch_status("rows_scatter_add_cuda", n_idx, n_cols);
}

/* One thread per block of keys: the CPU's running max in ascending j. */
__global__ void cand_blocks_kernel(const float *scores, int64_t n, int64_t block, float *beta)
{
    const int64_t nb = (n + block - 1) / block;
    const int64_t last = (n - 1) / block;

    for (int64_t blk = glue_first(); blk < nb; blk += glue_stride()) {
        float mx = -INFINITY;
        for (int64_t j = blk * block; j < (blk + 1) * block && j < n; j++) {
            mx = scores[j] > mx ? scores[j] : mx;
        }
        beta[blk] = blk == last ? INFINITY : mx;
    }
}

extern "C" tdm_status_t kern_cand_blocks_cuda(kern_ctx_t *ctx, const float *scores, int64_t n,
                                              int64_t block, float *beta_out)
{
    if (scores == NULL || beta_out == NULL || n < 1 || block < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    cand_blocks_kernel<<<glue_grid((n + block - 1) / block), GLUE_BLOCK, 0, kc_stream(ctx)>>>(
        scores, n, block, beta_out);
    return kc_launch_status("cand_blocks_cuda", 1, n);
}

__global__ void cand_mask_kernel(float *scores, int64_t n, int64_t block, const int32_t *pool,
                                 int64_t n_pool)
{
    for (int64_t j = glue_first(); j < n; j += glue_stride()) {
        int64_t blk = j / block;
        int keep = 0;
        for (int64_t k = 0; k < n_pool && !keep; k++) {
            keep = pool[k] == blk;
        }
        if (!keep) {
            scores[j] = -INFINITY;
        }
    }
}

extern "C" tdm_status_t kern_cand_mask_cuda(kern_ctx_t *ctx, float *scores, int64_t n,
                                            int64_t block, const int32_t *pool, int64_t n_pool)
{
    if (n < 0 || n_pool < 0 || block < 1 || (n > 0 && scores == NULL) ||
        (n_pool > 0 && pool == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 0) {
        return TDM_OK;
    }
    cand_mask_kernel<<<glue_grid(n), GLUE_BLOCK, 0, kc_stream(ctx)>>>(scores, n, block, pool,
                                                                      n_pool);
    return kc_launch_status("cand_mask_cuda", 1, n);
}

/* One block: counts per expert (a thread scans every pair for its experts), the prefix sum by
 * thread 0, then each thread fills its experts' entries in (r, k) order. */
__global__ void __launch_bounds__(GLUE_BLOCK)
    expert_rows_kernel(const int32_t *experts, const float *wts, int64_t N, int K, int64_t E,
                       int64_t *offsets, int64_t *rows, float *wts_out)
{
    for (int64_t e = threadIdx.x; e < E; e += GLUE_BLOCK) {
        int64_t count = 0;
        for (int64_t i = 0; i < N * K; i++) {
            count += experts[i] == e;
        }
        offsets[e + 1] = count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offsets[0] = 0;
        for (int64_t e = 0; e < E; e++) {
            offsets[e + 1] += offsets[e];
        }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += GLUE_BLOCK) {
        int64_t at = offsets[e];
        for (int64_t i = 0; i < N * K; i++) {
            if (experts[i] == e) {
                rows[at] = i / K;
                wts_out[at] = wts[i];
                at++;
            }
        }
    }
}

extern "C" tdm_status_t kern_expert_rows_cuda(kern_ctx_t *ctx, const int32_t *experts,
                                              const float *wts, int64_t N, int K, int64_t E,
                                              int64_t *offsets_out, int64_t *rows_out,
                                              float *wts_out)
{
    if (N < 0 || K < 1 || E < 1 || offsets_out == NULL ||
        (N > 0 && (experts == NULL || wts == NULL || rows_out == NULL || wts_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    expert_rows_kernel<<<1, GLUE_BLOCK, 0, kc_stream(ctx)>>>(experts, wts, N, K, E, offsets_out,
                                                             rows_out, wts_out);
    return kc_launch_status("expert_rows_cuda", N, E);
}

/* One thread per output element, the element formula of codec.cu's dequant_kernel. */
__global__ void dequant_rows_kernel(int format, const uint8_t *const *codes,
                                    const uint8_t *const *scales, int64_t n_rows, int64_t dim,
                                    float *y)
{
    for (int64_t e = glue_first(); e < n_rows * dim; e += glue_stride()) {
        const uint8_t *c = codes[e / dim];
        const uint8_t *sc = scales[e / dim];
        int64_t i = e % dim;
        if (format == KERN_ROWS_ACT8) {
            y[e] = codec_e4m3_to_f32(c[i]) * codec_ue8m0_to_f32(sc[i / KERN_ACT8_GROUP]);
        } else {
            const uint8_t nibble = (uint8_t)(c[i / 2] >> (4 * (i & 1)));
            const float s = format == KERN_ROWS_CKV ? codec_e4m3_to_f32(sc[i / KERN_CKV_GROUP])
                                                    : codec_ue8m0_to_f32(sc[i / KERN_MX4_GROUP]);
            y[e] = codec_e2m1_to_f32(nibble) * s;
        }
    }
}

extern "C" tdm_status_t kern_dequant_rows_cuda(kern_ctx_t *ctx, kern_rows_format_t format,
                                               const uint8_t *const *codes,
                                               const uint8_t *const *scales, int64_t n_rows,
                                               int64_t dim, float *y_out)
{
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
    if (n_rows == 0) {
        return TDM_OK;
    }
    dequant_rows_kernel<<<glue_grid(n_rows * dim), GLUE_BLOCK, 0, kc_stream(ctx)>>>(
        (int)format, codes, scales, n_rows, dim, y_out);
    return kc_launch_status("dequant_rows_cuda", n_rows, dim);
}

/* The ticket's side stream and events, made at its first start (kern_ahead_t). On failure
 * whatever was made is destroyed and the ticket stays as it was. */
static tdm_status_t ahead_make(kern_ahead_t *t)
{
    cudaStream_t q = NULL;
    cudaEvent_t ready = NULL, done = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking);

    if (err != cudaSuccess) {
        goto fail;
    }
    err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        goto fail_stream;
    }
    err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        goto fail_ready;
    }
    t->queue = q;
    t->ready = ready;
    t->done = done;
    return TDM_OK;

fail_ready:
    cudaEventDestroy(ready);
fail_stream:
    cudaStreamDestroy(q);
fail:
    tdm_log(TDM_LOG_ERROR, KC_LOG, "rows_ahead: side stream or event: cuda=%s",
            cudaGetErrorString(err));
    return err == cudaErrorMemoryAllocation ? TDM_ERR_NO_MEMORY : TDM_ERR_INTERNAL;
}

/* The side stream waits for what ctx's stream queued so far (event `ready`), runs
 * kern_dequant_rows_cuda's kernel, and records `done` for kern_ahead_wait_cuda. */
extern "C" tdm_status_t kern_rows_ahead_cuda(kern_ctx_t *ctx, kern_rows_format_t format,
                                             const uint8_t *const *codes,
                                             const uint8_t *const *scales, int64_t n_rows,
                                             int64_t dim, float *y_out, kern_ahead_t *ticket)
{
    kern_ctx_t side;
    cudaError_t err;
    tdm_status_t st;

    if (ticket == NULL || ticket->pending) {
        return TDM_ERR_INVALID_ARG;
    }
    /* the argument checks first: a refused call makes nothing */
    st = kern_dequant_rows_cuda(ctx, format, codes, scales, 0, dim, y_out);
    if (st != TDM_OK || n_rows < 0 || (n_rows > 0 && (codes == NULL || scales == NULL ||
                                                       y_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (ticket->queue == NULL) {
        st = ahead_make(ticket);
        if (st != TDM_OK) {
            return st;
        }
    }
    err = cudaEventRecord((cudaEvent_t)ticket->ready, kc_stream(ctx));
    if (err == cudaSuccess) {
        err = cudaStreamWaitEvent((cudaStream_t)ticket->queue, (cudaEvent_t)ticket->ready, 0);
    }
    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "rows_ahead: ordering after the stream: cuda=%s",
                cudaGetErrorString(err));
        return TDM_ERR_INTERNAL;
    }
    side = ctx != NULL ? *ctx : kern_ctx_t{};
    side.cuda_stream = ticket->queue;
    st = kern_dequant_rows_cuda(&side, format, codes, scales, n_rows, dim, y_out);
    if (st != TDM_OK) {
        return st;
    }
    err = cudaEventRecord((cudaEvent_t)ticket->done, (cudaStream_t)ticket->queue);
    if (err != cudaSuccess) { /* launched but not recorded: nothing could wait for it later */
        tdm_log(TDM_LOG_ERROR, KC_LOG, "rows_ahead: recording the gather: cuda=%s",
                cudaGetErrorString(err));
        cudaStreamSynchronize((cudaStream_t)ticket->queue);
        return TDM_ERR_INTERNAL;
    }
    ticket->pending = 1;
    return TDM_OK;
}

extern "C" tdm_status_t kern_ahead_wait_cuda(kern_ctx_t *ctx, kern_ahead_t *ticket)
{
    cudaError_t err;

    if (ticket == NULL || !ticket->pending || ticket->done == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    err = cudaStreamWaitEvent(kc_stream(ctx), (cudaEvent_t)ticket->done, 0);
    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "ahead_wait: cuda=%s", cudaGetErrorString(err));
        return TDM_ERR_INTERNAL;
    }
    ticket->pending = 0;
    return TDM_OK;
}

extern "C" void kern_ahead_free_cuda(kern_ctx_t *ctx, kern_ahead_t *ticket)
{
    (void)ctx;
    if (ticket == NULL) {
        return;
    }
    if (ticket->queue != NULL) {
        cudaStreamSynchronize((cudaStream_t)ticket->queue);
        cudaEventDestroy((cudaEvent_t)ticket->ready);
        cudaEventDestroy((cudaEvent_t)ticket->done);
        cudaStreamDestroy((cudaStream_t)ticket->queue);
    }
    memset(ticket, 0, sizeof(*ticket));
}

/* One thread: the header check kern_kv_page_mark_rows makes (magic and version; the dims were
 * checked when the page was made and are not changed here), then its change. */
__global__ void page_mark_kernel(uint8_t *page, uint32_t slot_end, int32_t *status_word)
{
    const uint32_t version =
        (uint32_t)page[KERN_KV_PAGE_HDR_VERSION] | ((uint32_t)page[KERN_KV_PAGE_HDR_VERSION + 1] << 8);
    uint32_t rows;

    if (page[0] != (uint8_t)KERN_KV_PAGE_MAGIC[0] || page[1] != (uint8_t)KERN_KV_PAGE_MAGIC[1] ||
        page[2] != (uint8_t)KERN_KV_PAGE_MAGIC[2] || page[3] != (uint8_t)KERN_KV_PAGE_MAGIC[3] ||
        version != KERN_KV_PAGE_VERSION) {
        if (status_word != NULL) {
            atomicOr(status_word, KERN_STATUS_PAGE_HEADER);
        }
        return;
    }
    rows = (uint32_t)page[KERN_KV_PAGE_HDR_ROW_COUNT] |
           ((uint32_t)page[KERN_KV_PAGE_HDR_ROW_COUNT + 1] << 8);
    if (rows < slot_end) {
        page[KERN_KV_PAGE_HDR_ROW_COUNT] = (uint8_t)(slot_end & 0xFFu);
        page[KERN_KV_PAGE_HDR_ROW_COUNT + 1] = (uint8_t)(slot_end >> 8);
    }
    page[KERN_KV_PAGE_HDR_FLAGS] |= (uint8_t)KERN_KV_PAGE_FLAG_STALE;
}

extern "C" tdm_status_t kern_page_mark_cuda(kern_ctx_t *ctx, void *page, uint32_t slot_end)
{
    /* without a status word a bad header could not be reported without waiting: refused */
    if (page == NULL || slot_end == 0 || slot_end > KERN_KV_PAGE_ROWS || ctx == NULL ||
        ctx->status_word == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    page_mark_kernel<<<1, 1, 0, kc_stream(ctx)>>>((uint8_t *)page, slot_end,
                                                  ctx != NULL ? ctx->status_word : NULL);
    return kc_launch_status("page_mark_cuda", 1, slot_end);
}
