/* spec_bench.c - tandem-bench-spec: decode tok/s with and without speculative decoding
 * (MODEL.md 8) at several batch sizes: plain decode, DSpark, n-gram, and a controlled-acceptance
 * drafter that proposes the target's own (precomputed, greedy) continuation, each token kept
 * correct with probability p, to chart speedup against acceptance rate. Decode loops only
 * (prefill excluded; every configuration starts from the same imported state). Greedy, coupled
 * acceptance: every run's tokens are checked equal to plain decoding. Results go into
 * docs/BENCHMARKS.md ("Speculative decoding").
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "engine/forward.h"
#include "engine/spec.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_LIST   16
#define BENCH_MAX_SEQS   16
#define BENCH_POOL_PAGES 8192
#define BENCH_NS_PER_S   1e9

typedef struct {
    const char *model_dir;
    uint32_t n_threads;
    uint32_t context_tokens;
    uint32_t gen_tokens;
    const char *batches;
    const char *probs;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir), "checkpoint directory", 0, 0,
     1},
    {"threads", TDM_FLAG_U32, "2", offsetof(bench_cfg_t, n_threads), "kernel threads", 1, 256, 0},
    {"context", TDM_FLAG_U32, "128", offsetof(bench_cfg_t, context_tokens),
     "tokens prefilled per sequence before decoding", 8, 65536, 0},
    {"tokens", TDM_FLAG_U32, "32", offsetof(bench_cfg_t, gen_tokens),
     "tokens generated per sequence and configuration", 2, 4096, 0},
    {"batches", TDM_FLAG_STRING, "1,4,16", offsetof(bench_cfg_t, batches),
     "comma-separated batch sizes (<= 16)", 0, 0, 0},
    {"probs", TDM_FLAG_STRING, "0,0.5,0.7,0.8,0.9,1", offsetof(bench_cfg_t, probs),
     "controlled drafter: probabilities that a draft token is the target's", 0, 0, 0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

typedef struct {
    const engine_model_t *model;
    engine_kv_pool_t *pool;
    engine_fwd_t *fwd;
    engine_spec_t *spec;
    int64_t V;
    int n;
    int gen;
    uint8_t *blobs[BENCH_MAX_SEQS];
    size_t blob_bytes[BENCH_MAX_SEQS];
    int32_t *hist[BENCH_MAX_SEQS]; /* context + generated */
    int64_t n_ctx;
    int32_t first[BENCH_MAX_SEQS];
    int32_t *ref[BENCH_MAX_SEQS]; /* plain greedy continuation (gen tokens after first) */
} bench_t;

typedef struct {
    double tok_per_s;
    uint64_t verified;
    uint64_t accepted;
    uint64_t steps;
    int identical;
} run_result_t;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int parse_list(const char *s, double *out)
{
    int n = 0;
    for (const char *p = s; *p != '\0' && n < BENCH_MAX_LIST;) {
        out[n++] = atof(p);
        p = strchr(p, ',');
        if (p == NULL) {
            break;
        }
        p++;
    }
    return n;
}

/* One configuration: import the states, generate b->gen tokens per sequence. prob < 0: drafter
 * as given; else EXTERNAL with the reference continuation kept with probability prob. */
static tdm_status_t run(bench_t *b, engine_spec_drafter_t drafter, double prob, run_result_t *out)
{
    engine_seq_t *seqs[BENCH_MAX_SEQS] = {0};
    int n_gen[BENCH_MAX_SEQS];
    int64_t n_hist[BENCH_MAX_SEQS];
    engine_sampler_params_t sp;
    uint64_t rng = 12345;
    uint64_t t0, total = 0;
    tdm_status_t st = TDM_OK;

    memset(out, 0, sizeof(*out));
    out->identical = 1;
    engine_sampler_params_default(&sp);
    sp.temperature = 0.0;
    for (int i = 0; i < b->n && st == TDM_OK; i++) {
        st = engine_seq_import(b->model, b->pool, b->blobs[i], b->blob_bytes[i], &seqs[i]);
        n_gen[i] = 1;
        n_hist[i] = b->n_ctx + 1;
        b->hist[i][b->n_ctx] = b->first[i];
    }
    t0 = tdm_clock_now_ns();
    while (st == TDM_OK) {
        engine_spec_req_t reqs[BENCH_MAX_SEQS];
        engine_spec_result_t res[BENCH_MAX_SEQS];
        int32_t ext[BENCH_MAX_SEQS][ENGINE_SPEC_MAX_DRAFTS];
        int map[BENCH_MAX_SEQS];
        int nr = 0;
        for (int i = 0; i < b->n; i++) {
            if (n_gen[i] >= b->gen) {
                continue;
            }
            memset(&reqs[nr], 0, sizeof(reqs[nr]));
            reqs[nr].seq = seqs[i];
            reqs[nr].anchor = b->hist[i][n_hist[i] - 1];
            reqs[nr].drafter = prob >= 0.0 ? ENGINE_SPEC_EXTERNAL : drafter;
            reqs[nr].sampling = &sp;
            reqs[nr].history = b->hist[i];
            reqs[nr].n_history = n_hist[i];
            reqs[nr].max_emit = b->gen - n_gen[i];
            if (prob >= 0.0) {
                int k = 0;
                for (int j = n_gen[i] - 1; j < b->gen - 1 && k < ENGINE_SPEC_MAX_DRAFTS; j++) {
                    double u = (double)(splitmix(&rng) >> 11) * (1.0 / 9007199254740992.0);
                    int32_t t = b->ref[i][j];
                    ext[nr][k++] = u < prob ? t : (int32_t)((t + 1) % b->V);
                }
                reqs[nr].ext_drafts = ext[nr];
                reqs[nr].n_ext_drafts = k;
            }
            map[nr++] = i;
        }
        if (nr == 0) {
            break;
        }
        st = engine_spec_step(b->spec, reqs, nr, res);
        for (int r = 0; r < nr && st == TDM_OK; r++) {
            int i = map[r];
            for (int k = 0; k < res[r].n_emitted; k++) {
                int32_t t = res[r].samples[k].token;
                out->identical = out->identical && t == b->ref[i][n_gen[i] - 1];
                b->hist[i][n_hist[i]++] = t;
                n_gen[i]++;
            }
            out->verified += (uint64_t)res[r].n_verified;
            out->accepted += (uint64_t)res[r].n_accepted;
            out->steps++;
            total += (uint64_t)res[r].n_emitted;
        }
    }
    out->tok_per_s = (double)total * BENCH_NS_PER_S / (double)(tdm_clock_now_ns() - t0);
    for (int i = 0; i < b->n; i++) {
        engine_seq_destroy(seqs[i]);
    }
    return st;
}

/* Prefill n sequences, export their states, compute the plain greedy reference. */
static tdm_status_t prepare(bench_t *b, int n, int64_t n_ctx, int gen)
{
    const engine_config_t *c = engine_model_config(b->model);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    tdm_status_t st = logits == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    run_result_t r;

    b->n = n;
    b->gen = gen;
    b->n_ctx = n_ctx;
    for (int i = 0; i < n && st == TDM_OK; i++) {
        engine_seq_t *seq = NULL;
        uint64_t s = 1000 + (uint64_t)i;
        int64_t best = 0;
        b->hist[i] = malloc(sizeof(int32_t) * (size_t)(n_ctx + gen + 2));
        b->ref[i] = malloc(sizeof(int32_t) * (size_t)(gen + ENGINE_SPEC_MAX_DRAFTS + 2));
        if (b->hist[i] == NULL || b->ref[i] == NULL) {
            st = TDM_ERR_NO_MEMORY;
            break;
        }
        for (int64_t k = 0; k < n_ctx; k++) {
            b->hist[i][k] = (int32_t)(3 + splitmix(&s) % (uint64_t)(c->vocab_size - 6));
        }
        st = engine_seq_create(b->model, b->pool, &seq);
        if (st == TDM_OK) {
            st = engine_fwd_prefill(b->fwd, seq, b->hist[i], n_ctx, 0, logits, NULL);
        }
        for (int64_t v = 1; v < c->vocab_size; v++) {
            best = logits[v] > logits[best] ? v : best;
        }
        b->first[i] = (int32_t)best;
        if (st == TDM_OK) {
            b->blob_bytes[i] = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_PAGES);
            b->blobs[i] = malloc(b->blob_bytes[i]);
            st = b->blobs[i] == NULL ? TDM_ERR_NO_MEMORY
                                     : engine_seq_export(seq, ENGINE_SEQ_EXPORT_PAGES, b->blobs[i],
                                                         b->blob_bytes[i], &b->blob_bytes[i]);
        }
        engine_seq_destroy(seq);
    }
    free(logits);
    if (st != TDM_OK) {
        return st;
    }
    /* the reference: plain decoding; ref[i][j] is the token after first (j = 0 ..) */
    for (int i = 0; i < n; i++) {
        memset(b->ref[i], 0, sizeof(int32_t) * (size_t)(gen + ENGINE_SPEC_MAX_DRAFTS + 2));
    }
    st = run(b, ENGINE_SPEC_OFF, -1.0, &r);
    for (int i = 0; i < n && st == TDM_OK; i++) {
        memcpy(b->ref[i], b->hist[i] + n_ctx + 1, sizeof(int32_t) * (size_t)(gen - 1));
    }
    return st;
}

static void release(bench_t *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->blobs[i]);
        free(b->hist[i]);
        free(b->ref[i]);
        b->blobs[i] = NULL;
        b->hist[i] = NULL;
        b->ref[i] = NULL;
    }
}

static double rate(const run_result_t *r)
{
    return r->verified > 0 ? (double)r->accepted / (double)r->verified : 0.0;
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    engine_spec_params_t pp;
    engine_model_t *model = NULL;
    bench_t b;
    double batches[BENCH_MAX_LIST], probs[BENCH_MAX_LIST];
    int n_batches, n_probs;
    char err[256];
    tdm_status_t st;

    memset(&b, 0, sizeof(b));
    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-spec",
                        "decode tok/s with and without speculative decoding (MODEL.md 8).", &cfg,
                        NULL, NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    n_batches = parse_list(cfg.batches, batches);
    n_probs = parse_list(cfg.probs, probs);
    for (int k = 0; k < n_batches; k++) {
        if (batches[k] < 1 || batches[k] > BENCH_MAX_SEQS) {
            fprintf(stderr, "tandem-bench-spec: --batches: %g not in 1..%d\n", batches[k],
                    BENCH_MAX_SEQS);
            return 2;
        }
    }
    engine_model_params_default(&mp);
    mp.n_threads = (int)cfg.n_threads;
    if (engine_model_load(cfg.model_dir, &mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-spec: %s: %s\n", cfg.model_dir, err);
        return 1;
    }
    b.model = model;
    b.V = engine_model_config(model)->vocab_size;
    st = engine_kv_pool_create(engine_model_config(model), engine_model_fingerprint(model),
                               BENCH_POOL_PAGES, &b.pool);
    engine_fwd_params_default(model, &fp);
    fp.n_threads = (int)cfg.n_threads;
    if (st == TDM_OK) {
        st = engine_fwd_create(model, b.pool, &fp, &b.fwd);
    }
    engine_spec_params_default(model, &pp);
    pp.max_batch = BENCH_MAX_SEQS;
    if (st == TDM_OK) {
        st = engine_spec_create(b.fwd, &pp, &b.spec);
    }
    printf("# tandem-bench-spec: %s, threads %u, context %u, %u tokens per sequence, greedy, "
           "coupled, max drafts %d\n",
           cfg.model_dir, cfg.n_threads, cfg.context_tokens, cfg.gen_tokens, pp.max_drafts);
    for (int k = 0; k < n_batches && st == TDM_OK; k++) {
        int n = (int)batches[k];
        run_result_t base, r;
        st = prepare(&b, n, cfg.context_tokens, (int)cfg.gen_tokens);
        if (st == TDM_OK) {
            st = run(&b, ENGINE_SPEC_OFF, -1.0, &base);
        }
        printf("\n## batch %d\n| drafter | p | acceptance | drafts kept/step | tok/s | speedup | "
               "identical |\n|---|---|---|---|---|---|---|\n",
               n);
        if (st == TDM_OK) {
            printf("| off | - | - | - | %.1f | 1.00 | %s |\n", base.tok_per_s,
                   base.identical ? "yes" : "NO");
        }
        for (int d = ENGINE_SPEC_DSPARK; d <= ENGINE_SPEC_NGRAM && st == TDM_OK; d++) {
            st = run(&b, (engine_spec_drafter_t)d, -1.0, &r);
            if (st == TDM_OK) {
                printf("| %s | - | %.3f | %.2f | %.1f | %.2f | %s |\n",
                       engine_spec_drafter_name((engine_spec_drafter_t)d), rate(&r),
                       r.steps > 0 ? (double)r.accepted / (double)r.steps : 0.0, r.tok_per_s,
                       r.tok_per_s / base.tok_per_s, r.identical ? "yes" : "NO");
            }
        }
        for (int j = 0; j < n_probs && st == TDM_OK; j++) {
            st = run(&b, ENGINE_SPEC_EXTERNAL, probs[j], &r);
            if (st == TDM_OK) {
                printf("| controlled | %.2f | %.3f | %.2f | %.1f | %.2f | %s |\n", probs[j],
                       rate(&r), r.steps > 0 ? (double)r.accepted / (double)r.steps : 0.0,
                       r.tok_per_s, r.tok_per_s / base.tok_per_s, r.identical ? "yes" : "NO");
            }
        }
        fflush(stdout);
        release(&b);
    }
    if (st != TDM_OK) {
        fprintf(stderr, "tandem-bench-spec: %s\n", tdm_status_message(st));
    }
    engine_spec_destroy(b.spec);
    engine_fwd_destroy(b.fwd);
    engine_kv_pool_destroy(b.pool);
    engine_model_destroy(model);
    return st == TDM_OK ? 0 : 1;
}
