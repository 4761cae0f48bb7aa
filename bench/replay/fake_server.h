/* fake_server.h - a fake OpenAI-compatible streaming server for testing tandem-bench.
 *
 * Serves POST /v1/completions and /v1/chat/completions as SSE streams with controlled timing
 * (a first-token delay plus a per-computed-token prefill cost, then one chunk every itl_ms plus
 * itl_per_stream_ms for each other open stream, a crude batch-decode cost),
 * GET /v1/models (with vocab_size and max_model_len), GET /health, and GET /metrics with the
 * counters Tandem's router exports (metrics.h names). A global prefix cache over token blocks
 * decides which prompt tokens count as reused, so prefill counters behave like Tandem's. Owns
 * a libmicrohttpd daemon (one thread per connection; streams sleep between chunks). Stands in
 * for the cluster in tests and in `tandem-bench fake-server`; it runs no model.
 */
#ifndef TANDEM_BENCH_FAKE_SERVER_H
#define TANDEM_BENCH_FAKE_SERVER_H

#include <stdint.h>

#include "common/status.h"

/* Timing and behaviour of the fake. Plain data; bench_fake_params_default fills it. */
typedef struct {
    uint16_t port;               /* TCP port on 127.0.0.1; 0 picks a free one */
    double ttft_ms;              /* delay from request to first chunk, before prefill cost */
    double prefill_us_per_token; /* added to the first-token delay per computed prompt token */
    double itl_ms;               /* delay between chunks ... */
    double itl_per_stream_ms;    /* ... plus this for every other stream being written */
    uint32_t tokens_per_chunk;   /* tokens carried by each content chunk (>= 1) */
    uint32_t vocab_size;         /* reported by /v1/models; prompt ids must be 3..vocab-3 */
    uint64_t max_model_len;      /* reported by /v1/models */
    uint32_t block_tokens;       /* prefix-cache block, tokens (chat: 4 bytes a token) */
    uint64_t kv_bytes_per_token; /* KV bytes counted as moved per computed token ... */
    uint32_t disagg_min_tokens;  /* ... when a request computes at least this many */
    uint32_t fail_every;         /* every n-th generation request answers HTTP 500; 0 never */
    const char *model;           /* model id; borrowed, must outlive the server */
} bench_fake_params_t;

/* Counters since start; the same values /metrics serves. */
typedef struct {
    uint64_t n_requests;        /* generation requests received */
    uint64_t n_failed;          /* answered with an error status */
    uint64_t prompt_computed;   /* tandem_prefill_tokens_computed_total */
    uint64_t prompt_reused;     /* tandem_prefill_tokens_reused_total */
    uint64_t kv_bytes_moved;    /* tandem_kv_bytes_moved_total */
    uint64_t output_tokens;     /* tandem_output_tokens_total */
    uint64_t n_session_headers; /* requests that carried X-Session-Id */
} bench_fake_counters_t;

typedef struct bench_fake bench_fake_t;

/*
 * bench_fake_params_default - ttft 20 ms, no prefill cost, itl 5 ms, 1 token a chunk, vocab
 * 129280, max_model_len 1048576, 16-token blocks, 890 KV bytes a token (MODEL.md's compressed
 * rows) above 512 computed tokens, no failures, model "tandem-fake", port 0.
 */
void bench_fake_params_default(bench_fake_params_t *params);

/*
 * bench_fake_create - start serving on 127.0.0.1 (listening when this returns).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (tokens_per_chunk, block_tokens or vocab_size 0) or
 * TDM_ERR_IO (the port could not be bound; logged). Destroy with bench_fake_destroy.
 */
tdm_status_t bench_fake_create(const bench_fake_params_t *params, bench_fake_t **fake_out);

/* bench_fake_port - the bound port. */
uint16_t bench_fake_port(const bench_fake_t *fake);

/* bench_fake_counters - a consistent copy of the counters. Thread-safe. */
void bench_fake_counters(bench_fake_t *fake, bench_fake_counters_t *counters_out);

/*
 * bench_fake_destroy - stop serving: open streams end early with an error, threads are joined,
 * everything is freed. Accepts NULL.
 */
void bench_fake_destroy(bench_fake_t *fake);

#endif
