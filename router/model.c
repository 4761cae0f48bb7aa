#include "router/model.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/fingerprint.h"
#include "engine/config.h"
#include "kernels/kv_page.h"

#define MODEL_PATH_BYTES 4096

struct router_model {
    router_model_info_t info;
    text_tokenizer_t *tok;
    proto_compat_t compat;
    const char *kv_formats[2];
    char kv_layout[ENGINE_CONFIG_KV_LAYOUT_BYTES];
};

static tdm_status_t fill_name(const router_model_params_t *params, router_model_info_t *info,
                              char *err, size_t err_bytes)
{
    char path[MODEL_PATH_BYTES];
    const char *name = params->served_name;
    size_t n;

    if (name == NULL || name[0] == '\0') {
        snprintf(path, sizeof(path), "%s", params->model_dir);
        n = strlen(path);
        while (n > 1 && path[n - 1] == '/') {
            path[--n] = '\0';
        }
        name = basename(path);
    }
    n = strlen(name);
    if (n == 0 || n > ROUTER_MODEL_NAME_BYTES) {
        tdm_errbuf_set(err, err_bytes, "served model name must be 1..%d bytes",
                       ROUTER_MODEL_NAME_BYTES);
        return TDM_ERR_INVALID_ARG;
    }
    memcpy(info->name, name, n + 1);
    return TDM_OK;
}

static tdm_status_t fill_info(const router_model_params_t *params, const engine_config_t *cfg,
                              router_model_info_t *info, char *err, size_t err_bytes)
{
    kern_kv_geometry_t geometry;

    if (cfg->max_position_embeddings <= 0 || cfg->max_position_embeddings > UINT32_MAX) {
        tdm_errbuf_set(err, err_bytes, "config max_position_embeddings %lld out of range",
                       (long long)cfg->max_position_embeddings);
        return TDM_ERR_INVALID_ARG;
    }
    if (params->max_context > (uint64_t)cfg->max_position_embeddings) {
        tdm_errbuf_set(err, err_bytes, "max context %u exceeds the model's %lld tokens",
                       params->max_context, (long long)cfg->max_position_embeddings);
        return TDM_ERR_INVALID_ARG;
    }
    info->max_context =
        params->max_context != 0 ? params->max_context : (uint32_t)cfg->max_position_embeddings;
    info->n_vocab = (uint32_t)cfg->vocab_size;
    info->eos_id = (int32_t)cfg->eos_token_id;
    info->bos_id = cfg->bos_token_id >= 0 ? (int32_t)cfg->bos_token_id : -1;
    info->image_token_id = cfg->image_token_id >= 0 && cfg->image_token_id < cfg->vocab_size
                               ? (int32_t)cfg->image_token_id
                               : -1;
    info->sliding_window = (uint32_t)cfg->sliding_window;
    info->context_tokens =
        (uint32_t)(cfg->sliding_window +
                   (cfg->engram_max_ngram_size > 0 ? cfg->engram_max_ngram_size - 1 : 0));
    if (info->context_tokens > PROTO_MAX_CONTEXT_TOKENS) {
        info->context_tokens = PROTO_MAX_CONTEXT_TOKENS;
    }
    /* The header-only geometry (kernels/kv_page.h): the router does not link the kernels. */
    if (kern_kv_geometry((uint32_t)cfg->head_dim, (uint32_t)cfg->index_head_dim,
                         engine_config_max_kv_ratio(cfg), &geometry) != TDM_OK) {
        tdm_errbuf_set(err, err_bytes,
                       "config head_dim %lld / index_head_dim %lld give no page layout",
                       (long long)cfg->head_dim, (long long)cfg->index_head_dim);
        return TDM_ERR_INVALID_ARG;
    }
    info->page_bytes = geometry.page_bytes;
    info->tokens_per_block = geometry.tokens_per_block;
    info->n_dspark_blocks =
        cfg->num_nextn_predict_layers > 0 ? (uint32_t)cfg->num_nextn_predict_layers : 0;
    return TDM_OK;
}

tdm_status_t router_model_load(const router_model_params_t *params, router_model_t **model_out,
                               char *err, size_t err_bytes)
{
    char path[MODEL_PATH_BYTES];
    engine_config_t *cfg;
    router_model_t *model;
    tdm_status_t status;

    if (params == NULL || params->model_dir == NULL || model_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    model = calloc(1, sizeof(*model));
    cfg = calloc(1, sizeof(*cfg));
    if (model == NULL || cfg == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free;
    }
    status = engine_config_load(params->model_dir, cfg, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    status = fill_name(params, &model->info, err, err_bytes);
    if (status == TDM_OK) {
        status = fill_info(params, cfg, &model->info, err, err_bytes);
    }
    if (status != TDM_OK) {
        goto err_free;
    }
    status = tdm_model_fingerprint(params->model_dir, &model->info.fingerprint, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    /* every tensor byte, hashed once per checkpoint revision (cached beside it) */
    status = tdm_weights_digest(params->model_dir, 0, &model->info.weights_digest, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    engine_config_kv_layout(cfg, model->kv_layout, sizeof(model->kv_layout));
    snprintf(path, sizeof(path), "%s/tokenizer.json", params->model_dir);
    status = text_tokenizer_load_hf(path, &model->tok, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    model->kv_formats[0] = PROTO_KV_FORMAT_MAIN;
    model->kv_formats[1] = PROTO_KV_FORMAT_INDEX;
    model->compat.model_fingerprint = model->info.fingerprint;
    model->compat.weights_digest = model->info.weights_digest;
    model->compat.kv_layout = model->kv_layout;
    model->compat.page_format_version = KERN_KV_PAGE_VERSION;
    model->compat.page_rows = KERN_KV_PAGE_ROWS;
    model->compat.page_bytes = model->info.page_bytes;
    model->compat.tokens_per_block = model->info.tokens_per_block;
    model->compat.kv_formats = model->kv_formats;
    model->compat.n_kv_formats = 2;
    model->compat.max_context = model->info.max_context;
    model->compat.protocol_version = PROTO_VERSION;
    free(cfg);
    *model_out = model;
    return TDM_OK;

err_free:
    free(cfg);
    free(model);
    return status;
}

void router_model_destroy(router_model_t *model)
{
    if (model == NULL) {
        return;
    }
    text_tokenizer_destroy(model->tok);
    free(model);
}

const router_model_info_t *router_model_info(const router_model_t *model)
{
    return &model->info;
}

const text_tokenizer_t *router_model_tokenizer(const router_model_t *model)
{
    return model->tok;
}

const proto_compat_t *router_model_compat(const router_model_t *model)
{
    return &model->compat;
}
