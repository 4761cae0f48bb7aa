/* synth.c - synthetic coding-agent trace generator; see synth.h for the distributions. */
#include "bench/replay/synth.h"

#include "bench/replay/trace.h"
#include "common/buf.h"
#include "common/hash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SYNTH_TASK_MEDIAN          1200.0
#define SYNTH_TASK_SIGMA           0.8
#define SYNTH_TASK_MIN             200.0
#define SYNTH_TASK_MAX             20000.0
#define SYNTH_TURNS_MEDIAN         12.0
#define SYNTH_TURNS_SIGMA          1.1
#define SYNTH_TURNS_MIN            2.0
#define SYNTH_TURNS_MAX            400.0
#define SYNTH_OUTPUT_MEDIAN        110.0
#define SYNTH_OUTPUT_SIGMA         0.9
#define SYNTH_OUTPUT_MIN           4.0
#define SYNTH_OUTPUT_MAX           4096.0
#define SYNTH_BIG_RESULT_P         0.1
#define SYNTH_SMALL_MEDIAN         100.0
#define SYNTH_SMALL_SIGMA          1.0
#define SYNTH_SMALL_MIN            10.0
#define SYNTH_SMALL_MAX            5000.0
#define SYNTH_BIG_MEDIAN           2000.0
#define SYNTH_BIG_SIGMA            0.8
#define SYNTH_BIG_MIN              500.0
#define SYNTH_BIG_MAX              30000.0
#define SYNTH_PAUSE_MEDIAN_MS      3000.0
#define SYNTH_PAUSE_SIGMA          1.0
#define SYNTH_PAUSE_MIN_MS         200.0
#define SYNTH_PAUSE_MAX_MS         120000.0
#define SYNTH_ARRIVAL_MEAN_MS      5000.0
#define SYNTH_SERVICE_BASE_MS      250.0
#define SYNTH_SERVICE_PER_TOKEN_MS 20.0
#define SYNTH_OVER_TOKENS          100000

/* One request before sorting. */
typedef struct {
    int64_t timestamp_ms;
    int64_t delay_ms; /* -1 on a first turn */
    int64_t input_length;
    int64_t output_length;
    uint64_t session;
    uint64_t turn;
    size_t n_ids;
    int64_t *ids; /* owned */
} synth_req_t;

/* SplitMix64 stream. */
typedef struct {
    uint64_t state;
} synth_rng_t;

static double rng_unit(synth_rng_t *rng)
{
    uint64_t x = tdm_hash_splitmix64(rng->state);
    rng->state += 0x9E3779B97F4A7C15ULL;
    return ((double)(x >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(synth_rng_t *rng)
{
    double u1 = rng_unit(rng);
    double u2 = rng_unit(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static double lognormal(synth_rng_t *rng, double median, double sigma, double lo, double hi)
{
    double x = median * exp(sigma * rng_normal(rng));
    return x < lo ? lo : x > hi ? hi : x;
}

static int compare_reqs(const void *a, const void *b)
{
    const synth_req_t *x = a;
    const synth_req_t *y = b;
    if (x->timestamp_ms != y->timestamp_ms) {
        return x->timestamp_ms < y->timestamp_ms ? -1 : 1;
    }
    if (x->session != y->session) {
        return x->session < y->session ? -1 : 1;
    }
    return x->turn < y->turn ? -1 : x->turn > y->turn;
}

static int compare_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t median_of(int64_t *values, size_t n)
{
    if (n == 0) {
        return 0;
    }
    qsort(values, n, sizeof(int64_t), compare_i64);
    return values[n / 2];
}

static void free_reqs(synth_req_t *reqs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(reqs[i].ids);
    }
    free(reqs);
}

/* Generates every request of every session (unsorted). */
static tdm_status_t generate(const bench_synth_params_t *params, synth_req_t **reqs_out,
                             size_t *n_out)
{
    synth_rng_t rng = {tdm_hash_splitmix64(params->seed)};
    int64_t n_shared = BENCH_SYNTH_SHARED_TOKENS / BENCH_TRACE_BLOCK_TOKENS;
    int64_t next_id = n_shared;
    synth_req_t *reqs = NULL;
    size_t n = 0;
    size_t capacity = 0;
    double t_session_ms = 0.0;

    for (uint64_t s = 0; s < params->n_sessions; s++) {
        double context =
            BENCH_SYNTH_SHARED_TOKENS + round(lognormal(&rng, SYNTH_TASK_MEDIAN, SYNTH_TASK_SIGMA,
                                                        SYNTH_TASK_MIN, SYNTH_TASK_MAX));
        uint64_t n_turns = (uint64_t)lognormal(&rng, SYNTH_TURNS_MEDIAN, SYNTH_TURNS_SIGMA,
                                               SYNTH_TURNS_MIN, SYNTH_TURNS_MAX);
        double t_ms = t_session_ms;
        int64_t *prev_ids = NULL;
        size_t n_prev_full = 0;

        t_session_ms += -log(rng_unit(&rng)) * SYNTH_ARRIVAL_MEAN_MS;
        for (uint64_t t = 0; t < n_turns && context <= BENCH_SYNTH_MAX_CONTEXT; t++) {
            synth_req_t *req;
            double output = round(lognormal(&rng, SYNTH_OUTPUT_MEDIAN, SYNTH_OUTPUT_SIGMA,
                                            SYNTH_OUTPUT_MIN, SYNTH_OUTPUT_MAX));
            double pause = round(lognormal(&rng, SYNTH_PAUSE_MEDIAN_MS, SYNTH_PAUSE_SIGMA,
                                           SYNTH_PAUSE_MIN_MS, SYNTH_PAUSE_MAX_MS));
            double result = rng_unit(&rng) < SYNTH_BIG_RESULT_P
                                ? lognormal(&rng, SYNTH_BIG_MEDIAN, SYNTH_BIG_SIGMA, SYNTH_BIG_MIN,
                                            SYNTH_BIG_MAX)
                                : lognormal(&rng, SYNTH_SMALL_MEDIAN, SYNTH_SMALL_SIGMA,
                                            SYNTH_SMALL_MIN, SYNTH_SMALL_MAX);
            int64_t input = (int64_t)context;

            if (n == capacity) {
                synth_req_t *grown = tdm_array_grow(reqs, sizeof(*grown), n + 1, 1024, &capacity);
                if (grown == NULL) {
                    free_reqs(reqs, n);
                    return TDM_ERR_NO_MEMORY;
                }
                reqs = grown;
            }
            req = &reqs[n];
            memset(req, 0, sizeof(*req));
            req->session = s;
            req->turn = t;
            req->input_length = input;
            req->output_length = (int64_t)output;
            req->n_ids =
                (size_t)((input + BENCH_TRACE_BLOCK_TOKENS - 1) / BENCH_TRACE_BLOCK_TOKENS);
            req->ids = malloc(req->n_ids * sizeof(int64_t));
            if (req->ids == NULL) {
                free_reqs(reqs, n);
                return TDM_ERR_NO_MEMORY;
            }
            n++;
            for (size_t b = 0; b < req->n_ids; b++) {
                if ((int64_t)b < n_shared) {
                    req->ids[b] = (int64_t)b;
                } else if (b < n_prev_full) {
                    req->ids[b] = prev_ids[b];
                } else {
                    req->ids[b] = next_id++;
                }
            }
            if (t > 0) {
                t_ms += pause;
                req->delay_ms = (int64_t)pause;
            } else {
                req->delay_ms = -1;
            }
            req->timestamp_ms = (int64_t)t_ms;
            t_ms += SYNTH_SERVICE_BASE_MS + SYNTH_SERVICE_PER_TOKEN_MS * output;
            prev_ids = req->ids;
            n_prev_full = (size_t)(input / BENCH_TRACE_BLOCK_TOKENS);
            context += output + round(result);
        }
    }
    *reqs_out = reqs;
    *n_out = n;
    return TDM_OK;
}

tdm_status_t bench_synth_write(const bench_synth_params_t *params, FILE *out,
                               bench_synth_summary_t *summary_out)
{
    synth_req_t *reqs = NULL;
    size_t n = 0;
    tdm_buf_t line = {0};
    int64_t *inputs = NULL;
    int64_t *outputs = NULL;
    int64_t *pauses = NULL;
    size_t n_pauses = 0;
    bench_synth_summary_t summary;
    tdm_status_t status;

    if (params->n_sessions == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    status = generate(params, &reqs, &n);
    if (status != TDM_OK) {
        return status;
    }
    qsort(reqs, n, sizeof(*reqs), compare_reqs);
    memset(&summary, 0, sizeof(summary));
    inputs = malloc((n + 1) * sizeof(int64_t));
    outputs = malloc((n + 1) * sizeof(int64_t));
    pauses = malloc((n + 1) * sizeof(int64_t));
    if (inputs == NULL || outputs == NULL || pauses == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto free_all;
    }
    for (size_t i = 0; i < n && status == TDM_OK; i++) {
        const synth_req_t *req = &reqs[i];
        tdm_buf_reset(&line);
        status = tdm_buf_printf(&line, "{\"session_id\":\"synth-%llu-%llu\",\"timestamp\":%lld,",
                                (unsigned long long)params->seed, (unsigned long long)req->session,
                                (long long)req->timestamp_ms);
        if (status == TDM_OK && req->delay_ms >= 0) {
            status = tdm_buf_printf(&line, "\"delay\":%lld,", (long long)req->delay_ms);
        }
        if (status == TDM_OK) {
            status = tdm_buf_printf(&line,
                                    "\"input_length\":%lld,\"output_length\":%lld,"
                                    "\"hash_ids\":[",
                                    (long long)req->input_length, (long long)req->output_length);
        }
        for (size_t b = 0; b < req->n_ids && status == TDM_OK; b++) {
            status = tdm_buf_printf(&line, b == 0 ? "%lld" : ",%lld", (long long)req->ids[b]);
        }
        if (status == TDM_OK) {
            status = tdm_buf_printf(&line, "]}\n");
        }
        if (status == TDM_OK && fwrite(line.data, 1, line.n_bytes, out) != line.n_bytes) {
            status = TDM_ERR_IO;
        }
        inputs[i] = req->input_length;
        outputs[i] = req->output_length;
        if (req->delay_ms >= 0) {
            pauses[n_pauses++] = req->delay_ms;
        }
        summary.n_over_100k += req->input_length > SYNTH_OVER_TOKENS ? 1 : 0;
        summary.input_max =
            req->input_length > summary.input_max ? req->input_length : summary.input_max;
    }
    if (status == TDM_OK && fflush(out) != 0) {
        status = TDM_ERR_IO;
    }
    summary.n_requests = n;
    summary.n_sessions = params->n_sessions;
    summary.input_p50 = median_of(inputs, n);
    summary.output_p50 = median_of(outputs, n);
    summary.pause_p50_ms = median_of(pauses, n_pauses);
    if (status == TDM_OK && summary_out != NULL) {
        *summary_out = summary;
    }

free_all:
    free(inputs);
    free(outputs);
    free(pauses);
    tdm_buf_fini(&line);
    free_reqs(reqs, n);
    return status;
}
