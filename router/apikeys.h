/* apikeys.h - the API keys of the router's HTTP front end: who may call, as which tenant, and
 * how often.
 *
 * Owns the key table (loaded once from a key file and/or the text of --api-keys /
 * TANDEM_API_KEYS), each key's limits (requests in flight, requests per minute) and its usage
 * counters. A key is kept only as its SHA-256 digest; a presented key is digested and compared
 * with every entry in constant time (CRYPTO_memcmp, no early exit), so timing does not say how
 * much of a key was right. Each key has a public name (its metrics label, never the secret) and a
 * tenant id (its index + 1): sessions and stored responses belong to the tenant that created them
 * (session.h, responses.h). With no keys configured the table is empty and the front end is open
 * (tenant 0). Knows nothing of HTTP or sessions.
 *
 * Key file / text format (docs/DEPLOY.md "Security"): one key per line (in --api-keys text also
 * separated by commas); blank lines and lines starting with '#' are skipped; a line is
 *     KEY [name=NAME] [concurrency=N] [rpm=N]
 * KEY is 16..256 printable ASCII bytes without spaces; NAME (default "key<index>") is 1..63
 * bytes of [A-Za-z0-9_.-]; concurrency and rpm override the defaults (0: unlimited).
 *
 * Threading: create/destroy from one thread; everything else from any thread (one mutex).
 */
#ifndef TANDEM_ROUTER_APIKEYS_H
#define TANDEM_ROUTER_APIKEYS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Most keys in one table; longest key and name, bytes (no NUL). */
#define ROUTER_APIKEYS_MAX       4096
#define ROUTER_APIKEY_MIN_BYTES  16
#define ROUTER_APIKEY_MAX_BYTES  256
#define ROUTER_APIKEY_NAME_BYTES 63

/* Limits of one key (plain data; 0 = unlimited). */
typedef struct {
    uint32_t max_concurrency; /* requests in flight at once */
    uint32_t rpm;             /* requests per minute (token bucket of rpm, refilled rpm / 60 s) */
} router_apikeys_limits_t;

/* Verdict of router_apikeys_acquire. */
typedef enum {
    ROUTER_APIKEY_ADMITTED = 0,    /* counted in flight; release with router_apikeys_release */
    ROUTER_APIKEY_RATE_LIMITED,    /* over rpm: retry after *retry_after_s_out */
    ROUTER_APIKEY_CONCURRENCY_CAP, /* max_concurrency requests already in flight */
} router_apikey_verdict_t;

/* The table; opaque. */
typedef struct router_apikeys router_apikeys_t;

/*
 * router_apikeys_create - load the keys of `path` (a key file, or NULL) and of `text` (or NULL;
 * entries separated by newlines or commas), each entry without its own limits getting
 * `defaults`. An empty result is valid (open front end). Returns TDM_OK with *keys_out, or
 * TDM_ERR_NOT_FOUND / TDM_ERR_IO (file unreadable), TDM_ERR_FORMAT (a malformed entry, a key
 * given twice, a name used twice, too many keys; the line and reason, never the key, are written
 * to err, err_bytes may be 0) or TDM_ERR_NO_MEMORY. Nothing is kept on failure.
 */
tdm_status_t router_apikeys_create(const char *path, const char *text,
                                   const router_apikeys_limits_t *defaults,
                                   router_apikeys_t **keys_out, char *err, size_t err_bytes);

/* router_apikeys_destroy - free (wipes the digests). Accepts NULL. */
void router_apikeys_destroy(router_apikeys_t *keys);

/* router_apikeys_count - keys in the table (0: the front end is open). keys may be NULL (0). */
size_t router_apikeys_count(const router_apikeys_t *keys);

/*
 * router_apikeys_authenticate - the tenant (1..count) of the key in an HTTP Authorization
 * header value ("Bearer KEY", scheme case-insensitive), or 0 when it is missing, malformed or
 * matches no key (counted as an authentication failure). Constant time in the key's content.
 */
uint32_t router_apikeys_authenticate(router_apikeys_t *keys, const char *authorization);

/*
 * router_apikeys_acquire - admit one request of `tenant` at monotonic now_ns: checks the rate
 * (taking a token) and the concurrency cap (taking a slot). Returns ROUTER_APIKEY_ADMITTED, or
 * the refusal with *retry_after_s_out (>= 1 s) set; a refusal takes nothing. tenant 0 or out of
 * range is always admitted (and need not be released).
 */
router_apikey_verdict_t router_apikeys_acquire(router_apikeys_t *keys, uint32_t tenant,
                                               uint64_t now_ns, uint32_t *retry_after_s_out);

/* router_apikeys_release - give back the slot of an admitted request of `tenant`. */
void router_apikeys_release(router_apikeys_t *keys, uint32_t tenant);

/*
 * router_apikeys_name - the public name of `tenant` (borrowed; lives as long as the table), or
 * "" for tenant 0 or out of range.
 */
const char *router_apikeys_name(const router_apikeys_t *keys, uint32_t tenant);

/*
 * router_apikeys_render - the keys' Prometheus families (text 0.0.4; caller frees *text_out):
 * tandem_router_api_key_requests_total{key=NAME}, tandem_router_api_key_refused_total{key=NAME,
 * reason=rate|concurrency}, tandem_router_api_key_inflight{key=NAME} and
 * tandem_router_api_auth_failures_total. Labels carry names, never keys. TDM_OK or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_apikeys_render(router_apikeys_t *keys, char **text_out, size_t *n_out);

#endif
