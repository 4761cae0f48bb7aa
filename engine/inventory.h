/* inventory.h - the tensor inventory of a checkpoint (MODEL.md section 3) and its parameter and
 * byte counts (MODEL.md sections 9 and 10).
 *
 * Lists every text-model tensor a checkpoint for a given config must hold, with exact name,
 * dtype, shape, part and parameter count, and sums them the way the sizing tables do. Owns only
 * the spec array it returns. Knows nothing of files: the loader (engine/weights.h) compares this
 * list against the safetensors headers, the generator writes it.
 */
#ifndef TANDEM_ENGINE_INVENTORY_H
#define TANDEM_ENGINE_INVENTORY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/tensor.h"

/*
 * Parameter and byte totals of an inventory (engine_inventory_count).
 *
 * Parameters are logical weights (a packed FP4 byte holds two; scales hold none):
 *   backbone_params      every tensor of part ENGINE_PART_BACKBONE: layers 0..L-1 (attention,
 *                        norms, mHC, router, experts, compressors, indexers, Engram projections)
 *                        plus embed, head and norm.
 *   engram_table_params  layers.l.engram.embed.weight (R_l x d_e per Engram layer).
 *   dspark_params        mtp.k.* (blocks, main_proj/main_norm, last block's heads).
 *   total_params         the sum of the three.
 *   active_decode_params what one decode token multiplies: the backbone without the embedding
 *                        table (a gather) and with K of the E routed experts per layer (attention,
 *                        norms, mHC, router, K + shared experts, compressors, indexers, Engram
 *                        projections, final norm, head). Excludes Engram tables and DSpark.
 *   bias_vl_backbone_params, bias_vl_dspark_params
 *                        E x L and E_d x n_d: the release's ffn.gate.bias_vl [E] F32 tensors,
 *                        which MODEL.md section 1 calls vision and the loader skips, so they are
 *                        not in the inventory, but which section 10's backbone and DSpark figures
 *                        include (docs/MODEL-NOTES.md).
 * Bytes are storage bytes (product of shape x dtype size):
 *   resident_bytes       every tensor but the Engram tables and their scales (weights the
 *                        serving GPU holds), = fp8 + fp4 + scale + bf16 + f32 bytes below.
 *   engram_table_bytes   Engram tables and their scales (host memory, 264 B per row at full).
 *   dspark_bytes         the mtp.k.* tensors (included in resident_bytes).
 *   fp8_bytes            F8_E4M3 weights outside the Engram tables.
 *   fp4_bytes            packed E2M1 experts (I8).
 *   scale_bytes          F8_E8M0 scales outside the Engram tables.
 *   bf16_bytes, f32_bytes
 *   n_tensors            entries counted.
 */
typedef struct {
    int64_t backbone_params;
    int64_t engram_table_params;
    int64_t dspark_params;
    int64_t total_params;
    int64_t active_decode_params;
    int64_t bias_vl_backbone_params;
    int64_t bias_vl_dspark_params;
    int64_t resident_bytes;
    int64_t engram_table_bytes;
    int64_t dspark_bytes;
    int64_t fp8_bytes;
    int64_t fp4_bytes;
    int64_t scale_bytes;
    int64_t bf16_bytes;
    int64_t f32_bytes;
    int64_t n_tensors;
} engine_param_counts_t;

/*
 * engine_inventory_build - every tensor of MODEL.md section 3 for *cfg (borrowed), text model
 * only (no vision.*, aligner.*, image_*, ffn.gate.bias_vl).
 *
 * Names are bare (no "model." prefix): globals embed.weight, norm.weight, head.weight; layer
 * tensors "layers.<l>." + module; DSpark "mtp.<k>." + module. A quantized module's scale is
 * "<module>.scale" (MODEL.md 12.2): FP8 "<m>.weight" F8_E4M3 [out, in] + "<m>.scale" F8_E8M0
 * [ceil(out/32), ceil(in/32)]; FP4 experts "<m>.weight" I8 [out, in/2] (flag
 * ENGINE_SPEC_FP4_PACKED; U8 also accepted by the loader) + "<m>.scale" F8_E8M0 [out, in/32]; the
 * Engram table "engram.embed.weight" F8_E4M3 [R_l, d_e] + "engram.embed.scale" [R_l, d_e/32]
 * (part ENGINE_PART_ENGRAM_TABLE). mHC tensors have no ".weight" (hc_attn_fn, _base, _scale).
 * Compressor wgate only at ratio 2; indexer wq_b/weights_proj at index sources, wk/k_norm at Full
 * layers; experts e < E (E_d in blocks); mtp.0.main_proj/main_norm; the last block's norm,
 * markov_head.{embed,head} and confidence_head.proj.
 *
 * Order: embed.weight, layers 0..L-1 (norms, mHC, attention, compressor, indexer, router,
 * experts, shared expert, Engram), norm.weight, head.weight, then blocks mtp.0..mtp.{n_d-1}.
 * Every spec's layer is l, L+k for block k, -1 for globals; n_params per tensor.h.
 *
 * Returns TDM_OK with *specs_out (an array of *n_specs_out specs; caller frees with free()), or
 * TDM_ERR_INVALID_ARG (NULL argument) / TDM_ERR_NO_MEMORY with the outputs untouched.
 * Full model: 95,776 tensors; tiny 815.
 */
tdm_status_t engine_inventory_build(const engine_config_t *cfg, engine_tensor_spec_t **specs_out,
                                    size_t *n_specs_out);

/*
 * engine_inventory_count - sum specs[0..n_specs) (from engine_inventory_build for *cfg) into
 * *counts_out (see engine_param_counts_t for what each figure includes).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (NULL pointer, a spec with an invalid dtype or negative
 * dimension) with *counts_out untouched. Source: MODEL.md sections 9 and 10, docs/MODEL-NOTES.md.
 */
tdm_status_t engine_inventory_count(const engine_config_t *cfg, const engine_tensor_spec_t *specs,
                                    size_t n_specs, engine_param_counts_t *counts_out);

#endif
