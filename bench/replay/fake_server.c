/* fake_server.c - libmicrohttpd fake of the router's OpenAI API; see fake_server.h. */
#include "bench/replay/fake_server.h"

#include "bench/replay/metrics.h"
#include "bench/replay/u64map.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_SLEEP_SLICE_NS       (20ULL * TDM_NS_PER_MS) /* streams check for shutdown this often */
#define FAKE_CHAT_BYTES_PER_TOKEN 4
#define FAKE_MAX_BODY_BYTES       (64u << 20)
#define FAKE_SPECIAL_LOW          3 /* ids below this are special */
#define FAKE_SPECIAL_TOP          2 /* so are the top two */
#define FAKE_IDLE_TIMEOUT_S       120

struct bench_fake {
    bench_fake_params_t params;
    struct MHD_Daemon *daemon;
    uint16_t port;
    atomic_int quitting;
    atomic_int n_streams; /* streams being written (the batch the ITL model charges for) */
    pthread_mutex_t lock; /* guards counters and cache */
    bench_fake_counters_t counters;
    bench_u64map_t cache; /* prefix-chain hashes of blocks seen */
};

/* Per-connection upload state. */
typedef struct {
    tdm_buf_t body;
    int too_big;
} fake_upload_t;

/* One stream being written. */
typedef struct {
    bench_fake_t *fake;
    int chat;
    uint64_t n_tokens; /* to emit */
    uint64_t n_emitted;
    uint64_t t_next_ns; /* when the next event is due */
    uint64_t prompt_tokens;
    int include_usage;
    int stage;              /* 0 content, 1 finish, 2 usage, 3 done, 4 end */
    tdm_buf_t pending;      /* bytes of the current event not yet handed to MHD */
    size_t pending_off;
} fake_stream_t;

void bench_fake_params_default(bench_fake_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->ttft_ms = 20.0;
    params->itl_ms = 5.0;
    params->tokens_per_chunk = 1;
    params->vocab_size = 129280;
    params->max_model_len = 1048576;
    params->block_tokens = 16;
    params->kv_bytes_per_token = 890;
    params->disagg_min_tokens = 512;
    params->model = "tandem-fake";
}

/* Sleeps until t_ns (monotonic) in slices; returns 0 if the server began shutting down. */
static int sleep_until(bench_fake_t *fake, uint64_t t_ns)
{
    for (;;) {
        uint64_t now = tdm_clock_now_ns();
        uint64_t wait;
        struct timespec ts;

        if (atomic_load(&fake->quitting)) {
            return 0;
        }
        if (now >= t_ns) {
            return 1;
        }
        wait = t_ns - now < FAKE_SLEEP_SLICE_NS ? t_ns - now : FAKE_SLEEP_SLICE_NS;
        ts.tv_sec = (time_t)(wait / TDM_NS_PER_S);
        ts.tv_nsec = (long)(wait % TDM_NS_PER_S);
        nanosleep(&ts, NULL);
    }
}

/* Fills stream->pending with the next SSE event; returns 0 when the stream is over. */
static int next_event(fake_stream_t *stream)
{
    bench_fake_t *fake = stream->fake;
    tdm_buf_t *out = &stream->pending;

    tdm_buf_reset(out);
    stream->pending_off = 0;
    if (stream->stage == 0 && stream->n_emitted < stream->n_tokens) {
        uint64_t n = stream->n_tokens - stream->n_emitted;
        if (n > fake->params.tokens_per_chunk) {
            n = fake->params.tokens_per_chunk;
        }
        if (tdm_buf_printf(out, "data: {\"object\":\"%s\",\"model\":\"%s\",\"choices\":[{",
                           stream->chat ? "chat.completion.chunk" : "text_completion",
                           fake->params.model) != TDM_OK) {
            return 0;
        }
        tdm_buf_printf(out, stream->chat ? "\"index\":0,\"delta\":{\"content\":\""
                                         : "\"index\":0,\"text\":\"");
        for (uint64_t i = 0; i < n; i++) {
            tdm_buf_printf(out, " t%llu", (unsigned long long)(stream->n_emitted + i));
        }
        tdm_buf_printf(out, "\"%s,\"finish_reason\":null}]}\n\n", stream->chat ? "}" : "");
        stream->n_emitted += n;
        pthread_mutex_lock(&fake->lock);
        fake->counters.output_tokens += n;
        pthread_mutex_unlock(&fake->lock);
        if (stream->n_emitted == stream->n_tokens) {
            stream->stage = 1;
        }
        return 1;
    }
    if (stream->stage <= 1) {
        stream->stage = stream->include_usage ? 2 : 3;
        tdm_buf_printf(out,
                       "data: {\"object\":\"%s\",\"choices\":[{\"index\":0,%s"
                       "\"finish_reason\":\"length\"}]}\n\n",
                       stream->chat ? "chat.completion.chunk" : "text_completion",
                       stream->chat ? "\"delta\":{}," : "\"text\":\"\",");
        return 1;
    }
    if (stream->stage == 2) {
        stream->stage = 3;
        tdm_buf_printf(out,
                       "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%llu,"
                       "\"completion_tokens\":%llu,\"total_tokens\":%llu}}\n\n",
                       (unsigned long long)stream->prompt_tokens,
                       (unsigned long long)stream->n_tokens,
                       (unsigned long long)(stream->prompt_tokens + stream->n_tokens));
        return 1;
    }
    if (stream->stage == 3) {
        stream->stage = 4;
        tdm_buf_printf(out, "data: [DONE]\n\n");
        return 1;
    }
    return 0;
}

/* Next chunk delay: itl_ms plus itl_per_stream_ms for every other stream being written. */
static uint64_t itl_ns(bench_fake_t *fake)
{
    int n_others = atomic_load(&fake->n_streams) - 1;
    double ms = fake->params.itl_ms +
                fake->params.itl_per_stream_ms * (double)(n_others > 0 ? n_others : 0);
    return (uint64_t)(ms * (double)TDM_NS_PER_MS);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    fake_stream_t *stream = cls;
    size_t n;

    (void)pos;
    if (stream->pending_off >= stream->pending.n_bytes) {
        if (stream->stage == 0 || stream->stage == 1) {
            if (!sleep_until(stream->fake, stream->t_next_ns)) {
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            /* Relative schedule: a late chunk delays the rest instead of bunching them. */
            stream->t_next_ns = tdm_clock_now_ns() + itl_ns(stream->fake);
        }
        if (!next_event(stream)) {
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
    }
    n = stream->pending.n_bytes - stream->pending_off;
    if (n > max) {
        n = max;
    }
    memcpy(buf, stream->pending.data + stream->pending_off, n);
    stream->pending_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    fake_stream_t *stream = cls;
    atomic_fetch_sub(&stream->fake->n_streams, 1);
    tdm_buf_fini(&stream->pending);
    free(stream);
}

static enum MHD_Result send_text(struct MHD_Connection *connection, unsigned int code,
                                 const char *type, const char *text)
{
    struct MHD_Response *response =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (response == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(response, "Content-Type", type);
    ret = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return ret;
}

static enum MHD_Result send_error_code(struct MHD_Connection *connection, unsigned int code,
                                       const char *message, const char *error_code)
{
    char text[768];
    if (error_code != NULL) {
        snprintf(text, sizeof(text),
                 "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":\"%s\"}}", message,
                 code >= 500 ? "server_error" : "invalid_request_error", error_code);
    } else {
        snprintf(text, sizeof(text), "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%u}}",
                 message, code >= 500 ? "server_error" : "invalid_request_error", code);
    }
    return send_text(connection, code, "application/json", text);
}

static enum MHD_Result send_error(struct MHD_Connection *connection, unsigned int code,
                                  const char *message)
{
    return send_error_code(connection, code, message, NULL);
}

/*
 * Counts how many of the n_blocks leading blocks (hashes given as a chain) are cached, then
 * caches them all. Caller holds the lock.
 */
static uint64_t cache_lookup_insert(bench_fake_t *fake, const uint64_t *chain, size_t n_blocks)
{
    uint64_t n_hit = 0;
    int missed = 0;

    for (size_t b = 0; b < n_blocks; b++) {
        size_t cursor = 0;
        uint64_t value;
        if (!missed && bench_u64map_next(&fake->cache, chain[b], &cursor, &value)) {
            n_hit++;
            continue;
        }
        missed = 1;
        bench_u64map_insert(&fake->cache, chain[b], 1);
    }
    return n_hit;
}

/* Prompt token count and reused token count of a completions prompt; -1 on a bad prompt. */
static int prompt_of_completion(bench_fake_t *fake, const json_t *prompt, uint64_t *n_out,
                                uint64_t **chain_out, size_t *n_blocks_out, char *why,
                                size_t why_bytes)
{
    size_t n = json_array_size(prompt);
    size_t block = fake->params.block_tokens;
    size_t n_blocks = n / block;
    uint64_t *chain;
    uint64_t h = 0;

    if (json_is_string(prompt)) {
        *n_out = json_string_length(prompt) / FAKE_CHAT_BYTES_PER_TOKEN + 1;
        *chain_out = NULL;
        *n_blocks_out = 0;
        return 0;
    }
    if (!json_is_array(prompt) || n == 0) {
        snprintf(why, why_bytes, "prompt must be a string or a non-empty array of token ids");
        return -1;
    }
    chain = calloc(n_blocks + 1, sizeof(uint64_t));
    if (chain == NULL) {
        snprintf(why, why_bytes, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *id = json_array_get(prompt, i);
        json_int_t v = json_integer_value(id);
        if (!json_is_integer(id) || v < FAKE_SPECIAL_LOW ||
            v >= (json_int_t)fake->params.vocab_size - FAKE_SPECIAL_TOP) {
            snprintf(why, why_bytes, "prompt[%zu] is not a plain token id of this vocabulary", i);
            free(chain);
            return -1;
        }
        h = tdm_hash_xxh3_64_seeded(&v, sizeof(v), h);
        if ((i + 1) % block == 0) {
            chain[(i + 1) / block - 1] = h;
        }
    }
    *n_out = n;
    *chain_out = chain;
    *n_blocks_out = n_blocks;
    return 0;
}

/* Chat: tokens are bytes / 4 of the serialized messages; blocks of block_tokens * 4 bytes. */
static int prompt_of_chat(bench_fake_t *fake, const json_t *messages, uint64_t *n_out,
                          uint64_t **chain_out, size_t *n_blocks_out, char *why, size_t why_bytes)
{
    char *text;
    size_t n_bytes;
    size_t block = (size_t)fake->params.block_tokens * FAKE_CHAT_BYTES_PER_TOKEN;
    size_t n_blocks;
    uint64_t *chain;
    uint64_t h = 0;

    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        snprintf(why, why_bytes, "messages must be a non-empty array");
        return -1;
    }
    text = json_dumps(messages, JSON_COMPACT | JSON_SORT_KEYS);
    if (text == NULL) {
        snprintf(why, why_bytes, "out of memory");
        return -1;
    }
    n_bytes = strlen(text);
    n_blocks = n_bytes / block;
    chain = calloc(n_blocks + 1, sizeof(uint64_t));
    if (chain == NULL) {
        free(text);
        snprintf(why, why_bytes, "out of memory");
        return -1;
    }
    for (size_t b = 0; b < n_blocks; b++) {
        h = tdm_hash_xxh3_64_seeded(text + b * block, block, h);
        chain[b] = h;
    }
    free(text);
    *n_out = n_bytes / FAKE_CHAT_BYTES_PER_TOKEN + 1;
    *chain_out = chain;
    *n_blocks_out = n_blocks;
    return 0;
}

static enum MHD_Result handle_generate(bench_fake_t *fake, struct MHD_Connection *connection,
                                       const fake_upload_t *upload, int chat)
{
    json_error_t jerr;
    json_t *body = json_loadb(upload->body.data != NULL ? upload->body.data : "",
                              upload->body.n_bytes, 0, &jerr);
    const json_t *max_tokens;
    uint64_t n_prompt = 0;
    uint64_t *chain = NULL;
    size_t n_blocks = 0;
    uint64_t n_reused;
    uint64_t n_computed;
    uint64_t request_no;
    fake_stream_t *stream;
    struct MHD_Response *response;
    enum MHD_Result ret;
    char why[256];
    const char *code = NULL; /* the OpenAI error code string, when one applies */
    int rc;

    pthread_mutex_lock(&fake->lock);
    request_no = ++fake->counters.n_requests;
    if (MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "X-Session-Id") != NULL) {
        fake->counters.n_session_headers++;
    }
    pthread_mutex_unlock(&fake->lock);

    if (body == NULL || !json_is_object(body)) {
        snprintf(why, sizeof(why), "request body is not a JSON object");
        goto err_reject;
    }
    if (fake->params.fail_every > 0 && request_no % fake->params.fail_every == 0) {
        json_decref(body);
        pthread_mutex_lock(&fake->lock);
        fake->counters.n_failed++;
        pthread_mutex_unlock(&fake->lock);
        return send_error(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "injected failure");
    }
    max_tokens = json_object_get(body, "max_tokens");
    if (!json_is_integer(max_tokens) || json_integer_value(max_tokens) < 1) {
        snprintf(why, sizeof(why), "max_tokens must be an integer >= 1");
        goto err_reject;
    }
    rc = chat ? prompt_of_chat(fake, json_object_get(body, "messages"), &n_prompt, &chain,
                               &n_blocks, why, sizeof(why))
              : prompt_of_completion(fake, json_object_get(body, "prompt"), &n_prompt, &chain,
                                     &n_blocks, why, sizeof(why));
    if (rc != 0) {
        goto err_reject;
    }
    if (n_prompt + (uint64_t)json_integer_value(max_tokens) > fake->params.max_model_len) {
        /* Tandem's router's words (router/validate.c), which tandem-bench reads (fit.h) */
        free(chain);
        snprintf(why, sizeof(why),
                 "the prompt (%llu tokens) plus max_tokens (%lld) exceeds this model's maximum "
                 "context of %llu tokens",
                 (unsigned long long)n_prompt, (long long)json_integer_value(max_tokens),
                 (unsigned long long)fake->params.max_model_len);
        code = "context_length_exceeded";
        goto err_reject;
    }

    pthread_mutex_lock(&fake->lock);
    n_reused = cache_lookup_insert(fake, chain, n_blocks) * fake->params.block_tokens;
    if (chat) {
        n_reused = n_reused < n_prompt ? n_reused : n_prompt;
    }
    n_computed = n_prompt - n_reused;
    fake->counters.prompt_reused += n_reused;
    fake->counters.prompt_computed += n_computed;
    if (n_computed >= fake->params.disagg_min_tokens) {
        fake->counters.kv_bytes_moved += n_computed * fake->params.kv_bytes_per_token;
    }
    pthread_mutex_unlock(&fake->lock);
    free(chain);

    stream = calloc(1, sizeof(*stream));
    if (stream == NULL) {
        json_decref(body);
        return MHD_NO;
    }
    atomic_fetch_add(&fake->n_streams, 1);
    stream->fake = fake;
    stream->chat = chat;
    stream->n_tokens = (uint64_t)json_integer_value(max_tokens);
    stream->prompt_tokens = n_prompt;
    stream->include_usage =
        json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    stream->t_next_ns =
        tdm_clock_now_ns() + (uint64_t)(fake->params.ttft_ms * (double)TDM_NS_PER_MS) +
        (uint64_t)(fake->params.prefill_us_per_token * (double)n_computed * (double)TDM_NS_PER_US);
    json_decref(body);

    response =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, stream, stream_free);
    if (response == NULL) {
        stream_free(stream);
        return MHD_NO;
    }
    MHD_add_response_header(response, "Content-Type", "text/event-stream");
    MHD_add_response_header(response, "Cache-Control", "no-cache");
    ret = MHD_queue_response(connection, MHD_HTTP_OK, response);
    MHD_destroy_response(response);
    return ret;

err_reject:
    json_decref(body);
    pthread_mutex_lock(&fake->lock);
    fake->counters.n_failed++;
    pthread_mutex_unlock(&fake->lock);
    return send_error_code(connection, MHD_HTTP_BAD_REQUEST, why, code);
}

static enum MHD_Result handle_metrics(bench_fake_t *fake, struct MHD_Connection *connection)
{
    bench_fake_counters_t c;
    char text[2048];

    bench_fake_counters(fake, &c);
    snprintf(text, sizeof(text),
             "# HELP %s Prompt tokens computed by prefill.\n# TYPE %s counter\n"
             "%s{node=\"fake-prefill-0\"} %llu\n"
             "# HELP %s Prompt tokens reused from cached KV.\n# TYPE %s counter\n"
             "%s{node=\"fake-decode-0\"} %llu\n"
             "# HELP %s KV bytes moved between workers.\n# TYPE %s counter\n"
             "%s %llu\n"
             "# TYPE tandem_output_tokens_total counter\ntandem_output_tokens_total %llu\n"
             "# TYPE tandem_requests_total counter\ntandem_requests_total %llu\n",
             BENCH_METRIC_PREFILL_COMPUTED, BENCH_METRIC_PREFILL_COMPUTED,
             BENCH_METRIC_PREFILL_COMPUTED, (unsigned long long)c.prompt_computed,
             BENCH_METRIC_PREFILL_REUSED, BENCH_METRIC_PREFILL_REUSED, BENCH_METRIC_PREFILL_REUSED,
             (unsigned long long)c.prompt_reused, BENCH_METRIC_KV_BYTES_MOVED,
             BENCH_METRIC_KV_BYTES_MOVED, BENCH_METRIC_KV_BYTES_MOVED,
             (unsigned long long)c.kv_bytes_moved, (unsigned long long)c.output_tokens,
             (unsigned long long)c.n_requests);
    return send_text(connection, MHD_HTTP_OK, "text/plain; version=0.0.4", text);
}

static enum MHD_Result handle_models(bench_fake_t *fake, struct MHD_Connection *connection)
{
    char text[512];
    snprintf(text, sizeof(text),
             "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
             "\"owned_by\":\"tandem\",\"vocab_size\":%u,\"max_model_len\":%llu}]}",
             fake->params.model, fake->params.vocab_size,
             (unsigned long long)fake->params.max_model_len);
    return send_text(connection, MHD_HTTP_OK, "application/json", text);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    bench_fake_t *fake = cls;
    fake_upload_t *upload = *con_cls;

    (void)version;
    if (strcmp(method, "POST") == 0) {
        if (upload == NULL) {
            upload = calloc(1, sizeof(*upload));
            if (upload == NULL) {
                return MHD_NO;
            }
            *con_cls = upload;
            return MHD_YES;
        }
        if (*upload_data_size > 0) {
            if (upload->body.n_bytes + *upload_data_size > FAKE_MAX_BODY_BYTES ||
                tdm_buf_append(&upload->body, upload_data, *upload_data_size) != TDM_OK) {
                upload->too_big = 1;
            }
            *upload_data_size = 0;
            return MHD_YES;
        }
        if (upload->too_big) {
            return send_error(connection, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large");
        }
        if (strcmp(url, "/v1/completions") == 0) {
            return handle_generate(fake, connection, upload, 0);
        }
        if (strcmp(url, "/v1/chat/completions") == 0) {
            return handle_generate(fake, connection, upload, 1);
        }
        return send_error(connection, MHD_HTTP_NOT_FOUND, "no such endpoint");
    }
    if (strcmp(method, "GET") != 0) {
        return send_error(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed");
    }
    if (strcmp(url, "/metrics") == 0) {
        return handle_metrics(fake, connection);
    }
    if (strcmp(url, "/v1/models") == 0) {
        return handle_models(fake, connection);
    }
    if (strcmp(url, "/health") == 0) {
        return send_text(connection, MHD_HTTP_OK, "application/json", "{\"status\":\"ok\"}");
    }
    return send_error(connection, MHD_HTTP_NOT_FOUND, "no such endpoint");
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                         enum MHD_RequestTerminationCode code)
{
    fake_upload_t *upload = *con_cls;

    (void)cls;
    (void)connection;
    (void)code;
    if (upload != NULL) {
        tdm_buf_fini(&upload->body);
        free(upload);
        *con_cls = NULL;
    }
}

tdm_status_t bench_fake_create(const bench_fake_params_t *params, bench_fake_t **fake_out)
{
    bench_fake_t *fake;
    const union MHD_DaemonInfo *info;
    struct sockaddr_in addr;

    if (params->tokens_per_chunk == 0 || params->block_tokens == 0 ||
        params->vocab_size <= FAKE_SPECIAL_LOW + FAKE_SPECIAL_TOP || params->model == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    fake = calloc(1, sizeof(*fake));
    if (fake == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    fake->params = *params;
    pthread_mutex_init(&fake->lock, NULL);
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(params->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fake->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
        params->port, NULL, NULL, on_request, fake, MHD_OPTION_NOTIFY_COMPLETED, on_completed, fake,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)FAKE_IDLE_TIMEOUT_S, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_END);
    if (fake->daemon == NULL) {
        tdm_log(TDM_LOG_ERROR, "bench", "fake server failed to start: port=%u", params->port);
        pthread_mutex_destroy(&fake->lock);
        free(fake);
        return TDM_ERR_IO;
    }
    info = MHD_get_daemon_info(fake->daemon, MHD_DAEMON_INFO_BIND_PORT);
    fake->port = info != NULL ? info->port : params->port;
    tdm_log(TDM_LOG_INFO, "bench", "fake server listening: port=%u model=%s", fake->port,
            params->model);
    *fake_out = fake;
    return TDM_OK;
}

uint16_t bench_fake_port(const bench_fake_t *fake)
{
    return fake->port;
}

void bench_fake_counters(bench_fake_t *fake, bench_fake_counters_t *counters_out)
{
    pthread_mutex_lock(&fake->lock);
    *counters_out = fake->counters;
    pthread_mutex_unlock(&fake->lock);
}

void bench_fake_destroy(bench_fake_t *fake)
{
    if (fake == NULL) {
        return;
    }
    atomic_store(&fake->quitting, 1);
    MHD_stop_daemon(fake->daemon);
    bench_u64map_fini(&fake->cache);
    pthread_mutex_destroy(&fake->lock);
    free(fake);
}
