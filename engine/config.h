/* config.h - the model configuration (MODEL.md section 2) and the per-layer roles derived from it.
 *
 * Owns nothing on the heap: engine_config_t is plain data, filled from a config.json (nested HF
 * release layout or the flat inference/config.json aliases), from a named test preset (MODEL.md
 * section 9), and written back as the nested release layout. Every load-time check of MODEL.md
 * section 2 happens here, so a config that loads is one the engine can run. Also answers the
 * sizing questions that follow from the config alone (published rows, KV bytes, ring entries).
 * Knows nothing of tensors (engine/inventory.h), weights or the forward pass.
 */
#ifndef TANDEM_ENGINE_CONFIG_H
#define TANDEM_ENGINE_CONFIG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Backbone layers plus DSpark blocks (L + n_d) a config may have. */
#define ENGINE_CONFIG_MAX_LAYERS 64
/* Engram layers (entries of engram_layer_ids) a config may have. */
#define ENGINE_CONFIG_MAX_ENGRAM_LAYERS 8
/* Largest Engram n-gram size N (engram_max_ngram_size). */
#define ENGINE_CONFIG_MAX_NGRAM 8
/* Largest number of Engram heads h_e (engram_n_heads). */
#define ENGINE_CONFIG_MAX_ENGRAM_HEADS 32
/* Bytes of every string field, NUL included. */
#define ENGINE_CONFIG_NAME_BYTES 32

/* The YaRN parameters of ratio>0 layers (text_config.rope_scaling, MODEL.md section 5). */
typedef struct {
    char rope_type[ENGINE_CONFIG_NAME_BYTES]; /* "yarn" ("rope_type" or "type" in JSON) */
    double factor;                            /* 16 */
    double beta_fast;                         /* 32 */
    double beta_slow;                         /* 1 */
    int64_t original_max_position_embeddings; /* L0, 65536 tokens */
} engine_rope_scaling_t;

/* What a layer's attention does with compressed rows (MODEL.md section 2, derived roles). */
typedef enum {
    ENGINE_LAYER_SWA = 0,     /* ratio 0: sliding window only (also every DSpark block) */
    ENGINE_LAYER_FULL = 1,    /* KV source and index source: compressor, index keys, own top-k */
    ENGINE_LAYER_REINDEX = 2, /* index source only: own index query over kv_src's keys */
    ENGINE_LAYER_REUSE = 3,   /* ratio>0, no indexer: top-k of idx_src */
} engine_layer_kind_t;

/* Role flags of one layer or DSpark block (engine_layer_role_t.flags). */
enum {
    ENGINE_ROLE_KV_SOURCE = 1u << 0,          /* in kv_source_layer_ids: owns a compressor */
    ENGINE_ROLE_INDEX_SOURCE = 1u << 1,       /* in index_source_layer_ids: own index query */
    ENGINE_ROLE_CANDIDATE_SOURCE = 1u << 2,   /* candidate_source_layer_id: publishes the pool */
    ENGINE_ROLE_CANDIDATE_CONSUMER = 1u << 3, /* index source above the candidate source */
    ENGINE_ROLE_ENGRAM = 1u << 4,             /* in engram_layer_ids: Engram before the block */
    ENGINE_ROLE_TAP = 1u << 5,                /* in dspark_target_layer_ids */
    ENGINE_ROLE_DSPARK = 1u << 6,             /* DSpark block L+k (prefix mtp.k.) */
};

/*
 * The derived role of layer l (0 <= l < L) or DSpark block k (index L+k).
 *
 * ratio:       compress_ratios[l] (0 when the list is shorter), 0, 1 or 2.
 * kind:        ENGINE_LAYER_*; DSpark blocks are ENGINE_LAYER_SWA.
 * flags:       ENGINE_ROLE_* bits.
 * kv_src:      ratio>0 backbone layers: the largest KV source <= l, whose compressed rows this
 *              layer attends; -1 for ratio 0 layers and DSpark blocks.
 * idx_src:     ratio>0 backbone layers: the largest index source <= l, whose selection S(t) this
 *              layer uses; -1 otherwise.
 * engram_slot: position of l in engram_layer_ids, or -1.
 * tap_slot:    position of l in dspark_target_layer_ids, or -1.
 */
typedef struct {
    int ratio;
    engine_layer_kind_t kind;
    uint32_t flags;
    int kv_src;
    int idx_src;
    int engram_slot;
    int tap_slot;
} engine_layer_role_t;

/*
 * engine_config_t - every field of MODEL.md section 2 plus the roles derived from them.
 *
 * Field names are the nested release names (flat aliases are mapped on load). Integers are
 * int64_t, flags (JSON booleans) are int 0/1, lists hold their entry count in n_<list>. The
 * "derived" block is computed by every constructor (load, from_json, preset) and never read from
 * JSON. Plain data: copy it freely; no pointers. A value produced by this module always passed
 * every load-time check of MODEL.md section 2.
 */
typedef struct {
    /* top level */
    char architectures[ENGINE_CONFIG_NAME_BYTES]; /* "DeepseekV41ForCausalLM" */
    char model_type[ENGINE_CONFIG_NAME_BYTES];    /* "deepseek_v41" */
    char dtype[ENGINE_CONFIG_NAME_BYTES];         /* "bfloat16" (flat layout: "fp8"), as written */
    int64_t bos_token_id;                         /* 0 */
    int64_t eos_token_id;                         /* 1 */
    int64_t pad_token_id;                         /* 2 */
    int64_t image_token_id;                       /* 129264; reserved, rejected by the router */

    /* quantization_config (falls back to the top level, as the flat layout has them) */
    char quant_method[ENGINE_CONFIG_NAME_BYTES];      /* "fp8" */
    char activation_scheme[ENGINE_CONFIG_NAME_BYTES]; /* "dynamic" */
    int n_weight_block_size;
    int64_t weight_block_size[2];                /* [32, 32] */
    char scale_fmt[ENGINE_CONFIG_NAME_BYTES];    /* "ue8m0" */
    char expert_dtype[ENGINE_CONFIG_NAME_BYTES]; /* "fp4" */

    /* text_config */
    char text_model_type[ENGINE_CONFIG_NAME_BYTES]; /* "deepseek_v41_text" */
    int64_t vocab_size;                             /* V */
    int64_t hidden_size;                            /* H */
    int64_t num_hidden_layers;                      /* L, backbone only */
    int64_t num_attention_heads;                    /* n_h */
    int64_t num_key_value_heads;                    /* 1: one shared latent */
    int64_t head_dim;                               /* d: latent is K and V */
    int64_t qk_rope_head_dim;                       /* d_r: RoPE on the last d_r dims */
    int64_t q_lora_rank;                            /* r_q */
    int64_t o_groups;                               /* G */
    int64_t o_lora_rank;                            /* r_o */
    char hidden_act[ENGINE_CONFIG_NAME_BYTES];      /* "silu" */
    double swiglu_limit;                            /* clamp lambda */
    double rms_norm_eps;                            /* eps of every RMSNorm and mHC/Engram rsqrt */
    int64_t max_position_embeddings;                /* context limit, tokens */
    double rope_theta;                              /* theta of ratio-0 layers and DSpark blocks */
    double compress_rope_theta;                     /* theta of ratio>0 layers */
    engine_rope_scaling_t rope_scaling;             /* YaRN of ratio>0 layers */
    int64_t sliding_window;                         /* W, tokens */
    int n_compress_ratios;                          /* <= L + n_d; missing entries are 0 */
    int64_t compress_ratios[ENGINE_CONFIG_MAX_LAYERS];
    int n_kv_source_layer_ids;
    int64_t kv_source_layer_ids[ENGINE_CONFIG_MAX_LAYERS];
    int n_index_source_layer_ids;
    int64_t index_source_layer_ids[ENGINE_CONFIG_MAX_LAYERS];
    int64_t index_n_heads;                       /* H_I */
    int64_t index_head_dim;                      /* d_I */
    int64_t index_topk;                          /* k_I */
    int64_t candidate_source_layer_id;           /* pool publisher */
    int64_t candidate_topk_blocks;               /* n_B */
    int64_t candidate_block_size;                /* B_c, rows */
    int64_t n_routed_experts;                    /* E */
    int64_t n_shared_experts;                    /* 1 */
    int64_t num_experts_per_tok;                 /* K */
    int64_t moe_intermediate_size;               /* I */
    char scoring_func[ENGINE_CONFIG_NAME_BYTES]; /* "sqrtsoftplus" */
    char topk_method[ENGINE_CONFIG_NAME_BYTES];  /* "noaux_tc" */
    int norm_topk_prob;                          /* 1 (true) */
    double routed_scaling_factor;                /* rho */
    int64_t hc_mult;                             /* m, mHC streams */
    int64_t hc_sinkhorn_iters;
    double hc_eps; /* eps_hc */
    int n_engram_layer_ids;
    int64_t engram_layer_ids[ENGINE_CONFIG_MAX_ENGRAM_LAYERS];
    int n_engram_num_embeddings;
    int64_t engram_num_embeddings[ENGINE_CONFIG_MAX_ENGRAM_LAYERS]; /* R_l, table rows */
    int64_t engram_max_ngram_size;                                  /* N */
    int64_t engram_n_heads;                                         /* h_e */
    int64_t engram_head_dim;                                        /* d_e */
    int64_t engram_vocab_size;                                      /* prime search start */
    int64_t engram_pad_token_id;
    int64_t engram_compressed_vocab_size; /* V_c */
    int64_t num_nextn_predict_layers;     /* n_d, DSpark blocks */
    int64_t dspark_block_size;            /* B, tokens */
    int64_t dspark_noise_token_id;
    int n_dspark_target_layer_ids; /* n_t taps */
    int64_t dspark_target_layer_ids[ENGINE_CONFIG_MAX_LAYERS];
    int64_t dspark_markov_rank;         /* r_m */
    int64_t dspark_n_routed_experts;    /* E_d */
    int64_t dspark_num_experts_per_tok; /* K_d */
    int tie_word_embeddings;            /* 0 (false) */

    /* derived (MODEL.md section 2, "Derived roles") */
    int n_layers; /* L */
    int n_blocks; /* n_d; DSpark block k is roles[L + k] */
    int n_roles;  /* L + n_d */
    int ced_cut;  /* c = max(kv_source_layer_ids) */
    engine_layer_role_t roles[ENGINE_CONFIG_MAX_LAYERS];
} engine_config_t;

/*
 * engine_config_load - read and check the config.json at `path`, or the config.json inside the
 * checkpoint directory `path`.
 *
 * Returns TDM_OK with *cfg_out filled, or with *cfg_out untouched and one line naming the file and
 * field in err (err_bytes, may be 0):
 *   TDM_ERR_INVALID_ARG  path or cfg_out is NULL
 *   TDM_ERR_NOT_FOUND    no such file or directory (or the directory has no config.json)
 *   TDM_ERR_IO           unreadable
 *   TDM_ERR_FORMAT       not JSON, or a field of the wrong JSON type
 *   TDM_ERR_MISMATCH     a field with a wrong value or a failed section 2 check
 * Thread-safe (no shared state). Source: MODEL.md sections 2 and 12.1.
 */
tdm_status_t engine_config_load(const char *path, engine_config_t *cfg_out, char *err,
                                size_t err_bytes);

/*
 * engine_config_from_json - fill *cfg_out from a parsed config.json (borrowed).
 *
 * Layout: fields come from `text_config`, falling back to the top level; a field may appear under
 * its release name or a flat inference/config.json alias (dim, n_layers, n_heads, moe_inter_dim,
 * n_activated_experts, score_func, route_scale, norm_eps, window_size, rope_head_dim,
 * original_seq_len, rope_factor, beta_fast, beta_slow, kv_source_layers, index_source_layers,
 * candidate_source_layer, n_mtp_layers, engram_pad_id, dspark_n_activated_experts); the first
 * present name in that order wins. `rope_parameters`, flat or {main, compress}, is read like
 * rope_scaling (main.rope_theta and compress.rope_theta give rope_theta and compress_rope_theta).
 * quantization_config fields fall back to the top level. JSON null counts as missing; a missing
 * field takes the full-size value (MODEL.md 12.1); unknown keys and vision_config are ignored.
 *
 * Errors (*cfg_out untouched; err gets "config.json: <field path>: <reason>", e.g.
 * "config.json: text_config.compress_ratios[3]: ratio 3 not in {0,1,2}"):
 *   TDM_ERR_INVALID_ARG  root or cfg_out is NULL
 *   TDM_ERR_FORMAT       root, text_config or quantization_config not an object; a field of the
 *                        wrong JSON type (integers may be written as integral reals)
 *   TDM_ERR_MISMATCH     a value out of range or any load-time check of section 2 (ratios, kv_src
 *                        and idx_src, candidate pool, DSpark ratio 0, multiples of 32, d_r,
 *                        G | n_h, one KV head, Engram prime sums, token ids < V, ...), and the
 *                        top-level checks (architectures, model_type, dtype, quantization_config)
 */
tdm_status_t engine_config_from_json(const json_t *root, engine_config_t *cfg_out, char *err,
                                     size_t err_bytes);

/*
 * engine_config_preset - the test configuration `name` ("tiny", "small" or "full") of MODEL.md
 * section 9 (fields the table does not list equal full), roles derived.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG for another name or NULL (*cfg_out untouched).
 */
tdm_status_t engine_config_preset(const char *name, engine_config_t *cfg_out);

/*
 * engine_config_to_json - the nested release layout of *cfg: top-level architectures,
 * model_type, dtype, bos/eos/pad ids, image_token_id, quantization_config and text_config (every
 * section 2 field under its release name, rope_scaling as an object); no vision_config, no derived
 * roles. engine_config_from_json() of the result gives back *cfg exactly.
 *
 * Returns a new reference (caller json_decref()s it), or NULL when out of memory.
 */
json_t *engine_config_to_json(const engine_config_t *cfg);

/*
 * engine_config_n_c - n_c(t) = floor((t+1)/r): the compressed rows visible to the query at
 * position t (tokens from 0) of `layer`, r = the layer's ratio (MODEL.md 5.3). 0 for ratio 0
 * layers, DSpark blocks, t < 0, or a layer outside 0..n_roles-1. For a sequence of length n the
 * rows a source holds are engine_config_n_c(cfg, source, n - 1).
 */
int64_t engine_config_n_c(const engine_config_t *cfg, int layer, int64_t t);

/*
 * engine_config_kv_row_bytes - bytes of one compressed KV row: main row d/2 E2M1 + d/16 E4M3
 * scales, index key d_I/2 E2M1 + d_I/32 UE8M0 (MODEL.md 7; full 356, small 106, tiny 53).
 */
int64_t engine_config_kv_row_bytes(const engine_config_t *cfg);

/*
 * engine_config_max_kv_ratio - the largest compression ratio among the KV sources, 1 when there
 * is none: the max_ratio of kern_kv_geometry (kernels/kv_page.h), whose tokens_per_block and
 * page_bytes the workers register and the router checks (docs/PROTOCOL.md, page_format).
 */
uint32_t engine_config_max_kv_ratio(const engine_config_t *cfg);

/* Longest engine_config_kv_layout text, bytes with the NUL. */
#define ENGINE_CONFIG_KV_LAYOUT_BYTES 96u

/*
 * engine_config_kv_layout - the name of the KV page layout of `cfg`, which the two ends of a page
 * put must share (Register.kv_layout, compared by the router like the page format; issue 16):
 * "tandem-kv1:src=S,idx=I,rows=64,row=B,map=XXXXXXXXXXXXXXXX" with S KV sources, I index
 * sources, B bytes per row and map the XXH3-64 of every KV source's (layer, ratio) and every
 * index source's layer, in config order (the order of a reservation's page lists). Written into
 * out[0, out_bytes) (at least ENGINE_CONFIG_KV_LAYOUT_BYTES), always NUL-terminated.
 */
void engine_config_kv_layout(const engine_config_t *cfg, char *out, size_t out_bytes);

/*
 * engine_config_max_tokens_in_pages - the longest sequence (tokens) whose compressed KV fits in
 * n_pages pages of 64 rows: the largest T <= limit with sum over KV sources of
 * ceil(rows(T) / 64) <= n_pages, rows(T) = engine_config_n_c(source, T - 1). What a worker
 * declares in Capacity.max_tokens. 0 when not even one token fits; `limit` when every length up
 * to it fits.
 */
uint64_t engine_config_max_tokens_in_pages(const engine_config_t *cfg, uint64_t n_pages,
                                           uint64_t limit);

/*
 * engine_config_kv_rows_per_token - sum over KV sources of 1/ratio (full 2.5, small 2.0,
 * tiny 1.5). Exact in double (ratios are 1 or 2).
 */
double engine_config_kv_rows_per_token(const engine_config_t *cfg);

/*
 * engine_config_kv_bytes_per_token - row bytes x rows per token, without page headers
 * (full 890, small 212, tiny 79.5).
 */
double engine_config_kv_bytes_per_token(const engine_config_t *cfg);

/*
 * engine_config_kv_bytes - exact bytes of the compressed KV of an n_tokens-long sequence: the sum
 * over KV sources of floor(n_tokens/ratio) rows x row bytes (no page headers). 0 for n_tokens <= 0.
 */
int64_t engine_config_kv_bytes(const engine_config_t *cfg, int64_t n_tokens);

/*
 * engine_config_ring_entry_bytes - bytes of one window-ring entry: d E4M3 + d/32 UE8M0
 * (MODEL.md 7; full 528, small 132, tiny 66).
 */
int64_t engine_config_ring_entry_bytes(const engine_config_t *cfg);

/* engine_config_ring_entries - window ring capacity C = W + B + 1 entries (MODEL.md 7, [tandem]).
 */
int64_t engine_config_ring_entries(const engine_config_t *cfg);

/*
 * engine_engram_prime_after - the smallest prime p > x (trial division by 6k+-1; x < 2^40 keeps
 * it under a millisecond). Returns 2 for x < 2. Pure function. The Engram tables' row counts are
 * sums of these primes (MODEL.md 5.6): the load-time check here and engine/engram_hash.c use it.
 */
int64_t engine_engram_prime_after(int64_t x);

/* engine_config_layer_kind_name - "swa", "full", "reindex" or "reuse"; "?" otherwise. Static. */
const char *engine_config_layer_kind_name(engine_layer_kind_t kind);

#endif
