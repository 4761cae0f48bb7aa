/* constrain_bench.c - tandem-bench-constrain: the cost of constrained decoding per sampled token
 * (engine/constrain.h: token mask of the automaton's state, -inf outside it, advance by the
 * chosen token) at a vocabulary of 129,280 tokens (the synthetic tokenizer of that size, or a
 * tokenizer.json given with --tokenizer) under a JSON schema of 10 properties, printed beside
 * one decode step (batch 1) of a checkpoint measured in the same run (--model; the small preset
 * is the budget the issue sets). Results go into docs/BENCHMARKS.md.
 *
 * The documents are generated as a sampling node would: random logits per step (tokens that
 * hold a '"' get +4 so strings end after a few tokens and every kind of state is visited),
 * masked, the greedy choice over the allowed tokens, advance; a new document after the stop id.
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "engine/constrain.h"
#include "engine/forward.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bias of tokens that contain a quote (ends strings early; see the header). */
#define QUOTE_BIAS 4.0f
/* Context prefilled before the decode steps are timed. */
#define DECODE_CONTEXT 128

typedef struct {
    const char *model_dir;
    const char *tokenizer;
    uint32_t vocab;
    uint32_t tokens;
    uint32_t decode_steps;
    uint32_t n_threads;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir),
     "checkpoint whose batch-1 decode step is the comparison (e.g. tandem-mkmodel --preset "
     "small); none: the constraint alone",
     0, 0, 0},
    {"tokenizer", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, tokenizer),
     "tokenizer.json to take the vocabulary from; none: the synthetic tokenizer of --vocab", 0, 0,
     0},
    {"vocab", TDM_FLAG_U32, "129280", offsetof(bench_cfg_t, vocab),
     "vocabulary size (ids past the tokenizer's are never allowed)", 284, 1u << 19, 0},
    {"tokens", TDM_FLAG_U32, "2000", offsetof(bench_cfg_t, tokens), "constrained tokens sampled", 1,
     10000000, 0},
    {"steps", TDM_FLAG_U32, "16", offsetof(bench_cfg_t, decode_steps),
     "decode steps timed on --model", 1, 100000, 0},
    {"threads", TDM_FLAG_U32, "2", offsetof(bench_cfg_t, n_threads), "kernel threads (--model)", 1,
     256, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

/* Ten properties: strings, numbers, integer, boolean, null-able, enum, array, nested object. */
static const char *const SCHEMA_RF =
    "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"ticket\",\"strict\":true,\"schema\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"title\":{\"type\":\"string\"},\"body\":{\"type\":\"string\"},"
    "\"priority\":{\"type\":\"integer\"},\"estimate\":{\"type\":\"number\"},"
    "\"blocking\":{\"type\":\"boolean\"},\"assignee\":{\"type\":[\"string\",\"null\"]},"
    "\"status\":{\"enum\":[\"open\",\"in_progress\",\"done\"]},"
    "\"labels\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"component\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]},"
    "\"owner\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"team\":{\"type\":\"string\"}},\"required\":[\"name\",\"team\"],"
    "\"additionalProperties\":false}},"
    "\"required\":[\"title\",\"body\",\"priority\",\"estimate\",\"blocking\",\"assignee\","
    "\"status\",\"labels\",\"component\",\"owner\"],\"additionalProperties\":false}}}";

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Mean seconds of one batch-1 decode step of the checkpoint; 0 on failure (printed). */
static double decode_step_s(const bench_cfg_t *cfg)
{
    engine_model_params_t mp;
    engine_model_t *model = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    engine_fwd_params_t fp;
    engine_seq_t *seq = NULL;
    int32_t ids[DECODE_CONTEXT];
    float *lg = NULL;
    char err[512];
    double best = 0.0;
    int32_t tok;
    int64_t V;
    uint64_t s = 7;

    engine_model_params_default(&mp);
    mp.n_threads = (int)cfg->n_threads;
    if (engine_model_load(cfg->model_dir, &mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-constrain: %s\n", err);
        return 0.0;
    }
    V = engine_model_config(model)->vocab_size;
    lg = malloc((size_t)V * sizeof(float));
    if (lg == NULL ||
        engine_kv_pool_create(engine_model_config(model), engine_model_fingerprint(model), 256,
                              &pool) != TDM_OK) {
        goto out;
    }
    engine_fwd_params_default(model, &fp);
    if (engine_fwd_create(model, pool, &fp, &fwd) != TDM_OK ||
        engine_seq_create(model, pool, &seq) != TDM_OK) {
        goto out;
    }
    for (int i = 0; i < DECODE_CONTEXT; i++) {
        ids[i] = (int32_t)(3 + rng_next(&s) % (uint64_t)(V - 6));
    }
    if (engine_fwd_prefill(fwd, seq, ids, DECODE_CONTEXT, 0, NULL, NULL) != TDM_OK) {
        goto out;
    }
    tok = ids[DECODE_CONTEXT - 1];
    /* the fastest of three runs of --steps (a shared box's load varies) */
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = tdm_clock_now_ns();
        double per;

        for (uint32_t step = 0; step < cfg->decode_steps; step++) {
            if (engine_fwd_decode(fwd, &seq, &tok, 1, lg) != TDM_OK) {
                goto out;
            }
            tok = (int32_t)((tok * 7 + 13) % V);
        }
        per = tdm_clock_elapsed_ms(t0) / 1e3 / cfg->decode_steps;
        best = (best == 0.0 || per < best) ? per : best;
    }
    printf("decode step (batch 1) of %s: %.3f ms (fastest of 3 runs of %u steps, %u threads, "
           "V %lld)\n",
           cfg->model_dir, best * 1e3, cfg->decode_steps, cfg->n_threads, (long long)V);
out:
    engine_seq_destroy(seq);
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    free(lg);
    return best;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    text_tokenizer_t *tok = NULL;
    engine_constrain_vocab_t *vocab = NULL;
    engine_constraint_t *c = NULL;
    engine_sampler_params_t sp;
    tdm_arena_t arena = {0};
    char err[512];
    float *bias = NULL;
    float *logits = NULL;
    double *cost = NULL;
    double *cost_cpu = NULL; /* process CPU time: what a shared box's preemptions do not add */
    double mask_s = 0.0, apply_s = 0.0, advance_s = 0.0;
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    int64_t V;
    uint32_t n_docs = 0;
    uint64_t n_bytes_out = 0;
    char doc[4096]; /* the current document's text (its last bytes when longer) */
    size_t n_doc = 0;
    double worst_s = 0.0;
    char worst_ctx[48] = "";
    int32_t stop_id;
    int rc = 1;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-constrain",
                        "Constrained-decoding cost per sampled token (mask + apply + advance) "
                        "beside a decode step.",
                        &cfg, NULL, NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    V = cfg.vocab;
    {
        uint64_t t0 = tdm_clock_now_ns();
        tdm_status_t st;

        if (cfg.tokenizer != NULL) {
            st = text_tokenizer_load_hf(cfg.tokenizer, &tok, err, sizeof(err));
        } else {
            char *json = NULL;
            size_t n_json = 0;

            st = text_tokenizer_synthetic_hf_text(cfg.vocab, &json, &n_json, err, sizeof(err));
            if (st == TDM_OK) {
                st = text_tokenizer_load_hf_buffer(json, n_json, "synthetic", &tok, err,
                                                   sizeof(err));
            }
            free(json);
        }
        if (st != TDM_OK) {
            fprintf(stderr, "tandem-bench-constrain: tokenizer: %s\n", err);
            return 1;
        }
        printf("tokenizer %s: %u ids (load %.0f ms)\n",
               cfg.tokenizer != NULL ? cfg.tokenizer : "synthetic", text_tokenizer_n_vocab(tok),
               tdm_clock_elapsed_ms(t0));
        t0 = tdm_clock_now_ns();
        if (engine_constrain_vocab_from_tokenizer(tok, V, &vocab) != TDM_OK) {
            fprintf(stderr, "tandem-bench-constrain: vocabulary tries failed\n");
            goto out;
        }
        {
            engine_constrain_vocab_stats_t vs;

            engine_constrain_vocab_stats(vocab, &vs);
            printf("per-vocabulary precompute for V %lld: %.0f ms, once per node: trie of %u "
                   "tokens (%u nodes); inside a free string only %u tokens (%u nodes) are walked, "
                   "inside raw text %u (%u nodes)\n",
                   (long long)V, tdm_clock_elapsed_ms(t0), vs.all_tokens, vs.all_nodes,
                   vs.string_tokens, vs.string_nodes, vs.raw_tokens, vs.raw_nodes);
        }
    }
    {
        text_tokenizer_info_t info;

        text_tokenizer_get_info(tok, &info);
        stop_id = info.eos_id >= 0 ? info.eos_id : 1;
    }
    bias = calloc((size_t)V, sizeof(float));
    logits = malloc((size_t)V * sizeof(float));
    cost = malloc((size_t)cfg.tokens * sizeof(double));
    cost_cpu = malloc((size_t)cfg.tokens * sizeof(double));
    if (bias == NULL || logits == NULL || cost == NULL || cost_cpu == NULL ||
        tdm_arena_init(&arena, engine_sampler_scratch_bytes(V)) != TDM_OK) {
        goto out;
    }
    for (int64_t x = 0; x < V && x < (int64_t)text_tokenizer_n_vocab(tok); x++) {
        const uint8_t *b;
        size_t n;

        if (text_tokenizer_token_bytes(tok, (int32_t)x, &b, &n) == TDM_OK &&
            memchr(b, '"', n) != NULL) {
            bias[x] = QUOTE_BIAS;
        }
    }
    engine_sampler_params_default(&sp);
    sp.temperature = 0.0;
    for (uint32_t i = 0; i < cfg.tokens; i++) {
        engine_sample_t sample;
        uint64_t t0, t1, t2, t3;
        uint64_t c0, c1, c2, c3;

        if (c == NULL) {
            if (engine_constraint_create(vocab, SCHEMA_RF, strlen(SCHEMA_RF), &stop_id, 1, &c, err,
                                         sizeof(err)) != TDM_OK) {
                fprintf(stderr, "tandem-bench-constrain: schema: %s\n", err);
                goto out;
            }
        }
        for (int64_t x = 0; x < V; x++) {
            logits[x] = bias[x] + (float)(rng_next(&rng) >> 40) * (1.0f / 16777216.0f) * 6.0f;
        }
        c0 = tdm_clock_process_cpu_ns();
        t0 = tdm_clock_now_ns();
        (void)engine_constraint_mask(c);
        t1 = tdm_clock_now_ns();
        if (engine_constraint_apply(c, logits, V) != TDM_OK) {
            fprintf(stderr, "tandem-bench-constrain: no token allowed (document %u)\n", n_docs);
            goto out;
        }
        t2 = tdm_clock_now_ns();
        c1 = tdm_clock_process_cpu_ns();
        if (engine_sampler_sample(&sp, logits, V, i, &arena, &sample) != TDM_OK) {
            goto out;
        }
        t3 = tdm_clock_now_ns();
        c2 = tdm_clock_process_cpu_ns();
        if (engine_constraint_advance(c, sample.token) != TDM_OK) {
            fprintf(stderr, "tandem-bench-constrain: advance refused token %d\n", sample.token);
            goto out;
        }
        mask_s += (double)(t1 - t0) / 1e9;
        apply_s += (double)(t2 - t1) / 1e9;
        advance_s += (double)(tdm_clock_now_ns() - t3) / 1e9;
        cost[i] = (double)(t2 - t0 + tdm_clock_now_ns() - t3) / 1e9;
        c3 = tdm_clock_process_cpu_ns();
        cost_cpu[i] = (double)(c1 - c0 + c3 - c2) / 1e9;
        if (cost[i] > worst_s) { /* where the slowest mask was: the text just before it */
            size_t k = n_doc < 24 ? n_doc : 24;

            worst_s = cost[i];
            memcpy(worst_ctx, doc + n_doc - k, k);
            worst_ctx[k] = '\0';
        }
        if (sample.token == stop_id) {
            engine_constraint_destroy(c);
            c = NULL;
            n_docs++;
            n_doc = 0;
        } else {
            const uint8_t *b;
            size_t n;

            if (text_tokenizer_token_bytes(tok, sample.token, &b, &n) == TDM_OK) {
                n_bytes_out += n;
                if (n_doc + n > sizeof(doc)) {
                    n_doc = 0;
                }
                memcpy(doc + n_doc, b, n < sizeof(doc) ? n : sizeof(doc));
                n_doc += n < sizeof(doc) ? n : sizeof(doc);
            }
        }
    }
    {
        double total = mask_s + apply_s + advance_s;
        double per_us = total / cfg.tokens * 1e6;
        double p50, p99;
        double cpu_total = 0.0;
        double cpu_p50, cpu_p99;
        double step_s = 0.0;

        for (uint32_t i = 0; i < cfg.tokens; i++) {
            cpu_total += cost_cpu[i];
        }
        qsort(cost, cfg.tokens, sizeof(double), compare_double);
        qsort(cost_cpu, cfg.tokens, sizeof(double), compare_double);
        cpu_p50 = cost_cpu[cfg.tokens / 2] * 1e6;
        cpu_p99 = cost_cpu[(size_t)((double)cfg.tokens * 0.99)] * 1e6;
        p50 = cost[cfg.tokens / 2] * 1e6;
        p99 = cost[(size_t)((double)cfg.tokens * 0.99)] * 1e6;
        printf("schema: 10 properties (string x2, integer, number, boolean, string|null, enum, "
               "array of string, anyOf string|integer, object of 2)\n");
        printf("constrained tokens %u (%u complete documents, %.1f bytes/token)\n", cfg.tokens,
               n_docs, (double)n_bytes_out / cfg.tokens);
        printf("cost per sampled token: %.1f us mean (mask %.1f + apply %.1f + advance %.1f), "
               "p50 %.1f us, p99 %.1f us\n",
               per_us, mask_s / cfg.tokens * 1e6, apply_s / cfg.tokens * 1e6,
               advance_s / cfg.tokens * 1e6, p50, p99);
        for (char *p = worst_ctx; *p != '\0'; p++) {
            *p = (*p == '\n' || *p == '\t') ? ' ' : *p;
        }
        printf("  the same in process CPU time: %.1f us mean, p50 %.1f us, p99 %.1f us (wall-clock "
               "outliers of 4 or 8 ms are a shared box's scheduler ticks)\n",
               cpu_total / cfg.tokens * 1e6, cpu_p50, cpu_p99);
        printf("slowest token (wall): %.1f us, after ...%s\n", worst_s * 1e6, worst_ctx);
        if (cfg.model_dir != NULL) {
            step_s = decode_step_s(&cfg);
            if (step_s <= 0.0) {
                goto out;
            }
            printf("constrained-decoding cost / decode step = %.1f us / %.1f us = %.3f (p99: "
                   "%.3f wall, %.3f CPU time)\n",
                   per_us, step_s * 1e6, per_us / (step_s * 1e6), p99 / (step_s * 1e6),
                   cpu_p99 / (step_s * 1e6));
        }
    }
    rc = 0;
out:
    engine_constraint_destroy(c);
    engine_constrain_vocab_destroy(vocab);
    text_tokenizer_destroy(tok);
    tdm_arena_fini(&arena);
    free(bias);
    free(logits);
    free(cost);
    free(cost_cpu);
    return rc;
}
