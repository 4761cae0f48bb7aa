/* predict.c - tandem-sim-calib: the cost model's prediction for a `tandem local` replay (issue 18
 * item 6; docs/SIM.md "Calibration"), beside what the replay measured.
 *
 * Input: a calibration file (tandem-bench-engine --calib, sim/perf.h sim_perf_calibrate) and
 * the requests.csv tandem-bench wrote for the replay (bench/replay/report.c): per request its
 * level, concurrency, agent, session, turn, prompt and output tokens, send time, TTFT and
 * duration. The workload the prediction replays is exactly those requests: each agent's turns in
 * the order it sent them, one after another (tool pauses are 0 in the check: --pause-scale 0).
 *
 * The cluster model (a small discrete-event loop of its own: the tandem-sim event loop of the
 * `sim` branch is not merged here): one prefill node and one decode node, as `tandem local
 * --prefill 1 --decode 1`. A turn whose uncached delta is at least --local-prefill-tokens goes
 * to the prefill node (FIFO, one job at a time), which samples the first token (TTFT) and hands
 * the sequence to the decode node; a shorter one is prefilled on the decode node between its
 * decode steps. A continuing turn costs sim_perf_continue_s (rewind and window replay, MODEL.md
 * 6(d): the calibration's `continue` records), a new one sim_perf_prefill_s. The decode node steps
 * every running sequence at once (continuous batching, at most --max-batch) at the calibrated cost
 * of sim_perf_decode_step_s(n, sum of contexts); prefill costs are sim_perf_prefill_s. Measured
 * figures are computed from the same CSV as tandem-bench computes them: output tok/s = output
 * tokens / (last response end - first send), TTFT p50 over successful requests.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/flags.h"
#include "sim/perf.h"

#define MAX_LEVELS 16
#define LINE_BYTES 1024

typedef struct {
    int level;
    int concurrency;
    int agent;
    long long session;
    int turn;
    int ok;
    double t_send_ms, ttft_ms, duration_ms;
    long long input, output;
} req_t;

typedef struct {
    const char *calib;
    const char *requests;
    uint32_t local_prefill_tokens;
    uint32_t max_batch;
    double request_overhead_ms;
    double handoff_ms;
    int gpu_table;
    double slowdown;
} cfg_t;

static const tdm_flag_t flags[] = {
    {"calib", TDM_FLAG_PATH, NULL, offsetof(cfg_t, calib),
     "calibration file (tandem-bench-engine --calib)", 0, 0, 0},
    {"requests", TDM_FLAG_PATH, NULL, offsetof(cfg_t, requests),
     "requests.csv of the tandem-bench replay to predict", 0, 0, 0},
    {"slowdown", TDM_FLAG_F64, "1", offsetof(cfg_t, slowdown),
     "multiply every calibrated step cost by this (a shared box: the calibration's CPU share "
     "over the cluster's, measured by bench/sim-calib/run)",
     0.01, 100, 0},
    {"gpu-table", TDM_FLAG_BOOL, "false", offsetof(cfg_t, gpu_table),
     "print the analytic model's figures per GPU kind (docs/SIM.md) instead", 0, 0, 0},
    {"local-prefill-tokens", TDM_FLAG_U32, "64", offsetof(cfg_t, local_prefill_tokens),
     "the router's --local-prefill-tokens of the replay", 1, 1u << 30, 0},
    {"max-batch", TDM_FLAG_U32, "64", offsetof(cfg_t, max_batch), "the decode node's --max-batch",
     1, 4096, 0},
    {"request-overhead-ms", TDM_FLAG_F64, "1", offsetof(cfg_t, request_overhead_ms),
     "HTTP, router and tokenizer time per request (added to TTFT)", 0, 10000, 0},
    {"handoff-ms", TDM_FLAG_F64, "2", offsetof(cfg_t, handoff_ms),
     "prefill-to-decode handoff on loopback (KV pages and the state record)", 0, 10000, 0},
};
#define N_FLAGS (sizeof(flags) / sizeof(flags[0]))

/* Column index of `name` in the CSV header, or -1. */
static int column(char *header, const char *name)
{
    int i = 0;
    for (char *save = NULL, *tok = strtok_r(header, ",\r\n", &save); tok != NULL;
         tok = strtok_r(NULL, ",\r\n", &save), i++) {
        if (strcmp(tok, name) == 0) {
            return i;
        }
    }
    return -1;
}

static int load_requests(const char *path, req_t **out, size_t *n_out)
{
    static const char *const names[] = {"level",       "concurrency",  "agent",        "session",
                                        "turn",        "result",       "t_send_ms",    "ttft_ms",
                                        "duration_ms", "input_tokens", "output_tokens"};
    int col[11];
    char line[LINE_BYTES];
    FILE *f = fopen(path, "r");
    size_t n = 0, cap = 256;
    req_t *reqs = malloc(cap * sizeof(*reqs));

    if (f == NULL || reqs == NULL || fgets(line, sizeof(line), f) == NULL) {
        fprintf(stderr, "tandem-sim-calib: %s: cannot read\n", path);
        free(reqs);
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    for (int k = 0; k < 11; k++) {
        char copy[LINE_BYTES];
        memcpy(copy, line, sizeof(copy));
        col[k] = column(copy, names[k]);
        if (col[k] < 0) {
            fprintf(stderr, "tandem-sim-calib: %s: no column %s\n", path, names[k]);
            fclose(f);
            free(reqs);
            return -1;
        }
    }
    int line_no = 1;
    while (fgets(line, sizeof(line), f) != NULL) {
        double v[32];
        int nv = 0;
        line_no++;
        for (char *save = NULL, *tok = strtok_r(line, ",\r\n", &save); tok != NULL && nv < 32;
             tok = strtok_r(NULL, ",\r\n", &save)) {
            v[nv++] = strtod(tok, NULL);
        }
        if (nv < 17) {
            fprintf(stderr, "tandem-sim-calib: %s:%d: expected 17 columns\n", path, line_no);
            fclose(f);
            free(reqs);
            return -1;
        }
        if (n == cap) {
            req_t *grown = realloc(reqs, 2 * cap * sizeof(*reqs));
            if (grown == NULL) {
                fclose(f);
                free(reqs);
                return -1;
            }
            reqs = grown;
            cap *= 2;
        }
        req_t *r = &reqs[n++];
        r->level = (int)v[col[0]];
        r->concurrency = (int)v[col[1]];
        r->agent = (int)v[col[2]];
        r->session = (long long)v[col[3]];
        r->turn = (int)v[col[4]];
        r->ok = v[col[5]] == 0;
        r->t_send_ms = v[col[6]];
        r->ttft_ms = v[col[7]];
        r->duration_ms = v[col[8]];
        r->input = (long long)v[col[9]];
        r->output = (long long)v[col[10]];
    }
    fclose(f);
    *out = reqs;
    *n_out = n;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* p50 by linear interpolation between closest ranks (numpy's default, as tandem-bench). */
static double median(double *v, size_t n)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, n, sizeof(double), cmp_double);
    double pos = 0.5 * (double)(n - 1);
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    return lo + 1 < n ? v[lo] + frac * (v[lo + 1] - v[lo]) : v[lo];
}

/* One agent's queue of requests (indices into the level's array), in send order. */
typedef struct {
    size_t *idx;
    size_t n, next;
    double ready_s; /* when the agent sends its next request */
    int waiting;    /* 1: a request of this agent is in flight */
    long long last_session;
    long long last_input;
} agent_t;

/* A running or pending request in the cluster. */
typedef struct {
    size_t req; /* index into the level's requests */
    int agent;
    double arrive_s; /* sent */
    double ready_s;  /* prefill done: joins the decode batch */
    long long ctx;   /* tokens in its sequence */
    long long left;  /* output tokens still to decode */
    double ttft_s;
} flight_t;

/* Predict one level; returns 0 and the two figures. */
static int predict_level(const cfg_t *cfg, const sim_perf_t *perf, const req_t *reqs, size_t n,
                         int concurrency, double *tok_s, double *ttft_p50_ms,
                         double *remote_compute_s, int *remote_jobs)
{
    agent_t *agents = calloc((size_t)concurrency, sizeof(*agents));
    flight_t *fl = calloc(n, sizeof(*fl));
    double *ttft = calloc(n, sizeof(double));
    size_t n_fl = 0, n_done = 0, n_ttft = 0;
    double now = 0, prefill_free = 0, last_end = 0;
    long long out_tokens = 0;

    if (agents == NULL || fl == NULL || ttft == NULL) {
        free(agents);
        free(fl);
        free(ttft);
        return -1;
    }
    for (int a = 0; a < concurrency; a++) {
        agents[a].idx = calloc(n, sizeof(size_t));
        agents[a].last_session = -1;
    }
    /* each agent's requests in send order (the CSV is in completion order per level) */
    for (size_t i = 0; i < n; i++) {
        int a = reqs[i].agent;
        if (a < 0 || a >= concurrency || agents[a].idx == NULL) {
            continue;
        }
        size_t k = agents[a].n++;
        while (k > 0 && reqs[agents[a].idx[k - 1]].t_send_ms > reqs[i].t_send_ms) {
            agents[a].idx[k] = agents[a].idx[k - 1];
            k--;
        }
        agents[a].idx[k] = i;
    }
    /* Event loop over the decode node's steps: new arrivals are dispatched when their agent is
     * ready; the prefill node is a FIFO server whose completions feed the batch. */
    while (n_done < n) {
        /* dispatch every request whose agent is ready by `now` */
        for (int a = 0; a < concurrency; a++) {
            agent_t *ag = &agents[a];
            if (ag->waiting || ag->next >= ag->n || ag->ready_s > now) {
                continue;
            }
            size_t ri = ag->idx[ag->next++];
            const req_t *r = &reqs[ri];
            long long cached = 0;
            if (r->session == ag->last_session && r->turn > 0) {
                cached = ag->last_input < r->input ? ag->last_input : r->input - 1;
            }
            long long delta = r->input - cached;
            flight_t *f = &fl[n_fl++];
            f->req = ri;
            f->agent = a;
            f->arrive_s = ag->ready_s;
            f->ctx = r->input;
            f->left = r->output > 1 ? r->output - 1 : 0;
            double overhead = cfg->request_overhead_ms / 1e3;
            if (delta >= (long long)cfg->local_prefill_tokens) {
                double start = prefill_free > f->arrive_s ? prefill_free : f->arrive_s;
                double cost =
                    cfg->slowdown *
                    (cached > 0 ? sim_perf_continue_s(perf, (uint64_t)delta, (uint64_t)cached)
                                : sim_perf_prefill_s(perf, (uint64_t)delta, 0));
                prefill_free = start + cost;
                *remote_compute_s += cost;
                (*remote_jobs)++;
                f->ttft_s = prefill_free + overhead - f->arrive_s;
                f->ready_s = prefill_free + cfg->handoff_ms / 1e3;
            } else {
                /* local: on the decode node before its next step (it runs whole) */
                double cost =
                    cfg->slowdown *
                    (cached > 0 ? sim_perf_continue_s(perf, (uint64_t)delta, (uint64_t)cached)
                                : sim_perf_prefill_s(perf, (uint64_t)delta, 0));
                double start = now > f->arrive_s ? now : f->arrive_s;
                now = start + cost;
                f->ttft_s = now + overhead - f->arrive_s;
                f->ready_s = now;
            }
            ag->waiting = 1;
            ag->last_session = r->session;
            ag->last_input = r->input;
        }
        /* one decode step over the running sequences that are ready */
        uint32_t n_run = 0;
        uint64_t sum_ctx = 0;
        double next_event = INFINITY;
        for (size_t i = 0; i < n_fl; i++) {
            flight_t *f = &fl[i];
            if (f->req == SIZE_MAX) {
                continue;
            }
            if (f->ready_s <= now && n_run < cfg->max_batch) {
                if (f->left > 0) {
                    n_run++;
                    sum_ctx += (uint64_t)f->ctx;
                }
            } else if (f->ready_s < next_event) {
                next_event = f->ready_s;
            }
        }
        double step_start = now;
        if (n_run > 0) {
            now += cfg->slowdown * sim_perf_decode_step_s(perf, n_run, sum_ctx);
        }
        /* retire finished requests; advance the running ones */
        uint32_t stepped = 0;
        for (size_t i = 0; i < n_fl; i++) {
            flight_t *f = &fl[i];
            if (f->req == SIZE_MAX || f->ready_s > now) {
                continue;
            }
            if (f->left > 0 && f->ready_s <= step_start && stepped < n_run) {
                f->left--;
                f->ctx++;
                stepped++;
            }
            if (f->left == 0 && f->ready_s <= now) {
                const req_t *r = &reqs[f->req];
                agents[f->agent].waiting = 0;
                agents[f->agent].ready_s = now;
                last_end = now > last_end ? now : last_end;
                out_tokens += r->output;
                ttft[n_ttft++] = f->ttft_s * 1e3;
                f->req = SIZE_MAX;
                n_done++;
            }
        }
        if (n_run == 0) {
            /* idle: jump to the next arrival or prefill completion */
            double t = next_event;
            for (int a = 0; a < concurrency; a++) {
                if (!agents[a].waiting && agents[a].next < agents[a].n && agents[a].ready_s < t) {
                    t = agents[a].ready_s;
                }
            }
            if (!isfinite(t)) {
                break; /* nothing left that can happen */
            }
            now = t > now ? t : now;
        }
    }
    *tok_s = last_end > 0 ? (double)out_tokens / last_end : 0;
    *ttft_p50_ms = median(ttft, n_ttft);
    for (int a = 0; a < concurrency; a++) {
        free(agents[a].idx);
    }
    free(agents);
    free(fl);
    free(ttft);
    return n_done == n ? 0 : -1;
}

/* The analytic model's headline figures per GPU kind (docs/SIM.md "Cost model"). */
static int gpu_table(void)
{
    static const char *const names[] = {"h200", "b200", "b300", "gb200", "gb300"};
    printf("%-6s %5s %12s | %10s %10s | %10s %10s | %12s %10s\n", "gpu", "group", "KV tokens",
           "b1 plain", "b1 DSpark", "b64 tok/s", "per GPU", "prefill 8k s", "power kW");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        sim_perf_params_t p;
        sim_perf_t *plain = NULL, *spec = NULL;
        char err[256];
        sim_perf_params_default(&p);
        p.gpu = sim_gpu_find(names[i]);
        if (sim_perf_create(SIM_ROLE_DECODE, &p, &spec, err, sizeof(err)) != TDM_OK) {
            fprintf(stderr, "tandem-sim-calib: %s: %s\n", names[i], err);
            return 1;
        }
        p.dspark_draft_len = 0;
        p.dspark_acceptance = 0;
        if (sim_perf_create(SIM_ROLE_DECODE, &p, &plain, err, sizeof(err)) != TDM_OK) {
            sim_perf_destroy(spec);
            return 1;
        }
        const uint64_t ctx = 8192;
        double b1p = 1.0 / sim_perf_decode_step_s(plain, 1, ctx);
        double b1s = sim_perf_tokens_per_step(spec) / sim_perf_decode_step_s(spec, 1, ctx);
        double b64 =
            64.0 * sim_perf_tokens_per_step(spec) / sim_perf_decode_step_s(spec, 64, 64 * ctx);
        printf("%-6s %5u %12llu | %10.0f %10.0f | %10.0f %10.0f | %12.3f %10.2f\n", names[i],
               sim_perf_group_gpus(spec), (unsigned long long)sim_perf_kv_tokens(spec), b1p, b1s,
               b64, b64 / sim_perf_group_gpus(spec), sim_perf_prefill_s(spec, 8192, 0),
               sim_perf_power_w(spec, 1.0) / 1e3);
        sim_perf_destroy(plain);
        sim_perf_destroy(spec);
    }
    printf("(decode tok/s per agent at 8,192 tokens of context; DSpark: 3 drafts, 1.5 accepted; "
           "b64: 64 agents on one instance; efficiency 0.6; FP8 expert math)\n");
    return 0;
}

int main(int argc, char **argv)
{
    cfg_t cfg;
    tdm_flags_action_t action;
    sim_perf_params_t params;
    sim_perf_t *perf = NULL;
    char err[512];
    req_t *reqs = NULL;
    size_t n_reqs = 0;
    int rc = 0;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_flags_parse(flags, N_FLAGS, argc, argv, "tandem-sim-calib",
                        "tandem-sim's cost model, calibrated, against a measured tandem local "
                        "replay (requests.csv of tandem-bench).",
                        &cfg, NULL, NULL, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    if (cfg.gpu_table) {
        return gpu_table();
    }
    if (cfg.calib == NULL || cfg.requests == NULL) {
        fprintf(stderr, "tandem-sim-calib: --calib and --requests are required (or --gpu-table)\n");
        return 2;
    }
    /* The calibration replaces the step costs; the GPU kind only sizes capacity (unused). */
    sim_perf_params_default(&params);
    params.gpu = sim_gpu_find("b300");
    params.dspark_draft_len = 0; /* tandem local runs --spec off */
    params.dspark_acceptance = 0;
    params.max_batch_seqs = cfg.max_batch;
    if (sim_perf_create(SIM_ROLE_DECODE, &params, &perf, err, sizeof(err)) != TDM_OK ||
        sim_perf_calibrate(perf, cfg.calib, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-sim-calib: %s\n", err);
        sim_perf_destroy(perf);
        return 1;
    }
    if (!sim_perf_calibrated(perf)) {
        fprintf(stderr,
                "tandem-sim-calib: %s: no step costs (a gpu-check log calibrates rates "
                "only)\n",
                cfg.calib);
        sim_perf_destroy(perf);
        return 1;
    }
    if (load_requests(cfg.requests, &reqs, &n_reqs) != 0) {
        sim_perf_destroy(perf);
        return 1;
    }
    double coef[3], rms = 0;
    if (sim_perf_calibration_fit(perf, SIM_ROLE_DECODE, coef, &rms) == TDM_OK) {
        printf("calibration decode: %.3f ms + %.3f ms x seqs + %.3g ms x context tokens (rms %.1f "
               "%%)\n",
               coef[0] * 1e3, coef[1] * 1e3, coef[2] * 1e3, rms * 100);
    }
    if (sim_perf_calibration_fit(perf, SIM_ROLE_PREFILL, coef, &rms) == TDM_OK) {
        printf("calibration prefill: %.3f ms + %.4f ms x new + %.3g ms x new x context (rms %.1f "
               "%%)\n",
               coef[0] * 1e3, coef[1] * 1e3, coef[2] * 1e3, rms * 100);
    }
    printf("%5s %9s | %12s %12s %7s | %12s %12s %7s\n", "level", "requests", "meas tok/s",
           "pred tok/s", "err %", "meas TTFT50", "pred TTFT50", "err %");
    double remote_s = 0;
    int remote_jobs = 0;
    for (int level = 0; level < MAX_LEVELS; level++) {
        size_t n = 0;
        int conc = 0;
        double end = 0;
        long long out = 0;
        for (size_t i = 0; i < n_reqs; i++) {
            n += reqs[i].level == level;
        }
        if (n == 0) {
            continue;
        }
        req_t *lv = calloc(n, sizeof(*lv));
        double *tt = calloc(n, sizeof(double));
        size_t k = 0, n_tt = 0;
        for (size_t i = 0; i < n_reqs; i++) {
            if (reqs[i].level != level) {
                continue;
            }
            lv[k++] = reqs[i];
            conc = reqs[i].concurrency;
            if (reqs[i].ok) {
                double e = reqs[i].t_send_ms + reqs[i].duration_ms;
                end = e > end ? e : end;
                out += reqs[i].output;
                tt[n_tt++] = reqs[i].ttft_ms;
            }
        }
        double meas_tok_s = end > 0 ? (double)out / (end / 1e3) : 0;
        double meas_ttft = median(tt, n_tt);
        double pred_tok_s = 0, pred_ttft = 0;
        if (predict_level(&cfg, perf, lv, n, conc, &pred_tok_s, &pred_ttft, &remote_s,
                          &remote_jobs) != 0) {
            fprintf(stderr, "tandem-sim-calib: level %d: the prediction did not finish\n", level);
            rc = 1;
        }
        printf("%5d %9zu | %12.2f %12.2f %+7.1f | %12.1f %12.1f %+7.1f\n", level, n, meas_tok_s,
               pred_tok_s, 100.0 * (pred_tok_s - meas_tok_s) / meas_tok_s, meas_ttft, pred_ttft,
               100.0 * (pred_ttft - meas_ttft) / meas_ttft);
        printf("summary: level=%d concurrency=%d tok_s_err_pct=%.1f ttft_p50_err_pct=%.1f\n", level,
               conc, 100.0 * (pred_tok_s - meas_tok_s) / meas_tok_s,
               100.0 * (pred_ttft - meas_ttft) / meas_ttft);
        free(lv);
        free(tt);
    }
    printf("model: %d prefill-node jobs, %.2f s of calibrated compute (compare the prefill "
           "node's tandem_prefill_compute_seconds_total)\n",
           remote_jobs, remote_s);
    free(reqs);
    sim_perf_destroy(perf);
    return rc;
}
