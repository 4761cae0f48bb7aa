/* config.c - config.json parsing, checks, presets and derived roles (see config.h). */
#include "engine/config.h"

#include "common/json.h"
#include "common/log.h"
#include "engine/engram_hash.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* The only quantization block edge Tandem reads (MODEL.md 3). */
#define QUANT_BLOCK 32
/* Bytes of a field's location string, e.g. "text_config.rope_scaling.factor (default)". */
#define WHERE_BYTES 96
/* Alternative JSON key paths one field may have (canonical first). */
#define MAX_PATHS 7
/* Bytes of one key of a dotted path. */
#define KEY_BYTES 64

typedef enum {
    KIND_INT = 0,
    KIND_REAL = 1, /* finite and > 0 */
    KIND_BOOL = 2,
    KIND_STR = 3,
    KIND_INT_LIST = 4,
    KIND_STR_LIST = 5, /* a list of strings that must contain allowed[0]; stores allowed[0] */
} field_kind_t;

/* Which JSON objects a field is looked up in, in order. */
typedef enum {
    SCOPE_TEXT = 0,      /* text_config, then the top level */
    SCOPE_TEXT_ONLY = 1, /* text_config */
    SCOPE_ROOT = 2,      /* the top level, then text_config */
    SCOPE_ROOT_ONLY = 3, /* the top level */
    SCOPE_QUANT = 4,     /* quantization_config, then the top level */
} field_scope_t;

typedef struct {
    const char *paths[MAX_PATHS]; /* dotted key paths; paths[0] is the release name */
    field_scope_t scope;
    field_kind_t kind;
    size_t offset;          /* of the value in engine_config_t */
    size_t count_offset;    /* lists: of the int entry count */
    int max_count;          /* lists: capacity */
    int64_t min, max;       /* integers and list entries */
    const char *allowed[3]; /* strings: accepted values, NULL-terminated */
} field_t;

typedef enum {
    F_ARCHITECTURES,
    F_MODEL_TYPE,
    F_DTYPE,
    F_BOS,
    F_EOS,
    F_PAD,
    F_IMAGE,
    F_QUANT_METHOD,
    F_ACTIVATION_SCHEME,
    F_WEIGHT_BLOCK_SIZE,
    F_SCALE_FMT,
    F_EXPERT_DTYPE,
    F_TEXT_MODEL_TYPE,
    F_VOCAB,
    F_HIDDEN,
    F_LAYERS,
    F_HEADS,
    F_KV_HEADS,
    F_HEAD_DIM,
    F_ROPE_DIM,
    F_Q_LORA,
    F_O_GROUPS,
    F_O_LORA,
    F_HIDDEN_ACT,
    F_SWIGLU_LIMIT,
    F_NORM_EPS,
    F_MAX_POS,
    F_ROPE_THETA,
    F_COMPRESS_ROPE_THETA,
    F_ROPE_TYPE,
    F_ROPE_FACTOR,
    F_BETA_FAST,
    F_BETA_SLOW,
    F_ROPE_ORIG_MAX_POS,
    F_WINDOW,
    F_RATIOS,
    F_KV_SOURCES,
    F_INDEX_SOURCES,
    F_INDEX_HEADS,
    F_INDEX_HEAD_DIM,
    F_INDEX_TOPK,
    F_CAND_SOURCE,
    F_CAND_BLOCKS,
    F_CAND_BLOCK_SIZE,
    F_EXPERTS,
    F_SHARED_EXPERTS,
    F_EXPERTS_PER_TOK,
    F_MOE_INTER,
    F_SCORING,
    F_TOPK_METHOD,
    F_NORM_TOPK,
    F_ROUTE_SCALE,
    F_HC_MULT,
    F_HC_ITERS,
    F_HC_EPS,
    F_ENGRAM_LAYERS,
    F_ENGRAM_ROWS,
    F_ENGRAM_NGRAM,
    F_ENGRAM_HEADS,
    F_ENGRAM_HEAD_DIM,
    F_ENGRAM_VOCAB,
    F_ENGRAM_PAD,
    F_ENGRAM_CVOCAB,
    F_MTP_LAYERS,
    F_DSPARK_BLOCK,
    F_DSPARK_NOISE,
    F_DSPARK_TAPS,
    F_DSPARK_RANK,
    F_DSPARK_EXPERTS,
    F_DSPARK_PER_TOK,
    F_TIE,
    F_COUNT,
} field_id_t;

#define OFF(member) offsetof(engine_config_t, member)
#define I64_MAX_ID  ((int64_t)1 << 31)
#define DIM_MAX     ((int64_t)1 << 20)

/* The field table: JSON names, types and plain ranges. Cross-field checks are in check_*().
 * Kept one entry per line group by hand; clang-format would put every member on its own line. */
/* clang-format off */
static const field_t fields[F_COUNT] = {
    [F_ARCHITECTURES] = {{"architectures"}, SCOPE_ROOT_ONLY, KIND_STR_LIST, OFF(architectures),
                         0, 0, 0, 0, {"DeepseekV41ForCausalLM"}},
    [F_MODEL_TYPE] = {{"model_type"}, SCOPE_ROOT_ONLY, KIND_STR, OFF(model_type), 0, 0, 0, 0,
                      {"deepseek_v41"}},
    [F_DTYPE] = {{"dtype", "torch_dtype"}, SCOPE_ROOT_ONLY, KIND_STR, OFF(dtype), 0, 0, 0, 0,
                 {"bfloat16", "fp8"}},
    [F_BOS] = {{"bos_token_id"}, SCOPE_ROOT, KIND_INT, OFF(bos_token_id), 0, 0, 0, I64_MAX_ID},
    [F_EOS] = {{"eos_token_id"}, SCOPE_ROOT, KIND_INT, OFF(eos_token_id), 0, 0, 0, I64_MAX_ID},
    [F_PAD] = {{"pad_token_id"}, SCOPE_ROOT, KIND_INT, OFF(pad_token_id), 0, 0, 0, I64_MAX_ID},
    [F_IMAGE] = {{"image_token_id"}, SCOPE_ROOT, KIND_INT, OFF(image_token_id), 0, 0, 0,
                 I64_MAX_ID},
    [F_QUANT_METHOD] = {{"quant_method"}, SCOPE_QUANT, KIND_STR, OFF(quant_method), 0, 0, 0, 0,
                        {"fp8"}},
    [F_ACTIVATION_SCHEME] = {{"activation_scheme"}, SCOPE_QUANT, KIND_STR,
                             OFF(activation_scheme), 0, 0, 0, 0, {"dynamic"}},
    [F_WEIGHT_BLOCK_SIZE] = {{"weight_block_size"}, SCOPE_QUANT, KIND_INT_LIST,
                             OFF(weight_block_size), OFF(n_weight_block_size), 2, 1, DIM_MAX},
    [F_SCALE_FMT] = {{"scale_fmt"}, SCOPE_QUANT, KIND_STR, OFF(scale_fmt), 0, 0, 0, 0,
                     {"ue8m0"}},
    [F_EXPERT_DTYPE] = {{"expert_dtype"}, SCOPE_QUANT, KIND_STR, OFF(expert_dtype), 0, 0, 0, 0,
                        {"fp4"}},
    [F_TEXT_MODEL_TYPE] = {{"model_type"}, SCOPE_TEXT_ONLY, KIND_STR, OFF(text_model_type), 0,
                           0, 0, 0, {"deepseek_v41_text"}},
    [F_VOCAB] = {{"vocab_size"}, SCOPE_TEXT, KIND_INT, OFF(vocab_size), 0, 0, 2, (int64_t)1 << 24},
    [F_HIDDEN] = {{"hidden_size", "dim"}, SCOPE_TEXT, KIND_INT, OFF(hidden_size), 0, 0, 32,
                  (int64_t)1 << 16},
    [F_LAYERS] = {{"num_hidden_layers", "n_layers"}, SCOPE_TEXT, KIND_INT, OFF(num_hidden_layers),
                  0, 0, 1, ENGINE_CONFIG_MAX_LAYERS - 1},
    [F_HEADS] = {{"num_attention_heads", "n_heads"}, SCOPE_TEXT, KIND_INT,
                 OFF(num_attention_heads), 0, 0, 1, 1024},
    [F_KV_HEADS] = {{"num_key_value_heads"}, SCOPE_TEXT, KIND_INT, OFF(num_key_value_heads), 0, 0,
                    1, 1024},
    [F_HEAD_DIM] = {{"head_dim"}, SCOPE_TEXT, KIND_INT, OFF(head_dim), 0, 0, 32, 1 << 14},
    [F_ROPE_DIM] = {{"qk_rope_head_dim", "rope_head_dim"}, SCOPE_TEXT, KIND_INT,
                    OFF(qk_rope_head_dim), 0, 0, 2, 1 << 14},
    [F_Q_LORA] = {{"q_lora_rank"}, SCOPE_TEXT, KIND_INT, OFF(q_lora_rank), 0, 0, 32, 1 << 16},
    [F_O_GROUPS] = {{"o_groups"}, SCOPE_TEXT, KIND_INT, OFF(o_groups), 0, 0, 1, 1024},
    [F_O_LORA] = {{"o_lora_rank"}, SCOPE_TEXT, KIND_INT, OFF(o_lora_rank), 0, 0, 32, 1 << 16},
    [F_HIDDEN_ACT] = {{"hidden_act"}, SCOPE_TEXT, KIND_STR, OFF(hidden_act), 0, 0, 0, 0,
                      {"silu"}},
    [F_SWIGLU_LIMIT] = {{"swiglu_limit"}, SCOPE_TEXT, KIND_REAL, OFF(swiglu_limit)},
    [F_NORM_EPS] = {{"rms_norm_eps", "norm_eps"}, SCOPE_TEXT, KIND_REAL, OFF(rms_norm_eps)},
    [F_MAX_POS] = {{"max_position_embeddings"}, SCOPE_TEXT, KIND_INT,
                   OFF(max_position_embeddings), 0, 0, 1, (int64_t)1 << 40},
    [F_ROPE_THETA] = {{"rope_theta", "rope_parameters.main.rope_theta"}, SCOPE_TEXT, KIND_REAL,
                      OFF(rope_theta)},
    [F_COMPRESS_ROPE_THETA] = {{"compress_rope_theta", "rope_parameters.compress.rope_theta"},
                               SCOPE_TEXT, KIND_REAL, OFF(compress_rope_theta)},
    [F_ROPE_TYPE] = {{"rope_scaling.rope_type", "rope_scaling.type", "rope_parameters.rope_type",
                      "rope_parameters.type", "rope_parameters.compress.rope_type",
                      "rope_parameters.compress.type"},
                     SCOPE_TEXT, KIND_STR, OFF(rope_scaling.rope_type), 0, 0, 0, 0, {"yarn"}},
    [F_ROPE_FACTOR] = {{"rope_scaling.factor", "rope_parameters.factor",
                        "rope_parameters.compress.factor", "rope_factor"},
                       SCOPE_TEXT, KIND_REAL, OFF(rope_scaling.factor)},
    [F_BETA_FAST] = {{"rope_scaling.beta_fast", "rope_parameters.beta_fast",
                      "rope_parameters.compress.beta_fast", "beta_fast"},
                     SCOPE_TEXT, KIND_REAL, OFF(rope_scaling.beta_fast)},
    [F_BETA_SLOW] = {{"rope_scaling.beta_slow", "rope_parameters.beta_slow",
                      "rope_parameters.compress.beta_slow", "beta_slow"},
                     SCOPE_TEXT, KIND_REAL, OFF(rope_scaling.beta_slow)},
    [F_ROPE_ORIG_MAX_POS] = {{"rope_scaling.original_max_position_embeddings",
                              "rope_parameters.original_max_position_embeddings",
                              "rope_parameters.compress.original_max_position_embeddings",
                              "original_seq_len"},
                             SCOPE_TEXT, KIND_INT,
                             OFF(rope_scaling.original_max_position_embeddings), 0, 0, 1,
                             (int64_t)1 << 40},
    [F_WINDOW] = {{"sliding_window", "window_size"}, SCOPE_TEXT, KIND_INT, OFF(sliding_window),
                  0, 0, 1, DIM_MAX},
    [F_RATIOS] = {{"compress_ratios"}, SCOPE_TEXT, KIND_INT_LIST, OFF(compress_ratios),
                  OFF(n_compress_ratios), ENGINE_CONFIG_MAX_LAYERS, INT32_MIN, INT32_MAX},
    [F_KV_SOURCES] = {{"kv_source_layer_ids", "kv_source_layers"}, SCOPE_TEXT, KIND_INT_LIST,
                      OFF(kv_source_layer_ids), OFF(n_kv_source_layer_ids),
                      ENGINE_CONFIG_MAX_LAYERS, INT32_MIN, INT32_MAX},
    [F_INDEX_SOURCES] = {{"index_source_layer_ids", "index_source_layers"}, SCOPE_TEXT,
                         KIND_INT_LIST, OFF(index_source_layer_ids),
                         OFF(n_index_source_layer_ids), ENGINE_CONFIG_MAX_LAYERS, INT32_MIN,
                         INT32_MAX},
    [F_INDEX_HEADS] = {{"index_n_heads"}, SCOPE_TEXT, KIND_INT, OFF(index_n_heads), 0, 0, 1, 1024},
    [F_INDEX_HEAD_DIM] = {{"index_head_dim"}, SCOPE_TEXT, KIND_INT, OFF(index_head_dim), 0, 0, 32,
                          1 << 14},
    [F_INDEX_TOPK] = {{"index_topk"}, SCOPE_TEXT, KIND_INT, OFF(index_topk), 0, 0, 1, DIM_MAX},
    [F_CAND_SOURCE] = {{"candidate_source_layer_id", "candidate_source_layer"}, SCOPE_TEXT,
                       KIND_INT, OFF(candidate_source_layer_id), 0, 0, INT32_MIN, INT32_MAX},
    [F_CAND_BLOCKS] = {{"candidate_topk_blocks"}, SCOPE_TEXT, KIND_INT, OFF(candidate_topk_blocks),
                       0, 0, 1, DIM_MAX},
    [F_CAND_BLOCK_SIZE] = {{"candidate_block_size"}, SCOPE_TEXT, KIND_INT,
                           OFF(candidate_block_size), 0, 0, 1, DIM_MAX},
    [F_EXPERTS] = {{"n_routed_experts"}, SCOPE_TEXT, KIND_INT, OFF(n_routed_experts), 0, 0, 1,
                   4096},
    [F_SHARED_EXPERTS] = {{"n_shared_experts"}, SCOPE_TEXT, KIND_INT, OFF(n_shared_experts), 0, 0,
                          0, 64},
    [F_EXPERTS_PER_TOK] = {{"num_experts_per_tok", "n_activated_experts"}, SCOPE_TEXT, KIND_INT,
                           OFF(num_experts_per_tok), 0, 0, 1, 4096},
    [F_MOE_INTER] = {{"moe_intermediate_size", "moe_inter_dim"}, SCOPE_TEXT, KIND_INT,
                     OFF(moe_intermediate_size), 0, 0, 32, DIM_MAX},
    [F_SCORING] = {{"scoring_func", "score_func"}, SCOPE_TEXT, KIND_STR, OFF(scoring_func), 0, 0,
                   0, 0, {"sqrtsoftplus"}},
    [F_TOPK_METHOD] = {{"topk_method"}, SCOPE_TEXT, KIND_STR, OFF(topk_method), 0, 0, 0, 0,
                       {"noaux_tc"}},
    [F_NORM_TOPK] = {{"norm_topk_prob"}, SCOPE_TEXT, KIND_BOOL, OFF(norm_topk_prob)},
    [F_ROUTE_SCALE] = {{"routed_scaling_factor", "route_scale"}, SCOPE_TEXT, KIND_REAL,
                       OFF(routed_scaling_factor)},
    [F_HC_MULT] = {{"hc_mult"}, SCOPE_TEXT, KIND_INT, OFF(hc_mult), 0, 0, 1, 16},
    [F_HC_ITERS] = {{"hc_sinkhorn_iters"}, SCOPE_TEXT, KIND_INT, OFF(hc_sinkhorn_iters), 0, 0, 1,
                    1000},
    [F_HC_EPS] = {{"hc_eps"}, SCOPE_TEXT, KIND_REAL, OFF(hc_eps)},
    [F_ENGRAM_LAYERS] = {{"engram_layer_ids"}, SCOPE_TEXT, KIND_INT_LIST, OFF(engram_layer_ids),
                         OFF(n_engram_layer_ids), ENGINE_CONFIG_MAX_ENGRAM_LAYERS, INT32_MIN,
                         INT32_MAX},
    [F_ENGRAM_ROWS] = {{"engram_num_embeddings"}, SCOPE_TEXT, KIND_INT_LIST,
                       OFF(engram_num_embeddings), OFF(n_engram_num_embeddings),
                       ENGINE_CONFIG_MAX_ENGRAM_LAYERS, 1, (int64_t)1 << 40},
    [F_ENGRAM_NGRAM] = {{"engram_max_ngram_size"}, SCOPE_TEXT, KIND_INT,
                        OFF(engram_max_ngram_size), 0, 0, 2, ENGINE_CONFIG_MAX_NGRAM},
    [F_ENGRAM_HEADS] = {{"engram_n_heads"}, SCOPE_TEXT, KIND_INT, OFF(engram_n_heads), 0, 0, 1,
                        ENGINE_CONFIG_MAX_ENGRAM_HEADS},
    [F_ENGRAM_HEAD_DIM] = {{"engram_head_dim"}, SCOPE_TEXT, KIND_INT, OFF(engram_head_dim), 0, 0,
                           32, 1 << 14},
    [F_ENGRAM_VOCAB] = {{"engram_vocab_size"}, SCOPE_TEXT, KIND_INT, OFF(engram_vocab_size), 0, 0,
                        2, I64_MAX_ID},
    [F_ENGRAM_PAD] = {{"engram_pad_token_id", "engram_pad_id"}, SCOPE_TEXT, KIND_INT,
                      OFF(engram_pad_token_id), 0, 0, 0, I64_MAX_ID},
    [F_ENGRAM_CVOCAB] = {{"engram_compressed_vocab_size"}, SCOPE_TEXT, KIND_INT,
                         OFF(engram_compressed_vocab_size), 0, 0, 1, I64_MAX_ID},
    [F_MTP_LAYERS] = {{"num_nextn_predict_layers", "n_mtp_layers"}, SCOPE_TEXT, KIND_INT,
                      OFF(num_nextn_predict_layers), 0, 0, 0, ENGINE_CONFIG_MAX_LAYERS - 1},
    [F_DSPARK_BLOCK] = {{"dspark_block_size"}, SCOPE_TEXT, KIND_INT, OFF(dspark_block_size), 0, 0,
                        1, 1024},
    [F_DSPARK_NOISE] = {{"dspark_noise_token_id"}, SCOPE_TEXT, KIND_INT,
                        OFF(dspark_noise_token_id), 0, 0, 0, I64_MAX_ID},
    [F_DSPARK_TAPS] = {{"dspark_target_layer_ids"}, SCOPE_TEXT, KIND_INT_LIST,
                       OFF(dspark_target_layer_ids), OFF(n_dspark_target_layer_ids),
                       ENGINE_CONFIG_MAX_LAYERS, INT32_MIN, INT32_MAX},
    [F_DSPARK_RANK] = {{"dspark_markov_rank"}, SCOPE_TEXT, KIND_INT, OFF(dspark_markov_rank), 0, 0,
                       1, 1 << 16},
    [F_DSPARK_EXPERTS] = {{"dspark_n_routed_experts"}, SCOPE_TEXT, KIND_INT,
                          OFF(dspark_n_routed_experts), 0, 0, 1, 4096},
    [F_DSPARK_PER_TOK] = {{"dspark_num_experts_per_tok", "dspark_n_activated_experts"},
                          SCOPE_TEXT, KIND_INT, OFF(dspark_num_experts_per_tok), 0, 0, 1, 4096},
    [F_TIE] = {{"tie_word_embeddings"}, SCOPE_TEXT, KIND_BOOL, OFF(tie_word_embeddings)},
};
/* clang-format on */

/* Where each field's value came from, for error messages. */
typedef struct {
    char path[WHERE_BYTES]; /* e.g. "text_config.rope_scaling.factor" or "rope_factor" */
    int defaulted;          /* 1: missing from the JSON, the full-size value was used */
} where_t;

typedef struct {
    const char *what; /* file name for messages */
    const json_t *root;
    const json_t *text;  /* text_config or NULL */
    const json_t *quant; /* quantization_config or NULL */
    char *err;
    size_t err_bytes;
} parse_t;

/* ---- small helpers ---------------------------------------------------------------------- */

static tdm_status_t fail(const char *what, const char *where, char *err, size_t err_bytes,
                         tdm_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static tdm_status_t fail(const char *what, const char *where, char *err, size_t err_bytes,
                         tdm_status_t status, const char *fmt, ...)
{
    char reason[256];
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    if (err != NULL && err_bytes > 0) {
        if (where != NULL && where[0] != '\0') {
            snprintf(err, err_bytes, "%s: %s: %s", what, where, reason);
        } else {
            snprintf(err, err_bytes, "%s: %s", what, reason);
        }
    }
    return status;
}

static int64_t *int_at(engine_config_t *cfg, size_t offset)
{
    return (int64_t *)((char *)cfg + offset);
}

static const int64_t *int_at_const(const engine_config_t *cfg, size_t offset)
{
    return (const int64_t *)((const char *)cfg + offset);
}

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

static const char *scope_prefix(field_scope_t scope, int which)
{
    static const char *const text_then_root[2] = {"text_config.", ""};
    static const char *const root_then_text[2] = {"", "text_config."};
    static const char *const quant_then_root[2] = {"quantization_config.", ""};

    switch (scope) {
    case SCOPE_TEXT:
    case SCOPE_TEXT_ONLY:
        return text_then_root[which];
    case SCOPE_ROOT:
    case SCOPE_ROOT_ONLY:
        return root_then_text[which];
    case SCOPE_QUANT:
        return quant_then_root[which];
    }
    return "";
}

/* Every field at its release path; `defaulted` says whether the value is the full-size one. */
static void where_defaults(where_t *where, int defaulted)
{
    for (int f = 0; f < F_COUNT; f++) {
        snprintf(where[f].path, WHERE_BYTES, "%s%s", scope_prefix(fields[f].scope, 0),
                 fields[f].paths[0]);
        where[f].defaulted = defaulted;
    }
}

/* ---- presets (MODEL.md sections 2 and 9) --------------------------------------------------- */

static void fill_full(engine_config_t *cfg)
{
    static const int64_t block_size[2] = {QUANT_BLOCK, QUANT_BLOCK};
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

static void fill_tiny(engine_config_t *cfg)
{
    static const int64_t ratios[] = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0};
    static const int64_t kv_sources[] = {2, 4};
    static const int64_t index_sources[] = {2, 4, 6};
    static const int64_t engram_layers[] = {1, 2};
    static const int64_t engram_rows[] = {6126, 6332};
    static const int64_t taps[] = {5, 6, 7};

    fill_full(cfg);
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

static void fill_small(engine_config_t *cfg)
{
    static const int64_t kv_sources[] = {2, 5, 8};
    static const int64_t index_sources[] = {2, 5, 8, 12};
    static const int64_t engram_layers[] = {1, 5};
    static const int64_t engram_rows[] = {49796, 50980};
    static const int64_t taps[] = {13, 14, 15};
    int n = 0;

    fill_full(cfg);
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

/* ---- checks and derived roles (MODEL.md section 2) ----------------------------------------- */

typedef struct {
    const char *what;
    const where_t *where;
    char *err;
    size_t err_bytes;
} check_t;

/* A failed check of field f (entry `index`, or the whole field when index < 0): TDM_ERR_MISMATCH
 * with "what: path[index] (full-size default): reason" in err. */
static tdm_status_t check_fail(const check_t *c, field_id_t f, int index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tdm_status_t check_fail(const check_t *c, field_id_t f, int index, const char *fmt, ...)
{
    char where[WHERE_BYTES + 48];
    char reason[256];
    char item[16] = "";
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    if (index >= 0) {
        snprintf(item, sizeof(item), "[%d]", index);
    }
    snprintf(where, sizeof(where), "%s%s%s", c->where[f].path, item,
             c->where[f].defaulted ? " (missing: full-size default)" : "");
    return fail(c->what, where, c->err, c->err_bytes, TDM_ERR_MISMATCH, "%s", reason);
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
static tdm_status_t check_layer_list(const check_t *c, const engine_config_t *cfg, field_id_t f,
                                     int required)
{
    const int64_t *list = int_at_const(cfg, fields[f].offset);
    int n = *(const int *)((const char *)cfg + fields[f].count_offset);

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
        return check_fail(c, F_LAYERS, -1, "%lld layers + %lld DSpark blocks exceed %d",
                          (long long)cfg->num_hidden_layers,
                          (long long)cfg->num_nextn_predict_layers, ENGINE_CONFIG_MAX_LAYERS);
    }
    if (cfg->n_compress_ratios > n_total) {
        return check_fail(c, F_RATIOS, -1, "%d entries for %lld layers + %lld DSpark blocks",
                          cfg->n_compress_ratios, (long long)cfg->num_hidden_layers,
                          (long long)cfg->num_nextn_predict_layers);
    }
    for (int i = 0; i < cfg->n_compress_ratios; i++) {
        int64_t r = cfg->compress_ratios[i];

        if (r != 0 && r != 1 && r != 2) {
            return check_fail(c, F_RATIOS, i, "ratio %lld not in {0,1,2}", (long long)r);
        }
        if (i >= cfg->num_hidden_layers && r != 0) {
            return check_fail(c, F_RATIOS, i, "DSpark block %lld must have ratio 0, not %lld",
                              (long long)(i - cfg->num_hidden_layers), (long long)r);
        }
    }
    return TDM_OK;
}

/* KV and index sources: ratio>0; every ratio>0 layer has a same-ratio kv_src and an idx_src at
 * or above it. */
static tdm_status_t check_sources(const check_t *c, const engine_config_t *cfg)
{
    static const field_id_t source_lists[2] = {F_KV_SOURCES, F_INDEX_SOURCES};
    tdm_status_t status;

    for (int k = 0; k < 2; k++) {
        field_id_t f = source_lists[k];
        const int64_t *list = int_at_const(cfg, fields[f].offset);
        int n = *(const int *)((const char *)cfg + fields[f].count_offset);

        status = check_layer_list(c, cfg, f, 1);
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
            return check_fail(c, F_KV_SOURCES, -1,
                              "layer %d (ratio %d) has no KV source at or below it", l, r);
        }
        if (ratio_of(cfg, kv) != r) {
            return check_fail(c, F_KV_SOURCES, -1,
                              "layer %d has ratio %d but its KV source %d has ratio %d", l, r, kv,
                              ratio_of(cfg, kv));
        }
        if (idx < 0) {
            return check_fail(c, F_INDEX_SOURCES, -1,
                              "layer %d (ratio %d) has no index source at or below it", l, r);
        }
        if (idx < kv) {
            return check_fail(c, F_INDEX_SOURCES, -1,
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
        return check_fail(c, F_CAND_SOURCE, -1, "layer %lld is not an index source",
                          (long long)src);
    }
    if (src > cut) {
        return check_fail(c, F_CAND_SOURCE, -1,
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
            return check_fail(c, F_INDEX_SOURCES, i,
                              "candidate consumer %d reads KV source %d, the candidate source %lld "
                              "reads %d",
                              consumer, kv, (long long)src, src_kv);
        }
    }
    if (cfg->candidate_topk_blocks * cfg->candidate_block_size < cfg->index_topk) {
        return check_fail(c, F_CAND_BLOCKS, -1,
                          "%lld blocks x candidate_block_size %lld < index_topk %lld",
                          (long long)cfg->candidate_topk_blocks,
                          (long long)cfg->candidate_block_size, (long long)cfg->index_topk);
    }
    return TDM_OK;
}

/* Dimensions: multiples of 32, d_r, G | n_h, one KV head, experts. */
static tdm_status_t check_dims(const check_t *c, const engine_config_t *cfg)
{
    static const field_id_t multiples[] = {
        F_HIDDEN, F_MOE_INTER, F_HEAD_DIM, F_INDEX_HEAD_DIM, F_ENGRAM_HEAD_DIM, F_Q_LORA, F_O_LORA};
    int64_t min_dim;

    for (size_t i = 0; i < sizeof(multiples) / sizeof(multiples[0]); i++) {
        int64_t v = *int_at_const(cfg, fields[multiples[i]].offset);
        if (v % QUANT_BLOCK != 0) {
            return check_fail(c, multiples[i], -1, "%lld is not a multiple of %d", (long long)v,
                              QUANT_BLOCK);
        }
    }
    if (cfg->qk_rope_head_dim % 2 != 0) {
        return check_fail(c, F_ROPE_DIM, -1, "%lld is odd", (long long)cfg->qk_rope_head_dim);
    }
    min_dim = cfg->head_dim < cfg->index_head_dim ? cfg->head_dim : cfg->index_head_dim;
    if (cfg->qk_rope_head_dim > min_dim) {
        return check_fail(c, F_ROPE_DIM, -1, "%lld exceeds min(head_dim, index_head_dim) = %lld",
                          (long long)cfg->qk_rope_head_dim, (long long)min_dim);
    }
    if (cfg->num_attention_heads % cfg->o_groups != 0) {
        return check_fail(c, F_O_GROUPS, -1, "%lld does not divide num_attention_heads %lld",
                          (long long)cfg->o_groups, (long long)cfg->num_attention_heads);
    }
    if (cfg->num_key_value_heads != 1) {
        return check_fail(c, F_KV_HEADS, -1,
                          "%lld, but the model has one shared KV latent (must be 1)",
                          (long long)cfg->num_key_value_heads);
    }
    if (cfg->n_shared_experts != 1) {
        return check_fail(c, F_SHARED_EXPERTS, -1, "%lld, must be 1",
                          (long long)cfg->n_shared_experts);
    }
    if (cfg->num_experts_per_tok > cfg->n_routed_experts) {
        return check_fail(c, F_EXPERTS_PER_TOK, -1, "%lld exceeds n_routed_experts %lld",
                          (long long)cfg->num_experts_per_tok, (long long)cfg->n_routed_experts);
    }
    if (cfg->dspark_num_experts_per_tok > cfg->dspark_n_routed_experts) {
        return check_fail(c, F_DSPARK_PER_TOK, -1, "%lld exceeds dspark_n_routed_experts %lld",
                          (long long)cfg->dspark_num_experts_per_tok,
                          (long long)cfg->dspark_n_routed_experts);
    }
    return TDM_OK;
}

/* Token ids below V; flags with the only value the model supports; quantization block. */
static tdm_status_t check_values(const check_t *c, const engine_config_t *cfg)
{
    static const field_id_t token_ids[] = {F_BOS,   F_EOS,          F_PAD,
                                           F_IMAGE, F_DSPARK_NOISE, F_ENGRAM_PAD};

    for (size_t i = 0; i < sizeof(token_ids) / sizeof(token_ids[0]); i++) {
        int64_t v = *int_at_const(cfg, fields[token_ids[i]].offset);
        if (v >= cfg->vocab_size) {
            return check_fail(c, token_ids[i], -1, "token id %lld not below vocab_size %lld",
                              (long long)v, (long long)cfg->vocab_size);
        }
    }
    if (cfg->tie_word_embeddings != 0) {
        return check_fail(c, F_TIE, -1,
                          "true, must be false (embed and head are separate tensors)");
    }
    if (cfg->norm_topk_prob == 0) {
        return check_fail(c, F_NORM_TOPK, -1,
                          "false, must be true (routing weights are normalised)");
    }
    if (cfg->n_weight_block_size != 2 || cfg->weight_block_size[0] != QUANT_BLOCK ||
        cfg->weight_block_size[1] != QUANT_BLOCK) {
        return check_fail(c, F_WEIGHT_BLOCK_SIZE, -1, "must be [%d, %d]", QUANT_BLOCK, QUANT_BLOCK);
    }
    return TDM_OK;
}

/* Engram layers, one row count each, equal to the sum of that layer's primes (MODEL.md 5.6). */
static tdm_status_t check_engram(const check_t *c, const engine_config_t *cfg)
{
    int64_t n_cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    int64_t prime = cfg->engram_vocab_size - 1;
    tdm_status_t status;

    status = check_layer_list(c, cfg, F_ENGRAM_LAYERS, 0);
    if (status != TDM_OK) {
        return status;
    }
    if (cfg->n_engram_num_embeddings != cfg->n_engram_layer_ids) {
        return check_fail(c, F_ENGRAM_ROWS, -1, "%d entries for %d Engram layers",
                          cfg->n_engram_num_embeddings, cfg->n_engram_layer_ids);
    }
    for (int i = 0; i < cfg->n_engram_layer_ids; i++) {
        int64_t sum = 0;

        for (int64_t col = 0; col < n_cols; col++) {
            prime = engine_engram_prime_after(prime);
            sum += prime;
        }
        if (sum != cfg->engram_num_embeddings[i]) {
            return check_fail(c, F_ENGRAM_ROWS, i,
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

/* Every cross-field check of MODEL.md section 2, then the derived roles. */
static tdm_status_t check_and_derive(engine_config_t *cfg, const char *what, const where_t *where,
                                     char *err, size_t err_bytes)
{
    check_t c = {what, where, err, err_bytes};
    tdm_status_t status;

    status = check_ratios(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_sources(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_candidates(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_dims(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_values(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_engram(&c, cfg);
    if (status != TDM_OK) {
        return status;
    }
    status = check_layer_list(&c, cfg, F_DSPARK_TAPS, cfg->num_nextn_predict_layers > 0);
    if (status != TDM_OK) {
        return status;
    }
    derive_roles(cfg);
    return TDM_OK;
}

/* ---- JSON reading -------------------------------------------------------------------------- */

/*
 * Look up a dotted path in `obj`. *value_out = the value, or NULL when absent or null. A present
 * intermediate that is neither an object nor null is a format error naming it.
 */
static tdm_status_t lookup_path(const parse_t *p, const json_t *obj, const char *prefix,
                                const char *path, const json_t **value_out)
{
    const char *key = path;
    const json_t *cur = obj;
    char name[KEY_BYTES];
    char where[WHERE_BYTES];

    *value_out = NULL;
    for (;;) {
        const char *dot = strchr(key, '.');
        size_t len = dot != NULL ? (size_t)(dot - key) : strlen(key);

        snprintf(name, sizeof(name), "%.*s", (int)len, key);
        cur = json_object_get(cur, name);
        if (cur == NULL || json_is_null(cur)) {
            return TDM_OK;
        }
        if (dot == NULL) {
            *value_out = cur;
            return TDM_OK;
        }
        if (!json_is_object(cur)) {
            snprintf(where, sizeof(where), "%s%.*s", prefix, (int)(dot - path), path);
            return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not an object");
        }
        key = dot + 1;
    }
}

/* The value of field f (NULL if absent everywhere) and where it was found. */
static tdm_status_t find_field(const parse_t *p, field_id_t f, const json_t **value_out,
                               char *where)
{
    const field_t *field = &fields[f];
    const json_t *containers[2] = {NULL, NULL};
    tdm_status_t status;

    switch (field->scope) {
    case SCOPE_TEXT:
        containers[0] = p->text;
        containers[1] = p->root;
        break;
    case SCOPE_TEXT_ONLY:
        containers[0] = p->text;
        break;
    case SCOPE_ROOT:
        containers[0] = p->root;
        containers[1] = p->text;
        break;
    case SCOPE_ROOT_ONLY:
        containers[0] = p->root;
        break;
    case SCOPE_QUANT:
        containers[0] = p->quant;
        containers[1] = p->root;
        break;
    }
    *value_out = NULL;
    for (int which = 0; which < 2; which++) {
        if (containers[which] == NULL) {
            continue;
        }
        for (int k = 0; k < MAX_PATHS && field->paths[k] != NULL; k++) {
            const char *prefix = scope_prefix(field->scope, which);
            const json_t *value;

            status = lookup_path(p, containers[which], prefix, field->paths[k], &value);
            if (status != TDM_OK) {
                return status;
            }
            if (value != NULL) {
                snprintf(where, WHERE_BYTES, "%s%s", prefix, field->paths[k]);
                *value_out = value;
                return TDM_OK;
            }
        }
    }
    return TDM_OK;
}

static tdm_status_t read_int(const parse_t *p, const field_t *field, const json_t *value,
                             const char *where, int64_t *value_out)
{
    int64_t v;

    if (tdm_json_int_exact(value, &v) != TDM_OK) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not an integer");
    }
    if (v < field->min || v > field->max) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                    "%lld not in [%lld, %lld]", (long long)v, (long long)field->min,
                    (long long)field->max);
    }
    *value_out = v;
    return TDM_OK;
}

static int string_allowed(const field_t *field, const char *s)
{
    for (int i = 0; i < 3 && field->allowed[i] != NULL; i++) {
        if (strcmp(s, field->allowed[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static tdm_status_t read_string(const parse_t *p, const field_t *field, const json_t *value,
                                const char *where, char *dst)
{
    const char *s;

    if (!json_is_string(value)) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a string");
    }
    s = json_string_value(value);
    if (!string_allowed(field, s)) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                    "\"%.64s\" is not %s%s%s", s, field->allowed[0],
                    field->allowed[1] != NULL ? " or " : "",
                    field->allowed[1] != NULL ? field->allowed[1] : "");
    }
    set_name(dst, s);
    return TDM_OK;
}

static tdm_status_t read_int_list(const parse_t *p, const field_t *field, const json_t *value,
                                  const char *where, engine_config_t *cfg)
{
    int64_t *dst = int_at(cfg, field->offset);
    size_t n = json_array_size(value);
    char item_where[WHERE_BYTES + 16];
    tdm_status_t status;

    if (!json_is_array(value)) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a list");
    }
    if (n > (size_t)field->max_count) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                    "%zu entries, at most %d", n, field->max_count);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(item_where, sizeof(item_where), "%s[%zu]", where, i);
        status = read_int(p, field, json_array_get(value, i), item_where, &dst[i]);
        if (status != TDM_OK) {
            return status;
        }
    }
    *(int *)((char *)cfg + field->count_offset) = (int)n;
    return TDM_OK;
}

static tdm_status_t read_string_list(const parse_t *p, const field_t *field, const json_t *value,
                                     const char *where, char *dst)
{
    int found = 0;

    if (!json_is_array(value)) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a list");
    }
    for (size_t i = 0; i < json_array_size(value); i++) {
        const json_t *item = json_array_get(value, i);
        if (!json_is_string(item)) {
            char item_where[WHERE_BYTES + 16];
            snprintf(item_where, sizeof(item_where), "%s[%zu]", where, i);
            return fail(p->what, item_where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a string");
        }
        found |= strcmp(json_string_value(item), field->allowed[0]) == 0;
    }
    if (!found) {
        return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                    "does not name %s (the only architecture Tandem serves)", field->allowed[0]);
    }
    set_name(dst, field->allowed[0]);
    return TDM_OK;
}

static tdm_status_t read_field(const parse_t *p, field_id_t f, const json_t *value,
                               const char *where, engine_config_t *cfg)
{
    const field_t *field = &fields[f];
    char *base = (char *)cfg + field->offset;

    switch (field->kind) {
    case KIND_INT:
        return read_int(p, field, value, where, (int64_t *)base);
    case KIND_REAL: {
        double v;
        if (!json_is_number(value)) {
            return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a number");
        }
        v = json_number_value(value);
        if (!isfinite(v) || v <= 0.0) {
            return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                        "%g is not a positive finite number", v);
        }
        *(double *)base = v;
        return TDM_OK;
    }
    case KIND_BOOL:
        if (!json_is_boolean(value)) {
            return fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT, "not a boolean");
        }
        *(int *)base = json_is_true(value) ? 1 : 0;
        return TDM_OK;
    case KIND_STR:
        return read_string(p, field, value, where, base);
    case KIND_INT_LIST:
        return read_int_list(p, field, value, where, cfg);
    case KIND_STR_LIST:
        return read_string_list(p, field, value, where, base);
    }
    return TDM_ERR_INTERNAL;
}

static tdm_status_t parse_root(const json_t *root, const char *what, engine_config_t *cfg_out,
                               char *err, size_t err_bytes)
{
    parse_t p = {what, root, NULL, NULL, err, err_bytes};
    engine_config_t cfg;
    where_t where[F_COUNT];
    const json_t *value;
    tdm_status_t status;

    if (!json_is_object(root)) {
        return fail(what, NULL, err, err_bytes, TDM_ERR_FORMAT, "not a JSON object");
    }
    value = json_object_get(root, "text_config");
    if (value != NULL && !json_is_null(value)) {
        if (!json_is_object(value)) {
            return fail(what, "text_config", err, err_bytes, TDM_ERR_FORMAT, "not an object");
        }
        p.text = value;
    }
    value = json_object_get(root, "quantization_config");
    if (value != NULL && !json_is_null(value)) {
        if (!json_is_object(value)) {
            return fail(what, "quantization_config", err, err_bytes, TDM_ERR_FORMAT,
                        "not an object");
        }
        p.quant = value;
    }

    fill_full(&cfg);
    where_defaults(where, 1);
    for (int f = 0; f < F_COUNT; f++) {
        status = find_field(&p, (field_id_t)f, &value, where[f].path);
        if (status != TDM_OK) {
            return status;
        }
        if (value == NULL) {
            continue;
        }
        where[f].defaulted = 0;
        status = read_field(&p, (field_id_t)f, value, where[f].path, &cfg);
        if (status != TDM_OK) {
            return status;
        }
    }
    status = check_and_derive(&cfg, what, (const where_t *)where, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    *cfg_out = cfg;
    return TDM_OK;
}

/* ---- public API ---------------------------------------------------------------------------- */

tdm_status_t engine_config_from_json(const json_t *root, engine_config_t *cfg_out, char *err,
                                     size_t err_bytes)
{
    if (root == NULL || cfg_out == NULL) {
        return fail("config.json", NULL, err, err_bytes, TDM_ERR_INVALID_ARG,
                    "no JSON or no output");
    }
    return parse_root(root, "config.json", cfg_out, err, err_bytes);
}

tdm_status_t engine_config_load(const char *path, engine_config_t *cfg_out, char *err,
                                size_t err_bytes)
{
    char file[4096];
    struct stat st;
    json_t *root = NULL;
    tdm_status_t status;

    if (path == NULL || cfg_out == NULL) {
        return fail("config", NULL, err, err_bytes, TDM_ERR_INVALID_ARG, "no path or no output");
    }
    if (stat(path, &st) != 0) {
        return fail(path, NULL, err, err_bytes, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO,
                    "%s", strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(file, sizeof(file), "%s/config.json", path) >= sizeof(file)) {
            return fail(path, NULL, err, err_bytes, TDM_ERR_INVALID_ARG, "path too long");
        }
    } else {
        snprintf(file, sizeof(file), "%s", path);
    }
    status = tdm_json_load_file(file, &root, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = parse_root(root, file, cfg_out, err, err_bytes);
    json_decref(root);
    return status;
}

tdm_status_t engine_config_preset(const char *name, engine_config_t *cfg_out)
{
    engine_config_t cfg;
    where_t where[F_COUNT];
    char err[256];
    tdm_status_t status;

    if (name == NULL || cfg_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (strcmp(name, "tiny") == 0) {
        fill_tiny(&cfg);
    } else if (strcmp(name, "small") == 0) {
        fill_small(&cfg);
    } else if (strcmp(name, "full") == 0) {
        fill_full(&cfg);
    } else {
        return TDM_ERR_INVALID_ARG;
    }
    where_defaults(where, 0);
    status = check_and_derive(&cfg, name, (const where_t *)where, err, sizeof(err));
    if (status != TDM_OK) {
        /* A preset that fails its own checks is a bug in this file. */
        tdm_log(TDM_LOG_ERROR, "config", "preset fails its checks: preset=%s error=\"%s\"", name,
                err);
        return TDM_ERR_INTERNAL;
    }
    *cfg_out = cfg;
    return TDM_OK;
}

/* ---- JSON writing -------------------------------------------------------------------------- */

/* Set obj[path] = value (a new reference, stolen), creating intermediate objects. */
static int set_path(json_t *obj, const char *path, json_t *value)
{
    const char *dot = strchr(path, '.');
    char name[KEY_BYTES];
    json_t *child;

    if (value == NULL) {
        return -1;
    }
    if (dot == NULL) {
        return json_object_set_new(obj, path, value);
    }
    snprintf(name, sizeof(name), "%.*s", (int)(dot - path), path);
    child = json_object_get(obj, name);
    if (child == NULL) {
        child = json_object();
        if (json_object_set_new(obj, name, child) != 0) {
            json_decref(value);
            return -1;
        }
    }
    return set_path(child, dot + 1, value);
}

static json_t *field_value(const engine_config_t *cfg, const field_t *field)
{
    const char *base = (const char *)cfg + field->offset;
    json_t *list;

    switch (field->kind) {
    case KIND_INT:
        return json_integer((json_int_t) * (const int64_t *)base);
    case KIND_REAL:
        return json_real(*(const double *)base);
    case KIND_BOOL:
        return json_boolean(*(const int *)base != 0);
    case KIND_STR:
        return json_string(base);
    case KIND_STR_LIST:
        list = json_array();
        if (list != NULL && json_array_append_new(list, json_string(base)) != 0) {
            json_decref(list);
            return NULL;
        }
        return list;
    case KIND_INT_LIST: {
        int n = *(const int *)((const char *)cfg + field->count_offset);
        list = json_array();
        for (int i = 0; list != NULL && i < n; i++) {
            if (json_array_append_new(list, json_integer(((const int64_t *)base)[i])) != 0) {
                json_decref(list);
                return NULL;
            }
        }
        return list;
    }
    }
    return NULL;
}

json_t *engine_config_to_json(const engine_config_t *cfg)
{
    json_t *root;
    json_t *text = NULL;
    json_t *quant = NULL;

    if (cfg == NULL) {
        return NULL;
    }
    root = json_object();
    if (root == NULL) {
        return NULL;
    }
    for (int f = 0; f < F_COUNT; f++) {
        const field_t *field = &fields[f];
        json_t *target = root;

        if (field->scope == SCOPE_TEXT || field->scope == SCOPE_TEXT_ONLY) {
            if (text == NULL) {
                text = json_object();
                if (json_object_set_new(root, "text_config", text) != 0) {
                    goto err_free_root;
                }
            }
            target = text;
        } else if (field->scope == SCOPE_QUANT) {
            if (quant == NULL) {
                quant = json_object();
                if (json_object_set_new(root, "quantization_config", quant) != 0) {
                    goto err_free_root;
                }
            }
            target = quant;
        }
        if (set_path(target, field->paths[0], field_value(cfg, field)) != 0) {
            goto err_free_root;
        }
    }
    return root;

err_free_root:
    json_decref(root);
    return NULL;
}

/* ---- sizing helpers ------------------------------------------------------------------------ */

int64_t engine_config_n_c(const engine_config_t *cfg, int layer, int64_t t)
{
    int ratio;

    if (layer < 0 || layer >= cfg->n_roles || t < 0) {
        return 0;
    }
    ratio = cfg->roles[layer].ratio;
    if (ratio == 0 || (cfg->roles[layer].flags & ENGINE_ROLE_DSPARK) != 0) {
        return 0;
    }
    return (t + 1) / ratio;
}

int64_t engine_config_kv_row_bytes(const engine_config_t *cfg)
{
    /* main: d/2 E2M1 bytes + d/16 E4M3 scales; index key: d_I/2 E2M1 + d_I/32 UE8M0 */
    return cfg->head_dim / 2 + cfg->head_dim / 16 + cfg->index_head_dim / 2 +
           cfg->index_head_dim / QUANT_BLOCK;
}

double engine_config_kv_rows_per_token(const engine_config_t *cfg)
{
    double rows = 0.0;

    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        int ratio = cfg->roles[cfg->kv_source_layer_ids[i]].ratio;
        if (ratio > 0) {
            rows += 1.0 / (double)ratio;
        }
    }
    return rows;
}

double engine_config_kv_bytes_per_token(const engine_config_t *cfg)
{
    return (double)engine_config_kv_row_bytes(cfg) * engine_config_kv_rows_per_token(cfg);
}

int64_t engine_config_kv_bytes(const engine_config_t *cfg, int64_t n_tokens)
{
    int64_t rows = 0;

    if (n_tokens <= 0) {
        return 0;
    }
    for (int i = 0; i < cfg->n_kv_source_layer_ids; i++) {
        rows += engine_config_n_c(cfg, (int)cfg->kv_source_layer_ids[i], n_tokens - 1);
    }
    return rows * engine_config_kv_row_bytes(cfg);
}

int64_t engine_config_ring_entry_bytes(const engine_config_t *cfg)
{
    /* d E4M3 codes + d/32 UE8M0 scales (Q_swa) */
    return cfg->head_dim + cfg->head_dim / QUANT_BLOCK;
}

int64_t engine_config_ring_entries(const engine_config_t *cfg)
{
    return cfg->sliding_window + cfg->dspark_block_size + 1;
}

const char *engine_config_layer_kind_name(engine_layer_kind_t kind)
{
    switch (kind) {
    case ENGINE_LAYER_SWA:
        return "swa";
    case ENGINE_LAYER_FULL:
        return "full";
    case ENGINE_LAYER_REINDEX:
        return "reindex";
    case ENGINE_LAYER_REUSE:
        return "reuse";
    }
    return "?";
}
