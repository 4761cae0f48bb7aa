/* prefill_batch_bench.c - tandem-bench-prefill-batch: the prefill node's compute for a set of
 * jobs (agent turns: a history of H tokens each, deltas of a given mix), run one job at a time
 * (each job: canonical ring replay at H, then engine_fwd_prefill of its delta: the node before
 * issue 17) against batched (the node's steps: one engine_fwd_replay_batch of every job, then
 * engine_fwd_prefill_parts calls of at most --chunk tokens per job and --budget tokens per
 * step, oldest first), alternating, in one process on one checkpoint. Each job starts from the
 * same imported state in both modes (an export of its history with pages), and the first-token
 * logits of every job are compared bit for bit between the modes. Prints prefill (delta) tokens
 * per second (wall and per process CPU second, the steadier figure on a shared box) of each mode
 * per round and the ratios (docs/BENCHMARKS.md, "Prefill node batching
 * (issue 17)"). Transfers, sampling and notices are not in it: bench/prefill-batch measures the
 * whole node on a cluster.
 */
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "engine/forward.h"
#include "engine/seq_state.h"
#include "bench_ids.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_MAX_JOBS 64

/* Process CPU seconds (every thread): on a shared box, the work a mode did, apart from the time
 * it waited for a core. */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
    const char *model_dir;
    uint32_t n_threads;
    uint32_t history;
    const char *deltas;
    uint32_t jobs;
    uint32_t chunk;
    uint32_t budget;
    uint32_t rounds;
} bench_cfg_t;

static const tdm_flag_t bench_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(bench_cfg_t, model_dir), "checkpoint directory", 0, 0,
     1},
    {"threads", TDM_FLAG_U32, "1", offsetof(bench_cfg_t, n_threads), "kernel threads", 1, 256, 0},
    {"history", TDM_FLAG_U32, "600", offsetof(bench_cfg_t, history),
     "tokens each job's session holds before its turn (H)", 1, 65536, 0},
    {"deltas", TDM_FLAG_STRING, "40,120,60,300,25,180,80,150", offsetof(bench_cfg_t, deltas),
     "delta tokens of the jobs, cycled", 0, 0, 0},
    {"jobs", TDM_FLAG_U32, "8", offsetof(bench_cfg_t, jobs), "jobs (turns) per round", 1,
     BENCH_MAX_JOBS, 0},
    {"chunk", TDM_FLAG_U32, "256", offsetof(bench_cfg_t, chunk),
     "rows per layer pass (--chunk-tokens) and most tokens of one job per step", 1, 65536, 0},
    {"budget", TDM_FLAG_U32, "256", offsetof(bench_cfg_t, budget),
     "tokens per batched step (--batch-tokens)", 1, 1048576, 0},
    {"rounds", TDM_FLAG_U32, "3", offsetof(bench_cfg_t, rounds), "rounds of both modes", 1, 1000,
     0},
};
#define N_BENCH_FLAGS (sizeof(bench_flags) / sizeof(bench_flags[0]))

typedef struct {
    uint8_t *blob; /* the session at H, with pages */
    size_t n_blob;
    int32_t *ids;  /* [H + delta] */
    int64_t delta;
    float *logits[2]; /* first-token logits per mode */
} job_t;

/* Import every job's session at H and reset its rings (the node's start). */
static tdm_status_t import_all(const engine_model_t *model, engine_kv_pool_t *pool, job_t *jobs,
                               int n, engine_seq_t **seqs)
{
    for (int i = 0; i < n; i++) {
        tdm_status_t st = engine_seq_import(model, pool, jobs[i].blob, jobs[i].n_blob, &seqs[i]);
        if (st != TDM_OK) {
            return st;
        }
        engine_seq_reset_rings(seqs[i]);
    }
    return TDM_OK;
}

/* One job at a time: replay, prefill. */
static tdm_status_t run_one(engine_fwd_t *fwd, job_t *jobs, int n, int64_t H, int64_t n_ctx,
                            engine_seq_t **seqs)
{
    tdm_status_t st = TDM_OK;
    for (int i = 0; i < n && st == TDM_OK; i++) {
        st = engine_fwd_replay(fwd, seqs[i], jobs[i].ids + H - n_ctx, n_ctx,
                               ENGINE_REPLAY_CANONICAL, NULL);
        if (st == TDM_OK) {
            st = engine_fwd_prefill(fwd, seqs[i], jobs[i].ids + H, jobs[i].delta, 0,
                                    jobs[i].logits[0], NULL);
        }
    }
    return st;
}

/* Batched: one replay call, then steps as the node takes them. */
static tdm_status_t run_batched(engine_fwd_t *fwd, const bench_cfg_t *cfg, job_t *jobs, int n,
                                int64_t H, int64_t n_ctx, engine_seq_t **seqs)
{
    const int32_t *ctx[BENCH_MAX_JOBS];
    int64_t n_ids[BENCH_MAX_JOBS], done[BENCH_MAX_JOBS];
    tdm_status_t st;

    for (int i = 0; i < n; i++) {
        ctx[i] = jobs[i].ids + H - n_ctx;
        n_ids[i] = n_ctx;
        done[i] = 0;
    }
    st = engine_fwd_replay_batch(fwd, seqs, ctx, n_ids, n);
    for (;;) {
        engine_prefill_part_t parts[BENCH_MAX_JOBS];
        int64_t taken = 0;
        int n_parts = 0;
        if (st != TDM_OK) {
            return st;
        }
        for (int i = 0; i < n && taken < cfg->budget; i++) {
            int64_t m = jobs[i].delta - done[i];
            m = m < (int64_t)cfg->chunk ? m : (int64_t)cfg->chunk;
            m = m < (int64_t)cfg->budget - taken ? m : (int64_t)cfg->budget - taken;
            if (m <= 0) {
                continue;
            }
            parts[n_parts++] = (engine_prefill_part_t){seqs[i], H, H + jobs[i].delta,
                                                       jobs[i].ids + H + done[i], m, 0,
                                                       jobs[i].logits[1], 0};
            done[i] += m;
            taken += m;
        }
        if (n_parts == 0) {
            return TDM_OK;
        }
        st = engine_fwd_prefill_parts(fwd, parts, n_parts);
    }
}

int main(int argc, char **argv)
{
    bench_cfg_t cfg;
    tdm_flags_action_t action;
    engine_model_params_t mp;
    engine_model_t *model = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    engine_fwd_params_t fp;
    const engine_config_t *c;
    job_t jobs[BENCH_MAX_JOBS];
    engine_seq_t *seqs[BENCH_MAX_JOBS];
    int64_t mix[BENCH_MAX_JOBS];
    int n_mix = 0, n;
    int64_t H, n_ctx, tokens = 0;
    double sum_s[2] = {0, 0}, sum_cpu[2] = {0, 0};
    char err[512];
    tdm_status_t st = TDM_OK;
    int rc = 0;

    memset(&cfg, 0, sizeof(cfg));
    memset(jobs, 0, sizeof(jobs));
    if (tdm_flags_parse(bench_flags, N_BENCH_FLAGS, argc, argv, "tandem-bench-prefill-batch",
                        "prefill node compute: jobs one at a time vs batched steps.", &cfg, NULL,
                        NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    for (const char *p = cfg.deltas; *p != '\0' && n_mix < BENCH_MAX_JOBS;) {
        mix[n_mix++] = atoll(p);
        if (mix[n_mix - 1] < 1) {
            fprintf(stderr, "tandem-bench-prefill-batch: --deltas: each at least 1\n");
            return 2;
        }
        while (*p != '\0' && *p != ',') {
            p++;
        }
        if (*p == ',') {
            p++;
        }
    }
    if (n_mix == 0) {
        fprintf(stderr, "tandem-bench-prefill-batch: --deltas is empty\n");
        return 2;
    }
    engine_model_params_default(&mp);
    mp.n_threads = (int)cfg.n_threads;
    if (engine_model_load(cfg.model_dir, &mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-prefill-batch: %s\n", err);
        return 1;
    }
    c = engine_model_config(model);
    n = (int)cfg.jobs;
    H = cfg.history;
    n_ctx = H < c->sliding_window + c->engram_max_ngram_size - 1
                ? H
                : c->sliding_window + c->engram_max_ngram_size - 1;
    st = engine_kv_pool_create(c, engine_model_fingerprint(model), 16384, &pool);
    engine_fwd_params_default(model, &fp);
    fp.n_threads = (int)cfg.n_threads;
    fp.max_chunk_tokens = cfg.chunk;
    if (st == TDM_OK) {
        st = engine_fwd_create(model, pool, &fp, &fwd);
    }
    for (int i = 0; i < n && st == TDM_OK; i++) { /* each job's session at H, exported */
        engine_seq_t *s = NULL;
        jobs[i].delta = mix[i % n_mix];
        jobs[i].ids = malloc((size_t)(H + jobs[i].delta) * sizeof(int32_t));
        jobs[i].logits[0] = malloc((size_t)c->vocab_size * sizeof(float));
        jobs[i].logits[1] = malloc((size_t)c->vocab_size * sizeof(float));
        if (jobs[i].ids == NULL || jobs[i].logits[0] == NULL || jobs[i].logits[1] == NULL) {
            st = TDM_ERR_NO_MEMORY;
            break;
        }
        bench_seeded_ids(1000 + (uint64_t)i, c->vocab_size, jobs[i].ids, H + jobs[i].delta);
        tokens += jobs[i].delta;
        st = engine_seq_create(model, pool, &s);
        if (st == TDM_OK) {
            st = engine_fwd_prefill(fwd, s, jobs[i].ids, H, 0, NULL, NULL);
        }
        if (st == TDM_OK) {
            jobs[i].n_blob = engine_seq_export_bytes(s, ENGINE_SEQ_EXPORT_PAGES);
            jobs[i].blob = malloc(jobs[i].n_blob);
            st = jobs[i].blob == NULL ? TDM_ERR_NO_MEMORY
                                      : engine_seq_export(s, ENGINE_SEQ_EXPORT_PAGES, jobs[i].blob,
                                                          jobs[i].n_blob, &jobs[i].n_blob);
        }
        engine_seq_destroy(s);
    }
    if (st != TDM_OK) {
        fprintf(stderr, "tandem-bench-prefill-batch: setup failed: %s\n", tdm_status_name(st));
        rc = 1;
        goto out;
    }
    printf("%d jobs, history %lld tokens, deltas %s (%lld tokens), chunk %u, budget %u, "
           "threads %u\n",
           n, (long long)H, cfg.deltas, (long long)tokens, cfg.chunk, cfg.budget, cfg.n_threads);
    for (uint32_t r = 0; r < cfg.rounds && st == TDM_OK; r++) {
        double s_mode[2], cpu_mode[2];
        for (int mode = 0; mode < 2 && st == TDM_OK; mode++) {
            uint64_t t0;
            double c0;
            st = import_all(model, pool, jobs, n, seqs);
            t0 = tdm_clock_now_ns();
            c0 = cpu_seconds();
            if (st == TDM_OK) {
                st = mode == 0 ? run_one(fwd, jobs, n, H, n_ctx, seqs)
                               : run_batched(fwd, &cfg, jobs, n, H, n_ctx, seqs);
            }
            s_mode[mode] = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_S;
            cpu_mode[mode] = cpu_seconds() - c0;
            sum_s[mode] += s_mode[mode];
            sum_cpu[mode] += cpu_mode[mode];
            for (int i = 0; i < n; i++) {
                engine_seq_destroy(seqs[i]);
                seqs[i] = NULL;
            }
        }
        if (st != TDM_OK) {
            break;
        }
        for (int i = 0; i < n; i++) {
            if (memcmp(jobs[i].logits[0], jobs[i].logits[1],
                       (size_t)c->vocab_size * sizeof(float)) != 0) {
                fprintf(stderr, "tandem-bench-prefill-batch: job %d: batched logits differ\n", i);
                rc = 1;
            }
        }
        printf("round %u: one at a time %.1f tok/s (%.3f s, %.3f CPU s), batched %.1f tok/s "
               "(%.3f s, %.3f CPU s), ratio %.2f wall, %.2f CPU\n",
               r + 1, (double)tokens / s_mode[0], s_mode[0], cpu_mode[0],
               (double)tokens / s_mode[1], s_mode[1], cpu_mode[1], s_mode[0] / s_mode[1],
               cpu_mode[0] / cpu_mode[1]);
    }
    if (st != TDM_OK) {
        fprintf(stderr, "tandem-bench-prefill-batch: run failed: %s\n", tdm_status_name(st));
        rc = 1;
    } else {
        printf("all rounds: one at a time %.1f tok/s (%.1f per CPU s), batched %.1f tok/s (%.1f "
               "per CPU s), ratio %.2f wall, %.2f CPU%s\n",
               (double)tokens * cfg.rounds / sum_s[0], (double)tokens * cfg.rounds / sum_cpu[0],
               (double)tokens * cfg.rounds / sum_s[1], (double)tokens * cfg.rounds / sum_cpu[1],
               sum_s[0] / sum_s[1], sum_cpu[0] / sum_cpu[1],
               rc == 0 ? " (first-token logits bit-identical)" : "");
    }
out:
    for (int i = 0; i < n; i++) {
        free(jobs[i].blob);
        free(jobs[i].ids);
        free(jobs[i].logits[0]);
        free(jobs[i].logits[1]);
    }
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    return rc;
}
