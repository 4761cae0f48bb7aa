/* perf.c - tandem-sim's analytic performance model of one serving instance (see sim/perf.h and
 * docs/SIM.md "Cost model").
 *
 * Every cost is a roofline over the GPU's datasheet figures times `efficiency`:
 *   step = max(bytes / (bw x eff), flops / (rate x eff), EP all-to-all bytes / (NVLink x eff))
 *          + EP collective latencies + Engram host reads + a fixed per-step overhead,
 * with bytes and FLOPs counted from the full preset's tensor inventory (engine/inventory.h, the
 * same numbers as MODEL.md 10) and the KV geometry of MODEL.md 7. Attention is data parallel
 * over the GPUs of an instance (each GPU runs its own sequences: plan_gpu.h), routed experts are
 * sharded (expert parallel), so a step's time is the busiest GPU's.
 */
#include "sim/perf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/inventory.h"
#include "sim/perf_impl.h"
#include "tools/tandem-convert/plan_gpu.h"

/* MODEL.md 7 and 10. */
#define SIM_KV_BYTES_PER_TOKEN     890.0
#define SIM_ENGRAM_BYTES_PER_TOKEN 12672.0
/* Handoff state record: 43 rings x 128 x 528 B + 3 pending halves x 4096 B + 3 ids. */
#define SIM_HANDOFF_STATE_BYTES 2918412.0
/* Assumptions (docs/SIM.md "Cost model"): fixed latencies not in any datasheet. */
#define SIM_STEP_OVERHEAD_S  30e-6 /* per decode step: launch, sampling, scheduling */
#define SIM_CHUNK_OVERHEAD_S 50e-6 /* per prefill chunk */
#define SIM_EP_LATENCY_S     3e-6  /* one expert-parallel all-to-all over NVLink */
#define SIM_NVLINK_LATENCY_S 5e-6  /* one KV transfer's setup, same NVLink domain */
#define SIM_RDMA_LATENCY_S   20e-6 /* one KV transfer's setup over the NIC */
/* Prefill query tokens that share one read of their keys (flash-attention tile). */
#define SIM_PREFILL_QUERY_TILE 128.0
/* Bytes per token per MoE layer of the EP all-to-all: K copies of H out (FP8) and back (BF16). */
#define SIM_EP_BYTES_PER_EXPERT_ELEM 3.0

void sim_perf_params_default(sim_perf_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->gpu = NULL;
    params->group_gpus = 0;
    params->dspark_draft_len = 3;
    params->dspark_acceptance = 1.5;
    params->max_batch_seqs = 64;
    params->max_batch_tokens = 8192;
    params->context_tokens = PLAN_GPU_DEFAULT_CONTEXT_TOKENS;
    params->efficiency = 0.6;
}

static void set_err(char *err, size_t err_bytes, const char *msg)
{
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, "%s", msg);
    }
}

/* Storage bytes of one spec. */
static double spec_bytes(const engine_tensor_spec_t *spec)
{
    double n = (double)engine_dtype_size_bytes(spec->dtype);
    for (int k = 0; k < spec->n_dims; k++) {
        n *= (double)spec->shape[k];
    }
    return n;
}

/* Fill *m from the full preset's config and inventory. */
static tdm_status_t model_build(sim_perf_model_t *m, const engine_config_t *cfg,
                                const engine_tensor_spec_t *specs, size_t n_specs)
{
    double expert_bytes = 0, expert_params = 0, dexpert_bytes = 0, dexpert_params = 0;

    memset(m, 0, sizeof(*m));
    if (cfg->n_layers > SIM_PERF_MAX_LAYERS || cfg->n_routed_experts <= 0) {
        return TDM_ERR_UNSUPPORTED;
    }
    m->n_layers = cfg->n_layers;
    m->ced_cut = cfg->ced_cut;
    m->n_experts = (double)cfg->n_routed_experts;
    m->k_experts = (double)cfg->num_experts_per_tok;
    m->hidden = (double)cfg->hidden_size;
    m->window = (double)cfg->sliding_window;
    m->index_topk = (double)cfg->index_topk;
    m->pool_rows = (double)(cfg->candidate_topk_blocks * cfg->candidate_block_size);
    m->n_heads = (double)cfg->num_attention_heads;
    m->head_dim = (double)cfg->head_dim;
    m->index_heads = (double)cfg->index_n_heads;
    m->index_dim = (double)cfg->index_head_dim;
    m->main_row_bytes = m->head_dim / 2 + m->head_dim / 16;
    m->index_row_bytes = m->index_dim / 2 + m->index_dim / 32;
    m->ring_entry_bytes = (double)engine_config_ring_entry_bytes(cfg);
    for (int l = 0; l < cfg->n_layers; l++) {
        m->layer_ratio[l] = cfg->roles[l].ratio;
        m->layer_kind[l] = (int)cfg->roles[l].kind;
    }
    m->dspark_blocks = (double)cfg->n_blocks;
    m->dspark_block_size = (double)cfg->dspark_block_size;
    m->dspark_n_experts = (double)cfg->dspark_n_routed_experts;
    m->dspark_k_experts = (double)cfg->dspark_num_experts_per_tok;
    for (size_t i = 0; i < n_specs; i++) {
        const engine_tensor_spec_t *s = &specs[i];
        double b = spec_bytes(s);
        double p = (double)s->n_params;
        int expert = strstr(s->name, ".ffn.experts.") != NULL;

        if (s->part == ENGINE_PART_ENGRAM_TABLE) {
            continue; /* host memory: SIM_ENGRAM_BYTES_PER_TOKEN per token */
        }
        if (s->part == ENGINE_PART_DSPARK) {
            if (expert) {
                dexpert_bytes += b;
                dexpert_params += p;
            } else {
                m->dspark_rep_bytes += b;
                m->dspark_rep_params += p;
            }
        } else if (s->layer >= 0 && s->layer < cfg->n_layers) {
            if (expert) {
                expert_bytes += b;
                expert_params += p;
            } else {
                m->layer_rep_bytes[s->layer] += b;
                m->layer_rep_params[s->layer] += p;
            }
        } else if (strcmp(s->name, "embed.weight") == 0) {
            m->embed_row_bytes = b / (double)cfg->vocab_size;
        } else {
            m->head_bytes += b; /* head.weight, norm.weight */
            m->head_params += p;
        }
    }
    m->expert_bytes = expert_bytes / (m->n_experts * cfg->n_layers);
    m->expert_params = expert_params / (m->n_experts * cfg->n_layers);
    if (m->dspark_blocks > 0 && m->dspark_n_experts > 0) {
        m->dspark_expert_bytes = dexpert_bytes / (m->dspark_n_experts * m->dspark_blocks);
        m->dspark_expert_params = dexpert_params / (m->dspark_n_experts * m->dspark_blocks);
    }
    return TDM_OK;
}

/* Size the group and its KV with the plan arithmetic. */
static tdm_status_t plan_size(const engine_config_t *cfg, const engine_tensor_spec_t *specs,
                              size_t n_specs, const sim_perf_params_t *params, uint32_t *group_out,
                              uint64_t *kv_out, char *err, size_t err_bytes)
{
    plan_gpu_params_t pp;
    plan_gpu_t *plan = calloc(1, sizeof(*plan));
    tdm_status_t st;
    uint32_t group = params->group_gpus;
    char msg[256];

    if (plan == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    plan_gpu_params_default(&pp);
    pp.kind = plan_gpu_kind_find(params->gpu->name);
    if (pp.kind == NULL) {
        free(plan);
        snprintf(msg, sizeof(msg), "gpu %s: the plan (plan_gpu.h) does not know it",
                 params->gpu->name);
        set_err(err, err_bytes, msg);
        return TDM_ERR_INVALID_ARG;
    }
    pp.context_tokens = params->context_tokens;
    pp.n_gpus = group == 0 ? 1 : group;
    pp.group_gpus = pp.n_gpus;
    st = plan_gpu_build(cfg, specs, n_specs, &pp, plan);
    if (st == TDM_OK && group == 0 && !plan->fits && plan->min_group_gpus > 0) {
        group = plan->min_group_gpus;
        pp.n_gpus = group;
        pp.group_gpus = group;
        st = plan_gpu_build(cfg, specs, n_specs, &pp, plan);
    }
    if (st != TDM_OK) {
        free(plan);
        set_err(err, err_bytes, "the plan arithmetic refused the parameters (group or context)");
        return TDM_ERR_INVALID_ARG;
    }
    if (!plan->fits) {
        if (plan->min_group_gpus > 0) {
            snprintf(msg, sizeof(msg),
                     "the model does not fit in %u x %s: the smallest group that does is %u GPUs",
                     pp.group_gpus, params->gpu->name, plan->min_group_gpus);
        } else {
            snprintf(msg, sizeof(msg), "the model does not fit in any group of %s (1..%u GPUs)",
                     params->gpu->name, PLAN_GPU_MAX_GROUP);
        }
        free(plan);
        set_err(err, err_bytes, msg);
        return TDM_ERR_UNSUPPORTED;
    }
    uint64_t kv = 0;
    for (uint32_t g = 0; g < pp.group_gpus; g++) {
        kv += (uint64_t)plan->gpus[g].kv_tokens;
    }
    *group_out = pp.group_gpus;
    *kv_out = kv;
    free(plan);
    return TDM_OK;
}

tdm_status_t sim_perf_create(sim_role_t role, const sim_perf_params_t *params,
                             sim_perf_t **perf_out, char *err, size_t err_bytes)
{
    engine_config_t *cfg = NULL;
    engine_tensor_spec_t *specs = NULL;
    size_t n_specs = 0;
    sim_perf_t *perf = NULL;
    tdm_status_t st;

    if (params == NULL || perf_out == NULL || params->gpu == NULL) {
        set_err(err, err_bytes, "no parameters, output or gpu");
        return TDM_ERR_INVALID_ARG;
    }
    if (role != SIM_ROLE_PREFILL && role != SIM_ROLE_DECODE) {
        set_err(err, err_bytes, "role must be SIM_ROLE_PREFILL or SIM_ROLE_DECODE");
        return TDM_ERR_INVALID_ARG;
    }
    if (!(params->dspark_acceptance >= 0.0) ||
        params->dspark_acceptance > (double)params->dspark_draft_len) {
        set_err(err, err_bytes, "dspark_acceptance must be in [0, dspark_draft_len]");
        return TDM_ERR_INVALID_ARG;
    }
    if (params->max_batch_seqs == 0 || params->max_batch_tokens == 0) {
        set_err(err, err_bytes, "max_batch_seqs and max_batch_tokens must be > 0");
        return TDM_ERR_INVALID_ARG;
    }
    if (!(params->efficiency > 0.0 && params->efficiency <= 1.0)) {
        set_err(err, err_bytes, "efficiency must be in (0, 1]");
        return TDM_ERR_INVALID_ARG;
    }
    if (params->context_tokens <= 0) {
        set_err(err, err_bytes, "context_tokens must be > 0");
        return TDM_ERR_INVALID_ARG;
    }
    cfg = calloc(1, sizeof(*cfg));
    perf = calloc(1, sizeof(*perf));
    if (cfg == NULL || perf == NULL) {
        st = TDM_ERR_NO_MEMORY;
        goto out;
    }
    st = engine_config_preset("full", cfg);
    if (st == TDM_OK) {
        st = engine_inventory_build(cfg, &specs, &n_specs);
    }
    if (st != TDM_OK) {
        set_err(err, err_bytes, "the full preset's config or inventory failed");
        goto out;
    }
    st = model_build(&perf->m, cfg, specs, n_specs);
    if (st != TDM_OK) {
        set_err(err, err_bytes, "the full preset has more layers than the model handles");
        goto out;
    }
    st = plan_size(cfg, specs, n_specs, params, &perf->group, &perf->kv_tokens, err, err_bytes);
    if (st != TDM_OK) {
        goto out;
    }
    perf->role = role;
    perf->params = *params;
    perf->gpu = *params->gpu;
    *perf_out = perf;
    perf = NULL;
out:
    free(specs);
    free(cfg);
    free(perf);
    return st;
}

void sim_perf_destroy(sim_perf_t *perf)
{
    free(perf);
}

tdm_status_t sim_perf_set_expert_math(sim_perf_t *perf, sim_math_t math)
{
    if (perf == NULL || (math != SIM_MATH_FP8 && math != SIM_MATH_FP4)) {
        return TDM_ERR_INVALID_ARG;
    }
    perf->expert_fp4 = math == SIM_MATH_FP4;
    return TDM_OK;
}

/* Rows visible to a query at context c (tokens) for a layer of ratio r (MODEL.md 5.3). */
static double rows_at(double c, int ratio)
{
    return ratio > 0 ? floor(c / ratio) : 0.0;
}

/*
 * KV bytes and attention + indexer FLOPs of one query token at context c over layers
 * [l0, l1): window entries, selected compressed rows, index keys scored (Full layers score
 * their source's rows; Reindex layers only the candidate pool).
 */
static void attn_cost(const sim_perf_model_t *m, double c, int l0, int l1, double *bytes,
                      double *flops)
{
    double b = 0, f = 0;
    double win = c < m->window ? c : m->window;
    /* the largest ratio-1 and ratio-2 sources' rows at c: a Reuse layer selects from its
     * kv_src, whose ratio equals its own (MODEL.md 2) */
    for (int l = l0; l < l1; l++) {
        int r = m->layer_ratio[l];
        double keys = win;
        b += win * m->ring_entry_bytes;
        if (r > 0) {
            double rows = rows_at(c, r);
            double sel = rows < m->index_topk ? rows : m->index_topk;
            keys += sel;
            b += sel * m->main_row_bytes;
            if (m->layer_kind[l] == ENGINE_LAYER_FULL || m->layer_kind[l] == ENGINE_LAYER_REINDEX) {
                double scored = rows;
                if (m->layer_kind[l] == ENGINE_LAYER_REINDEX && scored > m->pool_rows) {
                    scored = m->pool_rows;
                }
                b += scored * m->index_row_bytes;
                f += 2.0 * m->index_heads * m->index_dim * scored;
            }
        }
        f += 4.0 * m->n_heads * m->head_dim * keys; /* q.k and p.v over every key */
    }
    *bytes = b;
    *flops = f;
}

/* Distinct routed experts n tokens touch in one layer of e experts, k per token (uniform). */
static double experts_touched(double e, double k, double n)
{
    if (n <= 0 || e <= 0) {
        return 0;
    }
    return e * (1.0 - pow(1.0 - k / e, n));
}

static double sum_range(const double *v, int l0, int l1)
{
    double s = 0;
    for (int l = l0; l < l1; l++) {
        s += v[l];
    }
    return s;
}

/* Seconds of the EP all-to-all traffic of `tokens` tokens on one GPU over `layers` MoE layers
 * (bandwidth only: it overlaps the GEMMs, as two-batch overlap does), and the latency of its
 * 2 x layers collectives (not overlapped). 0 for a one-GPU instance. */
static double ep_bw_seconds(const sim_perf_t *perf, double tokens, double layers)
{
    double g = (double)perf->group;
    if (perf->group <= 1) {
        return 0;
    }
    double bytes = tokens * layers * SIM_EP_BYTES_PER_EXPERT_ELEM * perf->m.k_experts *
                   perf->m.hidden * (g - 1.0) / g;
    return bytes / (perf->gpu.nvlink_bytes_per_s * perf->params.efficiency);
}

static double ep_latency_seconds(const sim_perf_t *perf, double layers)
{
    return perf->group <= 1 ? 0 : 2.0 * layers * SIM_EP_LATENCY_S;
}

/* The slowest of the overlapped parts. */
static double max3(double a, double b, double c)
{
    double m = a > b ? a : b;
    return m > c ? m : c;
}

double sim_perf_tokens_per_step(const sim_perf_t *perf)
{
    if (perf == NULL || perf->params.dspark_draft_len == 0) {
        return 1.0;
    }
    return 1.0 + perf->params.dspark_acceptance;
}

double sim_perf_decode_step_s(const sim_perf_t *perf, uint32_t n_seqs, uint64_t context_tokens)
{
    const sim_perf_model_t *m;
    double n, g, n_gpu, ctx, tok, bytes, rep_flops, exp_flops, kvb, kvf, t_mem, t_cmp, t;
    double eff, exp_rate;
    int L;

    if (perf == NULL) {
        return 0;
    }
    if (n_seqs == 0) {
        n_seqs = 1;
    }
    if (perf->decode_fit.have) {
        const double *c = perf->decode_fit.coef;
        return c[0] + c[1] * n_seqs + c[2] * (double)context_tokens;
    }
    m = &perf->m;
    L = m->n_layers;
    eff = perf->params.efficiency;
    n = (double)n_seqs;
    g = (double)perf->group;
    n_gpu = ceil(n / g); /* sequences on the busiest GPU (data-parallel attention) */
    ctx = (double)context_tokens / n;
    tok = perf->params.dspark_draft_len > 0 ? 1.0 + perf->params.dspark_draft_len : 1.0;

    /* target verify: replicated weights once per GPU, touched experts spread over the group */
    attn_cost(m, ctx, 0, L, &kvb, &kvf);
    bytes = sum_range(m->layer_rep_bytes, 0, L) + m->head_bytes +
            L * experts_touched(m->n_experts, m->k_experts, n * tok) * m->expert_bytes / g +
            n_gpu * (kvb + tok * m->embed_row_bytes);
    rep_flops = 2.0 * (sum_range(m->layer_rep_params, 0, L) + m->head_params) * n_gpu * tok +
                n_gpu * tok * kvf;
    exp_flops = 2.0 * m->expert_params * m->k_experts * L * n * tok / g;
    /* DSpark draft: the blocks on B tokens per sequence, the target head on each */
    if (perf->params.dspark_draft_len > 0 && m->dspark_blocks > 0) {
        double bt = m->dspark_block_size;
        double win = ctx < m->window ? ctx : m->window;
        bytes += m->dspark_rep_bytes + m->head_bytes +
                 m->dspark_blocks *
                     experts_touched(m->dspark_n_experts, m->dspark_k_experts, n * bt) *
                     m->dspark_expert_bytes / g +
                 n_gpu * m->dspark_blocks * win * m->ring_entry_bytes;
        rep_flops += 2.0 * (m->dspark_rep_params + m->head_params) * n_gpu * bt +
                     n_gpu * m->dspark_blocks * bt * 4.0 * m->n_heads * m->head_dim * (win + bt);
        exp_flops +=
            2.0 * m->dspark_expert_params * m->dspark_k_experts * m->dspark_blocks * n * bt / g;
    }
    exp_rate = sim_perf_flop_rate(perf, perf->expert_fp4);
    t_mem = bytes / sim_perf_hbm_rate(perf);
    t_cmp = rep_flops / sim_perf_flop_rate(perf, 0) + exp_flops / exp_rate;
    t = max3(t_mem, t_cmp, ep_bw_seconds(perf, n_gpu * tok, L)) + ep_latency_seconds(perf, L);
    t += n_gpu * tok * SIM_ENGRAM_BYTES_PER_TOKEN / (perf->gpu.host_bytes_per_s * eff);
    return t + SIM_STEP_OVERHEAD_S;
}

double sim_perf_prefill_s(const sim_perf_t *perf, uint64_t new_tokens, uint64_t cached_tokens)
{
    const sim_perf_model_t *m;
    double n, cached, g, eff, chunk, n_chunks, tail, c_mid, kvb, kvf, kvb_t, kvf_t, t, exp_rate;
    int L, c1;

    if (perf == NULL || new_tokens == 0) {
        return 0;
    }
    n = (double)new_tokens;
    cached = (double)cached_tokens;
    if (perf->prefill_fit.have) {
        const double *c = perf->prefill_fit.coef;
        return c[0] + c[1] * n + c[2] * n * (cached + n / 2.0);
    }
    m = &perf->m;
    L = m->n_layers;
    c1 = m->ced_cut + 1; /* layers 0..c run every new token */
    g = (double)perf->group;
    eff = perf->params.efficiency;
    chunk = (double)perf->params.max_batch_tokens;
    n_chunks = ceil(n / chunk);
    if (chunk > n) {
        chunk = n;
    }
    tail = n < m->window ? n : m->window;
    c_mid = cached + n / 2.0;
    exp_rate = sim_perf_flop_rate(perf, perf->expert_fp4);
    attn_cost(m, c_mid, 0, c1, &kvb, &kvf);
    attn_cost(m, cached + n, c1, L, &kvb_t, &kvf_t);

    /* one chunk on every GPU of the group: tokens spread (data parallel), experts sharded */
    double chunk_bytes =
        sum_range(m->layer_rep_bytes, 0, c1) +
        c1 * experts_touched(m->n_experts, m->k_experts, chunk) * m->expert_bytes / g +
        cached * SIM_KV_BYTES_PER_TOKEN / g;
    double lo_rep_flops = n * (2.0 * sum_range(m->layer_rep_params, 0, c1) + kvf);
    double lo_exp_flops = n * 2.0 * m->expert_params * m->k_experts * c1;
    double tail_bytes =
        sum_range(m->layer_rep_bytes, c1, L) + m->head_bytes +
        (L - c1) * experts_touched(m->n_experts, m->k_experts, tail) * m->expert_bytes / g;
    double tail_rep_flops =
        tail * (2.0 * sum_range(m->layer_rep_params, c1, L) + kvf_t) + 2.0 * m->head_params;
    double tail_exp_flops = tail * 2.0 * m->expert_params * m->k_experts * (L - c1);

    /* attention reads a query tile's keys once (flash-attention tiling) */
    double tiles = ceil(n / SIM_PREFILL_QUERY_TILE);
    double t_mem = (n_chunks * chunk_bytes + tiles * kvb / g) / sim_perf_hbm_rate(perf);
    double t_cmp = lo_rep_flops / g / sim_perf_flop_rate(perf, 0) + lo_exp_flops / g / exp_rate;
    t = max3(t_mem, t_cmp, ep_bw_seconds(perf, n / g, c1)) +
        n_chunks * ep_latency_seconds(perf, c1);
    /* the tail: its tokens on one GPU's share, after the lower layers */
    double t_tail_mem =
        (tail_bytes + ceil(tail / SIM_PREFILL_QUERY_TILE) * kvb_t) / sim_perf_hbm_rate(perf);
    double t_tail_cmp =
        tail_rep_flops / sim_perf_flop_rate(perf, 0) + tail_exp_flops / g / exp_rate;
    t += max3(t_tail_mem, t_tail_cmp, ep_bw_seconds(perf, tail, L - c1)) +
         ep_latency_seconds(perf, L - c1);
    t += n * SIM_ENGRAM_BYTES_PER_TOKEN / g / (perf->gpu.host_bytes_per_s * eff);
    return t + n_chunks * SIM_CHUNK_OVERHEAD_S;
}

double sim_perf_continue_s(const sim_perf_t *perf, uint64_t new_tokens, uint64_t cached_tokens)
{
    uint64_t replay;

    if (perf == NULL || new_tokens == 0) {
        return 0;
    }
    if (perf->continue_fit.have) {
        const double *c = perf->continue_fit.coef;
        double n = (double)new_tokens, cached = (double)cached_tokens;
        return c[0] + c[1] * n + c[2] * n * (cached + n / 2.0);
    }
    /* the window replay (MODEL.md 6(d)) as W more prefilled tokens before the new ones */
    replay = (uint64_t)perf->m.window < cached_tokens ? (uint64_t)perf->m.window : cached_tokens;
    return sim_perf_prefill_s(perf, new_tokens + replay, cached_tokens - replay);
}

double sim_perf_transfer_s(const sim_perf_t *perf, uint64_t tokens, int same_domain)
{
    double bytes, bw;

    if (perf == NULL) {
        return 0;
    }
    bytes = (double)tokens * SIM_KV_BYTES_PER_TOKEN + SIM_HANDOFF_STATE_BYTES;
    bw = same_domain ? perf->gpu.nvlink_bytes_per_s : perf->gpu.rdma_bytes_per_s;
    return bytes / (bw * perf->params.efficiency) +
           (same_domain ? SIM_NVLINK_LATENCY_S : SIM_RDMA_LATENCY_S);
}

uint64_t sim_perf_kv_tokens(const sim_perf_t *perf)
{
    return perf == NULL ? 0 : perf->kv_tokens;
}

uint32_t sim_perf_group_gpus(const sim_perf_t *perf)
{
    return perf == NULL ? 0 : perf->group;
}

double sim_perf_power_w(const sim_perf_t *perf, double busy)
{
    if (perf == NULL) {
        return 0;
    }
    if (!(busy > 0.0)) {
        busy = 0.0;
    } else if (busy > 1.0) {
        busy = 1.0;
    }
    return (double)perf->group *
           (perf->gpu.power_idle_w + busy * (perf->gpu.power_busy_w - perf->gpu.power_idle_w));
}

int sim_perf_calibrated(const sim_perf_t *perf)
{
    return perf != NULL && (perf->decode_fit.have || perf->prefill_fit.have);
}
