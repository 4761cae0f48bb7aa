/* replay.c - agents, levels and progress; see replay.h. */
#include "bench/replay/replay.h"

#include "bench/replay/client.h"
#include "bench/replay/tokens.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPLAY_TICK_MS              200  /* main thread: power ticks, deadline checks */
#define REPLAY_PROGRESS_TTY_MS      500  /* progress line rewrite period on a terminal */
#define REPLAY_PROGRESS_LOG_MS      5000 /* progress line period otherwise */
#define REPLAY_CONNECT_TIMEOUT_MS   10000
#define REPLAY_METRICS_TIMEOUT_MS   5000
#define REPLAY_WARN_ERRORS          5 /* failed requests logged at warn per level */
#define REPLAY_SESSION_HEADER_BYTES 160
#define REPLAY_TAG_BYTES            64
#define REPLAY_SALT_LEVEL           0x9E3779B97F4A7C15ULL
#define REPLAY_SALT_WRAP            0xC2B2AE3D27D4EB4FULL
#define REPLAY_PAUSE_KEY            0x165667B19E3779F9ULL

/* State shared by the agents of one level. */
typedef struct {
    const bench_replay_params_t *params;
    const bench_trace_t *trace;
    size_t level_index;
    uint64_t session_limit; /* 0: none */
    uint64_t t_deadline_ns; /* 0: none */
    char *model_json;       /* the model name as a JSON string */
    atomic_uint_fast64_t next_session;
    atomic_int stop;
    atomic_uint_fast64_t n_done;
    atomic_uint_fast64_t n_errors;
    atomic_uint_fast64_t output_tokens;
    atomic_uint_fast64_t n_in_flight;
    atomic_uint_fast64_t sessions_started;
    atomic_uint_fast64_t sessions_completed;
    atomic_uint_fast64_t context_cut;
    atomic_uint_fast64_t pause_total_us;
    pthread_mutex_t lock; /* guards n_running, stop_reason; with cond, wakes pauses and main */
    pthread_cond_t cond;
    uint32_t n_running;
    const char *stop_reason;
    bench_fit_t *fit;       /* the run's context-fit tracker (shared by every level) */
    int64_t longest_tokens; /* the trace's longest turn at the run's scale (bench_fit_longest) */
    atomic_uint_fast64_t context_errors;
    char first_error[BENCH_FIT_HINT_BYTES]; /* guarded by lock */
} level_ctx_t;

/* One simulated agent. */
typedef struct {
    level_ctx_t *level;
    uint32_t index;
    pthread_t thread;
    bench_client_t *client;
    bench_request_t *reqs;
    size_t n_reqs;
    size_t reqs_capacity;
    uint32_t *tokens;
    size_t tokens_capacity;
    tdm_buf_t body;
    tdm_status_t status;
} agent_t;

void bench_replay_params_default(bench_replay_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->model = "tandem";
    params->concurrency[0] = 1;
    params->n_levels = 1;
    params->duration_s = 60.0;
    params->scale = 1.0;
    params->seed = 1;
    params->pause_scale = 1.0;
    params->max_pause_s = 10.0;
    params->timeout_s = 600.0;
    params->max_errors = 100;
    params->send_session_header = 1;
}

void bench_run_result_fini(bench_run_result_t *result)
{
    for (size_t l = 0; l < result->n_levels; l++) {
        bench_level_result_t *level = &result->levels[l];
        for (size_t r = 0; r < level->n_requests; r++) {
            bench_request_fini(&level->requests[r]);
        }
        free(level->requests);
        level->requests = NULL;
        level->n_requests = 0;
    }
    result->n_levels = 0;
}

tdm_status_t bench_replay_discover(const char *base_url, const char *api_key,
                                   bench_server_info_t *info_out)
{
    char url[BENCH_URL_BYTES];
    tdm_buf_t body = {0};
    long http_status = 0;
    json_t *root;
    const json_t *first;
    const json_t *value;
    json_error_t jerr;
    tdm_status_t status;

    memset(info_out, 0, sizeof(*info_out));
    info_out->vocab_size = -1;
    info_out->max_model_len = -1;
    snprintf(url, sizeof(url), "%s/v1/models", base_url);
    status = bench_http_get(url, api_key, REPLAY_METRICS_TIMEOUT_MS, &body, &http_status);
    if (status != TDM_OK) {
        tdm_buf_fini(&body);
        return status;
    }
    root = json_loadb(body.data, body.n_bytes, 0, &jerr);
    tdm_buf_fini(&body);
    first = json_array_get(json_object_get(root, "data"), 0);
    if (!json_is_object(first)) {
        json_decref(root);
        return TDM_ERR_FORMAT;
    }
    value = json_object_get(first, "id");
    if (json_is_string(value)) {
        snprintf(info_out->model, sizeof(info_out->model), "%s", json_string_value(value));
    }
    value = json_object_get(first, "vocab_size");
    if (json_is_integer(value)) {
        info_out->vocab_size = (int64_t)json_integer_value(value);
    }
    value = json_object_get(first, "max_model_len");
    if (!json_is_integer(value)) {
        value = json_object_get(first, "context_length");
    }
    if (json_is_integer(value)) {
        info_out->max_model_len = (int64_t)json_integer_value(value);
    }
    json_decref(root);
    return TDM_OK;
}

/* A uniform double in (0, 1) from a key. */
static double unit_of(uint64_t key)
{
    return ((double)(tdm_hash_splitmix64(key) >> 11) + 0.5) / 9007199254740992.0;
}

double bench_replay_pause_ms(const bench_replay_params_t *params, bench_trace_format_t format,
                             const bench_turn_t *turn, uint64_t session_seq, size_t turn_index,
                             double prev_service_ms)
{
    double pause_ms = 0.0;

    if (turn->delay_ms >= 0) {
        pause_ms = (double)turn->delay_ms;
    } else if (turn->gap_ms >= 0) {
        pause_ms = (double)turn->gap_ms - prev_service_ms;
        pause_ms = pause_ms > 0.0 ? pause_ms : 0.0;
    } else if (format == BENCH_TRACE_SWE_AGENT) {
        uint64_t key = params->seed * REPLAY_PAUSE_KEY ^ (session_seq << 20) ^ turn_index;
        double u1 = unit_of(key);
        double u2 = unit_of(key ^ REPLAY_SALT_WRAP);
        double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        pause_ms = BENCH_SWE_PAUSE_MEDIAN_MS * exp(BENCH_SWE_PAUSE_SIGMA * z);
        pause_ms = pause_ms < BENCH_SWE_PAUSE_MIN_MS ? BENCH_SWE_PAUSE_MIN_MS : pause_ms;
        pause_ms = pause_ms > BENCH_SWE_PAUSE_MAX_MS ? BENCH_SWE_PAUSE_MAX_MS : pause_ms;
    }
    pause_ms *= params->pause_scale;
    if (pause_ms > params->max_pause_s * 1000.0) {
        pause_ms = params->max_pause_s * 1000.0;
    }
    return pause_ms;
}

static void level_stop(level_ctx_t *level, const char *reason)
{
    pthread_mutex_lock(&level->lock);
    if (!atomic_load(&level->stop)) {
        level->stop_reason = reason;
        atomic_store(&level->stop, 1);
    }
    pthread_cond_broadcast(&level->cond);
    pthread_mutex_unlock(&level->lock);
}

static struct timespec timespec_of(uint64_t t_ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(t_ns / TDM_NS_PER_S);
    ts.tv_nsec = (long)(t_ns % TDM_NS_PER_S);
    return ts;
}

/* Waits pause_ms unless the level stops first; returns 1 when the full pause passed. */
static int wait_pause(level_ctx_t *level, double pause_ms)
{
    uint64_t t_start = tdm_clock_now_ns();
    uint64_t t_until = t_start + (uint64_t)(pause_ms * (double)TDM_NS_PER_MS);
    int completed = 1;

    pthread_mutex_lock(&level->lock);
    for (;;) {
        struct timespec ts;
        if (atomic_load(&level->stop)) {
            completed = 0;
            break;
        }
        if (tdm_clock_now_ns() >= t_until) {
            break;
        }
        ts = timespec_of(t_until);
        pthread_cond_timedwait(&level->cond, &level->lock, &ts);
    }
    pthread_mutex_unlock(&level->lock);
    atomic_fetch_add(&level->pause_total_us, (tdm_clock_now_ns() - t_start) / 1000ULL);
    return completed;
}

/* The session header value: the trace's id (first 80 bytes), the level and the sequence number,
 * in [A-Za-z0-9._-]: under the router's 127-byte limit (router/session.h). */
static void session_header(const char *trace_id, size_t level_index, uint64_t seq, char *out,
                           size_t out_bytes)
{
    snprintf(out, out_bytes, "%.80s.l%zu.s%llu", trace_id, level_index, (unsigned long long)seq);
    for (char *c = out; *c != '\0'; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '.' || *c == '_' || *c == '-';
        if (!ok) {
            *c = '_';
        }
    }
}

static const char *body_tail_fmt =
    "\"max_tokens\":%zu,\"min_tokens\":%zu,\"ignore_eos\":true,\"temperature\":0,"
    "\"stream\":true,\"stream_options\":{\"include_usage\":true}}";

/* Builds a /v1/completions body for a Mooncake turn. */
static tdm_status_t body_of_tokens(agent_t *agent, const bench_token_params_t *tp,
                                   const bench_turn_t *turn, size_t n_prompt, size_t n_out)
{
    tdm_status_t status;
    size_t n = 0;

    if (n_prompt > agent->tokens_capacity) {
        uint32_t *grown = realloc(agent->tokens, n_prompt * sizeof(uint32_t));
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        agent->tokens = grown;
        agent->tokens_capacity = n_prompt;
    }
    status = bench_tokens_prompt(tp, turn, agent->tokens, agent->tokens_capacity, &n);
    if (status != TDM_OK) {
        return status;
    }
    tdm_buf_reset(&agent->body);
    status = tdm_buf_printf(&agent->body, "{\"model\":%s,\"prompt\":[", agent->level->model_json);
    for (size_t i = 0; i < n && status == TDM_OK; i++) {
        char digits[16];
        int n_digits = snprintf(digits, sizeof(digits), i == 0 ? "%u" : ",%u", agent->tokens[i]);
        status = tdm_buf_append(&agent->body, digits, (size_t)n_digits);
    }
    if (status == TDM_OK) {
        status = tdm_buf_printf(&agent->body, "],");
    }
    if (status == TDM_OK) {
        status = tdm_buf_printf(&agent->body, body_tail_fmt, n_out, n_out);
    }
    return status;
}

/* Builds a /v1/chat/completions body for a SWE-agent turn, tagging one message with `salt`. */
static tdm_status_t body_of_messages(agent_t *agent, const bench_session_t *session,
                                     const bench_turn_t *turn, uint64_t salt, size_t n_out)
{
    json_t *messages = json_array();
    char *text = NULL;
    char *model = agent->level->model_json;
    tdm_status_t status = TDM_ERR_NO_MEMORY;
    size_t i;
    json_t *message;

    if (messages == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    json_array_foreach(turn->messages, i, message)
    {
        const json_t *content = json_object_get(message, "content");
        if ((long)i == session->tag_message && json_is_string(content)) {
            json_t *copy = json_copy(message);
            char tag[REPLAY_TAG_BYTES];
            tdm_buf_t tagged = {0};
            snprintf(tag, sizeof(tag), "[tandem-bench run %016llx]\n", (unsigned long long)salt);
            if (copy == NULL || tdm_buf_printf(&tagged, "%s", tag) != TDM_OK ||
                tdm_buf_append(&tagged, json_string_value(content), json_string_length(content)) !=
                    TDM_OK ||
                json_object_set_new(copy, "content", json_stringn(tagged.data, tagged.n_bytes)) !=
                    0 ||
                json_array_append_new(messages, copy) != 0) {
                tdm_buf_fini(&tagged);
                goto free_messages;
            }
            tdm_buf_fini(&tagged);
        } else if (json_array_append(messages, message) != 0) {
            goto free_messages;
        }
    }
    text = json_dumps(messages, JSON_COMPACT);
    if (text == NULL) {
        goto free_messages;
    }
    tdm_buf_reset(&agent->body);
    status = tdm_buf_printf(&agent->body, "{\"model\":%s,\"messages\":%s,", model, text);
    if (status == TDM_OK) {
        status = tdm_buf_printf(&agent->body, body_tail_fmt, n_out, n_out);
    }
    free(text);

free_messages:
    json_decref(messages);
    return status;
}

static bench_request_t *next_record(agent_t *agent)
{
    bench_request_t *req;

    if (agent->n_reqs == agent->reqs_capacity) {
        bench_request_t *grown = tdm_array_grow(agent->reqs, sizeof(*grown), agent->n_reqs + 1, 64,
                                                &agent->reqs_capacity);
        if (grown == NULL) {
            return NULL;
        }
        agent->reqs = grown;
    }
    req = &agent->reqs[agent->n_reqs];
    memset(req, 0, sizeof(*req));
    return req;
}

/* Records a failed request of `turn` (index t) of `session`: the level's first error text, and,
 * when the server refused it as too long, the count, the learned ratio and the run's hint. */
static void note_failure(level_ctx_t *level, const bench_session_t *session, size_t trace_index,
                         size_t t, size_t n_prompt, size_t n_out, const char *error)
{
    const bench_replay_params_t *params = level->params;
    int64_t server_prompt;
    int64_t server_max;
    bench_fit_case_t fit_case;

    pthread_mutex_lock(&level->lock);
    if (level->first_error[0] == '\0') {
        snprintf(level->first_error, sizeof(level->first_error), "%s", error);
    }
    pthread_mutex_unlock(&level->lock);
    if (!bench_fit_parse_error(error, &server_prompt, &server_max)) {
        return;
    }
    atomic_fetch_add(&level->context_errors, 1);
    bench_fit_learn(level->fit, trace_index, (int64_t)n_prompt, server_prompt);
    memset(&fit_case, 0, sizeof(fit_case));
    fit_case.session_id = session->id;
    fit_case.turn_index = t;
    fit_case.needed_tokens =
        (server_prompt > 0 ? server_prompt : (int64_t)n_prompt) + (int64_t)n_out;
    fit_case.max_context = server_max > 0 ? server_max : (int64_t)params->server_context;
    fit_case.scale = params->scale;
    /* Estimates of both turns are in the same unit, so their ratio carries over. */
    fit_case.longest_factor = (double)level->longest_tokens / (double)(n_prompt + n_out);
    bench_fit_offer(level->fit, &fit_case);
}

/* Replays one session; returns 1 when every turn was answered. */
static int run_session(agent_t *agent, uint64_t seq)
{
    level_ctx_t *level = agent->level;
    const bench_replay_params_t *params = level->params;
    const bench_trace_t *trace = level->trace;
    size_t trace_index = (size_t)(seq % trace->n_sessions);
    const bench_session_t *session = &trace->sessions[trace_index];
    uint64_t wrap = seq / trace->n_sessions;
    bench_token_params_t tp;
    char header[REPLAY_SESSION_HEADER_BYTES];
    double prev_service_ms = 0.0;

    tp.vocab_size = params->vocab_size;
    tp.scale = params->scale;
    tp.salt = tdm_hash_splitmix64(params->seed ^
                                  ((uint64_t)(level->level_index + 1) * REPLAY_SALT_LEVEL) ^
                                  ((wrap + 1) * REPLAY_SALT_WRAP));
    session_header(session->id, level->level_index, seq, header, sizeof(header));

    for (size_t t = 0; t < session->n_turns; t++) {
        const bench_turn_t *turn = &session->turns[t];
        size_t n_out = bench_tokens_scaled(turn->output_length, params->scale);
        size_t n_prompt = trace->format == BENCH_TRACE_MOONCAKE
                              ? bench_tokens_scaled(turn->input_length, params->scale)
                              : (size_t)turn->input_length;
        bench_request_t *req;
        tdm_status_t status;

        if (atomic_load(&level->stop)) {
            return 0;
        }
        if (t > 0) {
            double pause_ms =
                bench_replay_pause_ms(params, trace->format, turn, seq, t, prev_service_ms);
            if (pause_ms > 0.0 && !wait_pause(level, pause_ms)) {
                return 0;
            }
        }
        if (params->max_context > 0) {
            int64_t n_known = bench_fit_tokens(level->fit, trace_index, (int64_t)n_prompt);
            if (n_known >= 0 && (uint64_t)n_known + n_out > params->max_context) {
                atomic_fetch_add(&level->context_cut, 1);
                return 0;
            }
        }
        status = trace->format == BENCH_TRACE_MOONCAKE
                     ? body_of_tokens(agent, &tp, turn, n_prompt, n_out)
                     : body_of_messages(agent, session, turn, tp.salt, n_out);
        if (status != TDM_OK) {
            agent->status = status;
            level_stop(level, "errors");
            return 0;
        }
        req = next_record(agent);
        if (req == NULL) {
            agent->status = TDM_ERR_NO_MEMORY;
            level_stop(level, "errors");
            return 0;
        }
        req->agent = agent->index;
        req->turn = (uint32_t)t;
        req->session = seq;
        req->max_tokens = (int64_t)n_out;
        req->input_tokens = (int64_t)n_prompt;
        atomic_fetch_add(&level->n_in_flight, 1);
        status = bench_client_stream(agent->client,
                                     trace->format == BENCH_TRACE_MOONCAKE ? BENCH_API_COMPLETIONS
                                                                           : BENCH_API_CHAT,
                                     agent->body.data, agent->body.n_bytes,
                                     params->send_session_header ? header : NULL, req);
        atomic_fetch_sub(&level->n_in_flight, 1);
        agent->n_reqs++;
        atomic_fetch_add(&level->n_done, 1);
        prev_service_ms = (double)(req->t_end_ns - req->t_send_ns) / (double)TDM_NS_PER_MS;
        if (status == TDM_OK && req->prompt_reported) {
            bench_fit_learn(level->fit, trace_index, (int64_t)n_prompt, req->input_tokens);
        }
        if (status != TDM_OK) {
            uint64_t n_errors = atomic_fetch_add(&level->n_errors, 1) + 1;
            note_failure(level, session, trace_index, t, n_prompt, n_out,
                         bench_client_last_error(agent->client));
            tdm_log(n_errors <= REPLAY_WARN_ERRORS ? TDM_LOG_WARN : TDM_LOG_DEBUG, "bench",
                    "request failed: agent=%u session=%s turn=%zu status=%s err=%s", agent->index,
                    header, t, tdm_status_name(status), bench_client_last_error(agent->client));
            if (status == TDM_ERR_NO_MEMORY) {
                agent->status = status;
            }
            if (n_errors >= params->max_errors || status == TDM_ERR_NO_MEMORY) {
                level_stop(level, "errors");
            }
            return 0;
        }
        atomic_fetch_add(&level->output_tokens, (uint64_t)req->output_tokens);
    }
    return 1;
}

static void *agent_main(void *arg)
{
    agent_t *agent = arg;
    level_ctx_t *level = agent->level;

    for (;;) {
        uint64_t seq;
        if (atomic_load(&level->stop)) {
            break;
        }
        seq = atomic_fetch_add(&level->next_session, 1);
        if (level->session_limit > 0 && seq >= level->session_limit) {
            break;
        }
        atomic_fetch_add(&level->sessions_started, 1);
        if (run_session(agent, seq)) {
            atomic_fetch_add(&level->sessions_completed, 1);
        }
    }
    pthread_mutex_lock(&level->lock);
    level->n_running--;
    pthread_cond_broadcast(&level->cond);
    pthread_mutex_unlock(&level->lock);
    return NULL;
}

static void print_progress(const bench_replay_params_t *params, level_ctx_t *level, size_t level_no,
                           uint32_t concurrency, uint64_t t_start_ns, int final)
{
    double elapsed_s = (double)(tdm_clock_now_ns() - t_start_ns) / (double)TDM_NS_PER_S;
    uint64_t out = atomic_load(&level->output_tokens);

    if (params->progress == NULL) {
        return;
    }
    fprintf(params->progress,
            "%s[level %zu/%zu c=%u] %6.1fs  req %llu  err %llu  in-flight %llu  sessions %llu  "
            "out %llu tok  %.1f tok/s%s",
            params->progress_is_tty ? "\r" : "", level_no + 1, params->n_levels, concurrency,
            elapsed_s, (unsigned long long)atomic_load(&level->n_done),
            (unsigned long long)atomic_load(&level->n_errors),
            (unsigned long long)atomic_load(&level->n_in_flight),
            (unsigned long long)atomic_load(&level->sessions_started), (unsigned long long)out,
            elapsed_s > 0.0 ? (double)out / elapsed_s : 0.0,
            params->progress_is_tty && !final ? "   " : "\n");
    fflush(params->progress);
}

static tdm_status_t check_params(const bench_replay_params_t *params, const bench_trace_t *trace)
{
    if (params->n_levels == 0 || params->n_levels > BENCH_MAX_LEVELS || trace->n_sessions == 0 ||
        !(params->scale > 0.0) || params->scale > 1.0 || params->base_url == NULL ||
        params->n_metrics_urls > BENCH_MAX_METRICS_URLS) {
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t l = 0; l < params->n_levels; l++) {
        if (params->concurrency[l] == 0) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    if (trace->format == BENCH_TRACE_MOONCAKE && params->vocab_size < BENCH_TOKEN_MIN_VOCAB) {
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static tdm_status_t level_ctx_init(level_ctx_t *level, const bench_replay_params_t *params,
                                   const bench_trace_t *trace, size_t level_index, bench_fit_t *fit)
{
    pthread_condattr_t attr;
    size_t longest_session;
    size_t longest_turn;
    json_t *model = json_string(params->model != NULL ? params->model : "tandem");

    memset(level, 0, sizeof(*level));
    level->params = params;
    level->trace = trace;
    level->level_index = level_index;
    level->fit = fit;
    bench_fit_longest(trace, params->scale, &longest_session, &longest_turn,
                      &level->longest_tokens);
    level->model_json = model != NULL ? json_dumps(model, JSON_ENCODE_ANY) : NULL;
    json_decref(model);
    if (level->model_json == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (params->n_sessions > 0) {
        level->session_limit = params->n_sessions;
    } else if (params->duration_s <= 0.0) {
        level->session_limit = trace->n_sessions;
    }
    pthread_mutex_init(&level->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&level->cond, &attr);
    pthread_condattr_destroy(&attr);
    return TDM_OK;
}

static void level_ctx_fini(level_ctx_t *level)
{
    pthread_cond_destroy(&level->cond);
    pthread_mutex_destroy(&level->lock);
    free(level->model_json);
}

static void agents_fini(agent_t *agents, uint32_t n_agents)
{
    for (uint32_t a = 0; a < n_agents; a++) {
        for (size_t r = 0; r < agents[a].n_reqs; r++) {
            bench_request_fini(&agents[a].reqs[r]);
        }
        free(agents[a].reqs);
        free(agents[a].tokens);
        tdm_buf_fini(&agents[a].body);
        bench_client_destroy(agents[a].client);
    }
    free(agents);
}

/* Moves every agent's records into the level result (the agents keep none). */
static tdm_status_t collect(agent_t *agents, uint32_t n_agents, bench_level_result_t *out)
{
    size_t n = 0;

    for (uint32_t a = 0; a < n_agents; a++) {
        n += agents[a].n_reqs;
    }
    out->requests = calloc(n + 1, sizeof(bench_request_t));
    if (out->requests == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t a = 0; a < n_agents; a++) {
        if (agents[a].n_reqs == 0) {
            continue; /* an agent that sent nothing has no array (memcpy from NULL is UB) */
        }
        memcpy(out->requests + out->n_requests, agents[a].reqs,
               agents[a].n_reqs * sizeof(bench_request_t));
        out->n_requests += agents[a].n_reqs;
        agents[a].n_reqs = 0;
    }
    return TDM_OK;
}

static void metrics_delta(const bench_metrics_snapshot_t *before,
                          const bench_metrics_snapshot_t *after, bench_metrics_snapshot_t *out)
{
    memset(out, 0, sizeof(*out));
    for (int m = 0; m < BENCH_N_METRICS; m++) {
        out->present[m] = before->present[m] && after->present[m];
        out->values[m] = out->present[m] ? after->values[m] - before->values[m] : 0.0;
    }
    out->n_endpoints_ok = after->n_endpoints_ok;
}

/* Runs one level; on TDM_OK *out holds its figures and records. */
static tdm_status_t run_level(const bench_replay_params_t *params, const bench_trace_t *trace,
                              bench_power_t *power, bench_fit_t *fit, size_t level_index,
                              bench_level_result_t *out)
{
    uint32_t n_agents = params->concurrency[level_index];
    bench_metrics_snapshot_t before;
    bench_metrics_snapshot_t after;
    int have_before = 0;
    level_ctx_t level;
    agent_t *agents;
    bench_client_params_t cp;
    uint64_t t_start_ns;
    uint64_t t_end_ns;
    uint64_t t_progress_ns;
    uint32_t n_started = 0;
    tdm_status_t status;

    memset(out, 0, sizeof(*out));
    out->concurrency = n_agents;
    status = level_ctx_init(&level, params, trace, level_index, fit);
    if (status != TDM_OK) {
        return status;
    }
    agents = calloc(n_agents, sizeof(agent_t));
    if (agents == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto fini_level;
    }
    memset(&cp, 0, sizeof(cp));
    cp.base_url = params->base_url;
    cp.api_key = params->api_key;
    cp.timeout_ms = (long)(params->timeout_s * 1000.0);
    cp.connect_timeout_ms = REPLAY_CONNECT_TIMEOUT_MS;
    cp.abort_flag = params->abort_flag;
    for (uint32_t a = 0; a < n_agents; a++) {
        agents[a].level = &level;
        agents[a].index = a;
        status = bench_client_create(&cp, &agents[a].client);
        if (status != TDM_OK) {
            goto free_agents;
        }
    }

    if (params->n_metrics_urls > 0) {
        have_before = bench_metrics_scrape(params->metrics_urls, params->n_metrics_urls,
                                           REPLAY_METRICS_TIMEOUT_MS, &before) == TDM_OK;
    }
    if (power != NULL) {
        bench_power_begin(power);
    }
    t_start_ns = tdm_clock_now_ns();
    t_progress_ns = t_start_ns;
    if (params->duration_s > 0.0) {
        level.t_deadline_ns = t_start_ns + (uint64_t)(params->duration_s * (double)TDM_NS_PER_S);
    }
    pthread_mutex_lock(&level.lock);
    for (uint32_t a = 0; a < n_agents; a++) {
        if (pthread_create(&agents[a].thread, NULL, agent_main, &agents[a]) != 0) {
            status = TDM_ERR_INTERNAL;
            tdm_log(TDM_LOG_ERROR, "bench", "agent thread failed to start: agent=%u", a);
            break;
        }
        level.n_running++;
        n_started++;
    }
    pthread_mutex_unlock(&level.lock);
    if (status != TDM_OK) {
        level_stop(&level, "errors");
    }

    pthread_mutex_lock(&level.lock);
    while (level.n_running > 0) {
        struct timespec ts = timespec_of(tdm_clock_now_ns() + REPLAY_TICK_MS * TDM_NS_PER_MS);
        uint64_t now;
        uint64_t period_ms =
            params->progress_is_tty ? REPLAY_PROGRESS_TTY_MS : REPLAY_PROGRESS_LOG_MS;
        pthread_cond_timedwait(&level.cond, &level.lock, &ts);
        pthread_mutex_unlock(&level.lock);
        now = tdm_clock_now_ns();
        if (power != NULL) {
            bench_power_tick(power);
        }
        if (level.t_deadline_ns != 0 && now >= level.t_deadline_ns) {
            level_stop(&level, "duration");
        }
        if (params->abort_flag != NULL && atomic_load(params->abort_flag)) {
            level_stop(&level, "aborted");
        }
        if (now - t_progress_ns >= period_ms * TDM_NS_PER_MS) {
            print_progress(params, &level, level_index, n_agents, t_start_ns, 0);
            t_progress_ns = now;
        }
        pthread_mutex_lock(&level.lock);
    }
    pthread_mutex_unlock(&level.lock);
    for (uint32_t a = 0; a < n_started; a++) {
        pthread_join(agents[a].thread, NULL);
    }
    t_end_ns = tdm_clock_now_ns();
    print_progress(params, &level, level_index, n_agents, t_start_ns, 1);
    if (power != NULL) {
        out->power = bench_power_end(power);
    }
    if (have_before && bench_metrics_scrape(params->metrics_urls, params->n_metrics_urls,
                                            REPLAY_METRICS_TIMEOUT_MS, &after) == TDM_OK) {
        metrics_delta(&before, &after, &out->metrics_delta);
        out->metrics_available = 1;
    }
    for (uint32_t a = 0; a < n_agents && status == TDM_OK; a++) {
        status = agents[a].status;
    }
    if (status == TDM_OK) {
        status = collect(agents, n_agents, out);
    }
    if (status == TDM_OK) {
        /* The level ends when its last request does (agents exit right after). */
        uint64_t t_last = t_start_ns;
        for (size_t r = 0; r < out->n_requests; r++) {
            t_last = out->requests[r].t_end_ns > t_last ? out->requests[r].t_end_ns : t_last;
        }
        t_end_ns = out->n_requests > 0 ? t_last : t_end_ns;
        status = bench_level_stats_compute(out->requests, out->n_requests, t_start_ns, t_end_ns,
                                           &out->stats);
    }
    out->n_sessions_started = atomic_load(&level.sessions_started);
    out->n_sessions_completed = atomic_load(&level.sessions_completed);
    out->n_context_cut = atomic_load(&level.context_cut);
    out->n_context_errors = atomic_load(&level.context_errors);
    snprintf(out->first_error, sizeof(out->first_error), "%s", level.first_error);
    out->pause_total_s = (double)atomic_load(&level.pause_total_us) / 1e6;
    out->stop_reason = level.stop_reason != NULL ? level.stop_reason
                       : params->n_sessions > 0  ? "sessions"
                                                 : "trace";

free_agents:
    agents_fini(agents, n_agents);
fini_level:
    level_ctx_fini(&level);
    return status;
}

/* Runs every level in order into result_out. */
static tdm_status_t run_levels(const bench_replay_params_t *params, const bench_trace_t *trace,
                               bench_power_t *power, bench_fit_t *fit,
                               bench_run_result_t *result_out)
{
    tdm_status_t status;

    for (size_t l = 0; l < params->n_levels; l++) {
        bench_level_result_t *level = &result_out->levels[l];
        tdm_log(TDM_LOG_INFO, "bench", "level start: concurrency=%u level=%zu/%zu",
                params->concurrency[l], l + 1, params->n_levels);
        status = run_level(params, trace, power, fit, l, level);
        if (status != TDM_OK) {
            for (size_t r = 0; r < level->n_requests; r++) {
                bench_request_fini(&level->requests[r]);
            }
            free(level->requests);
            memset(level, 0, sizeof(*level));
            return status;
        }
        result_out->n_levels++;
        if (params->abort_flag != NULL && atomic_load(params->abort_flag)) {
            break;
        }
    }
    return TDM_OK;
}

/* A Mooncake trace's counts are exact: say before the first level when its longest turn does not
 * fit (its sessions will be cut there). Chat traces wait for the server's count. */
static void check_fit_before_run(const bench_replay_params_t *params, const bench_trace_t *trace,
                                 bench_fit_t *fit)
{
    size_t s;
    size_t t;
    int64_t tokens;
    bench_fit_case_t fit_case;

    if (params->server_context == 0 || trace->format != BENCH_TRACE_MOONCAKE) {
        return;
    }
    bench_fit_longest(trace, params->scale, &s, &t, &tokens);
    if (tokens <= (int64_t)params->server_context) {
        return;
    }
    memset(&fit_case, 0, sizeof(fit_case));
    fit_case.session_id = trace->sessions[s].id;
    fit_case.turn_index = t;
    fit_case.needed_tokens = tokens;
    fit_case.max_context = (int64_t)params->server_context;
    fit_case.scale = params->scale;
    fit_case.longest_factor = 1.0;
    bench_fit_offer(fit, &fit_case);
}

tdm_status_t bench_replay_run(const bench_replay_params_t *params, const bench_trace_t *trace,
                              bench_power_t *power, bench_run_result_t *result_out)
{
    tdm_status_t status = check_params(params, trace);
    bench_fit_t *fit = NULL;

    memset(result_out, 0, sizeof(*result_out));
    if (status != TDM_OK) {
        return status;
    }
    status = bench_fit_create(trace->format == BENCH_TRACE_MOONCAKE, trace->n_sessions, &fit);
    if (status != TDM_OK) {
        return status;
    }
    check_fit_before_run(params, trace, fit);
    status = run_levels(params, trace, power, fit, result_out);
    bench_fit_hint_copy(fit, result_out->context_hint, sizeof(result_out->context_hint));
    bench_fit_destroy(fit);
    return status;
}
