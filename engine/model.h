/* model.h - a loaded DeepSeek-V4.1-Flash checkpoint, ready for the forward pass.
 *
 * Owns: the config (engine/config.h), the checkpoint mapping (engine/weights.h, checked against
 * the inventory of MODEL.md section 3), the Engram sidecar (token map, multipliers) and layout,
 * the per-layer weight views in the kernel backend's compute layout (kern_mat_t: FP8 and MXFP4
 * weights as stored, used in place from the mapped safetensors and dequantized exactly in the
 * GEMM's registers, MODEL.md section 3; BF16 and FP32 matrices in place too), the
 * RoPE frequency tables (MODEL.md 5 [tandem] rule, computed once on the host) and the 64-bit model
 * fingerprint. Read-only after load: any number of forward contexts and threads may share one
 * model. Knows nothing of sequences, KV pages or schedules (engine/forward.h), nor of the
 * tokenizer.
 *
 * Model fingerprint [tandem]: tdm_model_fingerprint of the checkpoint directory
 * (common/fingerprint.h, docs/PROTOCOL.md), the one value the workers register with and the
 * router checks. KV pages and state records carry it (MODEL.md 7).
 */
#ifndef TANDEM_ENGINE_MODEL_H
#define TANDEM_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/engram_hash.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

/* A loaded model; opaque (layout in engine/model_impl.h, shared by the engine's .c files). */
typedef struct engine_model engine_model_t;

/*
 * engine_model_params_t - how to load. Filled by engine_model_params_default().
 *
 * n_threads: CPU worker threads the model's kernels may use (kern_ctx_t.n_threads), >= 1.
 * ops:       kernel table (kern_ops_cpu() by default; must outlive the model). With a table whose
 *            host_memory is 0 every weight except the Engram tables is uploaded once to its
 *            memory (mem_alloc + mem_copy, stored formats) and the Engram tables are registered
 *            with host_register; both are released by engine_model_destroy.
 * skip_weight_check: 0 = compare every tensor with the inventory (engine_weights_check).
 * expand_bf16: 0 (default) = FP8 and MXFP4 weights stay as stored; 1 = expand every one to BF16
 *   at load (2 bytes per parameter) - the reference mode of the kernel tests, which prove that
 *   both give the same logits byte for byte. A matrix whose scales fall outside the exact range
 *   (kern_mat_check_quantized) is expanded either way.
 * map_weights: 0 (default) = on a host_memory backend the checkpoint's shards are copied once
 *   into read-only anonymous memory advised for 2 MiB transparent huge pages
 *   (engine_weights_copy_resident: the CPU kernels stream the weights every step, and 4 KiB pages
 *   cost them page walks; 1.09x batch-1 decode, docs/BENCHMARKS.md); 1 = the weights stay in the
 *   mapped file pages (reclaimable page cache, 4 KiB pages). Other backends upload from the
 *   mapping either way.
 * ep_rank, ep_size: expert-parallel shard (issue 14 item 6; engine/ep.h drives the ranks). With
 *   ep_size R > 1 this model holds only the routed experts engine_expert_range(E, r, R) of every
 *   MoE layer (E = that layer's expert count, r = ep_rank; DSpark blocks too): the
 *   others are neither uploaded nor counted resident, and a forward context on it needs a
 *   kern_comm_t of the same rank and size (engine_fwd_params_t.comm). Everything else (attention,
 *   dense layers, router, shared expert, head, Engram) is replicated on every rank.
 *   0 or 1 = every expert (the default); ep_rank must be in 0..R-1 (else TDM_ERR_INVALID_ARG).
 */
typedef struct {
    int n_threads;
    const kern_ops_t *ops;
    int skip_weight_check;
    int expand_bf16;
    int map_weights;
    int ep_rank;
    int ep_size;
} engine_model_params_t;

/*
 * engine_model_resident_t - the weights' resident bytes by format after load (host memory:
 * the checkpoint's bytes used in place - copied into huge pages or mapped, engine_model_params_t
 * map_weights - plus the loader's own buffers).
 * fp8:      E4M3 codes of FP8 matrices used as stored (1 byte per parameter)
 * mxfp4:    packed E2M1 expert weights used as stored (0.5 byte per parameter)
 * scales:   their UE8M0 scale bytes
 * bf16:     BF16 matrices and rows (embedding, head, compressors, router, Markov head)
 * f32:      FP32 matrices (mHC mixes)
 * expanded: FP8/MXFP4 matrices expanded to BF16 (expand_bf16, or scales out of range)
 * vectors:  norm weights, biases and sinks widened to FP32 (small)
 * engram:   Engram table rows (E4M3 + scales; read per token, a handful of rows)
 * n_params: parameters of all of the above
 */
typedef struct {
    uint64_t fp8;
    uint64_t mxfp4;
    uint64_t scales;
    uint64_t bf16;
    uint64_t f32;
    uint64_t expanded;
    uint64_t vectors;
    uint64_t engram;
    uint64_t n_params;
} engine_model_resident_t;

/* engine_model_params_default - one thread, CPU kernels, full weight check. */
void engine_model_params_default(engine_model_params_t *params);

/*
 * engine_model_load - open the checkpoint directory `dir`: config.json, the tensors (checked
 * against the inventory unless params->skip_weight_check), the Engram sidecar
 * (engram-hash.safetensors, when the config has Engram layers). Uses the weights in place from
 * the files (their stored formats: about 0.6-1.1 bytes per parameter; on a host_memory backend
 * copied into huge pages first unless params->map_weights), logs the resident
 * bytes per format at INFO, and tabulates the RoPE frequencies.
 *
 * Returns TDM_OK with *model_out (caller frees with engine_model_destroy), or the loader's status
 * (TDM_ERR_NOT_FOUND, TDM_ERR_FORMAT, TDM_ERR_MISMATCH, TDM_ERR_IO, TDM_ERR_NO_MEMORY,
 * TDM_ERR_INVALID_ARG for NULL arguments) with one line in err (err_bytes, may be 0) and
 * *model_out untouched. Thread-safe (no shared state).
 */
tdm_status_t engine_model_load(const char *dir, const engine_model_params_t *params,
                               engine_model_t **model_out, char *err, size_t err_bytes);

/* engine_model_destroy - free everything of the model; accepts NULL. No forward context,
 * sequence or pool made from it may be used afterwards. */
void engine_model_destroy(engine_model_t *model);

/* engine_model_config - the model's config (owned by the model, valid until destroy). */
const engine_config_t *engine_model_config(const engine_model_t *model);

/* engine_model_fingerprint - the model fingerprint of the loaded directory, computed once at load
 * by tdm_model_fingerprint (common/fingerprint.h). */
uint64_t engine_model_fingerprint(const engine_model_t *model);

/* engine_model_ops - the kernel table the model was loaded for. */
const kern_ops_t *engine_model_ops(const engine_model_t *model);

/* engine_model_n_threads - params->n_threads of the load. */
int engine_model_n_threads(const engine_model_t *model);

/*
 * engine_model_rope_freqs - the FP32 RoPE frequencies f_i (i < d_r/2) of `layer` (0 <= layer <
 * n_roles): ratio-0 layers and DSpark blocks use rope_theta unscaled, ratio>0 layers
 * compress_rope_theta with YaRN (MODEL.md 5, [tandem] table rule). Owned by the model; backend
 * memory (host code must not read it) when the model's table has host_memory = 0. NULL for a
 * layer out of range.
 */
const float *engine_model_rope_freqs(const engine_model_t *model, int layer);

/* engine_model_resident - *out = the weights' resident bytes by format (above). */
void engine_model_resident(const engine_model_t *model, engine_model_resident_t *out);

/* engine_model_resident_total - the sum of every byte count of r (not n_params). */
uint64_t engine_model_resident_total(const engine_model_resident_t *r);

/*
 * engine_expert_range - the routed experts [*begin, *end) of rank r of R (0 <= r < R) out of E:
 * contiguous ranges, the first E mod R ranks one more (docs/DEPLOY.md section 10's layout:
 * 8 over 3 are 3+3+2).
 */
void engine_expert_range(int64_t E, int r, int R, int *begin, int *end);

/*
 * engine_model_expert_shard - the routed experts [*begin, *end) this model holds in `layer`
 * (0 <= layer < n_roles; MoE layers and DSpark blocks) and its ep_rank / ep_size (1 and 0 without
 * expert parallel: every expert). Returns TDM_OK, or TDM_ERR_INVALID_ARG for a NULL pointer or a
 * layer out of range (outputs untouched).
 */
tdm_status_t engine_model_expert_shard(const engine_model_t *model, int layer, int *begin, int *end,
                                       int *ep_rank, int *ep_size);

/* engine_model_weight_bytes - bytes of the host buffers the model holds (weights used in place
 * from the mapped checkpoint are not in it: engine_model_resident has them; with a table whose
 * host_memory is 0 the loader's buffers are freed once uploaded, so only descriptors remain). */
uint64_t engine_model_weight_bytes(const engine_model_t *model);

#endif
