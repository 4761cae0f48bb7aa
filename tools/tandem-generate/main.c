/* tandem-generate - load a DeepSeek-V4.1-Flash checkpoint, prefill a prompt, sample tokens with
 * the MODEL.md section-8 primitive and stream the text to stdout; then report prefill and decode
 * speed on stderr.
 *
 *   tandem-generate --model DIR (--prompt TEXT | --chat FILE.json | --prompt-ids 1,2,3)
 *                   --max-tokens N [--temperature X --top-p X --top-k N --min-p X --seed N]
 *                   [--schedule oracle|ced] [--dump-logits FILE] [--dump-layers DIR]
 *                   [--threads N] [--output text|ids] [--ignore-eos] [--thinking]
 *                   [--device cpu|cuda[:N]]
 *
 * Schedules (MODEL.md 6): "oracle" runs the whole prompt through every layer with window floor 0
 * (engine_fwd_prefill with ENGINE_PREFILL_TAIL_FROM_H, which is how engine_fwd_oracle computes,
 * but keeping the sequence so decode can continue it); "ced" (default) is the serving schedule,
 * CED prefill then exact decode. Either way each new token comes from engine_fwd_decode; the token
 * at position q is sampled with engine_sampler_sample(position = q), so the first generated token
 * of a T-token prompt has q = T.
 *
 * Dumps (MODEL.md 12.10): --dump-logits writes a TDLOGIT1 file whose rows are the logits
 * computed at consecutive positions: every prompt position (oracle) or the CED tail [R, T), then
 * one row per generated token (the logits computed when that token is fed at its position; the
 * last generated token is fed once more, untimed, for its row). --dump-layers writes the layer
 * directory of gen_dump.h for the same positions, with the ids of the whole fed sequence.
 * Without tokenizer.json in the model directory (or with --output ids) the generated token ids
 * are printed instead of text.
 * Exit status: 0 done, 1 runtime failure, 2 bad flags or prompt.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/startup.h"
#include "engine/config.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/seq_state.h"
#include "kernels/device.h"
#include "kernels/kv_page.h"
#include "text/tokenizer.h"
#include "gen_dump.h"
#include "gen_ep.h"
#include "gen_prompt.h"

#define GEN_PROGRAM     "tandem-generate"
#define GEN_ERR_BYTES   1024
#define GEN_PATH_BYTES  4096
#define GEN_EXIT_OK     0
#define GEN_EXIT_FAILED 1
#define GEN_EXIT_USAGE  2
#define GEN_SPARE_PAGES 4
#define GEN_MS_PER_S    1e3

typedef struct {
    const char *model_dir;
    const char *prompt;
    const char *chat_path;
    const char *prompt_ids;
    uint64_t max_tokens;
    double temperature;
    double top_p;
    uint32_t top_k;
    double min_p;
    uint64_t seed;
    const char *schedule;
    const char *dump_logits;
    const char *dump_layers;
    const char *output;
    uint32_t threads;
    const char *device;
    const char *devices;
    uint32_t chunk_tokens;
    int ignore_eos;
    int thinking;
    const char *log_level;
    const char *spec;
    const char *spec_accept;
    double spec_threshold;
} gen_cfg_t;

static const tdm_flag_t gen_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(gen_cfg_t, model_dir),
     "checkpoint directory (config.json, safetensors, tokenizer.json)", 0, 0, 1},
    {"prompt", TDM_FLAG_STRING, NULL, offsetof(gen_cfg_t, prompt),
     "prompt text (BOS prepended; special-token text is parsed)", 0, 0, 0},
    {"chat", TDM_FLAG_PATH, NULL, offsetof(gen_cfg_t, chat_path),
     "JSON list of {role, content} messages, DeepSeek chat encoding", 0, 0, 0},
    {"prompt-ids", TDM_FLAG_STRING, NULL, offsetof(gen_cfg_t, prompt_ids),
     "prompt token ids: 1,2,3 or @FILE", 0, 0, 0},
    {"max-tokens", TDM_FLAG_U64, "64", offsetof(gen_cfg_t, max_tokens),
     "tokens to generate (0: prefill only)", 0, 1048576, 0},
    {"temperature", TDM_FLAG_F64, "0", offsetof(gen_cfg_t, temperature),
     "sampling temperature; below 1e-5 (0 included) = greedy", 0, 1000, 0},
    {"top-p", TDM_FLAG_F64, "1", offsetof(gen_cfg_t, top_p), "nucleus mass; 1 = off", 1e-9, 1, 0},
    {"top-k", TDM_FLAG_U32, "0", offsetof(gen_cfg_t, top_k), "keep the k best tokens; 0 = off", 0,
     0, 0},
    {"min-p", TDM_FLAG_F64, "0", offsetof(gen_cfg_t, min_p), "keep p >= min-p * p_max; 0 = off", 0,
     1, 0},
    {"seed", TDM_FLAG_U64, "0", offsetof(gen_cfg_t, seed), "64-bit sampling seed (Philox key)", 0,
     0, 0},
    {"schedule", TDM_FLAG_STRING, "ced", offsetof(gen_cfg_t, schedule),
     "prefill schedule: oracle or ced (MODEL.md 6)", 0, 0, 0},
    {"dump-logits", TDM_FLAG_PATH, NULL, offsetof(gen_cfg_t, dump_logits),
     "write the logits as TDLOGIT1 (MODEL.md 12.10)", 0, 0, 0},
    {"dump-layers", TDM_FLAG_PATH, NULL, offsetof(gen_cfg_t, dump_layers),
     "write per-layer dumps and manifest.json into this directory (MODEL.md 12.10)", 0, 0, 0},
    {"output", TDM_FLAG_STRING, "text", offsetof(gen_cfg_t, output),
     "what streams to stdout: text (UTF-8 safe) or ids (space-separated token ids)", 0, 0, 0},
    {"threads", TDM_FLAG_U32, "0", offsetof(gen_cfg_t, threads),
     "kernel threads; 0 = every online CPU", 0, 1024, 0},
    {"device", TDM_FLAG_STRING, "cpu", offsetof(gen_cfg_t, device),
     "where the kernels, weights and KV pages live: cpu, cuda or cuda:N (guard: the checking "
     "backend of kernels/guard.h; kernels/device.h)",
     0, 0, 0},
    {"devices", TDM_FLAG_STRING, NULL, offsetof(gen_cfg_t, devices),
     "expert parallel: split the routed experts over these devices, e.g. 0,1 (CUDA with NCCL) "
     "or cpu,cpu (a CPU rehearsal); replaces --device (engine/ep.h)",
     0, 0, 0},
    {"chunk-tokens", TDM_FLAG_U32, "256", offsetof(gen_cfg_t, chunk_tokens),
     "prefill chunk: most tokens one layer pass takes", 1, 65536, 0},
    {"ignore-eos", TDM_FLAG_BOOL, "false", offsetof(gen_cfg_t, ignore_eos),
     "do not stop at the end-of-sequence token (benchmarks)", 0, 0, 0},
    {"thinking", TDM_FLAG_BOOL, "false", offsetof(gen_cfg_t, thinking),
     "--chat: open the assistant turn in thinking mode", 0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "warn", offsetof(gen_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
    {"spec", TDM_FLAG_STRING, "off", offsetof(gen_cfg_t, spec),
     "speculative decoding drafter: off, dspark or ngram (MODEL.md 8; output unchanged)", 0, 0, 0},
    {"spec-accept", TDM_FLAG_STRING, "coupled", offsetof(gen_cfg_t, spec_accept),
     "acceptance: coupled (token-identical to --spec off) or rejection (same distribution)", 0, 0,
     0},
    {"spec-confidence-threshold", TDM_FLAG_F64, "0.3", offsetof(gen_cfg_t, spec_threshold),
     "DSpark verify length: longest prefix whose confidence product >= this; 0 = always B", 0, 1,
     0},
};

#define GEN_N_FLAGS (sizeof(gen_flags) / sizeof(gen_flags[0]))

/* Everything one run holds; made in main(), released by gen_state_fini(). */
typedef struct {
    gen_cfg_t flags;
    int oracle;     /* 1: --schedule oracle */
    int output_ids; /* 1: --output ids */
    engine_config_t *cfg;
    text_tokenizer_t *tok;
    text_detok_t *detok;
    engine_model_t *model;
    engine_kv_pool_t *pool;
    engine_fwd_t *fwd;
    engine_seq_t *seq;
    gen_ep_t *ep; /* --devices: the group and its sequences instead of model..seq */
    engine_sampler_params_t sampling;
    tdm_arena_t sample_arena;
    engine_spec_drafter_t drafter; /* --spec */
    engine_spec_accept_t accept;   /* --spec-accept */
    engine_spec_t *spec;           /* NULL with --spec off */
    int32_t *ids;                  /* [n_ids_cap]: the prompt, then each generated token */
    int64_t n_prompt;
    int64_t n_ids;
    int64_t n_ids_cap;
    float *logits; /* [n_logit_rows, V] */
    gen_logits_dump_t *logits_dump;
    gen_layer_dump_t *layer_dump;
    int printed_text;
    int flushed; /* emit_flush ran */
} gen_state_t;

/* Timings and counts of one run (reported on stderr). */
typedef struct {
    int64_t tail_start;
    uint64_t prefill_ns;
    uint64_t prefill_cpu_ns; /* CPU time of every thread of the process during prefill */
    uint64_t ttft_ns;
    uint64_t decode_ns;
    uint64_t decode_cpu_ns;
    int64_t n_decoded; /* tokens that came out of decode steps */
    int64_t n_generated;
    int stopped_on_eos;
} gen_stats_t;

static void gen_state_fini(gen_state_t *g)
{
    gen_layer_dump_destroy(g->layer_dump);
    gen_logits_dump_destroy(g->logits_dump);
    free(g->logits);
    free(g->ids);
    tdm_arena_fini(&g->sample_arena);
    engine_spec_destroy(g->spec);
    engine_seq_destroy(g->seq);
    gen_ep_close(g->ep);
    engine_fwd_destroy(g->fwd);
    engine_kv_pool_destroy(g->pool);
    engine_model_destroy(g->model);
    text_detok_destroy(g->detok);
    text_tokenizer_destroy(g->tok);
    free(g->cfg);
}

/* Tokens the sequence holds (the group's with --devices). */
static int64_t gen_seq_length(const gen_state_t *g)
{
    return g->ep != NULL ? gen_ep_length(g->ep) : engine_seq_length(g->seq);
}

static int usage_error(const char *fmt, const char *a)
{
    fprintf(stderr, GEN_PROGRAM ": ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return GEN_EXIT_USAGE;
}

/* Flags that do not need the model (--log-level: tdm_main_start). Returns GEN_EXIT_OK or
 * GEN_EXIT_USAGE (message printed). */
static int check_flags(gen_state_t *g)
{
    const gen_cfg_t *f = &g->flags;
    int n_sources = (f->prompt != NULL) + (f->chat_path != NULL) + (f->prompt_ids != NULL);

    if (strcmp(f->schedule, "oracle") == 0) {
        g->oracle = 1;
    } else if (strcmp(f->schedule, "ced") != 0) {
        return usage_error("--schedule=%s: expected oracle or ced", f->schedule);
    }
    if (strcmp(f->output, "ids") == 0) {
        g->output_ids = 1;
    } else if (strcmp(f->output, "text") != 0) {
        return usage_error("--output=%s: expected text or ids", f->output);
    }
    if (n_sources != 1) {
        return usage_error("%s", "give exactly one of --prompt, --chat and --prompt-ids");
    }
    if (f->thinking && f->chat_path == NULL) {
        return usage_error("%s", "--thinking applies to --chat only");
    }
    if (engine_spec_drafter_parse(f->spec, &g->drafter) != TDM_OK) {
        return usage_error("--spec=%s: expected off, dspark or ngram", f->spec);
    }
    if (engine_spec_accept_parse(f->spec_accept, &g->accept) != TDM_OK) {
        return usage_error("--spec-accept=%s: expected coupled or rejection", f->spec_accept);
    }
    if (g->drafter != ENGINE_SPEC_OFF && (f->dump_logits != NULL || f->dump_layers != NULL)) {
        return usage_error("%s", "--spec applies without --dump-logits and --dump-layers");
    }
    if (f->devices != NULL &&
        (g->drafter != ENGINE_SPEC_OFF || f->dump_layers != NULL || strcmp(f->device, "cpu") != 0)) {
        return usage_error("%s", "--devices (expert parallel) runs prefill and decode only: not "
                                 "with --spec, --dump-layers or --device");
    }
    return GEN_EXIT_OK;
}

/* Load config.json and tokenizer.json (the latter optional with --prompt-ids). */
static int load_config_and_tokenizer(gen_state_t *g)
{
    char err[GEN_ERR_BYTES] = "";
    char path[GEN_PATH_BYTES];
    struct stat st;
    tdm_status_t status;

    g->cfg = calloc(1, sizeof(*g->cfg));
    if (g->cfg == NULL) {
        return GEN_EXIT_FAILED;
    }
    status = engine_config_load(g->flags.model_dir, g->cfg, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": --model=%s: %s (%s)\n", g->flags.model_dir, err,
                tdm_status_message(status));
        return GEN_EXIT_FAILED;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", g->flags.model_dir);
    if (stat(path, &st) != 0) {
        if (g->flags.prompt_ids == NULL) {
            fprintf(stderr,
                    GEN_PROGRAM ": --model=%s has no tokenizer.json; --prompt and --chat "
                                "need one (use --prompt-ids)\n",
                    g->flags.model_dir);
            return GEN_EXIT_FAILED;
        }
        return GEN_EXIT_OK; /* ids in, ids out */
    }
    status = text_tokenizer_load_hf(path, &g->tok, err, sizeof(err));
    if (status == TDM_OK) {
        status = text_detok_create(g->tok, TEXT_DETOK_SKIP_CONTROL, &g->detok);
    }
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": %s: %s (%s)\n", path, err, tdm_status_message(status));
        return GEN_EXIT_FAILED;
    }
    return GEN_EXIT_OK;
}

/* The prompt ids, checked against the model (vocabulary, image token, context length). */
static int build_prompt(gen_state_t *g)
{
    char err[GEN_ERR_BYTES] = "";
    const gen_cfg_t *f = &g->flags;
    const engine_config_t *c = g->cfg;
    int32_t *ids = NULL;
    int64_t n = 0;
    int64_t limit;
    int dumping;
    tdm_status_t status;

    if (f->prompt_ids != NULL) {
        status = gen_prompt_parse_ids(f->prompt_ids, c->vocab_size, &ids, &n, err, sizeof(err));
    } else if (f->prompt != NULL) {
        status = gen_prompt_encode_text(g->tok, f->prompt, &ids, &n, err, sizeof(err));
    } else {
        status = gen_prompt_encode_chat(g->tok, f->chat_path, f->thinking ? TEXT_CHAT_THINKING : 0,
                                        &ids, &n, err, sizeof(err));
    }
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": %s\n", err[0] != '\0' ? err : tdm_status_message(status));
        return status == TDM_ERR_INVALID_ARG || status == TDM_ERR_FORMAT ||
                       status == TDM_ERR_NOT_FOUND
                   ? GEN_EXIT_USAGE
                   : GEN_EXIT_FAILED;
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size) {
            fprintf(stderr,
                    GEN_PROGRAM ": prompt token %lld is id %d, outside the vocabulary "
                                "[0, %lld)\n",
                    (long long)i, ids[i], (long long)c->vocab_size);
            free(ids);
            return GEN_EXIT_USAGE;
        }
        if (ids[i] == c->image_token_id) {
            fprintf(stderr,
                    GEN_PROGRAM ": prompt token %lld is the image token %d: image inputs "
                                "are not supported by this deployment\n",
                    (long long)i, ids[i]);
            free(ids);
            return GEN_EXIT_USAGE;
        }
    }
    /* every token's position (the last generated one fed too when dumping) below the limit */
    limit = c->max_position_embeddings < ENGINE_SAMPLER_MAX_POSITION ? c->max_position_embeddings
                                                                     : ENGINE_SAMPLER_MAX_POSITION;
    dumping = f->dump_logits != NULL || f->dump_layers != NULL;
    if (n + (int64_t)f->max_tokens + dumping > limit) {
        fprintf(stderr,
                GEN_PROGRAM ": prompt of %lld tokens plus --max-tokens=%llu%s exceeds the "
                            "context limit of %lld tokens\n",
                (long long)n, (unsigned long long)f->max_tokens,
                dumping ? " (plus one fed for the dumps)" : "", (long long)limit);
        free(ids);
        return GEN_EXIT_USAGE;
    }
    g->n_ids_cap = n + (int64_t)f->max_tokens;
    g->ids = malloc((size_t)g->n_ids_cap * sizeof(int32_t));
    if (g->ids == NULL) {
        free(ids);
        return GEN_EXIT_FAILED;
    }
    memcpy(g->ids, ids, (size_t)n * sizeof(int32_t));
    free(ids);
    g->n_prompt = n;
    g->n_ids = n;
    return GEN_EXIT_OK;
}

static int setup_sampler(gen_state_t *g)
{
    char err[GEN_ERR_BYTES] = "";
    engine_sampler_params_t *s = &g->sampling;
    const engine_config_t *c = g->cfg;

    engine_sampler_params_default(s);
    s->temperature = g->flags.temperature;
    s->top_k = (int32_t)(g->flags.top_k > INT32_MAX ? INT32_MAX : g->flags.top_k);
    s->top_p = g->flags.top_p;
    s->min_p = g->flags.min_p;
    s->seed = g->flags.seed;
    if (!g->flags.ignore_eos && c->eos_token_id >= 0 && c->eos_token_id < c->vocab_size) {
        s->stop_ids[s->n_stop_ids++] = (int32_t)c->eos_token_id;
    }
    if (engine_sampler_params_validate(s, c->vocab_size, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": sampling: %s\n", err);
        return GEN_EXIT_USAGE;
    }
    if (tdm_arena_init(&g->sample_arena, engine_sampler_scratch_bytes(c->vocab_size)) != TDM_OK) {
        return GEN_EXIT_FAILED;
    }
    return GEN_EXIT_OK;
}

/* Pages one sequence of n_tokens needs in every KV source, plus spares. */
static uint32_t pages_for(const engine_config_t *c, int64_t n_tokens)
{
    uint64_t pages = GEN_SPARE_PAGES;
    for (int s = 0; s < c->n_kv_source_layer_ids; s++) {
        int64_t rows = engine_config_n_c(c, (int)c->kv_source_layer_ids[s], n_tokens - 1);
        pages += (uint64_t)kern_kv_page_count(rows) + 1;
    }
    return pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

/* The first-token logits buffer: every prompt row when dumping logits (oracle: T, CED: at most
 * T), else the last one. */
static int alloc_logits(gen_state_t *g, int64_t V)
{
    int64_t n_rows = g->flags.dump_logits != NULL ? g->n_prompt : 1;
    g->logits = malloc((size_t)n_rows * (size_t)V * sizeof(float));
    return g->logits != NULL ? GEN_EXIT_OK : GEN_EXIT_FAILED;
}

/* --devices: the expert-parallel group (gen_ep.h) instead of one model, pool and context. */
static int load_engine_ep(gen_state_t *g, int n_threads)
{
    char err[GEN_ERR_BYTES] = "";
    tdm_status_t status = gen_ep_open(g->flags.model_dir, g->flags.devices, n_threads,
                                      g->flags.chunk_tokens, pages_for(g->cfg, g->n_ids_cap + 1),
                                      &g->ep, err, sizeof(err));
    if (status == TDM_ERR_INVALID_ARG || status == TDM_ERR_UNSUPPORTED ||
        status == TDM_ERR_NOT_FOUND) {
        fprintf(stderr, GEN_PROGRAM ": --devices=%s: %s\n", g->flags.devices, err);
        return GEN_EXIT_USAGE;
    }
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": loading %s on --devices=%s: %s (%s)\n",
                g->flags.model_dir, g->flags.devices, err, tdm_status_message(status));
        return GEN_EXIT_FAILED;
    }
    tdm_log(TDM_LOG_INFO, "generate", "model loaded: dir=%s expert-parallel ranks=%d devices=%s",
            g->flags.model_dir, gen_ep_size(g->ep), g->flags.devices);
    return alloc_logits(g, g->cfg->vocab_size);
}

static int load_engine(gen_state_t *g)
{
    char err[GEN_ERR_BYTES] = "";
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    const engine_config_t *c;
    int n_threads = (int)g->flags.threads;
    tdm_status_t status;

    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (g->flags.devices != NULL) {
        return load_engine_ep(g, n_threads);
    }
    engine_model_params_default(&mp);
    mp.n_threads = n_threads;
    status = kern_device_open(g->flags.device, NULL, &mp.ops, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": --device: %s\n", err);
        return GEN_EXIT_USAGE;
    }
    status = engine_model_load(g->flags.model_dir, &mp, &g->model, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": loading %s: %s (%s)\n", g->flags.model_dir, err,
                tdm_status_message(status));
        return GEN_EXIT_FAILED;
    }
    c = engine_model_config(g->model);
    status = engine_kv_pool_create_ops(c, engine_model_fingerprint(g->model),
                                       pages_for(c, g->n_ids_cap + 1), engine_model_ops(g->model),
                                       &g->pool);
    if (status == TDM_OK) {
        engine_fwd_params_default(g->model, &fp);
        fp.n_threads = n_threads;
        fp.max_chunk_tokens = g->flags.chunk_tokens;
        status = engine_fwd_create(g->model, g->pool, &fp, &g->fwd);
    }
    if (status == TDM_OK) {
        status = engine_seq_create(g->model, g->pool, &g->seq);
    }
    if (status == TDM_OK && g->drafter != ENGINE_SPEC_OFF) {
        engine_spec_params_t sp;
        engine_spec_params_default(g->model, &sp);
        sp.accept = g->accept;
        sp.confidence_threshold = g->flags.spec_threshold;
        sp.max_batch = 1;
        if (g->drafter == ENGINE_SPEC_DSPARK && c->n_blocks == 0) {
            fprintf(stderr, GEN_PROGRAM ": --spec=dspark: the checkpoint has no DSpark blocks\n");
            return GEN_EXIT_USAGE;
        }
        status = engine_spec_create(g->fwd, &sp, &g->spec);
    }
    if (status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": engine setup: %s\n", tdm_status_message(status));
        return GEN_EXIT_FAILED;
    }
    if (alloc_logits(g, c->vocab_size) != GEN_EXIT_OK) {
        return GEN_EXIT_FAILED;
    }
    tdm_log(TDM_LOG_INFO, "generate",
            "model loaded: dir=%s layers=%d vocab=%lld threads=%d pages=%u weight_bytes=%llu",
            g->flags.model_dir, c->n_layers, (long long)c->vocab_size, n_threads,
            engine_kv_pool_n_pages(g->pool),
            (unsigned long long)engine_model_weight_bytes(g->model));
    return GEN_EXIT_OK;
}

static int open_dumps(gen_state_t *g)
{
    engine_dump_sink_t sink;
    tdm_status_t status;

    if (g->flags.dump_logits != NULL) {
        status = gen_logits_dump_create(
            g->flags.dump_logits, g->cfg->vocab_size,
            g->oracle ? GEN_DUMP_SCHEDULE_ORACLE : GEN_DUMP_SCHEDULE_CED, &g->logits_dump);
        if (status != TDM_OK) {
            fprintf(stderr, GEN_PROGRAM ": --dump-logits=%s: %s\n", g->flags.dump_logits,
                    tdm_status_message(status));
            return GEN_EXIT_FAILED;
        }
    }
    if (g->flags.dump_layers != NULL) {
        status = gen_layer_dump_create(g->flags.dump_layers, engine_model_config(g->model),
                                       g->flags.schedule, &g->layer_dump);
        if (status != TDM_OK) {
            fprintf(stderr, GEN_PROGRAM ": --dump-layers=%s: %s\n", g->flags.dump_layers,
                    tdm_status_message(status));
            return GEN_EXIT_FAILED;
        }
        gen_layer_dump_sink(g->layer_dump, &sink);
        engine_fwd_set_dump(g->fwd, &sink);
    }
    return GEN_EXIT_OK;
}

/* Write the text of `token` to stdout as soon as whole UTF-8 characters are complete. */
static tdm_status_t emit(gen_state_t *g, int32_t token)
{
    const char *text = NULL;
    size_t n = 0;
    tdm_status_t status;

    if (g->output_ids || g->detok == NULL) {
        printf("%s%d", g->printed_text ? " " : "", token);
        g->printed_text = 1;
        fflush(stdout);
        return TDM_OK;
    }
    status = text_detok_push(g->detok, token, &text, &n);
    if (status == TDM_OK && n > 0) {
        fwrite(text, 1, n, stdout);
        fflush(stdout);
        g->printed_text = 1;
    }
    return status;
}

static void emit_flush(gen_state_t *g)
{
    const char *text = NULL;
    size_t n = 0;

    if (g->flushed) {
        return;
    }
    g->flushed = 1;
    if (!g->output_ids && g->detok != NULL && text_detok_flush(g->detok, &text, &n) == TDM_OK &&
        n > 0) {
        fwrite(text, 1, n, stdout);
        g->printed_text = 1;
    }
    if (g->printed_text) {
        fputc('\n', stdout);
    }
    fflush(stdout);
}

/* Sample the token at position `position` from `logits`; append it to ids. */
static tdm_status_t sample_next(gen_state_t *g, const float *logits, int64_t position,
                                int32_t *token_out)
{
    engine_sample_t sample;
    tdm_status_t status = engine_sampler_sample(&g->sampling, logits, g->cfg->vocab_size, position,
                                                &g->sample_arena, &sample);
    if (status != TDM_OK) {
        return status;
    }
    g->ids[g->n_ids++] = sample.token;
    *token_out = sample.token;
    return TDM_OK;
}

/* CPU time of the whole process (all threads), ns: the speed a loaded host cannot skew as much
 * as wall time (benchmarks on shared machines). Not a duration clock (tdm_clock is). */
static uint64_t process_cpu_ns(void)
{
    return tdm_clock_process_cpu_ns();
}

static tdm_status_t run_prefill(gen_state_t *g, gen_stats_t *stats)
{
    uint32_t flags = g->oracle ? ENGINE_PREFILL_TAIL_FROM_H : ENGINE_PREFILL_DEFAULT;
    int64_t R = 0;
    uint64_t t0 = tdm_clock_now_ns();
    uint64_t cpu0 = process_cpu_ns();
    tdm_status_t status;

    if (g->logits_dump != NULL) {
        flags |= ENGINE_PREFILL_ALL_LOGITS;
    }
    status = g->ep != NULL
                 ? gen_ep_prefill(g->ep, g->ids, g->n_prompt, flags, g->logits, &R)
                 : engine_fwd_prefill(g->fwd, g->seq, g->ids, g->n_prompt, flags, g->logits, &R);
    stats->prefill_ns = tdm_clock_now_ns() - t0;
    stats->prefill_cpu_ns = process_cpu_ns() - cpu0;
    if (status != TDM_OK) {
        return status;
    }
    stats->tail_start = R;
    if (g->logits_dump != NULL) {
        int64_t n_rows = g->n_prompt - R;
        status = gen_logits_dump_append(g->logits_dump, R, g->logits, n_rows);
        /* the first-token logits are the last row */
        memmove(g->logits, g->logits + (size_t)(n_rows - 1) * (size_t)g->cfg->vocab_size,
                (size_t)g->cfg->vocab_size * sizeof(float));
    }
    return status;
}

/* One decode step: feed `token` (the newest id) and leave the logits at its position. */
static tdm_status_t decode_step(gen_state_t *g, int32_t token)
{
    int64_t position = gen_seq_length(g);
    tdm_status_t status = g->ep != NULL ? gen_ep_decode(g->ep, token, g->logits)
                                        : engine_fwd_decode(g->fwd, &g->seq, &token, 1, g->logits);
    if (status == TDM_OK && g->logits_dump != NULL) {
        status = gen_logits_dump_append(g->logits_dump, position, g->logits, 1);
    }
    return status;
}

/* One speculative step from anchor `token` (the newest id): emits 1..max_emit tokens. */
static tdm_status_t spec_step(gen_state_t *g, int32_t token, int64_t max_emit, gen_stats_t *stats,
                              int32_t *last_out)
{
    engine_spec_req_t req;
    engine_spec_result_t res;
    tdm_status_t status;

    memset(&req, 0, sizeof(req));
    req.seq = g->seq;
    req.anchor = token;
    req.drafter = g->drafter;
    req.sampling = &g->sampling;
    req.history = g->ids;
    req.n_history = g->n_ids;
    req.max_emit = max_emit > ENGINE_SPEC_MAX_EMIT ? ENGINE_SPEC_MAX_EMIT : (int)max_emit;
    status = engine_spec_step(g->spec, &req, 1, &res);
    for (int k = 0; k < res.n_emitted && status == TDM_OK; k++) {
        *last_out = res.samples[k].token;
        g->ids[g->n_ids++] = *last_out;
        status = emit(g, *last_out);
        stats->n_generated++;
        stats->n_decoded++;
        stats->stopped_on_eos = engine_sampler_is_stop(&g->sampling, *last_out);
    }
    return status;
}

static tdm_status_t generate(gen_state_t *g, gen_stats_t *stats)
{
    uint64_t t_start = tdm_clock_now_ns();
    uint64_t t_decode, cpu_decode;
    int64_t max_tokens = (int64_t)g->flags.max_tokens;
    int32_t token = -1;
    tdm_status_t status;

    status = run_prefill(g, stats);
    if (status != TDM_OK || max_tokens == 0) {
        return status;
    }
    status = sample_next(g, g->logits, g->n_ids, &token);
    if (status == TDM_OK) {
        status = emit(g, token);
    }
    stats->ttft_ns = tdm_clock_now_ns() - t_start;
    if (status != TDM_OK) {
        return status;
    }
    stats->n_generated = 1;
    stats->stopped_on_eos = engine_sampler_is_stop(&g->sampling, token);
    t_decode = tdm_clock_now_ns();
    cpu_decode = process_cpu_ns();
    while (g->spec != NULL && !stats->stopped_on_eos && stats->n_generated < max_tokens) {
        status = spec_step(g, token, max_tokens - stats->n_generated, stats, &token);
        if (status != TDM_OK) {
            return status;
        }
    }
    while (!stats->stopped_on_eos && stats->n_generated < max_tokens) {
        status = decode_step(g, token);
        if (status == TDM_OK) {
            status = sample_next(g, g->logits, g->n_ids, &token);
        }
        if (status == TDM_OK) {
            status = emit(g, token);
        }
        if (status != TDM_OK) {
            return status;
        }
        stats->n_generated++;
        stats->n_decoded++;
        stats->stopped_on_eos = engine_sampler_is_stop(&g->sampling, token);
    }
    stats->decode_ns = tdm_clock_now_ns() - t_decode;
    stats->decode_cpu_ns = process_cpu_ns() - cpu_decode;
    emit_flush(g);
    if (g->logits_dump != NULL || g->layer_dump != NULL) {
        status = decode_step(g, token); /* the last token's row (untimed) */
    }
    return status;
}

static double per_second(int64_t n, uint64_t ns)
{
    return ns > 0 ? (double)n * GEN_MS_PER_S * TDM_NS_PER_MS / (double)ns : 0.0;
}

static void print_stats(const gen_state_t *g, const gen_stats_t *s)
{
    fprintf(stderr,
            "prompt_tokens=%lld generated_tokens=%lld stop=%s schedule=%s tail_start=%lld\n",
            (long long)g->n_prompt, (long long)s->n_generated, s->stopped_on_eos ? "eos" : "length",
            g->flags.schedule, (long long)s->tail_start);
    fprintf(stderr, "prefill: %lld tokens in %.1f ms = %.1f tok/s (cpu %.1f ms)\n",
            (long long)g->n_prompt, (double)s->prefill_ns / TDM_NS_PER_MS,
            per_second(g->n_prompt, s->prefill_ns), (double)s->prefill_cpu_ns / TDM_NS_PER_MS);
    if (s->n_generated > 0) {
        fprintf(stderr, "ttft: %.1f ms\n", (double)s->ttft_ns / TDM_NS_PER_MS);
    }
    fprintf(stderr, "decode: %lld tokens in %.1f ms = %.1f tok/s (cpu %.1f ms)\n",
            (long long)s->n_decoded, (double)s->decode_ns / TDM_NS_PER_MS,
            per_second(s->n_decoded, s->decode_ns), (double)s->decode_cpu_ns / TDM_NS_PER_MS);
    if (g->spec != NULL) {
        engine_spec_metrics_t m;
        engine_spec_metrics(g->spec, g->drafter, &m);
        fprintf(stderr,
                "spec: drafter=%s accept=%s steps=%llu drafted=%llu verified=%llu accepted=%llu "
                "acceptance_rate=%.3f mean_accepted_length=%.2f\n",
                engine_spec_drafter_name(g->drafter), g->flags.spec_accept,
                (unsigned long long)m.n_steps, (unsigned long long)m.drafted,
                (unsigned long long)m.verified, (unsigned long long)m.accepted, m.acceptance_rate,
                m.mean_accepted_length);
    }
}

static int finish_dumps(gen_state_t *g)
{
    tdm_status_t status = gen_logits_dump_finish(g->logits_dump);
    tdm_status_t layer_status;

    g->logits_dump = NULL;
    layer_status = gen_layer_dump_finish(g->layer_dump, g->ids, gen_seq_length(g));
    g->layer_dump = NULL;
    if (status != TDM_OK || layer_status != TDM_OK) {
        fprintf(stderr, GEN_PROGRAM ": writing dumps failed: %s\n",
                tdm_status_message(status != TDM_OK ? status : layer_status));
        return GEN_EXIT_FAILED;
    }
    return GEN_EXIT_OK;
}

int main(int argc, char **argv)
{
    static const tdm_main_spec_t spec = {
        GEN_PROGRAM,
        "Generate text from a DeepSeek-V4.1-Flash checkpoint on the CPU engine; streams the text, "
        "then prints prefill and decode tok/s.",
        gen_flags, GEN_N_FLAGS, offsetof(gen_cfg_t, log_level)};
    gen_state_t g;
    gen_stats_t stats;
    tdm_flags_action_t action;
    tdm_status_t status;
    int rc;

    memset(&g, 0, sizeof(g));
    memset(&stats, 0, sizeof(stats));
    status = tdm_main_start(&spec, argc, argv, &g.flags, &action);
    if (status != TDM_OK) {
        return GEN_EXIT_USAGE;
    }
    if (action == TDM_FLAGS_HELP) {
        return GEN_EXIT_OK;
    }
    rc = check_flags(&g);
    if (rc == GEN_EXIT_OK) {
        rc = load_config_and_tokenizer(&g);
    }
    if (rc == GEN_EXIT_OK) {
        rc = build_prompt(&g);
    }
    if (rc == GEN_EXIT_OK) {
        rc = setup_sampler(&g);
    }
    if (rc == GEN_EXIT_OK) {
        rc = load_engine(&g);
    }
    if (rc == GEN_EXIT_OK) {
        rc = open_dumps(&g);
    }
    if (rc == GEN_EXIT_OK) {
        status = generate(&g, &stats);
        if (status != TDM_OK) {
            emit_flush(&g);
            fprintf(stderr, GEN_PROGRAM ": generation failed at position %lld: %s\n",
                    (long long)g.n_ids, tdm_status_message(status));
            rc = GEN_EXIT_FAILED;
        }
    }
    if (rc == GEN_EXIT_OK) {
        rc = finish_dumps(&g);
        print_stats(&g, &stats);
    }
    gen_state_fini(&g);
    return rc;
}
