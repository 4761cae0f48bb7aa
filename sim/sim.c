/* sim.c - tandem-sim's setup, event loop, heartbeats and results. See sim/sim.h. */
#include "sim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/proto.h"
#include "sim/sim_impl.h"

/* The compatibility every simulated worker matches (page accounting in SIM_PAGE_TOKENS). */
static const char *const sim_kv_formats[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};
static const proto_compat_t sim_compat = {
    .model_fingerprint = 0x51u,
    .page_format_version = 1,
    .page_rows = SIM_PAGE_TOKENS,
    .page_bytes = SIM_PAGE_TOKENS * 890u,
    .tokens_per_block = SIM_PAGE_TOKENS,
    .kv_formats = sim_kv_formats,
    .n_kv_formats = 2,
    .max_context = 1u << 20,
    .protocol_version = PROTO_VERSION,
};

void sim_config_default(sim_config_t *config)
{
    memset(config, 0, sizeof(*config));
    sim_perf_params_default(&config->perf);
    config->racks = 1;
    config->agents = 100;
    config->duration_s = 600.0;
    config->warmup_s = 60.0;
    config->ramp_s = 30.0;
    config->seed = 1;
    config->local_prefill_tokens = 512;
    config->heartbeat_s = 0.25;
}

void sim_hist_add(hist_t *h, double v_s)
{
    /* bucket b covers [1e-4 * 1.03^b, 1e-4 * 1.03^(b+1)) seconds */
    double x = v_s > 1e-4 ? log(v_s / 1e-4) / log(1.03) : 0.0;
    int b = (int)x;

    if (b >= SIM_HIST_BUCKETS) {
        b = SIM_HIST_BUCKETS - 1;
    }
    h->counts[b]++;
    h->n++;
}

static double hist_quantile(const hist_t *h, double q)
{
    uint64_t want = (uint64_t)ceil(q * (double)h->n), seen = 0;

    if (h->n == 0) {
        return 0.0;
    }
    for (int b = 0; b < SIM_HIST_BUCKETS; b++) {
        seen += h->counts[b];
        if (seen >= want && seen > 0) {
            return 1e-4 * pow(1.03, b + 0.5);
        }
    }
    return 1e-4 * pow(1.03, SIM_HIST_BUCKETS);
}

double sim_window(const sim_t *s, double t0, double t1)
{
    double a = t0 > s->cfg.warmup_s ? t0 : s->cfg.warmup_s;
    double b = t1 < s->cfg.duration_s ? t1 : s->cfg.duration_s;

    return b > a ? b - a : 0.0;
}

router_session_t *sim_router_session(sim_t *s, int32_t a, int *created_out)
{
    char id[48];
    router_session_t *rs;

    snprintf(id, sizeof(id), "agent-%d", a);
    rs = router_sessions_get(s->sessions, id);
    if (rs == NULL && created_out != NULL) {
        if (router_sessions_add(s->sessions, id, 0, (uint64_t)(s->now * 1e9), &rs) != TDM_OK) {
            return NULL;
        }
        *created_out = 1;
    }
    return rs;
}

static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Prefill instances per rack for n_slots instance slots: balance the workload's mean prefill
 * time per turn against the decode time per turn of a full batch (docs/SIM.md). */
static uint32_t choose_prefill(const sim_t *s, uint32_t n_slots)
{
    uint64_t in = 0, shared = 0, out = 0;
    double n = (double)s->wl->n_turns, delta, ctx, tp, td, steps;
    uint32_t p;

    if (n_slots < 2) {
        return 0;
    }
    sim_workload_totals(s->wl, &in, &shared, &out);
    delta = (double)(in - shared) / n;
    ctx = (double)in / n;
    tp = sim_perf_prefill_s(s->perf_prefill, (uint64_t)(delta > 1 ? delta : 1),
                            (uint64_t)(shared / n));
    steps = ceil((double)out / n / s->tps);
    td = steps *
         sim_perf_decode_step_s(s->perf_decode, s->max_batch, (uint64_t)(ctx * s->max_batch)) /
         s->max_batch;
    p = (uint32_t)lround((double)n_slots * tp / (tp + td));
    if (p < 1) {
        p = 1;
    }
    if (p > n_slots - 1) {
        p = n_slots - 1;
    }
    return p;
}

static tdm_status_t register_inst(sim_t *s, inst_t *in, char *err, size_t err_bytes)
{
    Tandem__Register r = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char rack[24], node[40];
    tdm_status_t status;

    snprintf(rack, sizeof(rack), "rack%u", in->rack);
    snprintf(node, sizeof(node), "%s-node", in->id);
    pf.version = sim_compat.page_format_version;
    pf.rows_per_page = sim_compat.page_rows;
    pf.page_bytes = sim_compat.page_bytes;
    pf.tokens_per_block = sim_compat.tokens_per_block;
    cap.total_pages = in->role == SIM_ROLE_DECODE ? (uint32_t)(in->kv_cap / SIM_PAGE_TOKENS) : 0;
    cap.max_sequences = s->max_batch;
    r.role = in->role == SIM_ROLE_DECODE ? TANDEM__ROLE__ROLE_DECODE : TANDEM__ROLE__ROLE_PREFILL;
    r.incarnation_id = in->id;
    r.rack = rack;
    r.node = node;
    r.model_fingerprint = sim_compat.model_fingerprint;
    r.page_format = &pf;
    r.kv_formats = (char **)sim_kv_formats;
    r.n_kv_formats = 2;
    r.max_context = sim_compat.max_context;
    r.protocol_version = PROTO_VERSION;
    r.capacity = &cap;
    status = router_registry_register(s->registry, in->id, &r, 0, &in->slot, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    in->gen = router_registry_worker(s->registry, in->slot, 0)->generation;
    in->dirty = 1;
    return TDM_OK;
}

static tdm_status_t heartbeat_all(sim_t *s)
{
    uint64_t now_ns = (uint64_t)(s->now * 1e9);

    router_registry_tick(s->registry, now_ns);
    for (uint32_t i = 0; i < s->n_inst; i++) {
        inst_t *in = &s->inst[i];
        Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
        Tandem__Load load = TANDEM__LOAD__INIT;
        tdm_status_t status;

        if (!in->dirty) {
            continue;
        }
        in->dirty = 0;
        if (in->role == SIM_ROLE_DECODE) {
            uint64_t total = in->kv_cap / SIM_PAGE_TOKENS;
            uint64_t used = (in->kv_used + SIM_PAGE_TOKENS - 1) / SIM_PAGE_TOKENS;

            load.running_sequences = in->n_running;
            load.total_pages = (uint32_t)total;
            load.free_pages = (uint32_t)(used < total ? total - used : 0);
        } else {
            load.queued_prefill_tokens = in->queued_tokens;
            load.recent_tokens_per_s = in->tok_rate;
        }
        hb.seq = (uint64_t)(s->now / s->cfg.heartbeat_s) + 1;
        hb.load = &load;
        status = router_registry_heartbeat(s->registry, in->id, &hb, now_ns);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

/* Instances of both roles in every rack, registered with the router's registry. */
static tdm_status_t setup_instances(sim_t *s, char *err, size_t err_bytes)
{
    uint32_t gpr = s->cfg.gpus_per_rack > 0 ? s->cfg.gpus_per_rack : s->cfg.perf.gpu->domain_gpus;
    uint32_t gp = sim_perf_group_gpus(s->perf_prefill), gd = sim_perf_group_gpus(s->perf_decode);
    uint32_t n_p, n_d, idx = 0;
    tdm_status_t status;

    if (gd > gpr) {
        snprintf(err, err_bytes, "a decode instance needs %u GPUs, a rack has %u", gd, gpr);
        return TDM_ERR_UNSUPPORTED;
    }
    n_p = s->cfg.prefill_per_rack;
    if (n_p == 0 && gp == gd) {
        n_p = choose_prefill(s, gpr / gd);
    } else if (n_p == 0) {
        n_p = choose_prefill(s, gpr / (gp > gd ? gp : gd));
    }
    while (n_p > 0 && n_p * gp + gd > gpr) {
        n_p--;
    }
    n_d = (gpr - n_p * gp) / gd;
#ifdef ROUTER_MAX_WORKERS
    if ((uint64_t)(n_p + n_d) * s->cfg.racks > ROUTER_MAX_WORKERS) {
        snprintf(err, err_bytes,
                 "%u racks x %u instances exceed the router registry's %d workers "
                 "(larger instances: --group-gpus)",
                 s->cfg.racks, n_p + n_d, ROUTER_MAX_WORKERS);
        return TDM_ERR_UNSUPPORTED;
    }
#endif
    s->res->prefill_group_gpus = gp;
    s->res->decode_group_gpus = gd;
    s->res->prefill_per_rack = n_p;
    s->res->decode_per_rack = n_d;
    s->res->idle_gpus_per_rack = gpr - n_p * gp - n_d * gd;
    s->res->gpus_total = gpr * s->cfg.racks;
    s->res->decode_kv_tokens = sim_perf_kv_tokens(s->perf_decode);
    s->n_inst = (n_p + n_d) * s->cfg.racks;
    s->n_prefill_inst = n_p * s->cfg.racks;
    s->inst = calloc(s->n_inst, sizeof(*s->inst));
    if (s->inst == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t r = 0; r < s->cfg.racks; r++) {
        for (uint32_t k = 0; k < n_p + n_d; k++) {
            inst_t *in = &s->inst[idx++];

            in->role = k < n_p ? SIM_ROLE_PREFILL : SIM_ROLE_DECODE;
            in->rack = r;
            in->perf = in->role == SIM_ROLE_PREFILL ? s->perf_prefill : s->perf_decode;
            snprintf(in->id, sizeof(in->id), "r%u-%s%u", r, k < n_p ? "p" : "d",
                     k < n_p ? k : k - n_p);
            in->queue.head = in->queue.tail = in->lp.head = in->lp.tail = -1;
            in->current = -1;
            in->lru_head = in->lru_tail = -1;
            if (in->role == SIM_ROLE_DECODE) {
                in->kv_cap = sim_perf_kv_tokens(in->perf);
                in->fin = calloc(s->max_batch, sizeof(*in->fin));
                in->fresh = calloc(s->max_batch, sizeof(*in->fresh));
                if (in->fin == NULL || in->fresh == NULL) {
                    return TDM_ERR_NO_MEMORY;
                }
            }
            status = register_inst(s, in, err, err_bytes);
            if (status != TDM_OK) {
                return status;
            }
        }
    }
    s->n_slots = router_registry_capacity(s->registry);
    s->inst_of_slot = malloc((size_t)s->n_slots * sizeof(*s->inst_of_slot));
    if (s->inst_of_slot == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int k = 0; k < s->n_slots; k++) {
        s->inst_of_slot[k] = -1;
    }
    for (uint32_t i = 0; i < s->n_inst; i++) {
        s->inst_of_slot[s->inst[i].slot] = (int)i;
    }
    return heartbeat_all(s);
}

static tdm_status_t setup(sim_t *s, char *err, size_t err_bytes)
{
    sim_perf_params_t params = s->cfg.perf;
    tdm_status_t status;
    uint64_t rng = s->cfg.seed;

    status = sim_perf_create(SIM_ROLE_PREFILL, &params, &s->perf_prefill, err, err_bytes);
    if (status == TDM_OK) {
        status = sim_perf_create(SIM_ROLE_DECODE, &params, &s->perf_decode, err, err_bytes);
    }
    if (status == TDM_OK && s->cfg.calibration != NULL) {
        status = sim_perf_calibrate(s->perf_prefill, s->cfg.calibration, err, err_bytes);
        if (status == TDM_OK) {
            status = sim_perf_calibrate(s->perf_decode, s->cfg.calibration, err, err_bytes);
        }
    }
    if (status != TDM_OK) {
        return status;
    }
    s->tps = sim_perf_tokens_per_step(s->perf_decode);
    s->max_batch = params.max_batch_seqs;
    status = sim_evq_create(s->cfg.agents * 2u + 1024u, &s->evq);
    if (status == TDM_OK) {
        status = router_registry_create(&sim_compat, 3600u * 1000u, &s->registry);
    }
    if (status == TDM_OK) {
        status = router_sessions_create(s->cfg.agents + 16u, SIM_PAGE_TOKENS, &s->sessions);
    }
    if (status != TDM_OK) {
        return status;
    }
    status = setup_instances(s, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    s->agents = calloc(s->cfg.agents, sizeof(*s->agents));
    if (s->agents == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t a = 0; a < s->cfg.agents; a++) {
        agent_t *ag = &s->agents[a];
        double t0 = s->cfg.ramp_s * (double)(next_u64(&rng) % 1000000u) / 1e6;

        ag->session = (uint32_t)((next_u64(&rng) % s->wl->n_sessions));
        ag->decode = ag->prefill = -1;
        ag->q_next = ag->lru_prev = ag->lru_next = -1;
        status = sim_evq_push(s->evq, t0, EV_TURN, a, 0);
        if (status != TDM_OK) {
            return status;
        }
    }
    return sim_evq_push(s->evq, s->cfg.heartbeat_s, EV_HEARTBEAT, 0, 0);
}

static void teardown(sim_t *s)
{
    for (uint32_t i = 0; s->inst != NULL && i < s->n_inst; i++) {
        free(s->inst[i].fin);
        free(s->inst[i].fresh);
    }
    free(s->inst);
    free(s->inst_of_slot);
    free(s->agents);
    router_sessions_destroy(s->sessions);
    router_registry_destroy(s->registry);
    sim_evq_destroy(s->evq);
    sim_perf_destroy(s->perf_prefill);
    sim_perf_destroy(s->perf_decode);
}

static void results(sim_t *s)
{
    sim_result_t *r = s->res;
    double window = s->cfg.duration_s - s->cfg.warmup_s;
    double power = 0.0, busy_p = 0.0, busy_d = 0.0;
    uint32_t n_d = 0, n_p = 0;

    for (uint32_t i = 0; i < s->n_inst; i++) {
        const inst_t *in = &s->inst[i];
        double busy = in->busy_s / window;

        busy = busy > 1.0 ? 1.0 : busy;
        power += sim_perf_power_w(in->perf, busy);
        if (in->role == SIM_ROLE_DECODE) {
            busy_d += busy;
            n_d++;
        } else {
            busy_p += busy;
            n_p++;
        }
    }
    power += (double)r->idle_gpus_per_rack * s->cfg.racks * s->cfg.perf.gpu->power_idle_w;
    r->window_s = window;
    r->end_s = s->now;
    r->output_tok_s = (double)s->window_tokens / window;
    r->power_w = power;
    r->tok_s_per_mw = power > 0.0 ? r->output_tok_s / (power / 1e6) : 0.0;
    r->agent_tok_s = s->n_window_turns > 0 ? s->sum_agent_tok_s / s->n_window_turns : 0.0;
    r->agent_e2e_tok_s = s->n_window_turns > 0 ? s->sum_e2e_tok_s / s->n_window_turns : 0.0;
    r->ttft_p50_s = hist_quantile(&s->ttft, 0.50);
    r->ttft_p99_s = hist_quantile(&s->ttft, 0.99);
    r->decode_batch_mean =
        s->window_steps > 0 ? (double)s->window_step_seqs / (double)s->window_steps : 0.0;
    r->decode_busy = n_d > 0 ? busy_d / n_d : 0.0;
    r->prefill_busy = n_p > 0 ? busy_p / n_p : 0.0;
}

static tdm_status_t loop(sim_t *s)
{
    sim_event_t ev;
    double next_progress = 0.0, step = s->cfg.duration_s / 50.0;
    tdm_status_t status = TDM_OK;

    while (status == TDM_OK && sim_evq_pop(s->evq, &ev)) {
        if (ev.t_s > s->cfg.duration_s && !s->cfg.drain) {
            s->now = s->cfg.duration_s;
            break;
        }
        s->now = ev.t_s;
        s->res->events++;
        if (s->cfg.progress != NULL && s->now >= next_progress) {
            s->cfg.progress(s->cfg.progress_ctx, s->now, s->cfg.duration_s, s->res->events);
            next_progress = s->now + step;
        }
        switch (ev.kind) {
        case EV_TURN:
            if (s->now < s->cfg.duration_s) {
                status = turn_submit(s, (int32_t)ev.id);
            } else {
                s->agents[ev.id].state = AG_DONE;
            }
            break;
        case EV_PREFILL:
            status = turn_prefill_done(s, ev.id);
            break;
        case EV_XFER:
            status = turn_xfer_done(s, (int32_t)ev.id);
            break;
        case EV_STEP:
            status = turn_step_done(s, ev.id);
            break;
        case EV_HEARTBEAT:
            status = heartbeat_all(s);
            if (status == TDM_OK && (s->now < s->cfg.duration_s || sim_evq_size(s->evq) > 0)) {
                status = sim_evq_push(s->evq, s->now + s->cfg.heartbeat_s, EV_HEARTBEAT, 0, 0);
            }
            break;
        default:
            status = TDM_ERR_INTERNAL;
        }
    }
    return status;
}

tdm_status_t sim_run(const sim_config_t *config, const sim_workload_t *workload,
                     sim_result_t *result_out, char *err, size_t err_bytes)
{
    sim_t *s;
    sim_result_t res;
    tdm_status_t status;
    struct timespec t0, t1;
    tdm_log_level_t level = tdm_log_get_level();

    if (err_bytes > 0) {
        err[0] = '\0';
    }
    if (config->perf.gpu == NULL || config->racks < 1 || config->racks > SIM_MAX_RACKS ||
        config->agents < 1 || !(config->duration_s > 0.0) || config->warmup_s < 0.0 ||
        config->warmup_s >= config->duration_s || !(config->heartbeat_s > 0.0) ||
        config->perf.max_batch_seqs < 1 || workload == NULL || workload->n_sessions == 0) {
        snprintf(err, err_bytes,
                 "bad config: need a GPU kind, 1..%d racks, >= 1 agent, 0 <= warm-up < "
                 "duration, a heartbeat period, a batch limit and a workload",
                 SIM_MAX_RACKS);
        return TDM_ERR_INVALID_ARG;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(&res, 0, sizeof(res));
    snprintf(res.gpu, sizeof(res.gpu), "%s", config->perf.gpu->name);
    res.racks = config->racks;
    res.agents = config->agents;
    s->cfg = *config;
    s->wl = workload;
    s->res = &res;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (level < TDM_LOG_WARN) {
        tdm_log_set_level(TDM_LOG_WARN); /* one registration line per instance is noise here */
    }
    status = setup(s, err, err_bytes);
    if (status == TDM_OK) {
        status = loop(s);
        if (status != TDM_OK && err_bytes > 0 && err[0] == '\0') {
            snprintf(err, err_bytes, "event loop: %s", tdm_status_name(status));
        }
    }
    tdm_log_set_level(level);
    if (status == TDM_OK) {
        results(s);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        res.wall_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        memcpy(result_out, &res, sizeof(res)); /* padding too: results compare bytewise */
    }
    teardown(s);
    free(s);
    return status;
}

double sim_batch1_tok_s(const sim_perf_params_t *params, uint64_t context_tokens, char *err,
                        size_t err_bytes)
{
    sim_perf_t *perf = NULL;
    double tok_s;

    if (sim_perf_create(SIM_ROLE_DECODE, params, &perf, err, err_bytes) != TDM_OK) {
        return 0.0;
    }
    tok_s = sim_perf_tokens_per_step(perf) / sim_perf_decode_step_s(perf, 1, context_tokens);
    sim_perf_destroy(perf);
    return tok_s;
}
