/* spec_bench.c - tandem-bench-spec: decode tok/s with and without speculative decoding
 * (MODEL.md 8) at several batch sizes: plain decode, DSpark, n-gram, and a controlled-acceptance
 * drafter that proposes the target's own (precomputed, greedy) continuation, each token kept
 * correct with probability p, to chart speedup against acceptance rate. Decode loops only
 * (prefill excluded; every configuration starts from the same imported state). Greedy, coupled
 * acceptance: every run's tokens are checked equal to plain decoding. One table per batch size,
 * then a speedup-vs-acceptance summary across them. Each row's runs alternate with plain runs
 * and its speedup is against those, so load on a shared machine hits both sides alike. Large
 * batches are slow on a small CPU: --tokens, --probs and --drafters trim a run, --reps keeps the
 * fastest of several, and --clock cpu divides by this process's CPU time instead of wall time (with
 * --threads 1 on an oversubscribed machine that leaves out the time other processes held the core).
 * Results go into docs/BENCHMARKS.md ("Speculative decoding").
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/startup.h"
#include "common/status.h"
#include "engine/forward.h"
#include "engine/spec.h"
#include "kernels/device.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_MAX_LIST   16
#define BENCH_MAX_SEQS   16
#define BENCH_POOL_PAGES 8192
#define BENCH_NAME_BYTES 32
/* Summary rows: DSpark, n-gram, then one per controlled p. */
#define BENCH_ROW_DSPARK 0
#define BENCH_ROW_NGRAM  1
#define BENCH_ROW_P0     2
#define BENCH_MAX_ROWS   (BENCH_ROW_P0 + BENCH_MAX_LIST)

typedef struct {
    const char *model_dir;
    uint32_t n_threads;
    const char *device;
    uint32_t context_tokens;
    uint32_t gen_tokens;
    const char *batches;
    const char *probs;
    const char *drafters;
    uint32_t reps;
    const char *clock;
    const char *log_level;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir), "checkpoint directory", 0, 0,
     1},
    {"threads", TDM_FLAG_U32, "2", offsetof(bench_cfg_t, n_threads), "kernel threads", 1, 256, 0},
    {"device", TDM_FLAG_STRING, "cpu", offsetof(bench_cfg_t, device),
     "where the kernels, weights and KV pages live: cpu, cuda or cuda:N (guard: the checking "
     "backend of kernels/guard.h; kernels/device.h)",
     0, 0, 0},
    {"context", TDM_FLAG_U32, "128", offsetof(bench_cfg_t, context_tokens),
     "tokens prefilled per sequence before decoding", 8, 65536, 0},
    {"tokens", TDM_FLAG_U32, "32", offsetof(bench_cfg_t, gen_tokens),
     "tokens generated per sequence and configuration", 2, 4096, 0},
    {"batches", TDM_FLAG_STRING, "1,4,16", offsetof(bench_cfg_t, batches),
     "comma-separated batch sizes (<= 16)", 0, 0, 0},
    {"probs", TDM_FLAG_STRING, "0,0.5,0.7,0.8,0.9,1", offsetof(bench_cfg_t, probs),
     "controlled drafter: probabilities that a draft token is the target's", 0, 0, 0},
    {"drafters", TDM_FLAG_STRING, "dspark,ngram,controlled", offsetof(bench_cfg_t, drafters),
     "rows besides plain decoding: comma-separated subset of dspark, ngram, controlled", 0, 0, 0},
    {"reps", TDM_FLAG_U32, "1", offsetof(bench_cfg_t, reps),
     "runs per configuration; the fastest counts (other load only slows a run down)", 1, 16, 0},
    {"clock", TDM_FLAG_STRING, "wall", offsetof(bench_cfg_t, clock),
     "time base of tok/s: wall, or cpu (this process's CPU time; use with --threads 1 on a "
     "shared machine)",
     0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(bench_cfg_t, log_level),
     "trace, debug, info, warn, error or off (debug: the model load's steps and times)", 0, 0, 0},
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
    int cpu_clock; /* 1: tok/s per CPU-second of the process (--clock cpu) */
    uint8_t *blobs[BENCH_MAX_SEQS];
    size_t blob_bytes[BENCH_MAX_SEQS];
    int32_t *hist[BENCH_MAX_SEQS]; /* context + generated */
    int64_t n_ctx;
    int32_t first[BENCH_MAX_SEQS];
    int32_t *ref[BENCH_MAX_SEQS]; /* plain greedy continuation (gen tokens after first) */
} bench_t;

/* One summary cell: a row's acceptance and speedup at one batch size. */
typedef struct {
    int have;
    double acceptance;
    double speedup;
} bench_cell_t;

typedef struct {
    double tok_per_s;
    uint64_t verified;
    uint64_t accepted;
    uint64_t steps;
    int identical;
} run_result_t;

/* Now on the benchmark's clock: CLOCK_MONOTONIC, or the process's CPU time (--clock cpu). */
static uint64_t bench_now_ns(const bench_t *b)
{
    if (!b->cpu_clock) {
        return tdm_clock_now_ns();
    }
    return tdm_clock_process_cpu_ns();
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Parse "a,b,c" into out[] (at most BENCH_MAX_LIST numbers within [lo, hi]); -1 on anything
 * else (empty items, junk, too many, out of range). */
static int parse_list(const char *s, double lo, double hi, double *out)
{
    int n = 0;

    for (const char *p = s; *p != '\0';) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0') || n == BENCH_MAX_LIST || !(x >= lo) ||
            !(x <= hi)) {
            return -1;
        }
        out[n++] = x;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* Whether the comma-separated list names `name`; *unknown_out set when an item is not one of
 * dspark, ngram, controlled. */
static int list_has(const char *list, const char *name, int *unknown_out)
{
    static const char *const KNOWN[] = {"dspark", "ngram", "controlled"};
    int found = 0;

    for (const char *p = list; *p != '\0';) {
        size_t n = strcspn(p, ",");
        int known = 0;
        for (size_t k = 0; k < sizeof(KNOWN) / sizeof(KNOWN[0]); k++) {
            known |= strlen(KNOWN[k]) == n && strncmp(p, KNOWN[k], n) == 0;
        }
        *unknown_out |= !known;
        found |= strlen(name) == n && strncmp(p, name, n) == 0;
        p += n + (p[n] == ',');
    }
    return found;
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
    t0 = bench_now_ns(b);
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
    out->tok_per_s = (double)total * TDM_NS_PER_S / (double)(bench_now_ns(b) - t0);
    for (int i = 0; i < b->n; i++) {
        engine_seq_destroy(seqs[i]);
    }
    return st;
}

/* run() `reps` times; the fastest counts. Every repetition drafts the same tokens (the drafter's
 * stream restarts), so the counters are those of any one; identical only if it held in all. */
static tdm_status_t run_best(bench_t *b, engine_spec_drafter_t drafter, double prob, uint32_t reps,
                             run_result_t *out)
{
    tdm_status_t st = TDM_OK;
    int identical = 1;

    for (uint32_t k = 0; k < reps && st == TDM_OK; k++) {
        run_result_t r;
        st = run(b, drafter, prob, &r);
        if (st == TDM_OK) {
            identical = identical && r.identical;
            if (k == 0 || r.tok_per_s > out->tok_per_s) {
                *out = r;
            }
        }
    }
    out->identical = identical;
    return st;
}

/* Fold run r into best: the faster one counts; identical only if both were. */
static void keep_fastest(run_result_t *best, const run_result_t *r, int first)
{
    int identical = first ? r->identical : best->identical && r->identical;

    if (first || r->tok_per_s > best->tok_per_s) {
        *best = *r;
    }
    best->identical = identical;
}

/* `reps` rounds of a plain run then a run of the drafter, so both sides see the same load; the
 * fastest of each counts (counters as run_best). */
static tdm_status_t run_paired(bench_t *b, engine_spec_drafter_t drafter, double prob,
                               uint32_t reps, run_result_t *plain_out, run_result_t *out)
{
    tdm_status_t st = TDM_OK;

    for (uint32_t k = 0; k < reps && st == TDM_OK; k++) {
        run_result_t r;
        st = run(b, ENGINE_SPEC_OFF, -1.0, &r);
        if (st == TDM_OK) {
            keep_fastest(plain_out, &r, k == 0);
            st = run(b, drafter, prob, &r);
        }
        if (st == TDM_OK) {
            keep_fastest(out, &r, k == 0);
        }
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

/* One table row; records its summary cell. */
static void print_row(const char *name, double prob, const run_result_t *r, double base_tok_per_s,
                      bench_cell_t *cell)
{
    char p[BENCH_NAME_BYTES];

    if (prob >= 0.0) {
        snprintf(p, sizeof(p), "%.2f", prob);
    } else {
        snprintf(p, sizeof(p), "-");
    }
    cell->have = 1;
    cell->acceptance = rate(r);
    cell->speedup = r->tok_per_s / base_tok_per_s;
    printf("| %s | %s | %.3f | %.2f | %.1f | %.2f | %s |\n", name, p, cell->acceptance,
           r->steps > 0 ? (double)r->accepted / (double)r->steps : 0.0, r->tok_per_s, cell->speedup,
           r->identical ? "yes" : "NO");
}

/* The speedup-vs-acceptance summary: one row per drafter or p, one column per batch size. */
static void print_summary(const double *batches, int n_batches, const double *probs, int n_probs,
                          bench_cell_t cells[][BENCH_MAX_ROWS])
{
    printf(
        "\n## speedup vs acceptance (acceptance / speedup over plain decoding)\n| drafter | p |");
    for (int k = 0; k < n_batches; k++) {
        printf(" batch %d |", (int)batches[k]);
    }
    printf("\n|---|---|");
    for (int k = 0; k < n_batches; k++) {
        printf("---|");
    }
    printf("\n");
    for (int row = 0; row < BENCH_ROW_P0 + n_probs; row++) {
        int any = 0;
        for (int k = 0; k < n_batches; k++) {
            any |= cells[k][row].have;
        }
        if (!any) {
            continue;
        }
        if (row < BENCH_ROW_P0) {
            printf("| %s | - |", row == BENCH_ROW_DSPARK ? "dspark" : "ngram");
        } else {
            printf("| controlled | %.2f |", probs[row - BENCH_ROW_P0]);
        }
        for (int k = 0; k < n_batches; k++) {
            if (cells[k][row].have) {
                printf(" %.3f / %.2fx |", cells[k][row].acceptance, cells[k][row].speedup);
            } else {
                printf(" - |");
            }
        }
        printf("\n");
    }
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
    static bench_cell_t cells[BENCH_MAX_LIST][BENCH_MAX_ROWS];
    int n_batches, n_probs;
    int unknown = 0;
    int with_dspark, with_ngram, with_controlled;
    char err[256];
    tdm_status_t st;

    memset(&b, 0, sizeof(b));
    {
        const tdm_main_spec_t spec = {
            "tandem-bench-spec", "decode tok/s with and without speculative decoding (MODEL.md 8).",
            bench_flags, N_BENCH_FLAGS, offsetof(bench_cfg_t, log_level)};
        if (tdm_main_start(&spec, argc, argv, &cfg, &action) != TDM_OK) {
            return 2;
        }
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    n_batches = parse_list(cfg.batches, 1, BENCH_MAX_SEQS, batches);
    for (int k = 0; k < n_batches; k++) {
        if (batches[k] != (double)(int)batches[k]) {
            n_batches = -1;
        }
    }
    if (n_batches <= 0) {
        fprintf(stderr, "tandem-bench-spec: --batches=%s: expected 1..%d integers in 1..%d\n",
                cfg.batches, BENCH_MAX_LIST, BENCH_MAX_SEQS);
        return 2;
    }
    n_probs = parse_list(cfg.probs, 0.0, 1.0, probs);
    if (n_probs < 0) {
        fprintf(stderr, "tandem-bench-spec: --probs=%s: expected up to %d numbers in [0, 1]\n",
                cfg.probs, BENCH_MAX_LIST);
        return 2;
    }
    with_dspark = list_has(cfg.drafters, "dspark", &unknown);
    with_ngram = list_has(cfg.drafters, "ngram", &unknown);
    with_controlled = list_has(cfg.drafters, "controlled", &unknown);
    if (unknown) {
        fprintf(stderr,
                "tandem-bench-spec: --drafters=%s: expected names among dspark, ngram, "
                "controlled\n",
                cfg.drafters);
        return 2;
    }
    if (strcmp(cfg.clock, "wall") != 0 && strcmp(cfg.clock, "cpu") != 0) {
        fprintf(stderr, "tandem-bench-spec: --clock=%s: expected wall or cpu\n", cfg.clock);
        return 2;
    }
    b.cpu_clock = strcmp(cfg.clock, "cpu") == 0;
    engine_model_params_default(&mp);
    mp.n_threads = (int)cfg.n_threads;
    if (kern_device_open(cfg.device, NULL, &mp.ops, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-spec: --device: %s\n", err);
        return 2;
    }
    if (engine_model_load(cfg.model_dir, &mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-spec: %s: %s\n", cfg.model_dir, err);
        return 1;
    }
    b.model = model;
    b.V = engine_model_config(model)->vocab_size;
    st = engine_kv_pool_create_ops(engine_model_config(model), engine_model_fingerprint(model),
                                   BENCH_POOL_PAGES, engine_model_ops(model), &b.pool);
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
           "coupled, max drafts %d, best of %u, tok/s per %s second\n",
           cfg.model_dir, cfg.n_threads, cfg.context_tokens, cfg.gen_tokens, pp.max_drafts,
           cfg.reps, b.cpu_clock ? "process CPU" : "wall-clock");
    for (int k = 0; k < n_batches && st == TDM_OK; k++) {
        int n = (int)batches[k];
        run_result_t base = {0};
        run_result_t res[BENCH_MAX_ROWS] = {0};
        run_result_t plain[BENCH_MAX_ROWS] = {0};
        int have[BENCH_MAX_ROWS] = {0};
        uint32_t n_base_runs = cfg.reps;
        st = prepare(&b, n, cfg.context_tokens, (int)cfg.gen_tokens);
        if (st == TDM_OK) {
            st = run_best(&b, ENGINE_SPEC_OFF, -1.0, cfg.reps, &base);
        }
        /* Each row alternates with plain runs (run_paired); its speedup is against those. */
        for (int row = 0; row < BENCH_ROW_P0 + n_probs && st == TDM_OK; row++) {
            engine_spec_drafter_t d = row == BENCH_ROW_DSPARK  ? ENGINE_SPEC_DSPARK
                                      : row == BENCH_ROW_NGRAM ? ENGINE_SPEC_NGRAM
                                                               : ENGINE_SPEC_EXTERNAL;
            double prob = row >= BENCH_ROW_P0 ? probs[row - BENCH_ROW_P0] : -1.0;
            if (!(row == BENCH_ROW_DSPARK  ? with_dspark
                  : row == BENCH_ROW_NGRAM ? with_ngram
                                           : with_controlled)) {
                continue;
            }
            st = run_paired(&b, d, prob, cfg.reps, &plain[row], &res[row]);
            if (st == TDM_OK) {
                n_base_runs += cfg.reps;
                have[row] = 1;
                keep_fastest(&base, &plain[row], 0);
            }
        }
        printf("\n## batch %d\n| drafter | p | acceptance | drafts kept/step | tok/s | speedup | "
               "identical |\n|---|---|---|---|---|---|---|\n",
               n);
        if (st == TDM_OK) {
            printf("| off | - | - | - | %.1f | 1.00 | %s |\n", base.tok_per_s,
                   base.identical ? "yes" : "NO");
        }
        for (int row = 0; row < BENCH_ROW_P0 + n_probs && st == TDM_OK; row++) {
            if (have[row]) {
                print_row(row == BENCH_ROW_DSPARK  ? "dspark"
                          : row == BENCH_ROW_NGRAM ? "ngram"
                                                   : "controlled",
                          row >= BENCH_ROW_P0 ? probs[row - BENCH_ROW_P0] : -1.0, &res[row],
                          plain[row].tok_per_s, &cells[k][row]);
            }
        }
        if (st == TDM_OK) {
            printf("(off: fastest of %u plain runs; a row's speedup is against the plain runs "
                   "alternated with it)\n",
                   n_base_runs);
        }
        fflush(stdout);
        release(&b);
    }
    if (st == TDM_OK) {
        print_summary(batches, n_batches, probs, n_probs, cells);
    } else {
        fprintf(stderr, "tandem-bench-spec: %s\n", tdm_status_message(st));
    }
    engine_spec_destroy(b.spec);
    engine_fwd_destroy(b.fwd);
    engine_kv_pool_destroy(b.pool);
    engine_model_destroy(model);
    return st == TDM_OK ? 0 : 1;
}
