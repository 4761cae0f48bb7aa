/* config_presets.c - the full-size values of MODEL.md section 2 and the tiny and small test
 * configurations of section 9 (see config_impl.h).
 *
 * The three presets share every constant (names, token ids, norms, RoPE, routing, mHC, Engram
 * n-gram and DSpark block sizes) and differ in the dimensions below: one table entry each,
 * applied by one function (tiny and small are applied over the full preset).
 */
#include "engine/config_impl.h"

#include <stdio.h>
#include <string.h>

/* Longest id list of a preset (index_source_layer_ids of the full model). */
#define PRESET_MAX_IDS 8

/* An id list of a preset: n values. */
typedef struct {
    int n;
    int64_t ids[PRESET_MAX_IDS];
} preset_list_t;

/* What a preset sets beyond the shared constants. compress_ratios is
 * [0, 0] + [2] x n_ratio2 + [1] x n_ratio1 + [0, 0, 0] (MODEL.md 2 and 9). */
typedef struct {
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t head_dim;
    int64_t qk_rope_head_dim;
    int64_t q_lora_rank;
    int64_t o_groups;
    int64_t o_lora_rank;
    int64_t sliding_window;
    int64_t max_position_embeddings;
    int n_ratio2;
    int n_ratio1;
    preset_list_t kv_sources;
    preset_list_t index_sources;
    int64_t candidate_source_layer_id;
    int64_t candidate_topk_blocks;
    int64_t candidate_block_size;
    int64_t index_n_heads;
    int64_t index_head_dim;
    int64_t index_topk;
    int64_t n_routed_experts;
    int64_t num_experts_per_tok;
    int64_t moe_intermediate_size;
    preset_list_t engram_layers;
    preset_list_t engram_rows;
    int64_t engram_n_heads;
    int64_t engram_head_dim;
    int64_t engram_vocab_size;
    int64_t engram_compressed_vocab_size;
    preset_list_t taps;
    int64_t dspark_markov_rank;
    int64_t dspark_n_routed_experts;
    int64_t dspark_num_experts_per_tok;
    int64_t dspark_noise_token_id;
    int64_t image_token_id;
} preset_dims_t;

static const preset_dims_t full_dims = {
    .vocab_size = 129280,
    .hidden_size = 5120,
    .num_hidden_layers = 40,
    .num_attention_heads = 64,
    .head_dim = 512,
    .qk_rope_head_dim = 64,
    .q_lora_rank = 1280,
    .o_groups = 8,
    .o_lora_rank = 1024,
    .sliding_window = 128,
    .max_position_embeddings = 1048576,
    .n_ratio2 = 18,
    .n_ratio1 = 20,
    .kv_sources = {4, {2, 8, 14, 20}},
    .index_sources = {8, {2, 8, 14, 20, 24, 28, 32, 36}},
    .candidate_source_layer_id = 20,
    .candidate_topk_blocks = 2048,
    .candidate_block_size = 8,
    .index_n_heads = 32,
    .index_head_dim = 128,
    .index_topk = 512,
    .n_routed_experts = 384,
    .num_experts_per_tok = 6,
    .moe_intermediate_size = 2304,
    .engram_layers = {2, {1, 14}},
    .engram_rows = {2, {384006168, 384016682}},
    .engram_n_heads = 8,
    .engram_head_dim = 256,
    .engram_vocab_size = 16000000,
    .engram_compressed_vocab_size = 99092,
    .taps = {3, {37, 38, 39}},
    .dspark_markov_rank = 256,
    .dspark_n_routed_experts = 128,
    .dspark_num_experts_per_tok = 3,
    .dspark_noise_token_id = 128799,
    .image_token_id = 129264,
};

static const preset_dims_t tiny_dims = {
    .vocab_size = 1024,
    .hidden_size = 128,
    .num_hidden_layers = 8,
    .num_attention_heads = 4,
    .head_dim = 64,
    .qk_rope_head_dim = 16,
    .q_lora_rank = 64,
    .o_groups = 2,
    .o_lora_rank = 32,
    .sliding_window = 16,
    .max_position_embeddings = 8192,
    .n_ratio2 = 2,
    .n_ratio1 = 4,
    .kv_sources = {2, {2, 4}},
    .index_sources = {3, {2, 4, 6}},
    .candidate_source_layer_id = 4,
    .candidate_topk_blocks = 4,
    .candidate_block_size = 4,
    .index_n_heads = 4,
    .index_head_dim = 32,
    .index_topk = 8,
    .n_routed_experts = 8,
    .num_experts_per_tok = 2,
    .moe_intermediate_size = 32,
    .engram_layers = {2, {1, 2}},
    .engram_rows = {2, {6126, 6332}},
    .engram_n_heads = 2,
    .engram_head_dim = 32,
    .engram_vocab_size = 1000,
    .engram_compressed_vocab_size = 520,
    .taps = {3, {5, 6, 7}},
    .dspark_markov_rank = 16,
    .dspark_n_routed_experts = 4,
    .dspark_num_experts_per_tok = 2,
    .dspark_noise_token_id = 1023,
    .image_token_id = 1022,
};

static const preset_dims_t small_dims = {
    .vocab_size = 32768,
    .hidden_size = 512,
    .num_hidden_layers = 16,
    .num_attention_heads = 8,
    .head_dim = 128,
    .qk_rope_head_dim = 64,
    .q_lora_rank = 256,
    .o_groups = 4,
    .o_lora_rank = 128,
    .sliding_window = 128,
    .max_position_embeddings = 131072,
    .n_ratio2 = 6,
    .n_ratio1 = 8,
    .kv_sources = {3, {2, 5, 8}},
    .index_sources = {4, {2, 5, 8, 12}},
    .candidate_source_layer_id = 8,
    .candidate_topk_blocks = 64,
    .candidate_block_size = 8,
    .index_n_heads = 8,
    .index_head_dim = 64,
    .index_topk = 128,
    .n_routed_experts = 16,
    .num_experts_per_tok = 2,
    .moe_intermediate_size = 96,
    .engram_layers = {2, {1, 5}},
    .engram_rows = {2, {49796, 50980}},
    .engram_n_heads = 4,
    .engram_head_dim = 64,
    .engram_vocab_size = 4096,
    .engram_compressed_vocab_size = 16392,
    .taps = {3, {13, 14, 15}},
    .dspark_markov_rank = 32,
    .dspark_n_routed_experts = 4,
    .dspark_num_experts_per_tok = 2,
    .dspark_noise_token_id = 32767,
    .image_token_id = 32766,
};

static void set_name(char *dst, const char *src)
{
    memset(dst, 0, ENGINE_CONFIG_NAME_BYTES);
    snprintf(dst, ENGINE_CONFIG_NAME_BYTES, "%s", src);
}

static void set_list(int64_t *dst, int *n_out, const preset_list_t *src)
{
    for (int i = 0; i < src->n; i++) {
        dst[i] = src->ids[i];
    }
    *n_out = src->n;
}

/* [0, 0] + [2] x n_ratio2 + [1] x n_ratio1 + [0, 0, 0]. */
static void set_ratios(engine_config_t *cfg, int n_ratio2, int n_ratio1)
{
    int n = 0;

    cfg->compress_ratios[n++] = 0;
    cfg->compress_ratios[n++] = 0;
    for (int i = 0; i < n_ratio2; i++) {
        cfg->compress_ratios[n++] = 2;
    }
    for (int i = 0; i < n_ratio1; i++) {
        cfg->compress_ratios[n++] = 1;
    }
    for (int i = 0; i < 3; i++) {
        cfg->compress_ratios[n++] = 0;
    }
    cfg->n_compress_ratios = n;
}

/* The constants every preset shares (memset first). */
static void fill_constants(engine_config_t *cfg)
{
    static const preset_list_t block_size = {
        2, {ENGINE_CONFIG_QUANT_BLOCK, ENGINE_CONFIG_QUANT_BLOCK}};

    memset(cfg, 0, sizeof(*cfg));
    set_name(cfg->architectures, "DeepseekV41ForCausalLM");
    set_name(cfg->model_type, "deepseek_v41");
    set_name(cfg->dtype, "bfloat16");
    cfg->bos_token_id = 0;
    cfg->eos_token_id = 1;
    cfg->pad_token_id = 2;
    set_name(cfg->quant_method, "fp8");
    set_name(cfg->activation_scheme, "dynamic");
    set_list(cfg->weight_block_size, &cfg->n_weight_block_size, &block_size);
    set_name(cfg->scale_fmt, "ue8m0");
    set_name(cfg->expert_dtype, "fp4");

    set_name(cfg->text_model_type, "deepseek_v41_text");
    cfg->num_key_value_heads = 1;
    set_name(cfg->hidden_act, "silu");
    cfg->swiglu_limit = 10.0;
    cfg->rms_norm_eps = 1e-20;
    cfg->rope_theta = 10000.0;
    cfg->compress_rope_theta = 160000.0;
    set_name(cfg->rope_scaling.rope_type, "yarn");
    cfg->rope_scaling.factor = 16.0;
    cfg->rope_scaling.beta_fast = 32.0;
    cfg->rope_scaling.beta_slow = 1.0;
    cfg->rope_scaling.original_max_position_embeddings = 65536;
    cfg->n_shared_experts = 1;
    set_name(cfg->scoring_func, "sqrtsoftplus");
    set_name(cfg->topk_method, "noaux_tc");
    cfg->norm_topk_prob = 1;
    cfg->routed_scaling_factor = 1.5;
    cfg->hc_mult = 4;
    cfg->hc_sinkhorn_iters = 20;
    cfg->hc_eps = 1e-6;
    cfg->engram_max_ngram_size = 4;
    cfg->engram_pad_token_id = 2;
    cfg->num_nextn_predict_layers = 3;
    cfg->dspark_block_size = 5;
    cfg->tie_word_embeddings = 0;
}

/* Overwrite the dimensions with `dims`. List entries past a shorter list keep what was there, as
 * when engine_config_from_json reads a list over the full preset, so a preset and its JSON
 * round trip stay byte-identical. */
static void apply_dims(engine_config_t *cfg, const preset_dims_t *dims)
{
    cfg->vocab_size = dims->vocab_size;
    cfg->hidden_size = dims->hidden_size;
    cfg->num_hidden_layers = dims->num_hidden_layers;
    cfg->num_attention_heads = dims->num_attention_heads;
    cfg->head_dim = dims->head_dim;
    cfg->qk_rope_head_dim = dims->qk_rope_head_dim;
    cfg->q_lora_rank = dims->q_lora_rank;
    cfg->o_groups = dims->o_groups;
    cfg->o_lora_rank = dims->o_lora_rank;
    cfg->sliding_window = dims->sliding_window;
    cfg->max_position_embeddings = dims->max_position_embeddings;
    set_ratios(cfg, dims->n_ratio2, dims->n_ratio1);
    set_list(cfg->kv_source_layer_ids, &cfg->n_kv_source_layer_ids, &dims->kv_sources);
    set_list(cfg->index_source_layer_ids, &cfg->n_index_source_layer_ids, &dims->index_sources);
    cfg->candidate_source_layer_id = dims->candidate_source_layer_id;
    cfg->candidate_topk_blocks = dims->candidate_topk_blocks;
    cfg->candidate_block_size = dims->candidate_block_size;
    cfg->index_n_heads = dims->index_n_heads;
    cfg->index_head_dim = dims->index_head_dim;
    cfg->index_topk = dims->index_topk;
    cfg->n_routed_experts = dims->n_routed_experts;
    cfg->num_experts_per_tok = dims->num_experts_per_tok;
    cfg->moe_intermediate_size = dims->moe_intermediate_size;
    set_list(cfg->engram_layer_ids, &cfg->n_engram_layer_ids, &dims->engram_layers);
    set_list(cfg->engram_num_embeddings, &cfg->n_engram_num_embeddings, &dims->engram_rows);
    cfg->engram_n_heads = dims->engram_n_heads;
    cfg->engram_head_dim = dims->engram_head_dim;
    cfg->engram_vocab_size = dims->engram_vocab_size;
    cfg->engram_compressed_vocab_size = dims->engram_compressed_vocab_size;
    set_list(cfg->dspark_target_layer_ids, &cfg->n_dspark_target_layer_ids, &dims->taps);
    cfg->dspark_markov_rank = dims->dspark_markov_rank;
    cfg->dspark_n_routed_experts = dims->dspark_n_routed_experts;
    cfg->dspark_num_experts_per_tok = dims->dspark_num_experts_per_tok;
    cfg->dspark_noise_token_id = dims->dspark_noise_token_id;
    cfg->image_token_id = dims->image_token_id;
}

void engine_config_fill_full(engine_config_t *cfg)
{
    fill_constants(cfg);
    apply_dims(cfg, &full_dims);
}

void engine_config_fill_tiny(engine_config_t *cfg)
{
    engine_config_fill_full(cfg);
    apply_dims(cfg, &tiny_dims);
}

void engine_config_fill_small(engine_config_t *cfg)
{
    engine_config_fill_full(cfg);
    apply_dims(cfg, &small_dims);
}
