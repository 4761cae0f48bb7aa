/* tandem-convert - make a released (Hugging Face layout) DeepSeek-V4.1-Flash checkpoint servable:
 * check config.json and every tensor against the inventory (MODEL.md sections 2 and 3; vision
 * tensors listed and skipped), print the resident memory plan (section 10), then run MODEL.md
 * 9.2's converter once: the Engram token map from tokenizer.json, the numpy multipliers, primes
 * and offsets, written as engram-hash.safetensors next to the checkpoint. --random-weights applies
 * 9.2's random-checkpoint rules instead (a tandem-mkmodel --no-sidecar checkpoint). --preset
 * prints a test or full configuration's plan without any checkpoint. --gpu adds the GPU layout
 * (plan_gpu.h): experts sharded over --gpus, KV pages, tokens and sessions per GPU, from the
 * config alone. docs/CONVERT.md, docs/DEPLOY.md section 10.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/flags.h"
#include "common/log.h"
#include "common/startup.h"
#include "engine/config.h"
#include "engine/engram_hash.h"
#include "engine/engram_tokmap.h"
#include "engine/inventory.h"
#include "text/tokenizer.h"
#include "engine/weights.h"
#include "plan.h"
#include "plan_gpu.h"

#define CONVERT_ERR_BYTES  8192
#define CONVERT_PATH_BYTES 4096

/*
 * The release's vision tower (vision.*, aligner.*, image_*): 485,268,480 BF16 parameters in 266
 * tensors (MODEL.md section 10, docs/MODEL-NOTES.md 1). text_config does not describe it, so only
 * --preset full uses these figures; a checkpoint's own vision tensors are counted from its files.
 */
#define CONVERT_RELEASE_VISION_PARAMS  485268480LL
#define CONVERT_RELEASE_VISION_TENSORS 266LL

#define CONVERT_GB 1e9

typedef struct {
    const char *model_dir;
    const char *preset;
    int random_weights;
    int plan_only;
    int force;
    uint32_t n_pages;
    const char *gpu;
    uint32_t n_gpus;
    uint32_t group_gpus;
    uint32_t n_prefill_groups;
    uint64_t context_tokens;
    double reserve_gb;
    double cuda_reserve_gb;
    const char *log_level;
} convert_cfg_t;

static const tdm_flag_t convert_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(convert_cfg_t, model_dir),
     "checkpoint directory (config.json, model.safetensors.index.json + shards, tokenizer.json); "
     "the sidecar is written into it",
     0, 0, 0},
    {"preset", TDM_FLAG_STRING, NULL, offsetof(convert_cfg_t, preset),
     "print the memory plan of tiny, small or full (MODEL.md 9/10) without a checkpoint; "
     "implies --plan",
     0, 0, 0},
    {"random-weights", TDM_FLAG_BOOL, "false", offsetof(convert_cfg_t, random_weights),
     "MODEL.md 9.2 random-checkpoint rules (token_map pairs, splitmix multipliers) for a "
     "tandem-mkmodel --no-sidecar checkpoint; default: the real-checkpoint rules",
     0, 0, 0},
    {"plan", TDM_FLAG_BOOL, "false", offsetof(convert_cfg_t, plan_only),
     "check and print the memory plan only; write nothing", 0, 0, 0},
    {"force", TDM_FLAG_BOOL, "false", offsetof(convert_cfg_t, force),
     "replace an existing engram-hash.safetensors", 0, 0, 0},
    {"pages", TDM_FLAG_U32, "4096", offsetof(convert_cfg_t, n_pages),
     "KV pages to size the pool of in the plan", 1, 16777216, 0},
    {"gpu", TDM_FLAG_STRING, NULL, offsetof(convert_cfg_t, gpu),
     "add the GPU layout plan for h200, b200, b300, gb200 or gb300 (config only: no shard is "
     "read); implies --plan",
     0, 0, 0},
    {"gpus", TDM_FLAG_U32, "0", offsetof(convert_cfg_t, n_gpus),
     "GPUs of the layout (0: the smallest expert-parallel group that fits)", 0, 4608, 0},
    {"group", TDM_FLAG_U32, "0", offsetof(convert_cfg_t, group_gpus),
     "GPUs per expert-parallel group, one serving instance each; divides --gpus (0: all --gpus)", 0,
     72, 0},
    {"prefill-groups", TDM_FLAG_U32, "0", offsetof(convert_cfg_t, n_prefill_groups),
     "groups that serve as prefill instances (fewer than the groups); the rest decode", 0, 4608, 0},
    {"context", TDM_FLAG_U64, "0", offsetof(convert_cfg_t, context_tokens),
     "session length in tokens to count sessions at (0: 131072 or the config's "
     "max_position_embeddings when smaller)",
     0, 1099511627776.0, 0},
    {"reserve-gb", TDM_FLAG_F64, "8", offsetof(convert_cfg_t, reserve_gb),
     "GB (1e9 B) per GPU kept for activations and workspace", 0, 10000, 0},
    {"cuda-reserve-gb", TDM_FLAG_F64, "2", offsetof(convert_cfg_t, cuda_reserve_gb),
     "GB per GPU kept for the CUDA context, NCCL buffers and cuBLASLt workspace", 0, 10000, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(convert_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* Everything main() owns; released by convert_fini. */
typedef struct {
    engine_config_t *cfg;
    engine_tensor_spec_t *specs;
    size_t n_specs;
    engine_param_counts_t counts;
    engine_weights_t *weights;
    text_tokenizer_t *tok;
    int32_t *token_map;
    int64_t *multipliers;
    plan_t plan;
    plan_gpu_t gpu_plan;
    char err[CONVERT_ERR_BYTES];
} convert_t;

static void convert_fini(convert_t *c)
{
    free(c->multipliers);
    free(c->token_map);
    text_tokenizer_destroy(c->tok);
    engine_weights_close(c->weights);
    free(c->specs);
    free(c->cfg);
}

/* Inventory and counts of c->cfg, then the plan's text part. */
static tdm_status_t build_inventory(convert_t *c, uint32_t n_pages)
{
    tdm_status_t status = engine_inventory_build(c->cfg, &c->specs, &c->n_specs);

    if (status == TDM_OK) {
        status = engine_inventory_count(c->cfg, c->specs, c->n_specs, &c->counts);
    }
    if (status == TDM_OK) {
        status = plan_init(c->cfg, &c->counts, n_pages, &c->plan);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-convert: tensor inventory: %s\n", tdm_status_message(status));
    }
    return status;
}

/*
 * --gpu: the GPU layout of c->cfg (inventory built) from the flags. --gpus 0 first finds the
 * smallest group that fits. Returns 0 (fits), 1 (does not fit: the plan says why) or 2 (flags).
 */
static int run_gpu_plan(convert_t *c, const convert_cfg_t *flags, const char *name)
{
    plan_gpu_params_t params;
    tdm_status_t status;

    plan_gpu_params_default(&params);
    params.kind = plan_gpu_kind_find(flags->gpu);
    if (params.kind == NULL) {
        fprintf(stderr, "tandem-convert: --gpu=%s: expected %s\n", flags->gpu,
                plan_gpu_kind_names());
        return 2;
    }
    params.context_tokens = (int64_t)flags->context_tokens;
    if (params.context_tokens == 0) {
        params.context_tokens = c->cfg->max_position_embeddings < PLAN_GPU_DEFAULT_CONTEXT_TOKENS
                                    ? c->cfg->max_position_embeddings
                                    : PLAN_GPU_DEFAULT_CONTEXT_TOKENS;
    }
    if (params.context_tokens > c->cfg->max_position_embeddings) {
        fprintf(stderr,
                "tandem-convert: --context=%lld: above the config's "
                "max_position_embeddings %lld\n",
                (long long)params.context_tokens, (long long)c->cfg->max_position_embeddings);
        return 2;
    }
    params.reserve_bytes = (int64_t)(flags->reserve_gb * CONVERT_GB);
    params.cuda_reserve_bytes = (int64_t)(flags->cuda_reserve_gb * CONVERT_GB);
    params.n_gpus =
        flags->n_gpus != 0 ? flags->n_gpus : (flags->group_gpus != 0 ? flags->group_gpus : 1);
    params.group_gpus = flags->group_gpus != 0 ? flags->group_gpus : params.n_gpus;
    if (flags->n_gpus == 0 && flags->group_gpus == 0) {
        /* the smallest group that fits: plan one GPU, read its minimum */
        status = plan_gpu_build(c->cfg, c->specs, c->n_specs, &params, &c->gpu_plan);
        if (status == TDM_OK && c->gpu_plan.min_group_gpus != 0) {
            params.n_gpus = c->gpu_plan.min_group_gpus;
            params.group_gpus = params.n_gpus;
        }
    }
    params.n_prefill_groups = flags->n_prefill_groups;
    if (params.group_gpus > PLAN_GPU_MAX_GROUP || params.n_gpus % params.group_gpus != 0) {
        fprintf(stderr,
                "tandem-convert: --gpus=%u --group=%u: a group is 1..%u GPUs and divides "
                "--gpus (give --group for more than %u GPUs)\n",
                params.n_gpus, params.group_gpus, PLAN_GPU_MAX_GROUP, PLAN_GPU_MAX_GROUP);
        return 2;
    }
    if (params.n_prefill_groups >= params.n_gpus / params.group_gpus) {
        fprintf(stderr, "tandem-convert: --prefill-groups=%u: leaves no decode group of the %u\n",
                params.n_prefill_groups, params.n_gpus / params.group_gpus);
        return 2;
    }
    status = plan_gpu_build(c->cfg, c->specs, c->n_specs, &params, &c->gpu_plan);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-convert: GPU plan: %s\n", tdm_status_message(status));
        return 1;
    }
    plan_gpu_print(&c->gpu_plan, name, stdout);
    fflush(stdout);
    if (!c->gpu_plan.fits) {
        fprintf(stderr, "tandem-convert: %s on %u x %s does not fit (see the plan above)\n", name,
                params.group_gpus, params.kind->name);
        return 1;
    }
    return 0;
}

/* --model with --gpu: config.json and the inventory only (no shard is opened). */
static int run_config_gpu_plan(convert_t *c, const convert_cfg_t *flags)
{
    if (engine_config_load(flags->model_dir, c->cfg, c->err, sizeof(c->err)) != TDM_OK) {
        fprintf(stderr, "tandem-convert: %s\n", c->err);
        return 1;
    }
    if (build_inventory(c, flags->n_pages) != TDM_OK) {
        return 1;
    }
    return run_gpu_plan(c, flags, flags->model_dir);
}

/* --preset: the plan from the config alone; for full also the release's skipped tensors. */
static int run_preset(convert_t *c, const convert_cfg_t *flags)
{
    if (engine_config_preset(flags->preset, c->cfg) != TDM_OK) {
        fprintf(stderr, "tandem-convert: --preset=%s: expected tiny, small or full\n",
                flags->preset);
        return 2;
    }
    if (build_inventory(c, flags->n_pages) != TDM_OK) {
        return 1;
    }
    /* ffn.gate.bias_vl [E] F32 per layer and [E_d] per block: in the release, skipped here */
    plan_add_skipped_bytes(
        &c->plan, ENGINE_DTYPE_F32,
        4 * (c->counts.bias_vl_backbone_params + c->counts.bias_vl_dspark_params),
        c->cfg->num_hidden_layers + c->cfg->num_nextn_predict_layers);
    if (strcmp(flags->preset, "full") == 0) {
        plan_add_skipped_bytes(&c->plan, ENGINE_DTYPE_BF16, 2 * CONVERT_RELEASE_VISION_PARAMS,
                               CONVERT_RELEASE_VISION_TENSORS);
    }
    printf("preset %s: %zu text tensors (no checkpoint read, nothing allocated)\n", flags->preset,
           c->n_specs);
    plan_print(&c->plan, stdout);
    if (flags->gpu != NULL) {
        return run_gpu_plan(c, flags, flags->preset);
    }
    return 0;
}

/* Config, shards, every tensor against the inventory; vision tensors counted as skipped. */
static tdm_status_t check_checkpoint(convert_t *c, const convert_cfg_t *flags)
{
    tdm_status_t status;

    status = engine_config_load(flags->model_dir, c->cfg, c->err, sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    tdm_log(TDM_LOG_INFO, "convert", "config read: layers=%lld vocab=%lld engram_layers=%d",
            (long long)c->cfg->num_hidden_layers, (long long)c->cfg->vocab_size,
            c->cfg->n_engram_layer_ids);
    status = build_inventory(c, flags->n_pages);
    if (status != TDM_OK) {
        snprintf(c->err, sizeof(c->err), "tensor inventory failed");
        return status;
    }
    status = engine_weights_open(flags->model_dir, &c->weights, c->err, sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    tdm_log(TDM_LOG_INFO, "convert", "shards mapped: shards=%zu tensors=%zu bytes=%llu",
            engine_weights_n_shards(c->weights), engine_weights_n_tensors(c->weights),
            (unsigned long long)engine_weights_total_bytes(c->weights));
    status = engine_weights_check(c->weights, c->specs, c->n_specs, c->err, sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    for (size_t i = 0; i < engine_weights_n_tensors(c->weights); i++) {
        const engine_st_tensor_t *tensor = engine_weights_tensor_at(c->weights, i);
        if (engine_weights_name_is_vision(tensor->name)) {
            tdm_log(TDM_LOG_DEBUG, "convert", "skipped: tensor=%s bytes=%zu", tensor->name,
                    tensor->n_bytes);
            plan_add_skipped(&c->plan, tensor);
        }
    }
    tdm_log(TDM_LOG_INFO, "convert", "inventory ok: tensors=%zu skipped=%lld (vision, bias_vl)",
            c->n_specs, (long long)c->plan.n_skipped);
    return TDM_OK;
}

/* Token map and multipliers by the rule the flags select (MODEL.md 9.2). */
static tdm_status_t make_sidecar_arrays(convert_t *c, const convert_cfg_t *flags,
                                        int64_t *n_compressed_out)
{
    char path[CONVERT_PATH_BYTES];
    size_t n_mult = (size_t)c->cfg->n_engram_layer_ids * (size_t)c->cfg->engram_max_ngram_size;
    tdm_status_t status;

    snprintf(path, sizeof(path), "%s/tokenizer.json", flags->model_dir);
    status = text_tokenizer_load_hf(path, &c->tok, c->err, sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    c->token_map = malloc((size_t)c->cfg->vocab_size * sizeof(int32_t));
    c->multipliers = malloc(n_mult * sizeof(int64_t) + 1);
    if (c->token_map == NULL || c->multipliers == NULL) {
        snprintf(c->err, sizeof(c->err), "out of memory for the token map");
        return TDM_ERR_NO_MEMORY;
    }
    if (flags->random_weights) {
        engine_engram_random_token_map(c->cfg->vocab_size, c->token_map);
        engine_engram_random_multipliers(c->cfg, c->multipliers);
        *n_compressed_out = engine_engram_random_vocab(c->cfg->vocab_size);
        return TDM_OK;
    }
    tdm_log(TDM_LOG_INFO, "convert", "building token map: tokenizer_ids=%u vocab=%lld",
            text_tokenizer_n_vocab(c->tok), (long long)c->cfg->vocab_size);
    status = engine_engram_token_map_build(c->tok, c->cfg, c->token_map, n_compressed_out, c->err,
                                           sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    if (*n_compressed_out != c->cfg->engram_compressed_vocab_size) {
        snprintf(c->err, sizeof(c->err),
                 "%s: the token map has %lld compressed ids but config.json "
                 "engram_compressed_vocab_size is %lld (MODEL.md 9.2; a tandem-mkmodel "
                 "checkpoint needs --random-weights)",
                 path, (long long)*n_compressed_out,
                 (long long)c->cfg->engram_compressed_vocab_size);
        return TDM_ERR_MISMATCH;
    }
    engine_engram_release_multipliers(c->cfg, c->multipliers);
    return TDM_OK;
}

/* Build, write and read back engram-hash.safetensors. */
static tdm_status_t write_sidecar(convert_t *c, const convert_cfg_t *flags)
{
    char path[CONVERT_PATH_BYTES];
    char sha256[ENGINE_ENGRAM_SHA256_HEX_BYTES];
    engine_engram_sidecar_t check;
    int64_t n_compressed = 0;
    tdm_status_t status;

    snprintf(path, sizeof(path), "%s/%s", flags->model_dir, ENGINE_ENGRAM_SIDECAR_FILE);
    if (!flags->force && access(path, F_OK) == 0) {
        snprintf(c->err, sizeof(c->err), "%s exists (--force replaces it)", path);
        return TDM_ERR_INVALID_ARG;
    }
    status = make_sidecar_arrays(c, flags, &n_compressed);
    if (status != TDM_OK) {
        return status;
    }
    tdm_log(TDM_LOG_INFO, "convert", "token map: rule=%s compressed_vocab=%lld",
            flags->random_weights ? "random" : "release", (long long)n_compressed);
    snprintf(path, sizeof(path), "%s/tokenizer.json", flags->model_dir);
    status = engine_engram_file_sha256(path, sha256, c->err, sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    status = engine_engram_sidecar_write(
        flags->model_dir, c->cfg, c->token_map, n_compressed, c->multipliers, sha256,
        flags->random_weights ? "tandem-convert random-weights" : "tandem-convert release", c->err,
        sizeof(c->err));
    if (status != TDM_OK) {
        return status;
    }
    memset(&check, 0, sizeof(check));
    status = engine_engram_sidecar_load(flags->model_dir, c->cfg, &check, c->err, sizeof(c->err));
    engine_engram_sidecar_fini(&check);
    if (status != TDM_OK) {
        return status;
    }
    printf("wrote %s/%s: rule=%s token_map=[%lld] compressed_vocab_size=%lld "
           "tokenizer_sha256=%s\n",
           flags->model_dir, ENGINE_ENGRAM_SIDECAR_FILE,
           flags->random_weights ? "random" : "release", (long long)c->cfg->vocab_size,
           (long long)n_compressed, sha256);
    for (int i = 0; i < c->cfg->n_engram_layer_ids; i++) {
        printf("  layer %lld multipliers", (long long)c->cfg->engram_layer_ids[i]);
        for (int64_t s = 0; s < c->cfg->engram_max_ngram_size; s++) {
            printf(
                " %lld",
                (long long)
                    c->multipliers[(size_t)i * (size_t)c->cfg->engram_max_ngram_size + (size_t)s]);
        }
        printf("\n");
    }
    return TDM_OK;
}

int main(int argc, char **argv)
{
    static const tdm_main_spec_t spec = {
        "tandem-convert",
        "Check a DeepSeek-V4.1-Flash checkpoint in the release layout, print its resident memory "
        "plan and write its Engram sidecar engram-hash.safetensors once (MODEL.md 9.2; "
        "docs/CONVERT.md). --gpu prints the layout on a GPU set from the config alone "
        "(docs/DEPLOY.md section 10).",
        convert_flags, sizeof(convert_flags) / sizeof(convert_flags[0]),
        offsetof(convert_cfg_t, log_level)};
    convert_cfg_t flags;
    tdm_flags_action_t action;
    convert_t c;
    tdm_status_t status;
    int exit_code = 1;

    memset(&flags, 0, sizeof(flags));
    memset(&c, 0, sizeof(c));
    if (tdm_main_start(&spec, argc, argv, &flags, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    if ((flags.model_dir == NULL) == (flags.preset == NULL)) {
        fprintf(stderr, "tandem-convert: give exactly one of --model DIR or --preset NAME\n");
        return 2;
    }
    c.cfg = calloc(1, sizeof(*c.cfg));
    if (c.cfg == NULL) {
        return 1;
    }
    if (flags.preset != NULL) {
        exit_code = run_preset(&c, &flags);
        goto out;
    }
    if (flags.gpu != NULL) {
        exit_code = run_config_gpu_plan(&c, &flags);
        goto out;
    }

    status = check_checkpoint(&c, &flags);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-convert: %s\n", c.err);
        goto out;
    }
    plan_print(&c.plan, stdout);
    fflush(stdout);
    if (flags.plan_only) {
        exit_code = 0;
        goto out;
    }
    if (c.cfg->n_engram_layer_ids == 0) {
        printf("no Engram layers: no sidecar needed\n");
        exit_code = 0;
        goto out;
    }
    status = write_sidecar(&c, &flags);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-convert: %s\n", c.err);
        goto out;
    }
    exit_code = 0;
out:
    convert_fini(&c);
    return exit_code;
}
