/* moe.cu - CUDA MoE routing, SwiGLU and the routed experts of a layer (kern_moe_route_cuda,
 * kern_swiglu_cuda, kern_moe_ffn_cuda; kernels/moe.h, MODEL.md 5.5, R8).
 *
 * Routing: one block per row. s_e = sqrt(softplus(logit_e)) with kern_exp's and kern_log1p's steps
 * (kc_exp, kc_log1p): the CPU's scores and so its selection and weights. The top-K is K rounds of a
 * block arg-max in the [tandem] order (value descending, id ascending): a total order, so the
 * result does not depend on how the reduction is split. The ids are sorted ascending and the
 * weights summed in that order, as on the CPU. A NaN score, or fewer than K candidates above
 * -inf, makes the row's first id -1; the host copies the first id of each row back and returns
 * TDM_ERR_INTERNAL, so this op waits for its stream (the contract returns the NaN status),
 * unless the context carries a status word (kernels/backend.h): then the row gets experts
 * 0 .. K-1 at weight 0, the word's bit is set on the device, and nothing waits.
 *
 * SwiGLU: elementwise, the CPU's arithmetic and exp (kc_exp: kern_exp's steps), so its bits.
 *
 * Routed experts: every expert in one grouped launch per GEMM (kc_gemm_grouped reads the group
 * offsets on the device), so the layer needs no copy of the offsets to the host and no wait.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MOE_MAX_E        4096 /* as the CPU router's limit */
#define MOE_CHECK_ROWS   1024 /* rows whose first id is copied back per cudaMemcpy2D */
#define MOE_ROUTE_FAILED (-1) /* first id of a row with a NaN or too few candidates */

/* a is better than b in tie order (value descending, then index ascending); no NaN here. */
__device__ __forceinline__ int better_dev(float va, int ia, float vb, int ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Block arg-max in tie order of (v, i); i < 0 means "no candidate". All threads get it. */
__device__ __forceinline__ void block_argmax(float *v, int *i, float *red_v, int *red_i)
{
    const int lane = (int)(threadIdx.x % KC_WARP);
    const int warp = (int)(threadIdx.x / KC_WARP);

    for (int s = KC_WARP / 2; s >= 1; s /= 2) {
        const float ov = __shfl_down_sync(KC_FULL_MASK, *v, s);
        const int oi = __shfl_down_sync(KC_FULL_MASK, *i, s);
        if (oi >= 0 && (*i < 0 || better_dev(ov, oi, *v, *i))) {
            *v = ov;
            *i = oi;
        }
    }
    if (lane == 0) {
        red_v[warp] = *v;
        red_i[warp] = *i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < KC_BLOCK / KC_WARP; w++) {
            if (red_i[w] >= 0 &&
                (red_i[0] < 0 || better_dev(red_v[w], red_i[w], red_v[0], red_i[0]))) {
                red_v[0] = red_v[w];
                red_i[0] = red_i[w];
            }
        }
    }
    __syncthreads();
    *v = red_v[0];
    *i = red_i[0];
    __syncthreads();
}

__global__ void __launch_bounds__(KC_BLOCK)
    moe_route_kernel(const float *logits, const float *bias, int64_t n_rows, int E, int K,
                     float rho, int32_t *ids_out, float *weights_out, int32_t *status_word)
{
    __shared__ float s[MOE_MAX_E];
    __shared__ float biased[MOE_MAX_E];
    __shared__ float red_v[KC_BLOCK / KC_WARP];
    __shared__ int red_i[KC_BLOCK / KC_WARP];
    __shared__ int32_t sel[KERN_MOE_MAX_K];
    __shared__ int bad;
    const int tid = (int)threadIdx.x;

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        if (tid == 0) {
            bad = 0;
        }
        __syncthreads();
        for (int e = tid; e < E; e += KC_BLOCK) {
            const float z = logits[r * E + e];
            const float sp = __fadd_rn(kc_log1p(kc_exp(-fabsf(z))), z > 0.0f ? z : 0.0f);
            s[e] = __fsqrt_rn(sp);
            biased[e] = __fadd_rn(s[e], bias[e]);
            if (isnan(biased[e])) {
                bad = 1;
            }
        }
        __syncthreads();
        for (int k = 0; k < K && bad == 0; k++) {
            float bv = -INFINITY;
            int bi = -1;
            for (int e = tid; e < E; e += KC_BLOCK) {
                if (biased[e] != -INFINITY && (bi < 0 || better_dev(biased[e], e, bv, bi))) {
                    bv = biased[e];
                    bi = e;
                }
            }
            block_argmax(&bv, &bi, red_v, red_i);
            if (tid == 0) {
                if (bi < 0) {
                    bad = 1;
                } else {
                    sel[k] = bi;
                    biased[bi] = -INFINITY; /* taken */
                }
            }
            __syncthreads();
        }
        if (tid == 0) {
            if (bad != 0 && status_word != NULL) {
                /* deferred status: experts 0 .. K-1 at weight 0, the word's bit set */
                for (int a = 0; a < K; a++) {
                    ids_out[r * K + a] = a;
                    weights_out[r * K + a] = 0.0f;
                }
                atomicOr(status_word, KERN_STATUS_ROUTE_NAN);
            } else if (bad != 0) {
                ids_out[r * K] = MOE_ROUTE_FAILED;
            } else {
                float sum = 0.0f;
                for (int a = 1; a < K; a++) { /* ascending ids */
                    const int32_t v = sel[a];
                    int b = a - 1;
                    while (b >= 0 && sel[b] > v) {
                        sel[b + 1] = sel[b];
                        b--;
                    }
                    sel[b + 1] = v;
                }
                for (int a = 0; a < K; a++) {
                    sum = __fadd_rn(sum, s[sel[a]]);
                }
                for (int a = 0; a < K; a++) {
                    ids_out[r * K + a] = sel[a];
                    weights_out[r * K + a] =
                        __fdiv_rn(__fmul_rn(rho, s[sel[a]]), __fadd_rn(sum, 1e-20f));
                }
            }
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_moe_route_cuda(kern_ctx_t *ctx, const float *logits, const float *bias,
                                            int64_t n_rows, int64_t E, int K, float rho,
                                            int32_t *ids_out, float *weights_out)
{
    cudaStream_t stream = kc_stream(ctx);
    int32_t first_ids[MOE_CHECK_ROWS];
    tdm_status_t status;

    if (logits == NULL || bias == NULL || ids_out == NULL || weights_out == NULL || K < 1 ||
        K > KERN_MOE_MAX_K || K > E || E > MOE_MAX_E) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    moe_route_kernel<<<kc_grid(n_rows, 1), KC_BLOCK, 0, stream>>>(
        logits, bias, n_rows, (int)E, K, rho, ids_out, weights_out,
        ctx != NULL ? ctx->status_word : NULL);
    status = kc_launch_status("moe_route_cuda", n_rows, E);
    /* a failed row is reported through the status word when the caller set one (no wait);
     * otherwise the first id of every row comes back and the call waits for it */
    for (int64_t r0 = 0; status == TDM_OK && r0 < n_rows && (ctx == NULL || ctx->status_word == NULL);
         r0 += MOE_CHECK_ROWS) {
        const int64_t n = n_rows - r0 < MOE_CHECK_ROWS ? n_rows - r0 : MOE_CHECK_ROWS;
        status = kc_call_status("moe_route_cuda", "cudaMemcpy2DAsync",
                                cudaMemcpy2DAsync(first_ids, sizeof(int32_t), ids_out + r0 * K,
                                                  sizeof(int32_t) * (size_t)K, sizeof(int32_t),
                                                  (size_t)n, cudaMemcpyDeviceToHost, stream));
        if (status == TDM_OK) {
            status = kc_call_status("moe_route_cuda", "cudaStreamSynchronize",
                                    cudaStreamSynchronize(stream));
        }
        for (int64_t i = 0; status == TDM_OK && i < n; i++) {
            if (first_ids[i] == MOE_ROUTE_FAILED) {
                tdm_log(TDM_LOG_ERROR, KC_LOG,
                        "moe_route_cuda: NaN or fewer than K finite scores: row=%lld E=%lld "
                        "K=%d",
                        (long long)(r0 + i), (long long)E, K);
                status = TDM_ERR_INTERNAL;
            }
        }
    }
    return status;
}

__global__ void __launch_bounds__(KC_BLOCK)
    swiglu_kernel(const float *gu, const float *w, int64_t n_rows, int64_t I, float lambda,
                  float *h)
{
    const int64_t n = n_rows * I;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / I;
        const int64_t i = e % I;
        const float wr = w != NULL ? w[r] : 1.0f;
        const float g = gu[r * 2 * I + i];
        const float u = gu[r * 2 * I + I + i];
        const float gm = g < lambda ? g : lambda;
        const float uc = u < -lambda ? -lambda : (u > lambda ? lambda : u);
        const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, kc_exp(-gm)));
        h[e] = kc_bf16_round(__fmul_rn(wr, __fmul_rn(__fmul_rn(gm, sig), uc)));
    }
}

extern "C" tdm_status_t kern_swiglu_cuda(kern_ctx_t *ctx, const float *gu, const float *w,
                                         int64_t n_rows, int64_t I, float lambda, float *h_out)
{
    if (gu == NULL || h_out == NULL || I <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows <= 0) {
        return TDM_OK;
    }
    swiglu_kernel<<<kc_grid(n_rows * I, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(gu, w, n_rows, I,
                                                                                  lambda, h_out);
    return kc_launch_status("swiglu_cuda", n_rows, I);
}

/* ---- The routed experts of a layer in one call (kern_moe_ffn_cuda) ------------------------ */

/* xe[i] = xq[rows[p0 + i]] for the window's pairs below offsets[E] (the pairs kern_expert_rows
 * grouped; a pair past them, left by an id it skipped, is zero and belongs to no expert). */
__global__ void __launch_bounds__(KC_BLOCK)
    moe_gather_kernel(const float *xq, int64_t H, const int64_t *rows, const int64_t *offsets,
                      int64_t E, int64_t p0, int64_t n, float *xe)
{
    const int64_t n_valid = offsets[E];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * H; i += stride) {
        const int64_t p = p0 + i / H;
        const int64_t c = i % H;
        xe[i] = p < n_valid ? xq[rows[p] * H + c] : 0.0f;
    }
}

/* Token t = blockIdx.x: its pairs in the window, in ascending pair (= expert) order, added into
 * acc[t] one FP32 addition each, as kern_rows_scatter_add_cpu does expert by expert. One warp
 * finds them in order (ballots over the window), then the block adds column by column. */
__global__ void __launch_bounds__(KC_BLOCK)
    moe_combine_kernel(const float *ye, int64_t H, const int64_t *rows, const int64_t *offsets,
                       int64_t E, int64_t p0, int64_t p1, float *acc)
{
    __shared__ int64_t mine[KERN_MOE_MAX_K];
    __shared__ int n_mine;
    const int64_t t = (int64_t)blockIdx.x;
    const int64_t end = p1 < offsets[E] ? p1 : offsets[E];

    if (threadIdx.x < KC_WARP) {
        const int lane = (int)threadIdx.x;
        int n = 0;
        for (int64_t base = p0; base < end; base += KC_WARP) {
            const int64_t p = base + lane;
            const int hit = p < end && rows[p] == t;
            const uint32_t m = __ballot_sync(KC_FULL_MASK, hit);
            const int at = n + __popc(m & ((1u << lane) - 1u));
            if (hit && at < KERN_MOE_MAX_K) {
                mine[at] = p;
            }
            n += __popc(m);
        }
        if (lane == 0) {
            n_mine = n < KERN_MOE_MAX_K ? n : KERN_MOE_MAX_K;
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
        float a = acc[t * H + c];
        for (int i = 0; i < n_mine; i++) {
            a = __fadd_rn(a, ye[(mine[i] - p0) * H + c]);
        }
        acc[t * H + c] = a;
    }
}

/* active[e] += 1 for each expert e with at least one pair. */
__global__ void moe_active_kernel(const int64_t *offsets, int64_t E, int64_t *active)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;

    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < E; e += stride) {
        active[e] += offsets[e + 1] > offsets[e] ? 1 : 0;
    }
}

/* The active counts of a call that succeeded (NULL active: none kept). */
static tdm_status_t count_active(kern_ctx_t *ctx, const int64_t *offsets, int64_t E,
                                 int64_t *active)
{
    if (active == NULL) {
        return TDM_OK;
    }
    moe_active_kernel<<<kc_grid(E, KC_BLOCK), KC_BLOCK, 0, kc_stream(ctx)>>>(offsets, E, active);
    return kc_launch_status("moe_ffn_cuda(active)", E, 1);
}

/* 1 when every held expert has the dtype and shape of w1 (gate, up) and w2 (down): the grouped
 * launches decode one dtype. The loader may expand a single expert to BF16 (scales outside the
 * exact range), so a layer can mix them. */
static int experts_alike(const kern_moe_experts_t *ex, const kern_mat_t *w1, const kern_mat_t *w2)
{
    for (int64_t e = 0; e < ex->n_experts; e++) {
        const kern_mat_t *a = &ex->w1[e], *b = &ex->w3[e], *c = &ex->w2[e];
        if (a->data == NULL && b->data == NULL && c->data == NULL) {
            continue;
        }
        if (a->data == NULL || b->data == NULL || c->data == NULL || a->dtype != w1->dtype ||
            b->dtype != w1->dtype || c->dtype != w2->dtype || a->n_out != w1->n_out ||
            a->n_in != w1->n_in || b->n_out != w1->n_out || b->n_in != w1->n_in ||
            c->n_out != w2->n_out || c->n_in != w2->n_in) {
            return 0;
        }
    }
    return 1;
}

/* A layer whose experts are not alike: the offsets copied to the host (one wait), then the
 * per-expert calls (same bits as the grouped form, which runs the same GEMM kernel). st: the
 * status so far (the active count's launch). */
static tdm_status_t moe_ffn_per_expert(kern_ctx_t *ctx, const kern_moe_experts_t *ex,
                                       const float *xq, int64_t n_tokens, int64_t H, int64_t I,
                                       const int64_t *offsets, const int64_t *rows,
                                       const float *wts, int64_t n_pairs, float lambda,
                                       float *scratch, int64_t scratch_rows, float *acc,
                                       tdm_status_t st)
{
    cudaStream_t stream = kc_stream(ctx);
    const int64_t E = ex->n_experts;
    int64_t *off = (int64_t *)malloc((size_t)(E + 1) * sizeof(int64_t));
    float *xe, *gu, *h, *ye;
    kern_moe_scratch_split(scratch, scratch_rows, H, I, &xe, &gu, &h, &ye);

    (void)n_tokens;
    (void)n_pairs;
    if (off == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (st == TDM_OK) {
        st = kc_call_status("moe_ffn_cuda", "cudaMemcpyAsync",
                            cudaMemcpyAsync(off, offsets, (size_t)(E + 1) * sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, stream));
    }
    if (st == TDM_OK) {
        st = kc_call_status("moe_ffn_cuda", "cudaStreamSynchronize",
                            cudaStreamSynchronize(stream));
    }
    for (int64_t e = 0; e < E && st == TDM_OK; e++) {
        const int64_t ne = off[e + 1] - off[e];
        if (ne == 0) {
            continue;
        }
        if (ne < 0 || ne > scratch_rows || ex->w1[e].data == NULL) {
            st = TDM_ERR_INVALID_ARG;
            break;
        }
        st = kern_rows_gather_cuda(ctx, xq, H, rows + off[e], ne, H, xe, H);
        if (st == TDM_OK) {
            st = kern_gemm_cuda(ctx, &ex->w1[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu, 2 * I);
        }
        if (st == TDM_OK) {
            st = kern_gemm_cuda(ctx, &ex->w3[e], xe, H, ne, KERN_GEMM_OUT_BF16, gu + I, 2 * I);
        }
        if (st == TDM_OK) {
            st = kern_swiglu_cuda(ctx, gu, wts + off[e], ne, I, lambda, h);
        }
        if (st == TDM_OK) {
            st = kern_qdq_act8_rows_cuda(ctx, h, ne, I, h);
        }
        if (st == TDM_OK) {
            st = kern_gemm_cuda(ctx, &ex->w2[e], h, I, ne, KERN_GEMM_OUT_BF16, ye, H);
        }
        if (st == TDM_OK) {
            st = kern_rows_scatter_add_cuda(ctx, ye, H, rows + off[e], ne, H, acc, H);
        }
    }
    free(off);
    return st;
}

/*
 * The pairs in windows of scratch_rows: gather, the grouped gate and up GEMMs (one launch each
 * over every expert, kc_gemm_grouped reading the offsets on the device), SwiGLU with the routing
 * weights and Q_act8 over the window, the grouped down GEMM, then each token's outputs added
 * into acc. Nothing is copied to the host and nothing waits. A token's pairs are at most
 * KERN_MOE_MAX_K (its top-K).
 */
extern "C" tdm_status_t kern_moe_ffn_cuda(kern_ctx_t *ctx, const kern_moe_experts_t *ex,
                                          const float *xq, int64_t n_tokens, int64_t H, int64_t I,
                                          const int64_t *offsets, const int64_t *rows,
                                          const float *wts, int64_t n_pairs, float lambda,
                                          float *scratch, int64_t scratch_rows, float *acc,
                                          int64_t *active_out)
{
    cudaStream_t stream = kc_stream(ctx);
    const int64_t need_rows = n_tokens < n_pairs ? n_tokens : n_pairs;
    tdm_status_t st = TDM_OK;
    int64_t E;
    const void *const *tab;

    if (ex == NULL || ex->w1 == NULL || ex->w3 == NULL || ex->w2 == NULL || ex->table == NULL ||
        ex->n_experts < 1 || ex->n_experts > 65535 || offsets == NULL || n_tokens < 0 ||
        n_pairs < 0 || H < 1 || I < 1 || n_tokens > 2147483647 ||
        (n_pairs > 0 && (xq == NULL || rows == NULL || wts == NULL || scratch == NULL ||
                         acc == NULL || scratch_rows < need_rows || scratch_rows < 1))) {
        return TDM_ERR_INVALID_ARG;
    }
    E = ex->n_experts;
    tab = ex->table;
    float *xe, *gu, *h, *ye;
    kern_moe_scratch_split(scratch, scratch_rows, H, I, &xe, &gu, &h, &ye);
    /* the first held expert's descriptors give the shape and dtype of the grouped launches */
    const kern_mat_t *w1 = &ex->w1[0], *w3 = &ex->w3[0], *w2 = &ex->w2[0];
    for (int64_t e = 0; e < E && w1->data == NULL; e++) {
        w1 = &ex->w1[e];
        w3 = &ex->w3[e];
        w2 = &ex->w2[e];
    }
    if (w1->data == NULL) {
        /* no expert held (an expert-parallel shard's view): only an empty layer is valid */
        return n_pairs == 0 ? TDM_OK : TDM_ERR_INVALID_ARG;
    }
    if (w1->n_out != I || w1->n_in != H || w3->n_out != I || w3->n_in != H || w2->n_out != H ||
        w2->n_in != I) {
        return TDM_ERR_INVALID_ARG;
    }
    if (!experts_alike(ex, w1, w2)) {
        st = moe_ffn_per_expert(ctx, ex, xq, n_tokens, H, I, offsets, rows, wts, n_pairs, lambda,
                                scratch, scratch_rows, acc, st);
        return st == TDM_OK ? count_active(ctx, offsets, E, active_out) : st;
    }
    for (int64_t p0 = 0; st == TDM_OK && p0 < n_pairs; p0 += scratch_rows) {
        const int64_t p1 = p0 + scratch_rows < n_pairs ? p0 + scratch_rows : n_pairs;
        const int64_t n = p1 - p0;
        /* an expert takes a token at most once: at most min(n_tokens, n) rows in a window */
        const int64_t max_rows = n_tokens < n ? n_tokens : n;

        moe_gather_kernel<<<kc_grid(n * H, KC_BLOCK), KC_BLOCK, 0, stream>>>(xq, H, rows, offsets,
                                                                             E, p0, n, xe);
        st = kc_launch_status("moe_ffn_cuda(gather)", n, H);
        if (st == TDM_OK) {
            st = kc_gemm_grouped(ctx, w1, tab, tab + E, offsets, E, max_rows, p0, p1, xe, H,
                                 KERN_GEMM_OUT_BF16, gu, 2 * I);
        }
        if (st == TDM_OK) {
            st = kc_gemm_grouped(ctx, w3, tab + 2 * E, tab + 3 * E, offsets, E, max_rows, p0, p1,
                                 xe, H, KERN_GEMM_OUT_BF16, gu + I, 2 * I);
        }
        if (st == TDM_OK) {
            st = kern_swiglu_cuda(ctx, gu, wts + p0, n, I, lambda, h);
        }
        if (st == TDM_OK) {
            st = kern_qdq_act8_rows_cuda(ctx, h, n, I, h);
        }
        if (st == TDM_OK) {
            st = kc_gemm_grouped(ctx, w2, tab + 4 * E, tab + 5 * E, offsets, E, max_rows, p0, p1,
                                 h, I, KERN_GEMM_OUT_BF16, ye, H);
        }
        if (st == TDM_OK && n_tokens > 0) {
            moe_combine_kernel<<<(unsigned int)n_tokens, KC_BLOCK, 0, stream>>>(
                ye, H, rows, offsets, E, p0, p1, acc);
            st = kc_launch_status("moe_ffn_cuda(combine)", n_tokens, H);
        }
    }
    return st == TDM_OK ? count_active(ctx, offsets, E, active_out) : st;
}
