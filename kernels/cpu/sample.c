/* sample.c - kern_argmax_cpu (kernels/sample.h): engine/sampler.c's scan, one row at a time. */
#include "kernels/sample.h"

#include <math.h>
#include <stddef.h>

tdm_status_t kern_argmax_cpu(kern_ctx_t *ctx, const float *logits, int64_t ld, int64_t n_rows,
                             int64_t n_vocab, int32_t *ids_out)
{
    tdm_status_t st = TDM_OK;

    (void)ctx;
    if (n_rows < 0 || n_vocab < 1 || ld < n_vocab ||
        (n_rows > 0 && (logits == NULL || ids_out == NULL))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        const float *row = logits + r * ld;
        float best = -INFINITY;
        int32_t arg = -1;
        for (int64_t x = 0; x < n_vocab; x++) {
            float v = row[x];
            if (isnan(v) || v == INFINITY) {
                arg = -1;
                break;
            }
            if (v != -INFINITY && (arg < 0 || v > best)) {
                best = v;
                arg = (int32_t)x;
            }
        }
        ids_out[r] = arg;
        if (arg < 0) {
            st = TDM_ERR_INTERNAL;
        }
    }
    return st;
}
