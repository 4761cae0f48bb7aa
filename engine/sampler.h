/* sampler.h - choosing the next token from logits: the MODEL.md section-8 sampling primitive.
 *
 * Every node (prefill, decode, DSpark draft, verifier) picks the token at sequence position q as
 *     argmax over surviving x of  s(x) + G(seed, q, x),   s(x) = l(x) / tau   (double),
 * G = -ln(-ln u) in double, u = (w + 0.5) * 2^-32, w = word 0 of Philox-4x32-10 with
 * key = (seed low 32 bits, seed high 32 bits) and counter = (q, x, 0, 0). tau = 0 is plain
 * argmax. Ties (equal score or equal logit) go to the lower token id (MODEL.md 5.4), so the
 * same (seed, q, logits, params) gives the same token on every node and in every batch.
 *
 * Filters, applied in this order (that of vLLM's V0 sampler; identical for draft and target):
 *   1. temperature  s(x) = l(x) / tau. tau < ENGINE_SAMPLER_GREEDY_BELOW (0 included) skips
 *                   everything below: greedy argmax.
 *   2. top-k        keep the k best tokens by (logit descending, id ascending).
 *   3. top-p        on the softmax of s over the top-k set, keep the smallest prefix in
 *                   (logit descending, id ascending) order whose mass >= top_p.
 *   4. min-p        keep tokens with p(x) >= min_p * p_max, i.e. s(x) - s_max >= ln(min_p).
 * Tokens whose logit is -inf are masked: never drawn, never counted. Repetition, presence and
 * frequency penalties are NOT implemented (they need the token history, which this module does
 * not see); a front end must refuse requests that set them (TDM_ERR_UNSUPPORTED).
 *
 * Log-probabilities describe the MODEL's distribution, as OpenAI and vLLM ("raw_logprobs")
 * report them: log-softmax of the raw logits at temperature 1, before any filter. The filtered
 * distribution actually sampled from is engine_sampler_filtered_probs().
 *
 * Owns nothing: all functions are pure functions of their arguments on plain host arrays (the
 * CUDA port keeps the same math); per-call scratch comes from a caller's tdm_arena_t and is
 * given back before return. Knows nothing of the forward pass, tokenizer or speculative
 * acceptance rules (which build on engine_sampler_gumbel and engine_sampler_filtered_probs).
 * Thread-safe given distinct arenas.
 */
#ifndef TANDEM_ENGINE_SAMPLER_H
#define TANDEM_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"

/* Most alternatives one sampled token reports (OpenAI's top_logprobs limit). */
#define ENGINE_SAMPLER_MAX_LOGPROBS 20

/* n_logprobs value that turns log-probabilities off. */
#define ENGINE_SAMPLER_LOGPROBS_OFF (-1)

/* Most stop token ids one request may list (EOS included). */
#define ENGINE_SAMPLER_MAX_STOP_IDS 32

/*
 * Temperatures below this act as 0: greedy argmax, filters and seed moot (vLLM's _SAMPLING_EPS,
 * 1e-5, draws the same line). The limit of Gumbel-max as tau -> 0+ is the argmax, and l / tau
 * for a tiny tau overflows a double (1e-310 gives +inf - +inf = NaN scores), so tiny positive
 * temperatures take the limit instead of the formula. The router's ROUTER_GREEDY_BELOW_TEMPERATURE
 * and tandem-generate follow the same rule (docs/PROTOCOL.md 3c).
 */
#define ENGINE_SAMPLER_GREEDY_BELOW 1e-5

/* Largest position the Philox counter word holds: q is counter word 0 (32 bits). */
#define ENGINE_SAMPLER_MAX_POSITION ((int64_t)UINT32_MAX)

/* Philox-4x32-10 round constants (Random123: PHILOX_M4x32_0/1, PHILOX_W32_0/1). */
#define ENGINE_SAMPLER_PHILOX_M0     0xD2511F53u
#define ENGINE_SAMPLER_PHILOX_M1     0xCD9E8D57u
#define ENGINE_SAMPLER_PHILOX_W0     0x9E3779B9u
#define ENGINE_SAMPLER_PHILOX_W1     0xBB67AE85u
#define ENGINE_SAMPLER_PHILOX_ROUNDS 10

/*
 * One request's sampling parameters (plain data). Fill with engine_sampler_params_default(),
 * override, then check with engine_sampler_params_validate().
 *
 * temperature: tau >= 0, finite. Below ENGINE_SAMPLER_GREEDY_BELOW (0, subnormals and every tiny
 *              positive value) = greedy (argmax; the other filters and the seed are moot).
 * top_k:       keep the k most likely tokens; 0 = off (also off when k >= finite tokens).
 * top_p:       nucleus mass in (0, 1]; 1 = off.
 * min_p:       in [0, 1]; keep p(x) >= min_p * p_max; 0 = off.
 * seed:        the 64-bit Philox key; word 0 = bits 0..31, word 1 = bits 32..63.
 * n_logprobs:  ENGINE_SAMPLER_LOGPROBS_OFF (-1): none; 0: the chosen token's logprob only;
 *              1..ENGINE_SAMPLER_MAX_LOGPROBS: also that many best alternatives.
 * stop_ids:    [n_stop_ids] token ids that end the sequence (engine_sampler_is_stop); each in
 *              [0, n_vocab). n_stop_ids in [0, ENGINE_SAMPLER_MAX_STOP_IDS].
 * suppress_stop: nonzero: every stop id is masked (-inf) before the filters, so none can be
 *              chosen and the logprobs are those of the masked logits (OpenAI/vLLM min_tokens:
 *              the caller sets it while fewer than min_tokens tokens were generated). 0 = off.
 */
typedef struct {
    double temperature;
    int32_t top_k;
    double top_p;
    double min_p;
    uint64_t seed;
    int n_logprobs;
    int n_stop_ids;
    int32_t stop_ids[ENGINE_SAMPLER_MAX_STOP_IDS];
    int suppress_stop;
} engine_sampler_params_t;

/* One token with its log-probability under the model (raw logits, temperature 1, unfiltered). */
typedef struct {
    int32_t token;
    double logprob; /* natural log, <= 0 */
} engine_sampler_logprob_t;

/*
 * The result of one engine_sampler_sample() call.
 *
 * token:   the sampled id, in [0, n_vocab).
 * logprob: ln softmax(raw logits)[token] in double; 0.0 when n_logprobs is
 *          ENGINE_SAMPLER_LOGPROBS_OFF.
 * n_top:   entries of top written: min(n_logprobs, tokens with a finite logit); 0 when off.
 * top:     the n_top most likely tokens, (logit descending, id ascending), with their logprobs.
 *          They may or may not include `token`; entries past n_top are zeroed.
 */
typedef struct {
    int32_t token;
    double logprob;
    int n_top;
    engine_sampler_logprob_t top[ENGINE_SAMPLER_MAX_LOGPROBS];
} engine_sample_t;

/*
 * engine_sampler_params_default - OpenAI's defaults: temperature 1, top_k 0 (off),
 * top_p 1 (off), min_p 0 (off), seed 0, logprobs off, no stop ids. The front end sets the
 * request's seed (a random one when the client gives none) and the model's EOS as a stop id.
 */
void engine_sampler_params_default(engine_sampler_params_t *params);

/*
 * engine_sampler_params_validate - check every field against the ranges documented on
 * engine_sampler_params_t, for a vocabulary of n_vocab tokens.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG for a NaN, infinite or out-of-range field (or n_vocab
 * outside [1, INT32_MAX]); err (err_bytes, may be 0 / NULL) then gets "<field>: <reason>",
 * e.g. "top_p: 1.5 outside (0, 1]". Changes nothing else; does not log. Pure; thread-safe.
 */
tdm_status_t engine_sampler_params_validate(const engine_sampler_params_t *params, int64_t n_vocab,
                                            char *err, size_t err_bytes);

/*
 * engine_sampler_is_greedy - nonzero when params->temperature < ENGINE_SAMPLER_GREEDY_BELOW, i.e.
 * when engine_sampler_sample() returns the argmax (lowest id on ties) whatever the seed and the
 * filters. params must be valid (engine_sampler_params_validate). Pure; thread-safe.
 */
int engine_sampler_is_greedy(const engine_sampler_params_t *params);

/*
 * engine_sampler_scratch_bytes - arena bytes engine_sampler_sample() and
 * engine_sampler_filtered_probs() need free for a vocabulary of n_vocab tokens (8 bytes per
 * token plus alignment). Size the step arena with at least this much.
 */
size_t engine_sampler_scratch_bytes(int64_t n_vocab);

/*
 * engine_sampler_philox4x32_10 - the Philox-4x32-10 bijection: 10 rounds of
 *     (c0, c1, c2, c3) -> (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)),
 * the key bumped by (W0, W1) between rounds (constants above).
 *
 * counter: [4] words c0..c3. key: [2] words k0, k1. out: [4] words, written (may alias counter).
 * Pure; thread-safe. Source: Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11; Random123 philox.h (the known-answer vectors in kat_vectors hold).
 */
void engine_sampler_philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                                  uint32_t out[4]);

/*
 * engine_sampler_gumbel - G(seed, position, token) = -ln(-ln u) in double, with
 * u = (w + 0.5) * 2^-32 and w = word 0 of Philox-4x32-10(key = (seed & 0xffffffff, seed >> 32),
 * counter = (position, token, 0, 0)) (MODEL.md 8, sampling primitive).
 *
 * u lies strictly inside (0, 1), so G is finite: about -3.10 (w = 0) to 22.87 (w = 2^32 - 1).
 * position: the sequence position q of the token being chosen (the first generated token after
 * an n-token prompt has q = n). Pure; thread-safe. For tests and the speculative verifier.
 */
double engine_sampler_gumbel(uint64_t seed, uint32_t position, uint32_t token);

/*
 * engine_sampler_sample - choose the token at sequence position `position` from `logits`.
 *
 * params:   validated as engine_sampler_params_validate() does (on failure: TDM_ERR_INVALID_ARG,
 *           reason logged at warn).
 * logits:   [n_vocab] f32 host memory, raw model logits for this position; -inf masks a token.
 * position: q in [0, ENGINE_SAMPLER_MAX_POSITION] (the Philox counter word 0).
 * scratch:  caller's arena with engine_sampler_scratch_bytes(n_vocab) bytes free; borrowed for
 *           the call only, used_bytes is restored before return (high_water_bytes may grow).
 * sample_out: written only on success (see engine_sample_t).
 *
 * tau = 0: argmax of the logits (ties: lower id). tau > 0: argmax of s(x) + G(seed, q, x) over
 * the tokens the filters keep (header comment), which draws x with probability
 * engine_sampler_filtered_probs()[x] (Gumbel-max). Boundaries are computed in double:
 *   top-k: the k-th token in (logit desc, id asc) order ends the set;
 *   top-p: with e(x) = exp(s(x) - s_max) and Z = sum of e over the top-k set in ascending id
 *          order, keep the shortest (logit desc, id asc) prefix whose running sum (in that order)
 *          is >= top_p * Z (all of the set if none is);
 *   min-p: keep s(x) - s_max >= ln(min_p).
 *
 * Returns TDM_OK; TDM_ERR_INVALID_ARG (params, logits NULL, n_vocab outside [1, INT32_MAX],
 * position out of range); TDM_ERR_NO_MEMORY (arena too small); TDM_ERR_INTERNAL if a logit is
 * NaN or +inf, or every logit is -inf (logged at error). On any error *sample_out and the arena
 * are unchanged. Not thread-safe per arena. Cost: one pass over the logits, Philox for the
 * kept tokens within ~23 nats of the best score (logs only for those that can still win), a
 * heap for top-k, an exp per token and a sort of the top-p candidates for top-p.
 * Sources: MODEL.md 8 (primitive); Gumbel-max: Maddison, Tarlow & Minka, "A* Sampling",
 * NIPS 2014; top-p: Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR
 * 2020; min-p: Nguyen et al., "Turning Up the Heat: Min-p Sampling", 2024; order: vLLM.
 */
tdm_status_t engine_sampler_sample(const engine_sampler_params_t *params, const float *logits,
                                   int64_t n_vocab, int64_t position, tdm_arena_t *scratch,
                                   engine_sample_t *sample_out);

/*
 * engine_sampler_filtered_probs - the distribution engine_sampler_sample() draws from:
 * probs_out[x] = e(x) / sum of e over the kept set (summed in ascending id order) for tokens the
 * filters keep, 0 elsewhere; e(x) = exp(s(x) - s_max). tau = 0 gives 1 at the argmax, 0 elsewhere.
 * This is q (draft) or p (target) of speculative rejection sampling (MODEL.md 8).
 *
 * probs_out: [n_vocab] double, written only on success. Other arguments and errors as
 * engine_sampler_sample() (no position: the distribution does not depend on it).
 */
tdm_status_t engine_sampler_filtered_probs(const engine_sampler_params_t *params,
                                           const float *logits, int64_t n_vocab,
                                           tdm_arena_t *scratch, double *probs_out);

/*
 * engine_sampler_is_stop - nonzero when `token` is one of params->stop_ids (the sequence ends
 * after emitting it), 0 otherwise. Pure; thread-safe.
 */
int engine_sampler_is_stop(const engine_sampler_params_t *params, int32_t token);

#endif
