/* tandem-mkmodel - write a random-weight DeepSeek-V4.1-Flash checkpoint of a test preset in the
 * release layout (MODEL.md section 9): nested config.json, bare tensor names, FP8 dense weights
 * with UE8M0 32x32 scales, packed MXFP4 experts, BF16/F32 tensors, sharded safetensors plus
 * model.safetensors.index.json, the Engram sidecar (unless --no-sidecar) and tokenizer.json. Same
 * seed, same bytes.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/log.h"
#include "common/startup.h"
#include "engine/config.h"
#include "engine/engram_hash.h"
#include "engine/inventory.h"
#include "engine/safetensors.h"
#include "engine/sanity.h"
#include "text/tokenizer.h"
#include "engine/weights.h"
#include "init.h"
#include "kernels/codec.h"

#define MKMODEL_ERR_BYTES 512
#define MKMODEL_PATH_BYTES 4096
#define MKMODEL_MIB (1024ULL * 1024ULL)

typedef struct {
    const char *preset;
    uint64_t seed;
    const char *out_dir;
    const char *tokenizer_path;
    uint64_t shard_mib;
    int no_sidecar;
    const char *log_level;
} mkmodel_cfg_t;

static const tdm_flag_t mkmodel_flags[] = {
    {"preset", TDM_FLAG_STRING, "tiny", offsetof(mkmodel_cfg_t, preset),
     "test configuration: tiny or small (MODEL.md section 9)", 0, 0, 0},
    {"seed", TDM_FLAG_U64, "1", offsetof(mkmodel_cfg_t, seed), "random seed of the weights", 0, 0,
     0},
    {"out", TDM_FLAG_PATH, NULL, offsetof(mkmodel_cfg_t, out_dir),
     "checkpoint directory to write (created)", 0, 0, 1},
    {"tokenizer", TDM_FLAG_PATH, NULL, offsetof(mkmodel_cfg_t, tokenizer_path),
     "tokenizer.json to copy (default: a synthetic byte-level BPE of the preset's vocab)", 0, 0,
     0},
    {"shard-mib", TDM_FLAG_U64, "64", offsetof(mkmodel_cfg_t, shard_mib),
     "largest safetensors shard, MiB", 1, 65536, 0},
    {"no-sidecar", TDM_FLAG_BOOL, "false", offsetof(mkmodel_cfg_t, no_sidecar),
     "leave out engram-hash.safetensors (the checkpoint is checked with it, then it is removed): "
     "a release-layout checkpoint for tandem-convert --random-weights",
     0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(mkmodel_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* The tensors written so far; each owns its name and data. */
typedef struct {
    engine_st_tensor_t *tensors;
    size_t n_tensors;
    size_t capacity;
    uint64_t total_bytes;
} tensor_list_t;

static void tensor_list_fini(tensor_list_t *list)
{
    for (size_t i = 0; i < list->n_tensors; i++) {
        free((void *)list->tensors[i].name);
        free((void *)list->tensors[i].data);
    }
    free(list->tensors);
    memset(list, 0, sizeof(*list));
}

/* Takes ownership of `data` (freed on failure too). */
static tdm_status_t tensor_list_add(tensor_list_t *list, const engine_tensor_spec_t *spec,
                                    const char *name, void *data, size_t n_bytes)
{
    engine_st_tensor_t *tensor;

    if (list->n_tensors == list->capacity) {
        engine_st_tensor_t *grown = tdm_array_grow(list->tensors, sizeof(*grown),
                                                   list->n_tensors + 1, 1024, &list->capacity);
        if (grown == NULL) {
            free(data);
            return TDM_ERR_NO_MEMORY;
        }
        list->tensors = grown;
    }
    tensor = &list->tensors[list->n_tensors];
    memset(tensor, 0, sizeof(*tensor));
    tensor->name = strdup(name);
    if (tensor->name == NULL) {
        free(data);
        return TDM_ERR_NO_MEMORY;
    }
    tensor->dtype = spec->dtype;
    tensor->n_dims = spec->n_dims;
    memcpy(tensor->shape, spec->shape, sizeof(tensor->shape));
    tensor->data = data;
    tensor->n_bytes = n_bytes;
    list->n_tensors++;
    list->total_bytes += n_bytes;
    return TDM_OK;
}

static size_t spec_elements(const engine_tensor_spec_t *spec)
{
    size_t n = 1;
    for (int d = 0; d < spec->n_dims; d++) {
        n *= (size_t)spec->shape[d];
    }
    return n;
}

static const engine_tensor_spec_t *find_spec(const engine_tensor_spec_t *specs, size_t n_specs,
                                             const char *name)
{
    for (size_t i = 0; i < n_specs; i++) {
        if (strcmp(specs[i].name, name) == 0) {
            return &specs[i];
        }
    }
    return NULL;
}

/* "<module>.weight" -> "<module>.scale" (MODEL.md 12.2). */
static int scale_name_of(const char *weight_name, char *out, size_t out_bytes)
{
    size_t n = strlen(weight_name);
    const char *suffix = ".weight";
    size_t n_suffix = strlen(suffix);

    if (n < n_suffix || strcmp(weight_name + n - n_suffix, suffix) != 0 ||
        n - n_suffix + strlen(".scale") + 1 > out_bytes) {
        return 0;
    }
    memcpy(out, weight_name, n - n_suffix);
    strcpy(out + n - n_suffix, ".scale");
    return 1;
}

/*
 * Draw one weight tensor per its 9.1 rule and store it in the spec's format: BF16, F32, FP8
 * with its 32x32 scale, packed MXFP4 with its per-(row, 32) scale, or Engram Q_act8 rows.
 */
static tdm_status_t generate_tensor(const engine_config_t *cfg, uint64_t seed,
                                    const engine_tensor_spec_t *spec,
                                    const engine_tensor_spec_t *specs, size_t n_specs,
                                    tensor_list_t *list, char *err, size_t err_bytes)
{
    char scale_name[ENGINE_TENSOR_NAME_BYTES + 8];
    const engine_tensor_spec_t *scale_spec = NULL;
    int64_t n_out = spec->n_dims >= 1 ? spec->shape[0] : 1;
    int64_t n_in = spec->n_dims >= 2 ? spec->shape[1] : 1;
    size_t n_values;
    init_rule_t rule;
    float *values;
    void *data = NULL;
    void *scale = NULL;
    size_t n_bytes = 0;
    size_t n_scale_bytes = 0;
    tdm_status_t status;

    if (spec->flags & ENGINE_SPEC_FP4_PACKED) {
        n_in *= 2; /* [out, in/2] bytes hold [out, in] values */
    }
    if (spec->n_dims > 2) {
        snprintf(err, err_bytes, "%s: %d-D weight not supported by the generator", spec->name,
                 spec->n_dims);
        return TDM_ERR_UNSUPPORTED;
    }
    status = init_rule_for(cfg, spec->name, spec->n_dims >= 2 ? n_in : 1, &rule);
    if (status != TDM_OK) {
        snprintf(err, err_bytes, "%s: no initialisation rule (MODEL.md 9.1)", spec->name);
        return status;
    }
    if (spec->dtype == ENGINE_DTYPE_F8_E4M3 || (spec->flags & ENGINE_SPEC_FP4_PACKED)) {
        if (!scale_name_of(spec->name, scale_name, sizeof(scale_name)) ||
            (scale_spec = find_spec(specs, n_specs, scale_name)) == NULL) {
            snprintf(err, err_bytes, "%s: quantized weight without a .scale in the inventory",
                     spec->name);
            return TDM_ERR_INTERNAL;
        }
    }

    n_values = (size_t)n_out * (size_t)n_in;
    values = malloc(n_values * sizeof(float));
    if (values == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    init_fill(&rule, seed, spec->name, values, (int64_t)n_values);

    if (scale_spec != NULL) {
        n_scale_bytes = spec_elements(scale_spec);
        scale = malloc(n_scale_bytes);
    }
    n_bytes = spec_elements(spec) * engine_dtype_size_bytes(spec->dtype);
    data = malloc(n_bytes);
    if (data == NULL || (scale_spec != NULL && scale == NULL)) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free;
    }

    if (spec->flags & ENGINE_SPEC_FP4_PACKED) {
        status = kern_weight_mxfp4_quantize(values, n_out, n_in, data, scale);
    } else if (spec->dtype == ENGINE_DTYPE_F8_E4M3 && strstr(spec->name, "engram.embed") != NULL) {
        /* Engram rows: Q_act8 per (row, 32 columns) (MODEL.md 12.7). */
        status = kern_quant_act8_cpu(NULL, values, n_out, n_in, data, scale);
    } else if (spec->dtype == ENGINE_DTYPE_F8_E4M3) {
        status = kern_weight_fp8_quantize(values, n_out, n_in, data, scale);
    } else if (spec->dtype == ENGINE_DTYPE_BF16) {
        uint16_t *bf16 = data;
        for (size_t i = 0; i < n_values; i++) {
            bf16[i] = kern_bf16_from_f32(values[i]);
        }
        status = TDM_OK;
    } else if (spec->dtype == ENGINE_DTYPE_F32) {
        memcpy(data, values, n_bytes);
        status = TDM_OK;
    } else {
        snprintf(err, err_bytes, "%s: dtype %s not generated", spec->name,
                 engine_dtype_name(spec->dtype));
        status = TDM_ERR_UNSUPPORTED;
    }
    if (status != TDM_OK) {
        goto err_free;
    }
    free(values);
    values = NULL;

    status = tensor_list_add(list, spec, spec->name, data, n_bytes);
    data = NULL;
    if (status == TDM_OK && scale_spec != NULL) {
        status = tensor_list_add(list, scale_spec, scale_spec->name, scale, n_scale_bytes);
        scale = NULL;
    }
err_free:
    free(scale);
    free(data);
    free(values);
    return status;
}

static tdm_status_t copy_file(const char *from, const char *to)
{
    unsigned char buf[65536];
    FILE *in = fopen(from, "rb");
    FILE *out;
    size_t n;
    tdm_status_t status = TDM_OK;

    if (in == NULL) {
        tdm_log(TDM_LOG_ERROR, "mkmodel", "cannot open tokenizer: path=%s error=%s", from,
                strerror(errno));
        return TDM_ERR_IO;
    }
    out = fopen(to, "wb");
    if (out == NULL) {
        tdm_log(TDM_LOG_ERROR, "mkmodel", "cannot create file: path=%s error=%s", to,
                strerror(errno));
        fclose(in);
        return TDM_ERR_IO;
    }
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            status = TDM_ERR_IO;
            break;
        }
    }
    if (fclose(out) != 0) {
        status = TDM_ERR_IO;
    }
    fclose(in);
    return status;
}

/* Write engram-hash.safetensors (MODEL.md 9.2, random checkpoints). */
static tdm_status_t write_engram_sidecar(const engine_config_t *cfg, const char *dir,
                                         const char *tokenizer_sha256, uint64_t seed, char *err,
                                         size_t err_bytes)
{
    char origin[128];
    int32_t *token_map = malloc((size_t)cfg->vocab_size * sizeof(int32_t));
    int64_t *multipliers = malloc((size_t)cfg->n_engram_layer_ids *
                                  (size_t)cfg->engram_max_ngram_size * sizeof(int64_t) + 1);
    tdm_status_t status = TDM_ERR_NO_MEMORY;

    if (token_map != NULL && multipliers != NULL) {
        engine_engram_random_token_map(cfg->vocab_size, token_map);
        engine_engram_random_multipliers(cfg, multipliers);
        snprintf(origin, sizeof(origin), "tandem-mkmodel random seed=%llu",
                 (unsigned long long)seed);
        status = engine_engram_sidecar_write(dir, cfg, token_map,
                                             engine_engram_random_vocab(cfg->vocab_size),
                                             multipliers, tokenizer_sha256, origin, err,
                                             err_bytes);
    }
    free(multipliers);
    free(token_map);
    return status;
}

static tdm_status_t write_config(const engine_config_t *cfg, const char *dir)
{
    char path[MKMODEL_PATH_BYTES];
    json_t *root = engine_config_to_json(cfg);
    int rc;

    if (root == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    snprintf(path, sizeof(path), "%s/config.json", dir);
    rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0) {
        tdm_log(TDM_LOG_ERROR, "mkmodel", "cannot write config: path=%s", path);
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

/*
 * Read the written checkpoint back the way a node loads it: config.json, every tensor against
 * the inventory, the Engram sidecar and tokenizer.json. Catches a writer/loader disagreement
 * before anyone else sees the checkpoint.
 */
static tdm_status_t verify_checkpoint(const char *dir, const engine_config_t *expected,
                                      const engine_tensor_spec_t *specs, size_t n_specs,
                                      char *err, size_t err_bytes)
{
    char path[MKMODEL_PATH_BYTES];
    engine_config_t *loaded = NULL;
    engine_weights_t *weights = NULL;
    engine_engram_sidecar_t sidecar;
    text_tokenizer_t *tok = NULL;
    tdm_status_t status;

    memset(&sidecar, 0, sizeof(sidecar));
    loaded = calloc(1, sizeof(*loaded));
    if (loaded == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = engine_config_load(dir, loaded, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    if (loaded->vocab_size != expected->vocab_size || loaded->n_roles != expected->n_roles ||
        loaded->hidden_size != expected->hidden_size) {
        snprintf(err, err_bytes, "config.json read back differs from the preset");
        status = TDM_ERR_MISMATCH;
        goto out;
    }
    status = engine_weights_open(dir, &weights, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    status = engine_weights_check(weights, specs, n_specs, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    status = engine_engram_sidecar_load(dir, loaded, &sidecar, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    status = text_tokenizer_load_hf(path, &tok, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    if (text_tokenizer_n_vocab(tok) > (uint32_t)loaded->vocab_size) {
        snprintf(err, err_bytes, "tokenizer.json has %u ids but vocab_size is %lld",
                 text_tokenizer_n_vocab(tok), (long long)loaded->vocab_size);
        status = TDM_ERR_MISMATCH;
    }
out:
    text_tokenizer_destroy(tok);
    engine_engram_sidecar_fini(&sidecar);
    engine_weights_close(weights);
    free(loaded);
    return status;
}

static void print_figures(const engine_config_t *cfg, const engine_param_counts_t *counts,
                          uint64_t stored_bytes)
{
    printf("preset figures (compare MODEL.md section 9):\n");
    printf("  params backbone        %14lld  (%.2f M)\n", (long long)counts->backbone_params,
           (double)counts->backbone_params / 1e6);
    printf("  params Engram tables   %14lld  (%.2f M)\n", (long long)counts->engram_table_params,
           (double)counts->engram_table_params / 1e6);
    printf("  params DSpark          %14lld  (%.2f M)\n", (long long)counts->dspark_params,
           (double)counts->dspark_params / 1e6);
    printf("  params total           %14lld  (%.2f M)\n", (long long)counts->total_params,
           (double)counts->total_params / 1e6);
    printf("  active decode / token  %14lld  (%.1f M)\n", (long long)counts->active_decode_params,
           (double)counts->active_decode_params / 1e6);
    printf("  resident bytes         %14llu  (%.2f MB)\n", (unsigned long long)stored_bytes,
           (double)stored_bytes / 1e6);
    printf("  KV bytes per row       %14lld\n", (long long)engine_config_kv_row_bytes(cfg));
    printf("  KV rows per token      %14.2f\n", engine_config_kv_rows_per_token(cfg));
    printf("  KV bytes per token     %14.1f\n", engine_config_kv_bytes_per_token(cfg));
    printf("  window ring entry B    %14lld\n", (long long)engine_config_ring_entry_bytes(cfg));
}

static tdm_status_t make_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        tdm_log(TDM_LOG_ERROR, "mkmodel", "cannot create directory: path=%s error=%s", dir,
                strerror(errno));
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

int main(int argc, char **argv)
{
    static const tdm_main_spec_t spec = {
        "tandem-mkmodel",
        "Write a random-weight DeepSeek-V4.1-Flash test checkpoint (MODEL.md section 9) in the "
        "release layout.",
        mkmodel_flags, sizeof(mkmodel_flags) / sizeof(mkmodel_flags[0]),
        offsetof(mkmodel_cfg_t, log_level)};
    mkmodel_cfg_t flags_cfg;
    tdm_flags_action_t action;
    engine_config_t *cfg = NULL;
    engine_tensor_spec_t *specs = NULL;
    size_t n_specs = 0;
    engine_param_counts_t counts;
    tensor_list_t list = {0};
    char err[MKMODEL_ERR_BYTES] = "";
    char path[MKMODEL_PATH_BYTES];
    char tokenizer_sha256[ENGINE_ENGRAM_SHA256_HEX_BYTES];
    tdm_status_t status;
    int exit_code = 1;

    memset(&flags_cfg, 0, sizeof(flags_cfg));
    status = tdm_main_start(&spec, argc, argv, &flags_cfg, &action);
    if (status != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    if (strcmp(flags_cfg.preset, "tiny") != 0 && strcmp(flags_cfg.preset, "small") != 0) {
        fprintf(stderr, "tandem-mkmodel: --preset=%s: expected tiny or small\n",
                flags_cfg.preset);
        return 2;
    }

    cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL) {
        return 1;
    }
    status = engine_config_preset(flags_cfg.preset, cfg);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: preset %s: %s\n", flags_cfg.preset,
                tdm_status_message(status));
        goto out;
    }
    status = engine_inventory_build(cfg, &specs, &n_specs);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: tensor inventory: %s\n", tdm_status_message(status));
        goto out;
    }
    status = make_dir(flags_cfg.out_dir);
    if (status != TDM_OK) {
        goto out;
    }
    tdm_log(TDM_LOG_INFO, "mkmodel", "generating: preset=%s seed=%llu tensors=%zu out=%s",
            flags_cfg.preset, (unsigned long long)flags_cfg.seed, n_specs, flags_cfg.out_dir);

    for (size_t i = 0; i < n_specs; i++) {
        if (specs[i].flags & ENGINE_SPEC_SCALE) {
            continue; /* written with its weight */
        }
        status = generate_tensor(cfg, flags_cfg.seed, &specs[i], specs, n_specs, &list, err,
                                 sizeof(err));
        if (status != TDM_OK) {
            fprintf(stderr, "tandem-mkmodel: %s\n", err[0] != '\0' ? err : specs[i].name);
            goto out;
        }
        if ((i + 1) % 512 == 0 || i + 1 == n_specs) {
            tdm_log(TDM_LOG_INFO, "mkmodel", "progress: tensors=%zu/%zu", i + 1, n_specs);
        }
    }
    if (list.n_tensors != n_specs) {
        fprintf(stderr, "tandem-mkmodel: generated %zu tensors but the inventory has %zu\n",
                list.n_tensors, n_specs);
        status = TDM_ERR_INTERNAL;
        goto out;
    }

    status = engine_weights_write_sharded(flags_cfg.out_dir, list.tensors, list.n_tensors,
                                          (size_t)(flags_cfg.shard_mib * MKMODEL_MIB), err,
                                          sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: writing tensors: %s\n", err);
        goto out;
    }
    status = write_config(cfg, flags_cfg.out_dir);
    if (status != TDM_OK) {
        goto out;
    }

    snprintf(path, sizeof(path), "%s/tokenizer.json", flags_cfg.out_dir);
    if (flags_cfg.tokenizer_path != NULL) {
        status = copy_file(flags_cfg.tokenizer_path, path);
    } else {
        status =
            text_tokenizer_write_synthetic_hf(path, (uint32_t)cfg->vocab_size, err, sizeof(err));
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: writing tokenizer.json: %s\n", err);
        goto out;
    }
    status = engine_engram_file_sha256(path, tokenizer_sha256, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: %s\n", err);
        goto out;
    }
    status = write_engram_sidecar(cfg, flags_cfg.out_dir, tokenizer_sha256, flags_cfg.seed, err,
                                  sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: writing Engram sidecar: %s\n", err);
        goto out;
    }

    status = verify_checkpoint(flags_cfg.out_dir, cfg, specs, n_specs, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-mkmodel: the written checkpoint does not load back: %s\n", err);
        goto out;
    }
    {
        /* MODEL.md 9.1: refuse a checkpoint whose forward is not sane (files are kept) */
        engine_sanity_report_t sanity;
        status = engine_sanity_check(flags_cfg.out_dir, 1, &sanity, err, sizeof(err));
        if (status != TDM_OK) {
            fprintf(stderr, "tandem-mkmodel: %s fails the MODEL.md 9.1 sanity check: %s\n",
                    flags_cfg.out_dir, err);
            goto out;
        }
        printf("sanity (MODEL.md 9.1): max |logit| %.3f, least-used expert %lld tokens\n",
               sanity.max_abs_logit, (long long)sanity.min_expert_tokens);
    }
    status = engine_inventory_count(cfg, specs, n_specs, &counts);
    if (status != TDM_OK) {
        goto out;
    }
    printf("wrote %s: preset=%s seed=%llu tensors=%zu bytes=%llu\n", flags_cfg.out_dir,
           flags_cfg.preset, (unsigned long long)flags_cfg.seed, list.n_tensors,
           (unsigned long long)list.total_bytes);
    print_figures(cfg, &counts, list.total_bytes);
    if (flags_cfg.no_sidecar) {
        snprintf(path, sizeof(path), "%s/%s", flags_cfg.out_dir, ENGINE_ENGRAM_SIDECAR_FILE);
        if (unlink(path) != 0) {
            fprintf(stderr, "tandem-mkmodel: cannot remove %s: %s\n", path, strerror(errno));
            goto out;
        }
        printf("--no-sidecar: removed %s (tandem-convert --random-weights makes it again)\n",
               path);
    }
    exit_code = 0;

out:
    tensor_list_fini(&list);
    free(specs);
    free(cfg);
    return exit_code;
}
