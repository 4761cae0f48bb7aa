/* config.c - config.json reading and writing through one field table, and the public entry
 * points (see config.h). Checks: config_check.c; presets: config_presets.c; sizes: config_sizes.c.
 */
#include "engine/config.h"

#include "engine/config_impl.h"

#include "common/json.h"
#include "common/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

_Static_assert(F_COUNT <= ENGINE_CONFIG_MAX_FIELDS, "where-tables are too small for the fields");

typedef engine_config_where_t where_t;

typedef struct {
    const char *what; /* file name for messages */
    const json_t *root;
    const json_t *text;  /* text_config or NULL */
    const json_t *quant; /* quantization_config or NULL */
    char *err;
    size_t err_bytes;
} parse_t;

/* ---- small helpers ---------------------------------------------------------------------- */

tdm_status_t engine_config_fail(const char *what, const char *where, char *err, size_t err_bytes,
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

static void set_name(char *dst, const char *src)
{
    memset(dst, 0, ENGINE_CONFIG_NAME_BYTES);
    snprintf(dst, ENGINE_CONFIG_NAME_BYTES, "%s", src);
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
        snprintf(where[f].path, ENGINE_CONFIG_WHERE_BYTES, "%s%s", scope_prefix(fields[f].scope, 0),
                 fields[f].paths[0]);
        where[f].defaulted = defaulted;
    }
}

void engine_config_field_where(const engine_config_where_t *where, size_t offset, int index,
                               char *text, size_t text_bytes)
{
    char item[16] = "";
    int f = 0;

    while (f < F_COUNT && fields[f].offset != offset) {
        f++;
    }
    if (index >= 0) {
        snprintf(item, sizeof(item), "[%d]", index);
    }
    if (f == F_COUNT) {
        snprintf(text, text_bytes, "field@%zu%s", offset, item);
        return;
    }
    snprintf(text, text_bytes, "%s%s%s", where[f].path, item,
             where[f].defaulted ? " (missing: full-size default)" : "");
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
    char where[ENGINE_CONFIG_WHERE_BYTES];

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
            return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                      "not an object");
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
                snprintf(where, ENGINE_CONFIG_WHERE_BYTES, "%s%s", prefix, field->paths[k]);
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
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                  "not an integer");
    }
    if (v < field->min || v > field->max) {
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
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
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                  "not a string");
    }
    s = json_string_value(value);
    if (!string_allowed(field, s)) {
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
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
    char item_where[ENGINE_CONFIG_WHERE_BYTES + 24]; /* where, "[", 20 digits, "]" */
    tdm_status_t status;

    if (!json_is_array(value)) {
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                  "not a list");
    }
    if (n > (size_t)field->max_count) {
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                                  "%zu entries, at most %d", n, field->max_count);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(item_where, sizeof(item_where), "%.*s[%zu]", ENGINE_CONFIG_WHERE_BYTES - 1, where, i);
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
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                  "not a list");
    }
    for (size_t i = 0; i < json_array_size(value); i++) {
        const json_t *item = json_array_get(value, i);
        if (!json_is_string(item)) {
            char item_where[ENGINE_CONFIG_WHERE_BYTES + 24]; /* where, "[", 20 digits, "]" */
            snprintf(item_where, sizeof(item_where), "%.*s[%zu]", ENGINE_CONFIG_WHERE_BYTES - 1, where, i);
            return engine_config_fail(p->what, item_where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                      "not a string");
        }
        found |= strcmp(json_string_value(item), field->allowed[0]) == 0;
    }
    if (!found) {
        return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                                  "does not name %s (the only architecture Tandem serves)",
                                  field->allowed[0]);
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
            return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                      "not a number");
        }
        v = json_number_value(value);
        if (!isfinite(v) || v <= 0.0) {
            return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_MISMATCH,
                                      "%g is not a positive finite number", v);
        }
        *(double *)base = v;
        return TDM_OK;
    }
    case KIND_BOOL:
        if (!json_is_boolean(value)) {
            return engine_config_fail(p->what, where, p->err, p->err_bytes, TDM_ERR_FORMAT,
                                      "not a boolean");
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
    where_t where[ENGINE_CONFIG_MAX_FIELDS];
    engine_config_report_t report;
    const json_t *value;
    tdm_status_t status;

    if (!json_is_object(root)) {
        return engine_config_fail(what, NULL, err, err_bytes, TDM_ERR_FORMAT, "not a JSON object");
    }
    value = json_object_get(root, "text_config");
    if (value != NULL && !json_is_null(value)) {
        if (!json_is_object(value)) {
            return engine_config_fail(what, "text_config", err, err_bytes, TDM_ERR_FORMAT,
                                      "not an object");
        }
        p.text = value;
    }
    value = json_object_get(root, "quantization_config");
    if (value != NULL && !json_is_null(value)) {
        if (!json_is_object(value)) {
            return engine_config_fail(what, "quantization_config", err, err_bytes, TDM_ERR_FORMAT,
                                      "not an object");
        }
        p.quant = value;
    }

    engine_config_fill_full(&cfg);
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
    report.what = what;
    report.where = where;
    report.err = err;
    report.err_bytes = err_bytes;
    status = engine_config_check_and_derive(&cfg, &report);
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
        return engine_config_fail("config.json", NULL, err, err_bytes, TDM_ERR_INVALID_ARG,
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
        return engine_config_fail("config", NULL, err, err_bytes, TDM_ERR_INVALID_ARG,
                                  "no path or no output");
    }
    if (stat(path, &st) != 0) {
        return engine_config_fail(path, NULL, err, err_bytes,
                                  errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, "%s",
                                  strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(file, sizeof(file), "%s/config.json", path) >= sizeof(file)) {
            return engine_config_fail(path, NULL, err, err_bytes, TDM_ERR_INVALID_ARG,
                                      "path too long");
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
    where_t where[ENGINE_CONFIG_MAX_FIELDS];
    engine_config_report_t report;
    char err[256];
    tdm_status_t status;

    if (name == NULL || cfg_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (strcmp(name, "tiny") == 0) {
        engine_config_fill_tiny(&cfg);
    } else if (strcmp(name, "small") == 0) {
        engine_config_fill_small(&cfg);
    } else if (strcmp(name, "full") == 0) {
        engine_config_fill_full(&cfg);
    } else {
        return TDM_ERR_INVALID_ARG;
    }
    where_defaults(where, 0);
    report.what = name;
    report.where = where;
    report.err = err;
    report.err_bytes = sizeof(err);
    status = engine_config_check_and_derive(&cfg, &report);
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
