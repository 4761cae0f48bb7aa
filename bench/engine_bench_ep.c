/* engine_bench_ep.c - tandem-bench-engine --devices (engine_bench_ep.h). */
#include "engine_bench_ep.h"
#include "bench_ids.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "engine/ep.h"
#include "engine/forward.h"
#include "engine/seq_state.h"
#include "kernels/device.h"

#define EP_POOL_PAGES 4096

/* One side's sequences and what their decode steps produced. */
typedef struct {
    const bench_ep_cfg_t *cfg;
    int B;
    int phase;           /* 0 prefill, 1 decode, 2 release */
    int n_ranks;         /* 1 for the one-device side */
    engine_seq_t **seqs; /* [B], sequence i on rank i mod n_ranks */
    int32_t *next;       /* [B] the token each sequence decodes next */
    int32_t *rec;        /* [B, steps] greedy ids */
} side_t;

/* The phase of `side` for the sequences of rank r on (model, pool, fwd). */
static tdm_status_t side_phase(side_t *side, int r, engine_model_t *model, engine_kv_pool_t *pool,
                               engine_fwd_t *fwd)
{
    const bench_ep_cfg_t *cfg = side->cfg;
    int64_t V = engine_model_config(model)->vocab_size;
    engine_seq_t *mine[ENGINE_FWD_MAX_BATCH];
    int32_t ids[ENGINE_FWD_MAX_BATCH], out[ENGINE_FWD_MAX_BATCH];
    int idx[ENGINE_FWD_MAX_BATCH];
    int n = 0;
    tdm_status_t st = TDM_OK;

    for (int i = r; i < side->B; i += side->n_ranks) {
        idx[n++] = i;
    }
    if (side->phase == 0) {
        int32_t *prompt = malloc(sizeof(int32_t) * (size_t)cfg->context);
        float *logits = malloc(sizeof(float) * (size_t)V);
        for (int k = 0; k < n && st == TDM_OK; k++) {
            int i = idx[k];
            st = prompt == NULL || logits == NULL ? TDM_ERR_NO_MEMORY
                                                  : engine_seq_create(model, pool, &side->seqs[i]);
            if (st == TDM_OK) {
                bench_seeded_ids(1000 + (uint64_t)i, V, prompt, cfg->context);
                st = engine_fwd_prefill(fwd, side->seqs[i], prompt, cfg->context, 0, logits, NULL);
            }
            if (st == TDM_OK) {
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++) {
                    best = logits[v] > logits[best] ? v : best;
                }
                side->next[i] = (int32_t)best;
            }
        }
        free(prompt);
        free(logits);
        return st;
    }
    if (side->phase == 2) {
        for (int k = 0; k < n; k++) {
            engine_seq_destroy(side->seqs[idx[k]]); /* on the rank's own thread: its device */
            side->seqs[idx[k]] = NULL;
        }
        return TDM_OK;
    }
    for (int k = 0; k < n; k++) {
        mine[k] = side->seqs[idx[k]];
        ids[k] = side->next[idx[k]];
    }
    for (int step = 0; step < cfg->steps && st == TDM_OK && n > 0; step++) {
        st = engine_fwd_decode_greedy(fwd, mine, ids, n, out);
        for (int k = 0; k < n && st == TDM_OK; k++) {
            side->rec[(size_t)idx[k] * (size_t)cfg->steps + (size_t)step] = out[k];
            ids[k] = out[k];
        }
    }
    return st;
}

static tdm_status_t ep_rank_fn(const engine_ep_rank_t *rank, void *user)
{
    return side_phase(user, rank->rank, rank->model, rank->pool, rank->fwd);
}

/* Prefill, timed decode, release on the group (ep != NULL) or the one device. Returns the
 * decode seconds, or -1 after printing why. */
static double side_run(side_t *side, engine_ep_t *ep, engine_model_t *model, engine_kv_pool_t *pool,
                       engine_fwd_t *fwd)
{
    double secs = -1.0;
    tdm_status_t st = TDM_OK;

    for (int phase = 0; phase < 3; phase++) {
        uint64_t t0 = tdm_clock_now_ns();
        side->phase = phase;
        tdm_status_t s = ep != NULL ? engine_ep_run(ep, ep_rank_fn, side)
                                    : side_phase(side, 0, model, pool, fwd);
        if (phase == 1) {
            secs = (double)(tdm_clock_now_ns() - t0) / (double)TDM_NS_PER_S;
        }
        if (st == TDM_OK && s != TDM_OK) {
            st = s;
            if (phase == 0) {
                phase = 1; /* skip the decode, still release what was made */
            }
        }
    }
    if (st != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: --devices: a %s run failed: %s\n",
                ep != NULL ? "group" : "one-device", tdm_status_message(st));
        return -1.0;
    }
    return secs;
}

/* The one-device side on dev: model, pool, context. Returns 0 or prints why. */
static int open_one(const bench_ep_cfg_t *cfg, const kern_device_t *dev, int n_threads,
                    engine_model_t **model, engine_kv_pool_t **pool, engine_fwd_t **fwd)
{
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    char err[512] = "";

    engine_model_params_default(&mp);
    mp.n_threads = n_threads;
    if (kern_device_ops(dev, &mp.ops, err, sizeof(err)) != TDM_OK ||
        engine_model_load(cfg->model_dir, &mp, model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: one-device baseline: %s\n", err);
        return -1;
    }
    if (engine_kv_pool_create_ops(engine_model_config(*model), engine_model_fingerprint(*model),
                                  EP_POOL_PAGES, mp.ops, pool) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: no memory for a %d-page KV pool\n", EP_POOL_PAGES);
        return -1;
    }
    engine_fwd_params_default(*model, &fp);
    if (engine_fwd_create(*model, *pool, &fp, fwd) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: cannot create the forward context\n");
        return -1;
    }
    return 0;
}

/* Each rank's resident weight bytes against the one device's. */
static void print_resident(engine_ep_t *ep, engine_model_t *one)
{
    engine_model_resident_t r1, r;
    engine_model_resident(one, &r1);
    printf("one device: weights resident %.1f MB (routed experts, MXFP4 codes %.1f MB)\n",
           engine_model_resident_total(&r1) / 1e6, r1.mxfp4 / 1e6);
    for (int k = 0; k < engine_ep_size(ep); k++) {
        const engine_ep_rank_t *rk = engine_ep_rank(ep, k);
        int e0, e1, er, es;
        engine_model_resident(rk->model, &r);
        engine_model_expert_shard(rk->model, 0, &e0, &e1, &er, &es);
        printf("rank %d: experts [%d, %d) of each backbone layer; weights resident %.1f MB = %.2f "
               "of one device's (MXFP4 codes %.1f MB)\n",
               k, e0, e1, engine_model_resident_total(&r) / 1e6,
               (double)engine_model_resident_total(&r) / (double)engine_model_resident_total(&r1),
               r.mxfp4 / 1e6);
    }
}

int bench_ep_run(const bench_ep_cfg_t *cfg)
{
    engine_ep_params_t p;
    engine_ep_t *ep = NULL;
    engine_model_t *one = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    char err[512] = "";
    int rc = 0;

    if (engine_ep_params_from_devices(cfg->devices, cfg->n_threads, EP_POOL_PAGES, &p, err,
                                      sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: --devices: %s\n", err);
        return 2;
    }
    tdm_status_t st = engine_ep_open(cfg->model_dir, &p, &ep, err, sizeof(err));
    if (st != TDM_OK) {
        fprintf(stderr, "tandem-bench-engine: --devices=%s: %s\n", cfg->devices, err);
        return st == TDM_ERR_INVALID_ARG || st == TDM_ERR_UNSUPPORTED || st == TDM_ERR_NOT_FOUND
                   ? 2
                   : 1;
    }
    int cpu = p.devices[0].backend == KERN_BACKEND_CPU;
    int one_threads = cpu ? cfg->n_threads * p.n_ranks : cfg->n_threads;
    if (open_one(cfg, &p.devices[0], one_threads, &one, &pool, &fwd) != 0) {
        rc = 1;
        goto done;
    }
    printf("expert parallel (data-parallel attention): %d ranks on %s, %d kernel thread(s) each; "
           "baseline: the whole model on %s with %d thread(s)\n",
           p.n_ranks, cfg->devices, cfg->n_threads, cpu ? "cpu" : "the first device", one_threads);
    print_resident(ep, one);
    for (int bi = 0; bi < cfg->n_batches && rc == 0; bi++) {
        int B = cfg->batches[bi];
        engine_seq_t *seqs[2][ENGINE_FWD_MAX_BATCH] = {{NULL}};
        int32_t next[2][ENGINE_FWD_MAX_BATCH];
        int32_t *rec[2] = {calloc((size_t)B * (size_t)cfg->steps, sizeof(int32_t)),
                           calloc((size_t)B * (size_t)cfg->steps, sizeof(int32_t))};
        side_t sides[2] = {{cfg, B, 0, p.n_ranks, seqs[0], next[0], rec[0]},
                           {cfg, B, 0, 1, seqs[1], next[1], rec[1]}};
        double best[2] = {0.0, 0.0};
        if (rec[0] == NULL || rec[1] == NULL) {
            rc = 1;
        }
        for (int rep = 0; rep < cfg->repeat && rc == 0; rep++) {
            for (int s = 0; s < 2 && rc == 0; s++) { /* alternating: group, then one device */
                double secs = side_run(&sides[s], s == 0 ? ep : NULL, one, pool, fwd);
                if (secs <= 0.0) {
                    rc = 1;
                } else if (best[s] == 0.0 || secs < best[s]) {
                    best[s] = secs;
                }
            }
        }
        if (rc == 0) {
            double tok = (double)B * cfg->steps;
            int same = memcmp(rec[0], rec[1], sizeof(int32_t) * (size_t)B * cfg->steps) == 0;
            printf("decode batch %d: %d ranks %.1f tok/s, one device %.1f tok/s, ratio %.2f; "
                   "greedy ids %s (best of %d alternating runs, %d steps after %lld-token "
                   "prompts)\n",
                   B, p.n_ranks, tok / best[0], tok / best[1], best[1] / best[0],
                   same ? "identical" : "differ", cfg->repeat, cfg->steps, (long long)cfg->context);
            if (!same && cpu) {
                fprintf(stderr, "tandem-bench-engine: CPU ranks must give the one-device ids\n");
                rc = 1;
            }
        }
        free(rec[0]);
        free(rec[1]);
    }
done:
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(one);
    engine_ep_close(ep);
    return rc;
}
