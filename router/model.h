/* model.h - what the router knows of the served model: limits, special ids, tokenizer, identity.
 *
 * Owns the loaded tokenizer and the facts the router needs from config.json (context length,
 * vocabulary size, EOS/BOS and image token ids, KV page format) plus the model fingerprint and
 * the compatibility requirements workers must meet at registration. Loads no weights and knows
 * nothing of HTTP, sessions or workers. Immutable after load: any thread may read it.
 */
#ifndef TANDEM_ROUTER_MODEL_H
#define TANDEM_ROUTER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/tokenizer.h"
#include "proto/proto.h"

/* Longest served model name, bytes (no NUL). */
#define ROUTER_MODEL_NAME_BYTES 128

/* Parameters of router_model_load (plain data; strings borrowed for the call). */
typedef struct {
    const char *model_dir;   /* checkpoint directory: config.json, tokenizer.json, shards */
    const char *served_name; /* the "model" clients send; NULL: the directory's base name */
    uint32_t max_context;    /* serving limit in tokens; 0: config max_position_embeddings */
} router_model_params_t;

/* Facts about the served model (plain data, filled at load). */
typedef struct {
    char name[ROUTER_MODEL_NAME_BYTES + 1]; /* served model name */
    uint32_t n_vocab;                       /* V: valid ids are 0 .. V-1 */
    uint32_t max_context;                   /* prompt + completion tokens, at most */
    int32_t eos_id;                         /* config eos_token_id (stop token) */
    int32_t bos_id;                         /* config bos_token_id, or -1 */
    int32_t image_token_id;                 /* config image_token_id, or -1: rejected in prompts */
    uint32_t tokens_per_block;              /* prefix-cache block: 64 * max compress ratio */
    uint32_t sliding_window;                /* W, tokens */
    uint32_t context_tokens;                /* ids before H a prefill job carries: W + N - 1 */
    uint64_t fingerprint;                   /* tdm_model_fingerprint of the directory */
    uint64_t weights_digest;                /* tdm_weights_digest of the directory */
    uint32_t page_bytes;                    /* bytes of one KV page (MODEL.md 7) */
    uint32_t n_dspark_blocks;               /* n_d: 0 means requests cannot ask for DSpark */
} router_model_info_t;

/* The loaded model; opaque. */
typedef struct router_model router_model_t;

/*
 * router_model_load - read config.json and tokenizer.json of params->model_dir and compute the
 * fingerprint, the weights digest (every shard byte once; cached beside the checkpoint, see
 * tdm_weights_digest) and the KV layout name (engine_config_kv_layout). Returns TDM_OK with
 * *model_out (destroy with router_model_destroy), or TDM_ERR_INVALID_ARG (NULL argument,
 * max_context above the config's, name too long), or the error of engine_config_load /
 * text_tokenizer_load_hf / tdm_model_fingerprint / tdm_weights_digest, with one line in err
 * (err_bytes, may be 0). *model_out untouched on failure.
 */
tdm_status_t router_model_load(const router_model_params_t *params, router_model_t **model_out,
                               char *err, size_t err_bytes);

/* router_model_destroy - release the tokenizer and the model. Accepts NULL. */
void router_model_destroy(router_model_t *model);

/* router_model_info - the model's facts; borrowed, valid until destroy. */
const router_model_info_t *router_model_info(const router_model_t *model);

/* router_model_tokenizer - the tokenizer; borrowed, valid until destroy, thread-safe to use. */
const text_tokenizer_t *router_model_tokenizer(const router_model_t *model);

/*
 * router_model_compat - what a registering worker must match (proto_compat_check): this model's
 * fingerprint, weights digest, page format, KV formats, KV layout, max_context and PROTO_VERSION. Borrowed, valid until
 * destroy.
 */
const proto_compat_t *router_model_compat(const router_model_t *model);

#endif
