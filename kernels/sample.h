/* sample.h - the greedy token choice on the backend that holds the logits (engine/sampler.h's
 * temperature-0 rule as an op, so a decode step can bring back token ids instead of logits).
 *
 * Owns nothing; knows nothing of requests or sampling parameters. The full sampler (top-k,
 * top-p, min-p, Gumbel-max, log-probabilities) stays engine/sampler.c on host logits.
 */
#ifndef TANDEM_KERNELS_SAMPLE_H
#define TANDEM_KERNELS_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/*
 * kern_argmax_fn - for each row r, ids_out[r] = the lowest id x with the largest finite
 * logits[r, x] (-inf logits are skipped): engine_sampler_sample's token at temperature 0
 * (MODEL.md 8; ties to the lower id, 5.4).
 *
 * logits: [n_rows, n_vocab] f32, row stride ld (>= n_vocab).   ids_out: [n_rows] int32.
 * Returns TDM_OK; TDM_ERR_INVALID_ARG (NULL, n_rows < 0, n_vocab < 1, ld < n_vocab; nothing
 * written); TDM_ERR_INTERNAL when a row holds a NaN or +inf or no finite logit (an engine error,
 * as in the sampler): that row's id is -1, every other row's id is valid. Not logged here: the
 * caller names the step. The CUDA version waits for its stream to learn that status.
 */
typedef tdm_status_t kern_argmax_fn(kern_ctx_t *ctx, const float *logits, int64_t ld,
                                    int64_t n_rows, int64_t n_vocab, int32_t *ids_out);
kern_argmax_fn kern_argmax_cpu;

#ifdef __cplusplus
}
#endif

#endif
