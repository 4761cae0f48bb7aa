/* config_check.c - the cross-field load-time checks of MODEL.md section 2 and the derived roles
 * (see config_impl.h). */
#include "engine/config_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define OFF(member) ENGINE_CONFIG_OFFSET(member)

typedef engine_config_report_t check_t;

/* A failed check of the field at byte offset f (entry `index`, or the whole field when index < 0):
 * TDM_ERR_MISMATCH with "what: path[index] (missing: full-size default): reason" in err. */
static tdm_status_t check_fail(const check_t *c, size_t f, int index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tdm_status_t check_fail(const check_t *c, size_t f, int index, const char *fmt, ...)
{
    char where[ENGINE_CONFIG_WHERE_TEXT_BYTES];
    char reason[256];
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    engine_config_field_where(c->where, f, index, where, sizeof(where));
    return engine_config_fail(c->what, where, c->err, c->err_bytes, TDM_ERR_MISMATCH, "%s", reason);
}

/* The int64 field at byte offset `offset`. */
static int64_t int_at(const engine_config_t *cfg, size_t offset)
{
    int64_t value;

    memcpy(&value, (const char *)cfg + offset, sizeof(value));
    return value;
}

/* Position of `layer` in list[0..n), or -1. */
static int list_find(const int64_t *list, int n, int64_t layer)
{
    for (int i = 0; i < n; i++) {
        if (list[i] == layer) {
            return i;
        }
    }
    return -1;
}

/* A list of backbone layer ids: each in [0, L), strictly increasing; non-empty if required. */
static tdm_status_t check_layer_list(const check_t *c, const engine_config_t *cfg, size_t f,
                                     const int64_t *list, int n, int required)
{
    if (n == 0 && required) {
        return check_fail(c, f, -1, "must not be empty");
    }
    for (int i = 0; i < n; i++) {
        if (list[i] < 0 || list[i] >= cfg->num_hidden_layers) {
            return check_fail(c, f, i, "layer %lld not in [0, %lld)", (long long)list[i],
                              (long long)cfg->num_hidden_layers);
        }
        if (i > 0 && list[i] <= list[i - 1]) {
            return check_fail(c, f, i, "layer %lld does not follow %lld (ids must increase)",
                              (long long)list[i], (long long)list[i - 1]);
        }
    }
    return TDM_OK;
}

/* Largest entry of list[0..n) that is <= layer, or -1. */
static int largest_at_or_below(const int64_t *list, int n, int layer)
{
    int best = -1;

    for (int i = 0; i < n; i++) {
        if (list[i] <= layer && (int)list[i] > best) {
            best = (int)list[i];
        }
    }
    return best;
}

static int ratio_of(const engine_config_t *cfg, int layer)
{
    return layer < cfg->n_compress_ratios ? (int)cfg->compress_ratios[layer] : 0;
}

static tdm_status_t check_ratios(const check_t *c, const engine_config_t *cfg)
{
    int64_t n_total = cfg->num_hidden_layers + cfg->num_nextn_predict_layers;

    if (n_total > ENGINE_CONFIG_MAX_LAYERS) {
        return check_fail(c, OFF(num_hidden_layers), -1,
                          "%lld layers + %lld DSpark blocks exceed %d",
                          (long long)cfg->num_hidden_layers,
                          (long long)cfg->num_nextn_predict_layers, ENGINE_CONFIG_MAX_LAYERS);
    }
    if (cfg->n_compress_ratios > n_total) {
        return check_fail(c, OFF(compress_ratios), -1,
                          "%d entries for %lld layers + %lld DSpark blocks", cfg->n_compress_ratios,
                          (long long)cfg->num_hidden_layers,
                          (long long)cfg->num_nextn_predict_layers);
    }
    for (int i = 0; i < cfg->n_compress_ratios; i++) {
        int64_t r = cfg->compress_ratios[i];

        if (r != 0 && r != 1 && r != 2) {
            return check_fail(c, OFF(compress_ratios), i, "ratio %lld not in {0,1,2}",
                              (long long)r);
        }
        if (i >= cfg->num_hidden_layers && r != 0) {
            return check_fail(c, OFF(compress_ratios), i,
                              "DSpark block %lld must have ratio 0, not %lld",
                              (long long)(i - cfg->num_hidden_layers), (long long)r);
        }
    }
    return TDM_OK;
}

/* KV and index sources: ratio>0; every ratio>0 layer has a same-ratio kv_src and an idx_src at
 * or above it. */
static tdm_status_t check_sources(const check_t *c, const engine_config_t *cfg)
{
    const size_t offsets[2] = {OFF(kv_source_layer_ids), OFF(index_source_layer_ids)};
    const int64_t *lists[2] = {cfg->kv_source_layer_ids, cfg->index_source_layer_ids};
    const int counts[2] = {cfg->n_kv_source_layer_ids, cfg->n_index_source_layer_ids};
    tdm_status_t status;

    for (int k = 0; k < 2; k++) {
        size_t f = offsets[k];
        const int64_t *list = lists[k];
        int n = counts[k];

        status = check_layer_list(c, cfg, f, list, n, 1);
        if (status != TDM_OK) {
            return status;
        }
        for (int i = 0; i < n; i++) {
            if (ratio_of(cfg, (int)list[i]) == 0) {
                return check_fail(c, f, i, "layer %lld has compress ratio 0", (long long)list[i]);
            }
        }
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        int r = ratio_of(cfg, l);
        int kv = largest_at_or_below(cfg->kv_source_layer_ids, cfg->n_kv_source_layer_ids, l);
        int idx =
            largest_at_or_below(cfg->index_source_layer_ids, cfg->n_index_source_layer_ids, l);

        if (r == 0) {
            continue;
        }
        if (kv < 0) {
            return check_fail(c, OFF(kv_source_layer_ids), -1,
                              "layer %d (ratio %d) has no KV source at or below it", l, r);
        }
        if (ratio_of(cfg, kv) != r) {
            return check_fail(c, OFF(kv_source_layer_ids), -1,
                              "layer %d has ratio %d but its KV source %d has ratio %d", l, r, kv,
                              ratio_of(cfg, kv));
        }
        if (idx < 0) {
            return check_fail(c, OFF(index_source_layer_ids), -1,
                              "layer %d (ratio %d) has no index source at or below it", l, r);
        }
        if (idx < kv) {
            return check_fail(c, OFF(index_source_layer_ids), -1,
                              "layer %d: index source %d is below its KV source %d", l, idx, kv);
        }
    }
    return TDM_OK;
}

/* Candidate source is an index source at or below c; consumers share its kv_src; n_B*B_c >= k_I. */
static tdm_status_t check_candidates(const check_t *c, const engine_config_t *cfg)
{
    int64_t src = cfg->candidate_source_layer_id;
    int cut = (int)cfg->kv_source_layer_ids[cfg->n_kv_source_layer_ids - 1];
    int src_kv;

    if (list_find(cfg->index_source_layer_ids, cfg->n_index_source_layer_ids, src) < 0) {
        return check_fail(c, OFF(candidate_source_layer_id), -1,
                          "layer %lld is not an index source", (long long)src);
    }
    if (src > cut) {
        return check_fail(c, OFF(candidate_source_layer_id), -1,
                          "layer %lld is above the CED cut c = %d (last KV source)", (long long)src,
                          cut);
    }
    src_kv = largest_at_or_below(cfg->kv_source_layer_ids, cfg->n_kv_source_layer_ids, (int)src);
    for (int i = 0; i < cfg->n_index_source_layer_ids; i++) {
        int consumer = (int)cfg->index_source_layer_ids[i];
        int kv;

        if (consumer <= src) {
            continue;
        }
        kv = largest_at_or_below(cfg->kv_source_layer_ids, cfg->n_kv_source_layer_ids, consumer);
        if (kv != src_kv) {
            return check_fail(c, OFF(index_source_layer_ids), i,
                              "candidate consumer %d reads KV source %d, the candidate source %lld "
                              "reads %d",
                              consumer, kv, (long long)src, src_kv);
        }
    }
    if (cfg->candidate_topk_blocks * cfg->candidate_block_size < cfg->index_topk) {
        return check_fail(c, OFF(candidate_topk_blocks), -1,
                          "%lld blocks x candidate_block_size %lld < index_topk %lld",
                          (long long)cfg->candidate_topk_blocks,
                          (long long)cfg->candidate_block_size, (long long)cfg->index_topk);
    }
    return TDM_OK;
}

/* Dimensions: multiples of 32, d_r, G | n_h, one KV head, experts. */
static tdm_status_t check_dims(const check_t *c, const engine_config_t *cfg)
{
    static const size_t multiples[] = {
        OFF(hidden_size),     OFF(moe_intermediate_size), OFF(head_dim),   OFF(index_head_dim),
        OFF(engram_head_dim), OFF(q_lora_rank),           OFF(o_lora_rank)};
    int64_t min_dim;

    for (size_t i = 0; i < sizeof(multiples) / sizeof(multiples[0]); i++) {
        int64_t v = int_at(cfg, multiples[i]);
        if (v % ENGINE_CONFIG_QUANT_BLOCK != 0) {
            return check_fail(c, multiples[i], -1, "%lld is not a multiple of %d", (long long)v,
                              ENGINE_CONFIG_QUANT_BLOCK);
        }
    }
    if (cfg->qk_rope_head_dim % 2 != 0) {
        return check_fail(c, OFF(qk_rope_head_dim), -1, "%lld is odd",
                          (long long)cfg->qk_rope_head_dim);
    }
    min_dim = cfg->head_dim < cfg->index_head_dim ? cfg->head_dim : cfg->index_head_dim;
    if (cfg->qk_rope_head_dim > min_dim) {
        return check_fail(c, OFF(qk_rope_head_dim), -1,
                          "%lld exceeds min(head_dim, index_head_dim) = %lld",
                          (long long)cfg->qk_rope_head_dim, (long long)min_dim);
    }
    if (cfg->num_attention_heads % cfg->o_groups != 0) {
        return check_fail(c, OFF(o_groups), -1, "%lld does not divide num_attention_heads %lld",
                          (long long)cfg->o_groups, (long long)cfg->num_attention_heads);
    }
    if (cfg->num_key_value_heads != 1) {
        return check_fail(c, OFF(num_key_value_heads), -1,
                          "%lld, but the model has one shared KV latent (must be 1)",
                          (long long)cfg->num_key_value_heads);
    }
    if (cfg->n_shared_experts != 1) {
        return check_fail(c, OFF(n_shared_experts), -1, "%lld, must be 1",
                          (long long)cfg->n_shared_experts);
    }
    if (cfg->num_experts_per_tok > cfg->n_routed_experts) {
        return check_fail(c, OFF(num_experts_per_tok), -1, "%lld exceeds n_routed_experts %lld",
                          (long long)cfg->num_experts_per_tok, (long long)cfg->n_routed_experts);
    }
    if (cfg->dspark_num_experts_per_tok > cfg->dspark_n_routed_experts) {
        return check_fail(
            c, OFF(dspark_num_experts_per_tok), -1, "%lld exceeds dspark_n_routed_experts %lld",
            (long long)cfg->dspark_num_experts_per_tok, (long long)cfg->dspark_n_routed_experts);
    }
    return TDM_OK;
}

/* Token ids below V; flags with the only value the model supports; quantization block. */
static tdm_status_t check_values(const check_t *c, const engine_config_t *cfg)
{
    static const size_t token_ids[] = {OFF(bos_token_id),          OFF(eos_token_id),
                                       OFF(pad_token_id),          OFF(image_token_id),
                                       OFF(dspark_noise_token_id), OFF(engram_pad_token_id)};

    for (size_t i = 0; i < sizeof(token_ids) / sizeof(token_ids[0]); i++) {
        int64_t v = int_at(cfg, token_ids[i]);
        if (v >= cfg->vocab_size) {
            return check_fail(c, token_ids[i], -1, "token id %lld not below vocab_size %lld",
                              (long long)v, (long long)cfg->vocab_size);
        }
    }
    if (cfg->tie_word_embeddings != 0) {
        return check_fail(c, OFF(tie_word_embeddings), -1,
                          "true, must be false (embed and head are separate tensors)");
    }
    if (cfg->norm_topk_prob == 0) {
        return check_fail(c, OFF(norm_topk_prob), -1,
                          "false, must be true (routing weights are normalised)");
    }
    if (cfg->n_weight_block_size != 2 || cfg->weight_block_size[0] != ENGINE_CONFIG_QUANT_BLOCK ||
        cfg->weight_block_size[1] != ENGINE_CONFIG_QUANT_BLOCK) {
        return check_fail(c, OFF(weight_block_size), -1, "must be [%d, %d]",
                          ENGINE_CONFIG_QUANT_BLOCK, ENGINE_CONFIG_QUANT_BLOCK);
    }
    return TDM_OK;
}

/* Engram layers, one row count each, equal to the sum of that layer's primes (MODEL.md 5.6). */
static tdm_status_t check_engram(const check_t *c, const engine_config_t *cfg)
{
    int64_t n_cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    int64_t prime = cfg->engram_vocab_size - 1;
    tdm_status_t status;

    status = check_layer_list(c, cfg, OFF(engram_layer_ids), cfg->engram_layer_ids,
                              cfg->n_engram_layer_ids, 0);
    if (status != TDM_OK) {
        return status;
    }
    if (cfg->n_engram_num_embeddings != cfg->n_engram_layer_ids) {
        return check_fail(c, OFF(engram_num_embeddings), -1, "%d entries for %d Engram layers",
                          cfg->n_engram_num_embeddings, cfg->n_engram_layer_ids);
    }
    for (int i = 0; i < cfg->n_engram_layer_ids; i++) {
        int64_t sum = 0;

        for (int64_t col = 0; col < n_cols; col++) {
            prime = engine_engram_prime_after(prime);
            sum += prime;
        }
        if (sum != cfg->engram_num_embeddings[i]) {
            return check_fail(c, OFF(engram_num_embeddings), i,
                              "%lld rows, but the primes of layer %lld sum to %lld",
                              (long long)cfg->engram_num_embeddings[i],
                              (long long)cfg->engram_layer_ids[i], (long long)sum);
        }
    }
    return TDM_OK;
}

static void derive_roles(engine_config_t *cfg)
{
    int n_layers = (int)cfg->num_hidden_layers;
    int n_blocks = (int)cfg->num_nextn_predict_layers;

    cfg->n_layers = n_layers;
    cfg->n_blocks = n_blocks;
    cfg->n_roles = n_layers + n_blocks;
    cfg->ced_cut = (int)cfg->kv_source_layer_ids[cfg->n_kv_source_layer_ids - 1];
    memset(cfg->roles, 0, sizeof(cfg->roles));
    for (int l = 0; l < cfg->n_roles; l++) {
        engine_layer_role_t *role = &cfg->roles[l];
        int is_kv = list_find(cfg->kv_source_layer_ids, cfg->n_kv_source_layer_ids, l) >= 0;
        int is_idx = list_find(cfg->index_source_layer_ids, cfg->n_index_source_layer_ids, l) >= 0;

        role->ratio = ratio_of(cfg, l);
        role->kind = ENGINE_LAYER_SWA;
        role->flags = 0;
        role->kv_src = -1;
        role->idx_src = -1;
        role->engram_slot = list_find(cfg->engram_layer_ids, cfg->n_engram_layer_ids, l);
        role->tap_slot = list_find(cfg->dspark_target_layer_ids, cfg->n_dspark_target_layer_ids, l);
        if (l >= n_layers) {
            role->flags = ENGINE_ROLE_DSPARK;
            role->engram_slot = -1;
            role->tap_slot = -1;
            continue;
        }
        role->flags |= is_kv ? ENGINE_ROLE_KV_SOURCE : 0;
        role->flags |= is_idx ? ENGINE_ROLE_INDEX_SOURCE : 0;
        role->flags |= role->engram_slot >= 0 ? ENGINE_ROLE_ENGRAM : 0;
        role->flags |= role->tap_slot >= 0 ? ENGINE_ROLE_TAP : 0;
        if (l == cfg->candidate_source_layer_id) {
            role->flags |= ENGINE_ROLE_CANDIDATE_SOURCE;
        }
        if (is_idx && l > cfg->candidate_source_layer_id) {
            role->flags |= ENGINE_ROLE_CANDIDATE_CONSUMER;
        }
        if (role->ratio == 0) {
            continue;
        }
        role->kv_src = largest_at_or_below(cfg->kv_source_layer_ids, cfg->n_kv_source_layer_ids, l);
        role->idx_src =
            largest_at_or_below(cfg->index_source_layer_ids, cfg->n_index_source_layer_ids, l);
        if (is_kv && is_idx) {
            role->kind = ENGINE_LAYER_FULL;
        } else if (is_idx) {
            role->kind = ENGINE_LAYER_REINDEX;
        } else {
            role->kind = ENGINE_LAYER_REUSE;
        }
    }
}

tdm_status_t engine_config_check_and_derive(engine_config_t *cfg,
                                            const engine_config_report_t *report)
{
    tdm_status_t status;

    status = check_ratios(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_sources(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_candidates(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_dims(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_values(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_engram(report, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status =
        check_layer_list(report, cfg, OFF(dspark_target_layer_ids), cfg->dspark_target_layer_ids,
                         cfg->n_dspark_target_layer_ids, cfg->num_nextn_predict_layers > 0);
    if (status != TDM_OK) {
        return status;
    }
    derive_roles(cfg);
    return TDM_OK;
}
