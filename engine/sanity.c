/* sanity.c - the MODEL.md 9.1 checkpoint sanity check (engine/sanity.h). */
#include "engine/sanity.h"

#include "common/hash.h"
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counts of tokens routed to each (layer, expert) during the random run. */
typedef struct {
    int64_t *counts; /* [L, E] */
    int64_t E;
    int L;
} expert_counts_t;

static void count_experts(void *user, const engine_dump_layer_t *rec)
{
    expert_counts_t *ec = user;
    if (rec->layer < 0 || rec->layer >= ec->L) {
        return;
    }
    for (int64_t r = 0; r < rec->n_rows; r++) {
        for (int64_t k = 0; k < rec->K; k++) {
            int32_t e = rec->experts[r * rec->K + k];
            if (e >= 0 && e < ec->E) {
                ec->counts[(int64_t)rec->layer * ec->E + e]++;
            }
        }
    }
}

static void scan_logits(const float *logits, int64_t n, engine_sanity_report_t *rep)
{
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(logits[i])) {
            rep->n_nonfinite++;
        } else if (fabs((double)logits[i]) > rep->max_abs_logit) {
            rep->max_abs_logit = fabs((double)logits[i]);
        }
    }
}

tdm_status_t engine_sanity_check(const char *dir, int n_threads, engine_sanity_report_t *report_out,
                                 char *err, size_t err_bytes)
{
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    engine_model_t *model = NULL;
    engine_kv_pool_t *pool = NULL;
    engine_fwd_t *fwd = NULL;
    engine_sanity_report_t rep;
    expert_counts_t ec = {NULL, 0, 0};
    int32_t ids[ENGINE_SANITY_RANDOM_TOKENS];
    float *logits = NULL;
    char local_err[256];
    const engine_config_t *cfg;
    int64_t V;
    tdm_status_t st;

    if (err == NULL || err_bytes == 0) {
        err = local_err;
        err_bytes = sizeof(local_err);
    }
    err[0] = '\0';
    if (dir == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&rep, 0, sizeof(rep));
    engine_model_params_default(&mp);
    mp.n_threads = n_threads > 0 ? n_threads : 1;
    st = engine_model_load(dir, &mp, &model, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    cfg = engine_model_config(model);
    V = cfg->vocab_size;
    /* pages for the longest run: rows per source / 64, rounded up, per source */
    st = engine_kv_pool_create(cfg, engine_model_fingerprint(model),
                               (uint32_t)(cfg->n_kv_source_layer_ids *
                                          (ENGINE_SANITY_RANDOM_TOKENS / 64 + 1)),
                               &pool);
    if (st == TDM_OK) {
        engine_fwd_params_default(model, &fp);
        st = engine_fwd_create(model, pool, &fp, &fwd);
    }
    logits = malloc(sizeof(float) * (size_t)(ENGINE_SANITY_RANDOM_TOKENS * V));
    ec.L = cfg->n_layers;
    ec.E = cfg->n_routed_experts;
    ec.counts = calloc((size_t)(ec.L * ec.E), sizeof(int64_t));
    if (st == TDM_OK && (logits == NULL || ec.counts == NULL)) {
        st = TDM_ERR_NO_MEMORY;
    }
    if (st == TDM_OK) {
        for (int i = 0; i < ENGINE_SANITY_PROMPT_TOKENS; i++) {
            ids[i] = (int32_t)((17 * (int64_t)i + 5) % V);
        }
        st = engine_fwd_oracle(fwd, ids, ENGINE_SANITY_PROMPT_TOKENS, logits);
        if (st == TDM_OK) {
            scan_logits(logits, ENGINE_SANITY_PROMPT_TOKENS * V, &rep);
        }
    }
    if (st == TDM_OK) {
        engine_dump_sink_t sink = {&ec, count_experts};
        uint64_t ctr = 0;
        for (int i = 0; i < ENGINE_SANITY_RANDOM_TOKENS; i++) {
            int32_t id;
            do {
                id = (int32_t)(tdm_hash_splitmix64(ENGINE_SANITY_SEED + ctr++) % (uint64_t)V);
            } while (id == cfg->image_token_id);
            ids[i] = id;
        }
        engine_fwd_set_dump(fwd, &sink);
        st = engine_fwd_oracle(fwd, ids, ENGINE_SANITY_RANDOM_TOKENS, logits);
        engine_fwd_set_dump(fwd, NULL);
        if (st == TDM_OK) {
            scan_logits(logits, ENGINE_SANITY_RANDOM_TOKENS * V, &rep);
        }
    }
    if (st == TDM_ERR_INTERNAL) {
        snprintf(err, err_bytes, "%s: the forward pass failed (a NaN reached a top-k)", dir);
        st = TDM_ERR_MISMATCH;
    } else if (st != TDM_OK && err[0] == '\0') {
        snprintf(err, err_bytes, "%s: sanity forward failed: %s", dir, tdm_status_message(st));
    }
    if (st == TDM_OK) {
        rep.min_expert_tokens = -1;
        for (int l = 0; l < ec.L; l++) {
            for (int64_t e = 0; e < ec.E; e++) {
                int64_t c = ec.counts[(int64_t)l * ec.E + e];
                if (rep.min_expert_tokens < 0 || c < rep.min_expert_tokens) {
                    rep.min_expert_tokens = c;
                    rep.min_expert_layer = l;
                    rep.min_expert_id = (int)e;
                }
            }
        }
        if (report_out != NULL) {
            *report_out = rep;
        }
        if (rep.n_nonfinite > 0) {
            snprintf(err, err_bytes, "%lld non-finite logits", (long long)rep.n_nonfinite);
            st = TDM_ERR_MISMATCH;
        } else if (rep.max_abs_logit > ENGINE_SANITY_MAX_ABS_LOGIT) {
            snprintf(err, err_bytes, "|logit| %.4g exceeds %.0e", rep.max_abs_logit,
                     ENGINE_SANITY_MAX_ABS_LOGIT);
            st = TDM_ERR_MISMATCH;
        } else if (rep.min_expert_tokens == 0) {
            snprintf(err, err_bytes, "expert %d of layer %d receives no token over %d random tokens",
                     rep.min_expert_id, rep.min_expert_layer, ENGINE_SANITY_RANDOM_TOKENS);
            st = TDM_ERR_MISMATCH;
        }
    }
    free(ec.counts);
    free(logits);
    engine_fwd_destroy(fwd);
    engine_kv_pool_destroy(pool);
    engine_model_destroy(model);
    return st;
}
