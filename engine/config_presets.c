/* config_presets.c - the full-size values of MODEL.md section 2 and the tiny and small test
 * configurations of section 9 (see config_impl.h). */
#include "engine/config_impl.h"

#include <stdio.h>
#include <string.h>

static void set_name(char *dst, const char *src)
{
    memset(dst, 0, ENGINE_CONFIG_NAME_BYTES);
    snprintf(dst, ENGINE_CONFIG_NAME_BYTES, "%s", src);
}

static void set_list(int64_t *dst, int *n_out, const int64_t *src, int n)
{
    for (int i = 0; i < n; i++) {
        dst[i] = src[i];
    }
    *n_out = n;
}

void engine_config_fill_full(engine_config_t *cfg)
{
    static const int64_t block_size[2] = {ENGINE_CONFIG_QUANT_BLOCK, ENGINE_CONFIG_QUANT_BLOCK};
    static const int64_t kv_sources[] = {2, 8, 14, 20};
    static const int64_t index_sources[] = {2, 8, 14, 20, 24, 28, 32, 36};
    static const int64_t engram_layers[] = {1, 14};
    static const int64_t engram_rows[] = {384006168, 384016682};
    static const int64_t taps[] = {37, 38, 39};
    int n = 0;

    memset(cfg, 0, sizeof(*cfg));
    set_name(cfg->architectures, "DeepseekV41ForCausalLM");
    set_name(cfg->model_type, "deepseek_v41");
    set_name(cfg->dtype, "bfloat16");
    cfg->bos_token_id = 0;
    cfg->eos_token_id = 1;
    cfg->pad_token_id = 2;
    cfg->image_token_id = 129264;
    set_name(cfg->quant_method, "fp8");
    set_name(cfg->activation_scheme, "dynamic");
    set_list(cfg->weight_block_size, &cfg->n_weight_block_size, block_size, 2);
    set_name(cfg->scale_fmt, "ue8m0");
    set_name(cfg->expert_dtype, "fp4");

    set_name(cfg->text_model_type, "deepseek_v41_text");
    cfg->vocab_size = 129280;
    cfg->hidden_size = 5120;
    cfg->num_hidden_layers = 40;
    cfg->num_attention_heads = 64;
    cfg->num_key_value_heads = 1;
    cfg->head_dim = 512;
    cfg->qk_rope_head_dim = 64;
    cfg->q_lora_rank = 1280;
    cfg->o_groups = 8;
    cfg->o_lora_rank = 1024;
    set_name(cfg->hidden_act, "silu");
    cfg->swiglu_limit = 10.0;
    cfg->rms_norm_eps = 1e-20;
    cfg->max_position_embeddings = 1048576;
    cfg->rope_theta = 10000.0;
    cfg->compress_rope_theta = 160000.0;
    set_name(cfg->rope_scaling.rope_type, "yarn");
    cfg->rope_scaling.factor = 16.0;
    cfg->rope_scaling.beta_fast = 32.0;
    cfg->rope_scaling.beta_slow = 1.0;
    cfg->rope_scaling.original_max_position_embeddings = 65536;
    cfg->sliding_window = 128;
    /* [0,0] + [2]x18 + [1]x20 + [0,0,0] */
    cfg->compress_ratios[n++] = 0;
    cfg->compress_ratios[n++] = 0;
    for (int i = 0; i < 18; i++) {
        cfg->compress_ratios[n++] = 2;
    }
    for (int i = 0; i < 20; i++) {
        cfg->compress_ratios[n++] = 1;
    }
    for (int i = 0; i < 3; i++) {
        cfg->compress_ratios[n++] = 0;
    }
    cfg->n_compress_ratios = n;
    set_list(cfg->kv_source_layer_ids, &cfg->n_kv_source_layer_ids, kv_sources, 4);
    set_list(cfg->index_source_layer_ids, &cfg->n_index_source_layer_ids, index_sources, 8);
    cfg->index_n_heads = 32;
    cfg->index_head_dim = 128;
    cfg->index_topk = 512;
    cfg->candidate_source_layer_id = 20;
    cfg->candidate_topk_blocks = 2048;
    cfg->candidate_block_size = 8;
    cfg->n_routed_experts = 384;
    cfg->n_shared_experts = 1;
    cfg->num_experts_per_tok = 6;
    cfg->moe_intermediate_size = 2304;
    set_name(cfg->scoring_func, "sqrtsoftplus");
    set_name(cfg->topk_method, "noaux_tc");
    cfg->norm_topk_prob = 1;
    cfg->routed_scaling_factor = 1.5;
    cfg->hc_mult = 4;
    cfg->hc_sinkhorn_iters = 20;
    cfg->hc_eps = 1e-6;
    set_list(cfg->engram_layer_ids, &cfg->n_engram_layer_ids, engram_layers, 2);
    set_list(cfg->engram_num_embeddings, &cfg->n_engram_num_embeddings, engram_rows, 2);
    cfg->engram_max_ngram_size = 4;
    cfg->engram_n_heads = 8;
    cfg->engram_head_dim = 256;
    cfg->engram_vocab_size = 16000000;
    cfg->engram_pad_token_id = 2;
    cfg->engram_compressed_vocab_size = 99092;
    cfg->num_nextn_predict_layers = 3;
    cfg->dspark_block_size = 5;
    cfg->dspark_noise_token_id = 128799;
    set_list(cfg->dspark_target_layer_ids, &cfg->n_dspark_target_layer_ids, taps, 3);
    cfg->dspark_markov_rank = 256;
    cfg->dspark_n_routed_experts = 128;
    cfg->dspark_num_experts_per_tok = 3;
    cfg->tie_word_embeddings = 0;
}

void engine_config_fill_tiny(engine_config_t *cfg)
{
    static const int64_t ratios[] = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0};
    static const int64_t kv_sources[] = {2, 4};
    static const int64_t index_sources[] = {2, 4, 6};
    static const int64_t engram_layers[] = {1, 2};
    static const int64_t engram_rows[] = {6126, 6332};
    static const int64_t taps[] = {5, 6, 7};

    engine_config_fill_full(cfg);
    cfg->vocab_size = 1024;
    cfg->hidden_size = 128;
    cfg->num_hidden_layers = 8;
    cfg->num_attention_heads = 4;
    cfg->head_dim = 64;
    cfg->qk_rope_head_dim = 16;
    cfg->q_lora_rank = 64;
    cfg->o_groups = 2;
    cfg->o_lora_rank = 32;
    cfg->sliding_window = 16;
    cfg->max_position_embeddings = 8192;
    set_list(cfg->compress_ratios, &cfg->n_compress_ratios, ratios, 11);
    set_list(cfg->kv_source_layer_ids, &cfg->n_kv_source_layer_ids, kv_sources, 2);
    set_list(cfg->index_source_layer_ids, &cfg->n_index_source_layer_ids, index_sources, 3);
    cfg->candidate_source_layer_id = 4;
    cfg->candidate_topk_blocks = 4;
    cfg->candidate_block_size = 4;
    cfg->index_n_heads = 4;
    cfg->index_head_dim = 32;
    cfg->index_topk = 8;
    cfg->n_routed_experts = 8;
    cfg->num_experts_per_tok = 2;
    cfg->moe_intermediate_size = 32;
    set_list(cfg->engram_layer_ids, &cfg->n_engram_layer_ids, engram_layers, 2);
    cfg->engram_n_heads = 2;
    cfg->engram_head_dim = 32;
    cfg->engram_vocab_size = 1000;
    set_list(cfg->engram_num_embeddings, &cfg->n_engram_num_embeddings, engram_rows, 2);
    cfg->engram_compressed_vocab_size = 520;
    set_list(cfg->dspark_target_layer_ids, &cfg->n_dspark_target_layer_ids, taps, 3);
    cfg->dspark_markov_rank = 16;
    cfg->dspark_n_routed_experts = 4;
    cfg->dspark_num_experts_per_tok = 2;
    cfg->dspark_noise_token_id = 1023;
    cfg->image_token_id = 1022;
}

void engine_config_fill_small(engine_config_t *cfg)
{
    static const int64_t kv_sources[] = {2, 5, 8};
    static const int64_t index_sources[] = {2, 5, 8, 12};
    static const int64_t engram_layers[] = {1, 5};
    static const int64_t engram_rows[] = {49796, 50980};
    static const int64_t taps[] = {13, 14, 15};
    int n = 0;

    engine_config_fill_full(cfg);
    cfg->vocab_size = 32768;
    cfg->hidden_size = 512;
    cfg->num_hidden_layers = 16;
    cfg->num_attention_heads = 8;
    cfg->head_dim = 128;
    cfg->qk_rope_head_dim = 64;
    cfg->q_lora_rank = 256;
    cfg->o_groups = 4;
    cfg->o_lora_rank = 128;
    cfg->sliding_window = 128;
    cfg->max_position_embeddings = 131072;
    /* [0,0] + [2]x6 + [1]x8 + [0,0,0] */
    cfg->compress_ratios[n++] = 0;
    cfg->compress_ratios[n++] = 0;
    for (int i = 0; i < 6; i++) {
        cfg->compress_ratios[n++] = 2;
    }
    for (int i = 0; i < 8; i++) {
        cfg->compress_ratios[n++] = 1;
    }
    for (int i = 0; i < 3; i++) {
        cfg->compress_ratios[n++] = 0;
    }
    cfg->n_compress_ratios = n;
    set_list(cfg->kv_source_layer_ids, &cfg->n_kv_source_layer_ids, kv_sources, 3);
    set_list(cfg->index_source_layer_ids, &cfg->n_index_source_layer_ids, index_sources, 4);
    cfg->candidate_source_layer_id = 8;
    cfg->candidate_topk_blocks = 64;
    cfg->candidate_block_size = 8;
    cfg->index_n_heads = 8;
    cfg->index_head_dim = 64;
    cfg->index_topk = 128;
    cfg->n_routed_experts = 16;
    cfg->num_experts_per_tok = 2;
    cfg->moe_intermediate_size = 96;
    set_list(cfg->engram_layer_ids, &cfg->n_engram_layer_ids, engram_layers, 2);
    cfg->engram_n_heads = 4;
    cfg->engram_head_dim = 64;
    cfg->engram_vocab_size = 4096;
    set_list(cfg->engram_num_embeddings, &cfg->n_engram_num_embeddings, engram_rows, 2);
    cfg->engram_compressed_vocab_size = 16392;
    set_list(cfg->dspark_target_layer_ids, &cfg->n_dspark_target_layer_ids, taps, 3);
    cfg->dspark_markov_rank = 32;
    cfg->dspark_n_routed_experts = 4;
    cfg->dspark_num_experts_per_tok = 2;
    cfg->dspark_noise_token_id = 32767;
    cfg->image_token_id = 32766;
}
