/* inventory.c - the tensor list of MODEL.md section 3 and its totals (see inventory.h). */
#include "engine/inventory.h"

#include "common/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Quantization block edge of FP8 weights and of every E8M0 scale group (MODEL.md 3). */
#define QUANT_BLOCK 32
/* Scalars of hc_*_scale: sigma_0 (pre), sigma_1 (post), sigma_2 (comb) (MODEL.md 12.2). */
#define HC_SCALE_COUNT 3
/* Specs the array starts with; it doubles as needed. */
#define INITIAL_CAPACITY 1024

/* Collects specs; an allocation failure is sticky and reported once by the caller. */
typedef struct {
    engine_tensor_spec_t *specs;
    size_t n;
    size_t cap;
    int failed;
    engine_part_t part; /* part of the specs added next */
    int layer;          /* layer of the specs added next */
    char prefix[32];    /* "layers.3.", "mtp.1." or "" */
} builder_t;

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static engine_tensor_spec_t *push(builder_t *b)
{
    if (b->failed) {
        return NULL;
    }
    if (b->n == b->cap) {
        engine_tensor_spec_t *grown =
            tdm_array_grow(b->specs, sizeof(*grown), b->n + 1, INITIAL_CAPACITY, &b->cap);
        if (grown == NULL) {
            b->failed = 1;
            return NULL;
        }
        b->specs = grown;
    }
    return &b->specs[b->n++];
}

/* dst = a + c; a name that does not fit fails the build (b->failed) instead of being cut. */
static int join_name(builder_t *b, char *dst, size_t size, const char *a, const char *c)
{
    int n = snprintf(dst, size, "%s%s", a, c);
    if (n < 0 || (size_t)n >= size) {
        b->failed = 1;
        return 0;
    }
    return 1;
}

/* One tensor named prefix + name; d1 < 0 means one dimension. */
static void add(builder_t *b, const char *name, engine_dtype_t dtype, int64_t d0, int64_t d1,
                uint32_t flags, int64_t n_params)
{
    engine_tensor_spec_t *spec = push(b);

    if (spec == NULL) {
        return;
    }
    memset(spec, 0, sizeof(*spec));
    if (!join_name(b, spec->name, sizeof(spec->name), b->prefix, name)) {
        b->n--; /* the slot push() gave is not a tensor */
        return;
    }
    spec->dtype = dtype;
    spec->n_dims = d1 < 0 ? 1 : 2;
    spec->shape[0] = d0;
    spec->shape[1] = d1 < 0 ? 0 : d1;
    spec->part = b->part;
    spec->layer = b->layer;
    spec->flags = flags;
    spec->n_params = n_params;
}

/* A 1-D tensor `name` [n]. */
static void add_vec(builder_t *b, const char *name, engine_dtype_t dtype, int64_t n)
{
    add(b, name, dtype, n, -1, 0, n);
}

/* A plain 2-D weight `module`.weight [out, in]. */
static void add_mat(builder_t *b, const char *module, engine_dtype_t dtype, int64_t out, int64_t in)
{
    char name[ENGINE_TENSOR_NAME_BYTES];

    if (join_name(b, name, sizeof(name), module, ".weight")) {
        add(b, name, dtype, out, in, 0, out * in);
    }
}

/* FP8 dense: `module`.weight F8_E4M3 [out, in] + `module`.scale F8_E8M0 [ceil(out/32),
 * ceil(in/32)]. */
static void add_fp8(builder_t *b, const char *module, int64_t out, int64_t in)
{
    char name[ENGINE_TENSOR_NAME_BYTES];

    if (join_name(b, name, sizeof(name), module, ".weight")) {
        add(b, name, ENGINE_DTYPE_F8_E4M3, out, in, 0, out * in);
    }
    if (join_name(b, name, sizeof(name), module, ".scale")) {
        add(b, name, ENGINE_DTYPE_F8_E8M0, ceil_div(out, QUANT_BLOCK), ceil_div(in, QUANT_BLOCK),
            ENGINE_SPEC_SCALE, 0);
    }
}

/* MXFP4 expert: `module`.weight I8 [out, in/2] + `module`.scale F8_E8M0 [out, in/32]. */
static void add_fp4(builder_t *b, const char *module, int64_t out, int64_t in)
{
    char name[ENGINE_TENSOR_NAME_BYTES];

    if (join_name(b, name, sizeof(name), module, ".weight")) {
        add(b, name, ENGINE_DTYPE_I8, out, in / 2, ENGINE_SPEC_FP4_PACKED, out * in);
    }
    if (join_name(b, name, sizeof(name), module, ".scale")) {
        add(b, name, ENGINE_DTYPE_F8_E8M0, out, in / QUANT_BLOCK, ENGINE_SPEC_SCALE, 0);
    }
}

/* hc_<site>_fn [(2+m)m, mH], _base [(2+m)m], _scale [3], all F32 (MODEL.md 5.1). */
static void add_mhc_site(builder_t *b, const engine_config_t *cfg, const char *site)
{
    int64_t m = cfg->hc_mult;
    int64_t n_mix = (2 + m) * m;
    char name[ENGINE_TENSOR_NAME_BYTES];

    snprintf(name, sizeof(name), "hc_%s_fn", site);
    add(b, name, ENGINE_DTYPE_F32, n_mix, m * cfg->hidden_size, 0, n_mix * m * cfg->hidden_size);
    snprintf(name, sizeof(name), "hc_%s_base", site);
    add_vec(b, name, ENGINE_DTYPE_F32, n_mix);
    snprintf(name, sizeof(name), "hc_%s_scale", site);
    add_vec(b, name, ENGINE_DTYPE_F32, HC_SCALE_COUNT);
}

static void add_attention(builder_t *b, const engine_config_t *cfg, const engine_layer_role_t *role)
{
    int64_t h = cfg->hidden_size;
    int64_t d = cfg->head_dim;
    int64_t n_h = cfg->num_attention_heads;
    int64_t r_q = cfg->q_lora_rank;
    int64_t g_r_o = cfg->o_groups * cfg->o_lora_rank;
    int64_t d_i = cfg->index_head_dim;

    add_fp8(b, "attn.wq_a", r_q, h);
    add_fp8(b, "attn.wq_b", n_h * d, r_q);
    add_vec(b, "attn.q_norm.weight", ENGINE_DTYPE_BF16, r_q);
    add_vec(b, "attn.kv_norm.weight", ENGINE_DTYPE_BF16, d);
    add_fp8(b, "attn.wkv", d, h);
    add_fp8(b, "attn.wo_a", g_r_o, n_h * d / cfg->o_groups);
    add_fp8(b, "attn.wo_b", h, g_r_o);
    add_vec(b, "attn.attn_sink", ENGINE_DTYPE_F32, n_h);
    if ((role->flags & ENGINE_ROLE_KV_SOURCE) != 0) {
        add_mat(b, "attn.compressor.wkv", ENGINE_DTYPE_BF16, d, h);
        add_vec(b, "attn.compressor.norm.weight", ENGINE_DTYPE_BF16, d);
        if (role->ratio == 2) {
            add_mat(b, "attn.compressor.wgate", ENGINE_DTYPE_BF16, d, h);
        }
    }
    if ((role->flags & ENGINE_ROLE_INDEX_SOURCE) != 0) {
        add_fp8(b, "attn.indexer.wq_b", cfg->index_n_heads * d_i, r_q);
        add_mat(b, "attn.indexer.weights_proj", ENGINE_DTYPE_BF16, cfg->index_n_heads, h);
    }
    if (role->kind == ENGINE_LAYER_FULL) {
        add_mat(b, "attn.indexer.wk", ENGINE_DTYPE_BF16, d_i, d);
        add_vec(b, "attn.indexer.k_norm.weight", ENGINE_DTYPE_BF16, d_i);
    }
}

static void add_moe(builder_t *b, const engine_config_t *cfg, int64_t n_experts)
{
    int64_t h = cfg->hidden_size;
    int64_t inter = cfg->moe_intermediate_size;
    char module[ENGINE_TENSOR_NAME_BYTES];

    add_mat(b, "ffn.gate", ENGINE_DTYPE_BF16, n_experts, h);
    add_vec(b, "ffn.gate.bias", ENGINE_DTYPE_F32, n_experts);
    for (int64_t e = 0; e < n_experts; e++) {
        snprintf(module, sizeof(module), "ffn.experts.%lld.w1", (long long)e);
        add_fp4(b, module, inter, h);
        snprintf(module, sizeof(module), "ffn.experts.%lld.w3", (long long)e);
        add_fp4(b, module, inter, h);
        snprintf(module, sizeof(module), "ffn.experts.%lld.w2", (long long)e);
        add_fp4(b, module, h, inter);
    }
    add_fp8(b, "ffn.shared_experts.w1", inter, h);
    add_fp8(b, "ffn.shared_experts.w3", inter, h);
    add_fp8(b, "ffn.shared_experts.w2", h, inter);
}

/* Engram table (host part) and projections of the Engram layer in slot `slot`. */
static void add_engram(builder_t *b, const engine_config_t *cfg, int slot)
{
    int64_t rows = cfg->engram_num_embeddings[slot];
    int64_t d_e = cfg->engram_head_dim;
    int64_t m = cfg->hc_mult;
    int64_t n_in = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads * d_e;

    b->part = ENGINE_PART_ENGRAM_TABLE;
    add(b, "engram.embed.weight", ENGINE_DTYPE_F8_E4M3, rows, d_e, 0, rows * d_e);
    add(b, "engram.embed.scale", ENGINE_DTYPE_F8_E8M0, rows, d_e / QUANT_BLOCK, ENGINE_SPEC_SCALE,
        0);
    b->part = ENGINE_PART_BACKBONE;
    add_fp8(b, "engram.wkv", (m + 1) * cfg->hidden_size, n_in);
    add(b, "engram.q_weight", ENGINE_DTYPE_BF16, m, cfg->hidden_size, 0, m * cfg->hidden_size);
    add(b, "engram.k_weight", ENGINE_DTYPE_BF16, m, cfg->hidden_size, 0, m * cfg->hidden_size);
}

/* Everything of backbone layer l or DSpark block k (index L+k) under the builder's prefix. */
static void add_block(builder_t *b, const engine_config_t *cfg, int index)
{
    const engine_layer_role_t *role = &cfg->roles[index];
    int is_dspark = (role->flags & ENGINE_ROLE_DSPARK) != 0;

    add_vec(b, "attn_norm.weight", ENGINE_DTYPE_BF16, cfg->hidden_size);
    add_vec(b, "ffn_norm.weight", ENGINE_DTYPE_BF16, cfg->hidden_size);
    add_mhc_site(b, cfg, "attn");
    add_mhc_site(b, cfg, "ffn");
    add_attention(b, cfg, role);
    add_moe(b, cfg, is_dspark ? cfg->dspark_n_routed_experts : cfg->n_routed_experts);
    if (role->engram_slot >= 0) {
        add_engram(b, cfg, role->engram_slot);
    }
}

/* mtp.0.main_proj/main_norm on block 0; the heads on the last block (MODEL.md 3, 8). */
static void add_dspark_extras(builder_t *b, const engine_config_t *cfg, int k)
{
    int64_t h = cfg->hidden_size;
    int64_t r_m = cfg->dspark_markov_rank;

    if (k == 0) {
        add_fp8(b, "main_proj", h, cfg->n_dspark_target_layer_ids * h);
        add_vec(b, "main_norm.weight", ENGINE_DTYPE_BF16, h);
    }
    if (k == cfg->n_blocks - 1) {
        add_vec(b, "norm.weight", ENGINE_DTYPE_BF16, h);
        add_mat(b, "markov_head.embed", ENGINE_DTYPE_BF16, cfg->vocab_size, r_m);
        add_mat(b, "markov_head.head", ENGINE_DTYPE_BF16, cfg->vocab_size, r_m);
        add_mat(b, "confidence_head.proj", ENGINE_DTYPE_BF16, 1, h + r_m);
    }
}

tdm_status_t engine_inventory_build(const engine_config_t *cfg, engine_tensor_spec_t **specs_out,
                                    size_t *n_specs_out)
{
    builder_t b;

    if (cfg == NULL || specs_out == NULL || n_specs_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&b, 0, sizeof(b));
    b.part = ENGINE_PART_BACKBONE;
    b.layer = -1;
    add_mat(&b, "embed", ENGINE_DTYPE_BF16, cfg->vocab_size, cfg->hidden_size);
    for (int l = 0; l < cfg->n_layers; l++) {
        b.layer = l;
        snprintf(b.prefix, sizeof(b.prefix), "layers.%d.", l);
        add_block(&b, cfg, l);
    }
    b.layer = -1;
    b.prefix[0] = '\0';
    add_vec(&b, "norm.weight", ENGINE_DTYPE_BF16, cfg->hidden_size);
    add_mat(&b, "head", ENGINE_DTYPE_BF16, cfg->vocab_size, cfg->hidden_size);
    b.part = ENGINE_PART_DSPARK;
    for (int k = 0; k < cfg->n_blocks; k++) {
        b.layer = cfg->n_layers + k;
        snprintf(b.prefix, sizeof(b.prefix), "mtp.%d.", k);
        add_block(&b, cfg, cfg->n_layers + k);
        add_dspark_extras(&b, cfg, k);
    }
    if (b.failed) {
        free(b.specs);
        return TDM_ERR_NO_MEMORY;
    }
    *specs_out = b.specs;
    *n_specs_out = b.n;
    return TDM_OK;
}

tdm_status_t engine_inventory_count(const engine_config_t *cfg, const engine_tensor_spec_t *specs,
                                    size_t n_specs, engine_param_counts_t *counts_out)
{
    engine_param_counts_t counts;
    int64_t embed_params = 0;
    int64_t routed_params = 0;

    if (cfg == NULL || (specs == NULL && n_specs > 0) || counts_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&counts, 0, sizeof(counts));
    for (size_t i = 0; i < n_specs; i++) {
        const engine_tensor_spec_t *spec = &specs[i];
        int64_t bytes = (int64_t)engine_dtype_size_bytes(spec->dtype);

        if (bytes == 0 || spec->n_dims < 0 || spec->n_dims > ENGINE_TENSOR_MAX_DIMS) {
            return TDM_ERR_INVALID_ARG;
        }
        for (int k = 0; k < spec->n_dims; k++) {
            if (spec->shape[k] < 0) {
                return TDM_ERR_INVALID_ARG;
            }
            bytes *= spec->shape[k];
        }
        counts.n_tensors++;
        switch (spec->part) {
        case ENGINE_PART_BACKBONE:
            counts.backbone_params += spec->n_params;
            if (strcmp(spec->name, "embed.weight") == 0) {
                embed_params += spec->n_params;
            }
            if ((spec->flags & ENGINE_SPEC_FP4_PACKED) != 0) {
                routed_params += spec->n_params;
            }
            break;
        case ENGINE_PART_ENGRAM_TABLE:
            counts.engram_table_params += spec->n_params;
            counts.engram_table_bytes += bytes;
            continue;
        case ENGINE_PART_DSPARK:
            counts.dspark_params += spec->n_params;
            counts.dspark_bytes += bytes;
            break;
        }
        counts.resident_bytes += bytes;
        switch (spec->dtype) {
        case ENGINE_DTYPE_F8_E4M3:
            counts.fp8_bytes += bytes;
            break;
        case ENGINE_DTYPE_I8:
        case ENGINE_DTYPE_U8:
            counts.fp4_bytes += bytes;
            break;
        case ENGINE_DTYPE_F8_E8M0:
            counts.scale_bytes += bytes;
            break;
        case ENGINE_DTYPE_BF16:
            counts.bf16_bytes += bytes;
            break;
        case ENGINE_DTYPE_F32:
            counts.f32_bytes += bytes;
            break;
        default:
            break;
        }
    }
    counts.total_params =
        counts.backbone_params + counts.engram_table_params + counts.dspark_params;
    /* Each layer holds E equal routed experts of which K run per token. */
    counts.active_decode_params = counts.backbone_params - embed_params - routed_params +
                                  routed_params * cfg->num_experts_per_tok / cfg->n_routed_experts;
    counts.bias_vl_backbone_params = cfg->n_routed_experts * cfg->n_layers;
    counts.bias_vl_dspark_params = cfg->dspark_n_routed_experts * cfg->n_blocks;
    *counts_out = counts;
    return TDM_OK;
}
