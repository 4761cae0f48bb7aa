/* gen_ep.h - tandem-generate's `--devices` path: one sequence generated on an expert-parallel
 * group (engine/ep.h), the model's routed experts split over the listed devices.
 *
 * Owns the group and one sequence per rank (the same ids go to every rank; rank 0's logits come
 * back, the other ranks' land in scratch rows). Prefill and decode only: speculative decoding and
 * the layer dumps are refused by the tool before this is opened. Not thread-safe.
 */
#ifndef TANDEM_TOOLS_GEN_EP_H
#define TANDEM_TOOLS_GEN_EP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"

/* A group with its sequences; opaque. */
typedef struct gen_ep gen_ep_t;

/*
 * gen_ep_open - parse `devices` (kern_device_parse_list: "0,1", "cpu,cpu", ...), open the group
 * on model_dir with n_threads kernel threads per rank, chunk_tokens per layer pass and n_pages
 * KV pages per rank, and make each rank's empty sequence.
 * Returns TDM_OK with *ep_out (gen_ep_close frees it), or the status with one line in err
 * (bad list, engine_ep_open's refusals and load errors); *ep_out untouched on error.
 */
tdm_status_t gen_ep_open(const char *model_dir, const char *devices, int n_threads,
                         int64_t chunk_tokens, uint32_t n_pages, gen_ep_t **ep_out, char *err,
                         size_t err_bytes);

/* gen_ep_close - release the sequences and the group; accepts NULL. */
void gen_ep_close(gen_ep_t *ep);

/* gen_ep_config - the model's config (rank 0's; valid until close). */
const engine_config_t *gen_ep_config(const gen_ep_t *ep);

/* gen_ep_size - the rank count. */
int gen_ep_size(const gen_ep_t *ep);

/* gen_ep_length - tokens the sequences hold. */
int64_t gen_ep_length(const gen_ep_t *ep);

/*
 * gen_ep_prefill - engine_fwd_prefill of ids[0..n_ids) with `flags` on every rank; rank 0's
 * logits into logits_out (rows as engine_fwd_prefill writes them) and its tail start into
 * *tail_out. Returns engine_ep_run's status (TDM_ERR_NO_MEMORY for the other ranks' scratch).
 */
tdm_status_t gen_ep_prefill(gen_ep_t *ep, const int32_t *ids, int64_t n_ids, uint32_t flags,
                            float *logits_out, int64_t *tail_out);

/* gen_ep_decode - one decode step of `token` on every rank; rank 0's [V] logits into
 * logits_out. Returns engine_ep_run's status. */
tdm_status_t gen_ep_decode(gen_ep_t *ep, int32_t token, float *logits_out);

#endif
