/* sample.cu - kern_argmax_cuda (kernels/sample.h): one block per logits row. Each thread scans
 * its strided tokens keeping (largest finite logit, lowest id) and a bad-logit flag; the block
 * then merges the threads' pairs by (value, then lower id), which is exact and independent of
 * the merge order, so the id equals the CPU's. The ids come back to the host to learn the
 * status (a row with a NaN, +inf or no finite logit gets -1), so the call waits for its stream.
 */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define ARGMAX_CHECK_ROWS 256 /* ids copied back per status check */

/* (v, id) better than (bv, bid): larger value, then lower id; id < 0 is "none". */
__device__ __forceinline__ int argmax_better(float v, int32_t id, float bv, int32_t bid)
{
    if (id < 0) {
        return 0;
    }
    return bid < 0 || v > bv || (v == bv && id < bid);
}

__global__ void __launch_bounds__(KC_BLOCK)
    argmax_kernel(const float *logits, int64_t ld, int64_t n_rows, int64_t n_vocab, int32_t *ids)
{
    __shared__ float s_val[KC_BLOCK];
    __shared__ int32_t s_id[KC_BLOCK];
    __shared__ int s_bad[KC_BLOCK];

    for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const float *row = logits + r * ld;
        float best = -INFINITY;
        int32_t arg = -1;
        int bad = 0;

        for (int64_t x = threadIdx.x; x < n_vocab; x += KC_BLOCK) {
            float v = row[x];
            if (isnan(v) || v == INFINITY) {
                bad = 1;
            } else if (v != -INFINITY && argmax_better(v, (int32_t)x, best, arg)) {
                best = v;
                arg = (int32_t)x;
            }
        }
        s_val[threadIdx.x] = best;
        s_id[threadIdx.x] = arg;
        s_bad[threadIdx.x] = bad;
        __syncthreads();
        for (int s = KC_BLOCK / 2; s >= 1; s /= 2) {
            if ((int)threadIdx.x < s) {
                int o = (int)threadIdx.x + s;
                if (argmax_better(s_val[o], s_id[o], s_val[threadIdx.x], s_id[threadIdx.x])) {
                    s_val[threadIdx.x] = s_val[o];
                    s_id[threadIdx.x] = s_id[o];
                }
                s_bad[threadIdx.x] |= s_bad[o];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            ids[r] = s_bad[0] ? -1 : s_id[0];
        }
        __syncthreads();
    }
}

extern "C" tdm_status_t kern_argmax_cuda(kern_ctx_t *ctx, const float *logits, int64_t ld,
                                         int64_t n_rows, int64_t n_vocab, int32_t *ids_out)
{
    cudaStream_t stream = kc_stream(ctx);
    int32_t host[ARGMAX_CHECK_ROWS];
    tdm_status_t st;

    if (n_rows < 0 || n_vocab < 1 || ld < n_vocab ||
        (n_rows > 0 && (logits == NULL || ids_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_rows == 0) {
        return TDM_OK;
    }
    argmax_kernel<<<kc_grid(n_rows, 1), KC_BLOCK, 0, stream>>>(logits, ld, n_rows, n_vocab,
                                                               ids_out);
    st = kc_launch_status("argmax_cuda", n_rows, n_vocab);
    for (int64_t r0 = 0; r0 < n_rows && st == TDM_OK; r0 += ARGMAX_CHECK_ROWS) {
        int64_t n = n_rows - r0 < ARGMAX_CHECK_ROWS ? n_rows - r0 : ARGMAX_CHECK_ROWS;
        st = kc_call_status("argmax_cuda", "cudaMemcpyAsync",
                            cudaMemcpyAsync(host, ids_out + r0, (size_t)n * sizeof(int32_t),
                                            cudaMemcpyDeviceToHost, stream));
        if (st == TDM_OK) {
            st = kc_call_status("argmax_cuda", "cudaStreamSynchronize",
                                cudaStreamSynchronize(stream));
        }
        for (int64_t i = 0; i < n && st == TDM_OK; i++) {
            if (host[i] < 0) {
                st = TDM_ERR_INTERNAL;
            }
        }
    }
    return st;
}
