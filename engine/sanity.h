/* sanity.h - the MODEL.md 9.1 sanity check a generated checkpoint must pass.
 *
 * Runs the oracle forward (engine/forward.h) on the fixed check prompt and on 256 seeded random
 * tokens and refuses a checkpoint with a non-finite logit, a |logit| above 1e4, or a routed
 * expert of some backbone layer that receives no token over the 256 random tokens. Owns nothing
 * beyond the call; knows nothing of how the checkpoint was made.
 *
 * Fixed check prompt [tandem] (docs/MODEL-NOTES.md): ids (17 i + 5) mod V for i < 64 (the numpy
 * reference uses the same). Random tokens: splitmix64(seed + i) mod V for i < 256 with seed
 * ENGINE_SANITY_SEED, skipping image_token_id (redrawn with the next counter). DSpark blocks are
 * not run by the oracle, so their experts are not counted.
 */
#ifndef TANDEM_ENGINE_SANITY_H
#define TANDEM_ENGINE_SANITY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define ENGINE_SANITY_PROMPT_TOKENS 64
#define ENGINE_SANITY_RANDOM_TOKENS 256
#define ENGINE_SANITY_MAX_ABS_LOGIT 1e4
#define ENGINE_SANITY_SEED 0x5A17C0DEull

/*
 * engine_sanity_report_t - what the check saw.
 * max_abs_logit: largest |logit| over both runs; n_nonfinite: logits that were NaN or inf;
 * min_expert_tokens: the least tokens any routed expert of any backbone layer received over the
 * random tokens (0 = an unused expert), at layer min_expert_layer, expert min_expert_id.
 */
typedef struct {
    double max_abs_logit;
    int64_t n_nonfinite;
    int64_t min_expert_tokens;
    int min_expert_layer;
    int min_expert_id;
} engine_sanity_report_t;

/*
 * engine_sanity_check - load the checkpoint in `dir` (engine_model_load, full weight check) and
 * run the check above with n_threads kernel threads.
 *
 * Returns TDM_OK when it passes, TDM_ERR_MISMATCH when the checkpoint is refused (err names
 * the reason, e.g. "expert 5 of layer 3 receives no token over 256 random tokens"), or the
 * loader's / forward pass's error with its text in err (err_bytes, may be 0). report_out (may be
 * NULL) is filled whenever the forward ran. Thread-safe.
 */
tdm_status_t engine_sanity_check(const char *dir, int n_threads, engine_sanity_report_t *report_out,
                                 char *err, size_t err_bytes);

#endif
