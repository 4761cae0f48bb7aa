/* gen_ep.h - tandem-generate's `--devices` path: one sequence generated on an expert-parallel
 * group (engine/ep.h), the model's routed experts split over the listed devices.
 *
 * Owns the group (data-parallel form: engine_fwd_params_t.ep_data_parallel) and the one
 * sequence, which lives on rank 0 (its KV pages in rank 0's pool); the other ranks hold only
 * their experts and serve rank 0's tokens routed to them. Prefill and decode only: speculative
 * decoding and the layer dumps are refused by the tool before this is opened. Not thread-safe.
 */
#ifndef TANDEM_TOOLS_GEN_EP_H
#define TANDEM_TOOLS_GEN_EP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* A group with its sequences; opaque. */
typedef struct gen_ep gen_ep_t;

/*
 * gen_ep_open - parse `devices` (kern_device_parse_list: "0,1", "cpu,cpu", ...), open the group
 * on model_dir with n_threads kernel threads per rank, chunk_tokens per layer pass and n_pages
 * KV pages per rank (rank 0's pool holds the sequence).
 * Returns TDM_OK with *ep_out (gen_ep_close frees it), or the status with one line in err
 * (bad list, engine_ep_open's refusals and load errors); *ep_out untouched on error.
 */
tdm_status_t gen_ep_open(const char *model_dir, const char *devices, int n_threads,
                         int64_t chunk_tokens, uint32_t n_pages, gen_ep_t **ep_out, char *err,
                         size_t err_bytes);

/* gen_ep_close - release the sequences and the group; accepts NULL. */
void gen_ep_close(gen_ep_t *ep);

/* gen_ep_size - the rank count. */
int gen_ep_size(const gen_ep_t *ep);

/* gen_ep_length - tokens the sequences hold. */
int64_t gen_ep_length(const gen_ep_t *ep);

/*
 * gen_ep_prefill - engine_fwd_prefill of ids[0..n_ids) with `flags` on rank 0: logits into
 * logits_out (rows as engine_fwd_prefill writes them), the tail start into *tail_out.
 * Returns engine_ep_run's status.
 */
tdm_status_t gen_ep_prefill(gen_ep_t *ep, const int32_t *ids, int64_t n_ids, uint32_t flags,
                            float *logits_out, int64_t *tail_out);

/* gen_ep_decode - one decode step of `token` on rank 0; its [V] logits into logits_out.
 * Returns engine_ep_run's status. */
tdm_status_t gen_ep_decode(gen_ep_t *ep, int32_t token, float *logits_out);

#endif
